"""A tiny run of benchmarks/determinism_cost.py so it cannot rot."""

import json

from helpers import load_benchmark

_load = load_benchmark


def test_determinism_cost_smoke(tmp_path):
    out = tmp_path / "d.jsonl"
    mod = _load("determinism_cost")
    recs = mod.main(["--workloads", "logreg", "--devices", "2", "--clients", "4",
                     "--steps", "1", "--batch", "4", "--min-size", "5",
                     "--max-size", "9", "--repeats", "1", "--out", str(out)])
    assert [r["deterministic"] for r in recs] == [False, True]
    for r in recs:
        assert r["round_s"] > 0 and r["compile_s"] > 0 and r["devices"] == 2
        assert r["seed"] == 0 and r["cpu_model"] is not None and r["git_sha"]
    assert recs[1]["bitwise_across_engines"] is True
    assert recs[1]["max_abs_diff_vs_default"] < 1e-5  # the same to float rounding
    lines = out.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["ratio_vs_default"] > 0
    table = mod.report(str(out))
    assert table.count("\n") == 3 and "| logreg |" in table
