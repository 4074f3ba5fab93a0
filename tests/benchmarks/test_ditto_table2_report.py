"""benchmarks/ditto_table2.py's bookkeeping: which recorded rows a resumed run
skips, and a report never mixing validation splits."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import load_benchmark

t2 = load_benchmark("ditto_table2")


def _rec(row, **kw):
    r = {"benchmark": "ditto_table2", "attack": "none", "ratio": 0.0, "rounds": 500,
         "model": "cnn", "clients": 300, "cohort_size": 10, "local_steps": 10,
         "finetune_steps": 50, "finetune_epochs": None, "input": "inverted",
         "val_fraction": 0.1, "seed": 0, "row": row, "config": None, "mean": 0.8,
         "std": 0.1, "worst10": 0.5, "val_mean": 0.7}
    r.update(kw)
    return r


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_records_without_a_val_split_held_out_the_tail(tmp_path):
    path = tmp_path / "t.jsonl"
    _write(path, [_rec("global"), _rec("Ditto", config="lam=1", val_split="random")])
    tag = {k: v for k, v in _rec("x").items() if k in t2.SAME_RUN}
    assert t2.recorded(str(path), {**tag, "val_split": "tail"}) == {("global", None)}
    assert t2.recorded(str(path), {**tag, "val_split": "random"}) == {
        ("Ditto", "lam=1")}


def test_report_refuses_mixed_val_splits(tmp_path):
    path = tmp_path / "t.jsonl"
    _write(path, [_rec("global"), _rec("global", seed=1, val_split="random")])
    with pytest.raises(ValueError, match="different validation rows"):
        t2.report(str(path))
    _write(path, [_rec("global", val_split="random"),
                  _rec("global", seed=1, val_split="random")])
    assert "| global | 0.800 +- 0.000 (0.10)" in t2.report(str(path))


def test_each_configuration_checkpoints_in_its_own_folder():
    """A checkpoint's fingerprint cannot see hyperparameters: a run with a
    non-default one gets its own folder (defaults keep the plain name)."""
    defaults = {"apfl": "alpha=0.5 fixed", "l2sgd": "lam=1"}
    assert t2.run_folder("apfl", "alpha=0.5 fixed", defaults) == "apfl"
    assert t2.run_folder("apfl", "alpha0=0.01 adaptive", defaults) == (
        "apfl_alpha0=0.01_adaptive")
    assert t2.run_folder("l2sgd", "lam=0.1", defaults) == "l2sgd_lam=0.1"
    assert t2.run_folder("mapper", None, defaults) == "mapper"
    assert t2.run_folder("ditto_lam0.1", "lam=0.1", defaults) == "ditto_lam0.1"
    assert t2.ditto_run(1.0) == "ditto" and t2.ditto_run(0.1) == "ditto_lam0.1"


def test_mixing_weights_splits_benign_and_malicious_writers():
    alpha = np.array([0.0, 0.0, 0.2, 0.0, 0.5, 0.7], np.float32)
    state = SimpleNamespace(clients=SimpleNamespace(alpha=alpha))
    benign = np.array([1, 1, 1, 0, 0, 0], np.float32)
    out = t2.mixing_weights(state, benign)
    assert out["benign"]["writers"] == 3 and out["benign"]["zero"] == 2
    assert out["benign"]["median"] == 0.0
    assert out["malicious"] == {"writers": 3, "zero": 1, "median": 0.5,
                                "q90": pytest.approx(0.66)}
    assert set(t2.mixing_weights(state, np.ones(6))) == {"benign"}
