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
    table = _load("throughput").report([str(out)])
    assert table.count("\n") == 5 and "scan2:map:1" in table


def test_reductions_smoke():
    recs = _load("reductions").main(["--clients", "3", "--shape", "4", "5",
                                     "--repeats", "1"])
    assert recs[0]["clients"] == 3 and recs[0]["sum_s"] > 0


def test_ditto_cost_smoke(tmp_path):
    recs = _load("ditto_cost").main(["--lams", "0", "1", "--clients", "6", "--cohort-size", "3",
                                     "--rounds", "1", "--eval-every", "1",
                                     "--repeats", "1", "--out",
                                     str(tmp_path / "d.jsonl")])
    sweep = next(r for r in recs if r["measure"] == "lambda_sweep")
    assert sweep["max_abs_diff_accuracy"] < 1e-5  # the sweep equals separate runs
    assert sweep["sweep_s"] > 0 and sweep["separate_s"] > 0
    assert next(r for r in recs if r["measure"] == "round_ratio")["ditto_over_fedavg"] > 0


def test_ditto_fmnist_smoke():
    import os

    import pytest

    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    recs = _load("ditto_fmnist").main([
        "--num-clients", "20", "--rounds", "1", "--eval-every", "1",
        "--attack", "A1", "--ratio", "0.5", "--lam-selection", "fixed"])
    last = recs[-1]
    assert last["round"] == 1 and 0 <= last["personal/test/accuracy/mean"] <= 1
