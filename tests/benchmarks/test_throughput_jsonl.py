"""benchmarks/throughput.read_jsonl, the one reader of the benchmarks' JSON-lines
records: it returns what write_jsonl appended, in order, and skips blank lines
(a record file edited by hand or concatenated from several runs may end with
one)."""

from helpers import load_benchmark

tp = load_benchmark("throughput")


def test_read_jsonl_returns_what_write_jsonl_appended(tmp_path):
    path = str(tmp_path / "r.jsonl")
    first = [{"method": "ditto", "acc": 0.5}, {"method": "fedavg", "acc": [1, 2]}]
    tp.write_jsonl(path, first)
    tp.write_jsonl(path, [{"method": "local", "acc": None}])
    with open(path, "a") as fh:
        fh.write("\n  \n")
    tp.write_jsonl(path, [{"method": "apfl"}])
    assert tp.read_jsonl(path) == first + [{"method": "local", "acc": None},
                                           {"method": "apfl"}]
