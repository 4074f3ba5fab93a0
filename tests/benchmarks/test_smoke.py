"""Tiny runs of every benchmark script so none can rot."""

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_throughput_smoke(tmp_path):
    out = tmp_path / "t.jsonl"
    recs = _load("throughput").main([
        "--models", "logreg", "--clients", "6", "--steps", "2", "--batch", "4",
        "--per-client", "8", "--repeats", "1", "--strategies", "vmap", "map:2",
        "--scan-rounds", "2", "--out", str(out)])
    assert {r["variant"] for r in recs} == {"loop", "vmap", "map:2", "scan2:map:1"}
    for r in recs:
        if not r["variant"].startswith("scan"):
            assert r["max_abs_diff_vs_loop"] < 1e-5  # same numbers as the loop
        assert r["round_s"] > 0 and r["compile_s"] > 0
    assert len(out.read_text().splitlines()) == 4
    assert json.loads(out.read_text().splitlines()[0])["backend"] == "cpu"


def test_reductions_smoke():
    recs = _load("reductions").main(["--clients", "3", "--shape", "4", "5",
                                     "--repeats", "1"])
    assert recs[0]["clients"] == 3 and recs[0]["sum_s"] > 0
