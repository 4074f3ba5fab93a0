"""Experiment tracking writers: TensorBoard event files read back with
TensorBoard's own reader, W&B through a fake ``wandb`` module, log lines."""

import io
import logging
import math
import re
import sys
import types

import jax
import numpy as np
import pytest

import fedjax_pfl as fp
from fedjax_pfl import algorithms, models, tracking
from fedjax_pfl import data as fdata

ROWS = [
    {"round": 0, "global/test/accuracy/mean": 0.25, "global/test/loss/mean": 1.5},
    {"round": 5, "global/test/accuracy/mean": 0.5, "global/test/loss/mean": 1.25,
     "personal/test/accuracy/mean": 0.75, "train/loss": float("nan"),
     "seconds": 2.0, "stopped": True, "note": "x", "privacy/epsilon": None,
     "per_round": [1.0, 2.0], "nonfinite_clients": 3},
]


def _read_scalars(logdir):
    """``{tag: [(step, value), ...]}`` as TensorBoard's reader sees them."""
    ea = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator")
    acc = ea.EventAccumulator(str(logdir), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"]}


def test_scalars_keep_finite_numbers_only():
    got = tracking.scalars({**ROWS[1], "inf": -math.inf, "f32": np.float32(0.5),
                            "i64": np.int64(7), "flag": np.bool_(True),
                            "array0d": jax.numpy.asarray(1.5), "obj": object()})
    assert got == {"global/test/accuracy/mean": 0.5, "global/test/loss/mean": 1.25,
                   "personal/test/accuracy/mean": 0.75, "seconds": 2.0,
                   "nonfinite_clients": 3.0, "f32": 0.5, "i64": 7.0,
                   "array0d": 1.5}
    assert all(type(v) is float for v in got.values())


def test_tensorboard_rows_read_back(tmp_path):
    pytest.importorskip("tensorboard")
    logdir = tmp_path / "runs" / "a"
    with tracking.TensorBoardWriter(logdir) as tb:
        assert not logdir.exists()  # opened at the first row
        for row in ROWS:
            tb(None, row)
    got = _read_scalars(logdir)
    assert set(got) == {"global/test/accuracy/mean", "global/test/loss/mean",
                        "personal/test/accuracy/mean", "seconds",
                        "nonfinite_clients"}
    assert got["global/test/accuracy/mean"] == [(0, 0.25), (5, 0.5)]
    assert got["global/test/loss/mean"] == [(0, 1.5), (5, 1.25)]
    assert got["personal/test/accuracy/mean"] == [(5, 0.75)]
    assert got["nonfinite_clients"] == [(5, 3.0)]


def test_tensorboard_follows_a_simulate_run(tmp_path):
    pytest.importorskip("tensorboard")
    data = fdata.fedprox_synthetic(0.5, 0.5, num_clients=6, dim=10, num_classes=3,
                                   max_size=30, min_size=8, seed=1)
    alg = algorithms.fedavg(models.logistic_regression((10,), 3), client_lr=0.1,
                            num_local_steps=2, batch_size=4, cohort_size=3)
    with tracking.TensorBoardWriter(tmp_path) as tb:
        res = fp.simulate(alg, data, num_rounds=3, eval_every=1,
                          key=jax.random.key(0), progress=False, callback=tb)
    got = _read_scalars(tmp_path)
    assert set(got) == set().union(*map(tracking.scalars, res.history))
    for tag, points in got.items():
        want = [(r["round"], r[tag]) for r in res.history if tag in r]
        assert [s for s, _ in points] == [s for s, _ in want]
        np.testing.assert_allclose([v for _, v in points], [v for _, v in want],
                                   rtol=1e-6)  # stored as float32
    assert [s for s, _ in got["global/test/accuracy/mean"]] == [0, 1, 2, 3]


def test_nothing_is_written_without_rows_or_off_the_first_process(tmp_path,
                                                                   monkeypatch):
    pytest.importorskip("tensorboard")
    tracking.TensorBoardWriter(tmp_path / "none").close()
    assert not (tmp_path / "none").exists()
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    stream = io.StringIO()
    with tracking.TensorBoardWriter(tmp_path / "p1") as tb, \
            tracking.LogWriter(stream) as log:
        for row in ROWS:
            tb(None, row)
            log(None, row)
    assert not (tmp_path / "p1").exists() and stream.getvalue() == ""


class _FakeWandb(types.ModuleType):
    """Records ``wandb.init`` and the run's ``log``/``finish`` calls."""

    def __init__(self):
        super().__init__("wandb")
        self.calls = []

    def init(self, **kwargs):
        self.calls.append(("init", kwargs))
        calls = self.calls

        class Run:
            def log(self, data, step=None):
                calls.append(("log", data, step))

            def finish(self):
                calls.append(("finish",))

        return Run()


def test_wandb_writer_with_a_fake_module(monkeypatch):
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    config = {"lam": 0.1}
    w = tracking.WandbWriter("pfl", config=config, name="ditto", mode="offline")
    assert fake.calls == [] and w.run is None  # the run starts at the first row
    for row in ROWS:
        w(None, row)
    w.close()
    w.close()
    assert fake.calls == [
        ("init", {"project": "pfl", "config": {"lam": 0.1}, "name": "ditto",
                  "mode": "offline"}),
        ("log", tracking.scalars(ROWS[0]), 0),
        ("log", tracking.scalars(ROWS[1]), 5),
        ("finish",)]
    with pytest.raises(ValueError, match="closed"):
        w(None, ROWS[0])


def test_wandb_writer_closed_before_any_row_starts_no_run(monkeypatch):
    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with tracking.WandbWriter():
        pass
    assert fake.calls == []


def test_log_writer_lines():
    stream = io.StringIO()
    with tracking.LogWriter(stream) as log:
        for row in ROWS:
            log(None, row)
    lines = stream.getvalue().splitlines()
    assert re.fullmatch(r"round 0 \| \d+\.\d s \| global/test/accuracy/mean=0\.25",
                        lines[0])
    assert re.fullmatch(r"round 5 \| \d+\.\d s \| global/test/accuracy/mean=0\.5 \| "
                        r"personal/test/accuracy/mean=0\.75 \(stopped\)", lines[1])
    assert len(lines) == 2
    log = tracking.LogWriter(io.StringIO(), metrics=["train/loss", "seconds",
                                                     "privacy/epsilon"])
    assert re.fullmatch(r"round 5 \| \d+\.\d s \| seconds=2 \(stopped\)",
                        log.format(ROWS[1]))
    eps = {"round": 7, "privacy/epsilon": 1.23456, "privacy/stopped": False}
    assert tracking.LogWriter().format(eps).endswith("| privacy/epsilon=1.235")


def test_log_writer_through_logging(caplog):
    logger = logging.getLogger("fedjax_pfl.test_tracking")
    with caplog.at_level(logging.INFO, logger=logger.name):
        tracking.LogWriter(logger=logger).write(ROWS[0])
        tracking.LogWriter(logger=logger, level=logging.DEBUG).write(ROWS[0])
    assert [r.getMessage().split(" | ")[0] for r in caplog.records] == ["round 0"]


def test_combine_calls_in_order_and_closes_all():
    seen = []

    class Closable:
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail

        def __call__(self, state, row):
            seen.append((self.name, state, row["round"]))

        def close(self):
            seen.append((self.name, "closed"))
            if self.fail:
                raise OSError(self.name)

    def plain(state, row):
        seen.append(("plain", state, row["round"]))

    with pytest.raises(OSError, match="a"):
        with tracking.combine(Closable("a", fail=True), None, plain,
                              Closable("b")) as cb:
            cb("s", ROWS[1])
    assert seen == [("a", "s", 5), ("plain", "s", 5), ("b", "s", 5), ("a", "closed"),
                    ("b", "closed")]


@pytest.mark.parametrize("make, match", [
    (lambda p: tracking.TensorBoardWriter(p / "file"), "logdir"),
    (lambda p: tracking.TensorBoardWriter(p / "file" / "sub"), "logdir"),
    (lambda p: tracking.TensorBoardWriter(3), "logdir"),
    (lambda p: tracking.TensorBoardWriter(""), "logdir"),
    (lambda p: tracking.WandbWriter(3), "project"),
    (lambda p: tracking.WandbWriter(""), "project"),
    (lambda p: tracking.WandbWriter(config=[("lam", 1)]), "config"),
    (lambda p: tracking.LogWriter(3), "stream"),
    (lambda p: tracking.LogWriter(io.StringIO(), logger=logging.getLogger()),
     "logger"),
    (lambda p: tracking.LogWriter(logger="fedjax_pfl"), "logger"),
    (lambda p: tracking.LogWriter(metrics="global/test/accuracy/mean"), "metrics"),
    (lambda p: tracking.LogWriter(metrics=[1]), "metrics"),
    (lambda p: tracking.LogWriter(level="INFO"), "level"),
    (lambda p: tracking.combine(print, 3), r"callbacks\[1\]"),
])
def test_invalid_arguments(tmp_path, monkeypatch, make, match):
    monkeypatch.setitem(sys.modules, "wandb", _FakeWandb())
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=match):
        make(tmp_path)


@pytest.mark.parametrize("row", [{"seconds": 1.0}, {"round": 1.0}, {"round": True},
                                 [("round", 1)]])
def test_rows_without_an_integer_round_are_refused(row):
    with pytest.raises(ValueError, match="row"):
        tracking.LogWriter(io.StringIO()).write(row)


@pytest.mark.parametrize("make, extra", [
    (lambda p: tracking.TensorBoardWriter(p), "tensorboard"),
    (lambda p: tracking.WandbWriter("pfl"), "wandb"),
])
def test_missing_package_names_the_extra(tmp_path, monkeypatch, make, extra):
    for name in list(sys.modules):
        if name == extra or name.startswith(extra + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, extra, None)  # import fails
    with pytest.raises(ImportError, match=re.escape(f"fedjax-pfl[{extra}]")):
        make(tmp_path)
