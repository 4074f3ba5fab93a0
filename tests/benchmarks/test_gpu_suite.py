"""The GPU suite's helpers: the environment check and the report."""

import json

from helpers import load_benchmark

_load = load_benchmark


def test_env_writes_versions_and_missing(tmp_path, capsys):
    assert _load("gpu_suite").main(["env", str(tmp_path)]) == 0
    info = json.loads((tmp_path / "env.json").read_text())
    assert info["backend"] == "cpu" and info["missing_required"] == {}
    assert info["fedjax_pfl_import_error"] is None and info["versions"]["jax"]
    assert "all required modules import" in capsys.readouterr().out


def test_env_fails_when_a_gpu_is_expected_on_cpu(tmp_path):
    assert _load("gpu_suite").main(["env", str(tmp_path), "--expect-gpu"]) == 1


def test_report_merges_records_and_steps(tmp_path):
    suite = _load("gpu_suite")
    suite.main(["env", str(tmp_path)])
    _load("throughput").main([
        "--models", "logreg", "--clients", "3", "--steps", "1", "--batch", "2",
        "--per-client", "4", "--repeats", "1", "--strategies", "vmap",
        "--scan-rounds", "0", "--out", str(tmp_path / "throughput.jsonl")])
    (tmp_path / "throughput.status").write_text(
        "throughput\tpassed\t0\t5\t300\tpython benchmarks/throughput.py\n")
    (tmp_path / "w1.status").write_text("w1\tskipped: no data\t-\t0\t0\t-\n")
    docs = tmp_path / "docs"
    assert suite.main(["report", str(tmp_path), "--docs", str(docs)]) == 0
    md = (tmp_path / "gpu.md").read_text()
    assert "| throughput | passed | 5 | 300 |" in md and "skipped: no data" in md
    assert "| logreg | 3 | 1 | vmap |" in md  # throughput's own table
    assert md.count("No records.") == 4  # w1, ditto_cost, privacy, ditto_fmnist
    assert (docs / "gpu.md").read_text() == md
    assert len((docs / "throughput_gpu.jsonl").read_text().splitlines()) == 2
