"""A tiny run of benchmarks/personalization_baselines.py so it cannot rot."""

import importlib.util
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # a benchmark smoke, as in test_smoke.py
def test_personalization_baselines_smoke(tmp_path):
    mod = _load("personalization_baselines")
    out = tmp_path / "p.jsonl"
    recs = mod.main(["--dataset", "synthetic", "--num-clients", "4", "--cohort", "2",
                     "--rounds", "2", "--steps", "1", "--batch", "4",
                     "--hidden", "4", "--seeds", "0", "--out", str(out)])
    assert [r["method"] for r in recs] == list(mod.METHODS)
    assert {r["view"] for r in recs} == {"global", "personal"}
    for r in recs:
        assert 0.0 <= r["acc_client_mean"] <= 1.0 and r["seconds"] > 0
        assert r["seed"] == 0 and r["git_sha"] and r["cpu_model"]
    assert len(out.read_text().splitlines()) == 5
    assert json.loads(out.read_text().splitlines()[0])["steps"] == 1
    table = mod.report(str(out))
    assert table.count("\n") == 8 and "| fedrep | personal | 1 |" in table
