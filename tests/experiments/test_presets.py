"""Presets, their validation, the run directory and exact resume."""

import csv
import json
import os

import numpy as np
import pytest

from fedjax_pfl import experiments, privacy
from fedjax_pfl.experiments import _presets, _run
from fedjax_pfl.experiments._cli import main

TINY = {"clients": "12", "max_size": "60", "rounds": "4", "eval_every": "2",
        "local_steps": "2", "batch_size": "5", "cohort_size": "4"}


def test_every_preset_resolves_with_its_defaults():
    assert {"ditto-synthetic", "ditto-fmnist", "ditto-femnist", "ditto-vehicle",
            "fedplus-table2", "fedfdp-table1", "fedfdp-table2"} <= set(
                experiments.PRESETS)
    for p in experiments.PRESETS.values():
        cfg = experiments.resolve(p)
        assert cfg == p.defaults() and p.paper and p.summary
        for k in ("rounds", "eval_every", "seed", "checkpoint_every"):
            assert k in cfg


@pytest.mark.parametrize("sets, match", [
    ({"bogus": "1"}, "bogus: not a key.*valid keys: a3_scale, aggregator, alpha"),
    ({"ratio": "1.0"}, "ratio: must be < 1.0"),
    ({"lam": "-1"}, "lam: must be >= 0.0"),
    ({"method": "fedsgd"}, r"method: must be one of \['ditto', 'global'"),
    ({"rounds": "ten"}, "rounds: expected an integer"),
    ({"rounds": "0"}, "rounds: must be >= 1"),
    ({"lr": "nan"}, "lr: must be a number"),
    ({"checkpoint_every": "3"}, "checkpoint_every: must be a multiple of eval_every"),
])
def test_invalid_config_is_rejected_before_any_work(tmp_path, monkeypatch, sets, match):
    preset = experiments.get_preset("ditto-synthetic")

    def never(cfg):
        raise AssertionError("the preset was built")

    monkeypatch.setitem(_presets.PRESETS, "ditto-synthetic",
                        experiments.Preset(**{**preset.__dict__, "build": never}))
    with pytest.raises(ValueError, match=match):
        experiments.run_preset("ditto-synthetic", sets, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_cli_errors_and_listing(tmp_path, capsys):
    with pytest.raises(SystemExit, match="preset: unknown 'nope'; valid presets"):
        main(["run", "nope", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--set: expected key=value"):
        main(["run", "ditto-synthetic", "--set", "rounds", "--out", str(tmp_path)])
    assert main(["list"]) == 0
    text = capsys.readouterr().out
    assert all(name in text for name in experiments.PRESETS)
    assert main(["list", "fedfdp-table2"]) == 0
    text = capsys.readouterr().out
    assert "target_epsilon" in text and (
        "{dp_fedavg, dp_scaffold, dp_fedprox, dp_feddyn, dp_qffl, fedfdp}" in text)


def _rows(path):
    with open(path) as fh:
        rows = [json.loads(line) for line in fh]
    for r in rows:
        r.pop("seconds", None)
    return rows


def test_run_writes_the_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "ditto-synthetic", "--quiet", "--out", str(out),
                 "--plots", "png,pdf",  # the suite's default is none (conftest)
                 *[f"--set={k}={v}" for k, v in {**TINY, "attack": "A1",
                                                 "ratio": "0.5"}.items()]]) == 0
    assert "personal" in capsys.readouterr().out
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["preset"] == "ditto-synthetic" and cfg["config"]["rounds"] == 4
    assert cfg["config"]["attack"] == "A1" and cfg["info"]["malicious"] == 6
    hist = _rows(out / "history.jsonl")
    assert [r["round"] for r in hist] == [0, 2, 4]
    with open(out / "clients.csv") as fh:
        table = list(csv.DictReader(fh))
    assert len(table) == 12
    assert sum(int(r["benign"]) for r in table) == 6
    acc = np.array([float(r["personal/test/accuracy"]) for r in table])
    n = np.array([int(r["train_examples"]) for r in table])
    assert np.all((acc >= 0) & (acc <= 1)) and np.all(n > 0)
    for png in ("curves.png", "clients.png"):
        assert (out / "plots" / png).stat().st_size > 1000
        assert (out / "plots" / png).with_suffix(".pdf").read_bytes()[:4] == b"%PDF"
    # the same directory again without --resume would overwrite it: refused
    with pytest.raises(SystemExit, match="already holds a run"):
        main(["run", "ditto-synthetic", "--quiet", "--out", str(out)])


def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    sets = {**TINY, "rounds": "6", "checkpoint_every": "2"}
    full = experiments.run_preset("ditto-synthetic", sets, out=tmp_path / "a",
                                  progress=False)
    real = _run.simulate

    def crash_after_round_2(*args, callback=None, **kwargs):
        def cb(state, row):
            if callback is not None:
                callback(state, row)
            if row["round"] == 2:
                raise KeyboardInterrupt
        return real(*args, **kwargs, callback=cb)

    monkeypatch.setattr(_run, "simulate", crash_after_round_2)
    with pytest.raises(KeyboardInterrupt):
        experiments.run_preset("ditto-synthetic", sets, out=tmp_path / "b",
                               progress=False)
    monkeypatch.setattr(_run, "simulate", real)
    with pytest.raises(ValueError, match="resume: .* holds a run of ditto-synthetic"):
        experiments.run_preset("ditto-synthetic", {**sets, "lam": "2"},
                               out=tmp_path / "b", resume=True, progress=False)
    resumed = experiments.run_preset("ditto-synthetic", sets, out=tmp_path / "b",
                                     resume=True, progress=False)
    assert _rows(tmp_path / "a" / "history.jsonl") == _rows(
        tmp_path / "b" / "history.jsonl")
    assert (tmp_path / "a" / "clients.csv").read_text() == (
        tmp_path / "b" / "clients.csv").read_text()
    assert full["final"]["round"] == resumed["final"]["round"] == 6


def test_fedfdp_plan_gives_every_private_method_the_same_epsilon():
    eps, plan = _presets.fedfdp_plan(60, 0.05, 2.0, 5.0)
    assert plan["fedfdp"] == 60 and plan["dp_fedavg"] > 60  # no loss releases
    ev = _presets.fedfdp_events(0.05, 2.0, 5.0)
    for m, t in plan.items():
        assert privacy.epsilon(ev[m](t), 1e-5) <= eps + 1e-9
        assert privacy.epsilon(ev[m](t + 1), 1e-5) > eps


def test_fedplus_synthetic_preset_runs(tmp_path):
    res = experiments.run_preset(
        "fedplus-table2", {"dataset": "synthetic", "rounds": "2", "eval_every": "1",
                           "local_steps": "2"}, out=tmp_path, progress=False)
    assert res["final"]["round"] == 2 and res["views"] == ("personal", "global")


@pytest.mark.skipif(not os.environ.get("FEDJAX_PFL_DATA_DIR"),
                    reason="FEDJAX_PFL_DATA_DIR is not set")
def test_vehicle_preset_on_real_data(tmp_path):
    res = experiments.run_preset(
        "ditto-vehicle", {"rounds": "4", "eval_every": "2", "attack": "A1",
                          "ratio": "0.5"}, out=tmp_path, progress=False)
    row = res["final"]
    assert row["round"] == 4 and 0.0 <= row["personal/test/accuracy/mean"] <= 1.0
    with open(tmp_path / "clients.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 23


@pytest.mark.slow  # ~15 s; run with -m slow
def test_lindt_preset_reports_gain_and_delta(tmp_path):
    res = experiments.run_preset(
        "lindt-table3", {"data": "synthetic", "clients": "10", "cohort_size": "2",
                         "rounds": "4", "eval_every": "2", "private_rounds": "1",
                         "private_steps": "2", "hidden": "8", "r_prime": "1",
                         "class_sigma": "1.5"},
        out=tmp_path, progress=False, plots="png")  # the suite's default is none
    rows = _rows(tmp_path / "history.jsonl")
    assert [r["round"] for r in rows] == [0, 2, 4]
    for r in rows:  # the gain callback's keys reach the file
        assert -100.0 <= r["nfl/beta"] <= 100.0
    assert rows[-1]["nfl/delta"] >= -1e6 and res["views"] == ("global", "personal")
    assert (tmp_path / "plots" / "nfl.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="hidden: must be comma-separated"):
        experiments.run_preset("lindt-table3", {"hidden": "16,x"}, out=tmp_path / "b")


# ------------------ what needs the loaded data fails before any file or round


def _fails_before_any_file(tmp_path, sets, match, name="ditto-synthetic"):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=match):
        experiments.run_preset(name, sets, out=out, progress=False)
    assert not out.exists()  # no config.json, history.jsonl or checkpoint


def test_cohort_larger_than_the_data_fails_before_any_file(tmp_path):
    _fails_before_any_file(tmp_path, {**TINY, "cohort_size": "20"},
                           r"cohort_size: 20 is larger than the number of clients")


def test_a_ratio_that_makes_no_attacker_fails_before_any_file(tmp_path):
    _fails_before_any_file(tmp_path, {**TINY, "attack": "A1", "ratio": "0.05"},
                           r"ratio: 0.05 of 12 clients makes no client malicious")
    _fails_before_any_file(tmp_path, {**TINY, "ratio": "0.5"},
                           "ratio: 0.5 has no effect without an attack")


def test_an_out_that_is_a_file_fails_before_any_work(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for out, match in [(a_file, "out: .* must be a folder"),
                       (a_file / "run", "out: .* is a file")]:
        with pytest.raises(ValueError, match=match):
            experiments.run_preset("ditto-synthetic", TINY, out=out, progress=False)
        with pytest.raises(SystemExit, match="fedjax-pfl run: out: "):
            main(["run", "ditto-synthetic", "--quiet", "--out", str(out),
                  *[f"--set={k}={v}" for k, v in TINY.items()]])
    assert a_file.read_text() == "x"


def _fake_preset(monkeypatch, build):
    base = experiments.get_preset("ditto-synthetic")
    monkeypatch.setitem(_presets.PRESETS, "fake", experiments.Preset(
        **{**base.__dict__, "name": "fake", "build": build}))


def test_a_model_that_does_not_fit_the_data_fails_before_any_file(tmp_path,
                                                                  monkeypatch):
    from fedjax_pfl import algorithms, models
    from fedjax_pfl import data as fdata

    def build(cfg):  # a 60-feature problem given to a 10-feature model
        fed = fdata.fedprox_synthetic(num_clients=6, max_size=40, seed=0)
        alg = algorithms.fedavg(models.logistic_regression((10,), 10), client_lr=0.1,
                                num_local_steps=1, batch_size=5, cohort_size=3)
        return experiments.Experiment(alg, fed)

    _fake_preset(monkeypatch, build)
    _fails_before_any_file(tmp_path, {"rounds": "2"},
                           r"data: features of shape \(60,\)", name="fake")


def test_labels_outside_the_models_classes_fail_before_any_file(tmp_path,
                                                                monkeypatch):
    from fedjax_pfl import algorithms, models
    from fedjax_pfl import data as fdata

    def build(cfg):  # 10 classes in the data, a 5-class model
        fed = fdata.fedprox_synthetic(num_clients=6, max_size=40, seed=0)
        alg = algorithms.fedavg(models.logistic_regression((60,), 5), client_lr=0.1,
                                num_local_steps=1, batch_size=5, cohort_size=3)
        return experiments.Experiment(alg, fed)

    _fake_preset(monkeypatch, build)
    _fails_before_any_file(tmp_path, {"rounds": "2"},
                           r"data: labels of the 'train' split must be class "
                           r"indices in \[0, 5\)", name="fake")


def test_a_budget_that_allows_no_round_and_unknown_views_fail_early(tmp_path,
                                                                     monkeypatch):
    from fedjax_pfl import algorithms, models
    from fedjax_pfl import data as fdata

    def build(cfg):
        fed = fdata.fedprox_synthetic(num_clients=6, max_size=40, seed=0)
        alg = algorithms.fedavg(models.logistic_regression((60,), 10), client_lr=0.1,
                                num_local_steps=1, batch_size=5, cohort_size=3)
        if cfg["rounds"] == 2:
            return experiments.Experiment(alg, fed, info={"num_rounds": 0})
        return experiments.Experiment(alg, fed, views=("global", "personal"))

    _fake_preset(monkeypatch, build)
    _fails_before_any_file(tmp_path, {"rounds": "2"},
                           "rounds: the run has 0 rounds .*privacy budget",
                           name="fake")
    _fails_before_any_file(tmp_path, {"rounds": "3"},
                           r"views: unknown \['personal'\]", name="fake")


def test_every_fedplus_method_runs_its_checks():
    # the preflight of each method on the synthetic row (views, models, round)
    import jax

    for method in _presets.FEDPLUS_METHODS:
        cfg = experiments.resolve(experiments.get_preset("fedplus-table2"),
                                  {"dataset": "synthetic", "method": method})
        exp = _presets._fedplus(cfg)
        _run._check_experiment(exp, cfg, jax.random.key(0))


def _dp_preset(normalize):
    """A tiny DP-FedAvg preset on synthetic data (registered by the test)."""
    from fedjax_pfl import algorithms, models
    from fedjax_pfl import data as fdata
    from fedjax_pfl.experiments._config import Experiment, Key, Preset, run_keys

    def build(cfg):
        fed = fdata.fedprox_synthetic(1.0, 1.0, num_clients=6, dim=6,
                                      num_classes=3, min_size=8, max_size=30, seed=0)
        alg = algorithms.dp_fedavg(models.logistic_regression((6,), 3), clip=1.0,
                                   noise_multiplier=1.0, sampling_rate=0.2,
                                   num_local_steps=2, cohort_size=3,
                                   normalize=cfg["normalize"])
        mech = alg.privacy(fed)
        mon = privacy.Monitor(mech, 1e-5) if mech.accounted else None
        return Experiment(alg, fed, None, mon, ("global",))

    keys = {**run_keys(4, 2), "normalize": Key(normalize, "normaliser",
                                               choices=("expected", "realized"))}
    return Preset("dp-tiny", "test", "tiny DP-FedAvg", "", keys, build)


@pytest.mark.parametrize("normalize", ["expected", "realized"])
def test_dp_preset_writes_the_privacy_ledger(tmp_path, monkeypatch, normalize):
    monkeypatch.setitem(experiments.PRESETS, "dp-tiny", _dp_preset(normalize))
    res = experiments.run_preset("dp-tiny", {}, out=tmp_path, progress=False)
    ledger = json.loads((tmp_path / "privacy.json").read_text())
    assert "privacy.json" in res["files"]
    assert ledger["mechanism"]["level"] == "sample"
    rows = _rows(tmp_path / "history.jsonl")
    if normalize == "expected":
        assert ledger["mechanism"]["accounted"]
        assert [e["round"] for e in ledger["evaluations"]] == [0, 2, 4]
        assert [e["epsilon"] for e in ledger["evaluations"]] == [
            r["privacy/epsilon"] for r in rows]
        assert [e["delta"] for e in ledger["evaluations"]] == [
            r["privacy/delta"] for r in rows]
        want = privacy.epsilon(privacy.dp_sgd_event(0.2, 1.0, 4, 2), 1e-5)
        assert ledger["evaluations"][-1]["epsilon"] == want
    else:  # the paper's normaliser: a ledger that says why, and no epsilon
        assert not ledger["mechanism"]["accounted"]
        assert "normalize='realized'" in ledger["mechanism"]["reason"]
        assert ledger["evaluations"] == [] and "privacy/epsilon" not in rows[-1]


def test_ditto_presets_a3_scale(tmp_path):
    """A3's factor defaults to the cohort size (the authors' code); another
    factor changes the run; without A3 the key is refused as inert."""
    sets = {**TINY, "attack": "A3", "ratio": "0.5", "method": "global",
            "cohort_size": "6"}
    key = "global/test/accuracy/mean"
    runs = {s: experiments.run_preset("ditto-synthetic", {**sets, "a3_scale": s},
                                      out=tmp_path / s, progress=False)["final"][key]
            for s in ("0", "6", "1")}
    assert runs["0"] == runs["6"] and runs["1"] != runs["6"]
    with pytest.raises(ValueError, match="a3_scale: has no effect unless attack is A3"):
        experiments.run_preset("ditto-synthetic", {**TINY, "attack": "A1",
                                                   "ratio": "0.5", "a3_scale": "2"},
                               out=tmp_path / "a1")


@pytest.mark.slow  # ~20 s: one run per rule; run with -m slow
def test_ditto_presets_choose_the_global_models_aggregator(tmp_path):
    """Ditto + robust aggregation (the paper's Tables 3 and 6): the preset's
    aggregator drives the global model, so Ditto's global model is the robust
    FedAvg's, and Krum-style rules get the cohort's expected attackers."""
    sets = {**TINY, "attack": "A2", "ratio": "0.5", "aggregator": "multi_krum",
            "cohort_size": "6"}
    ditto = experiments.run_preset("ditto-synthetic", sets, out=tmp_path / "d",
                                   progress=False)
    fedavg = experiments.run_preset("ditto-synthetic", {**sets, "method": "global"},
                                    out=tmp_path / "g", progress=False)
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["info"]["expected_attackers_per_cohort"] == 6 * 6 // 12
    key = "global/test/accuracy/mean"
    assert ditto["final"][key] == fedavg["final"][key]
    plain = experiments.run_preset("ditto-synthetic", {**sets, "method": "global",
                                                       "aggregator": "mean"},
                                   out=tmp_path / "m", progress=False)
    assert plain["final"][key] != fedavg["final"][key]
    for m in ("term", "mocha"):
        with pytest.raises(ValueError, match=f"aggregator: method={m}"):
            experiments.run_preset("ditto-synthetic", {**sets, "method": m},
                                   out=tmp_path / m)
    mocha = experiments.run_preset("ditto-synthetic", {**TINY, "method": "mocha"},
                                   out=tmp_path / "mocha", progress=False)
    assert mocha["views"] == ("personal",) and mocha["final"]["round"] == 4


def test_fedplus_keys_refused_where_they_do_nothing():
    preset = experiments.get_preset("fedplus-table2")
    for over, name in (({"method": "scaffold", "sigma": "1"}, "sigma"),
                       ({"method": "fedavg", "init_mix": "0.5"}, "init_mix"),
                       ({"dataset": "mnist-robust-10", "noise_scale": "1"},
                        "noise_scale"),
                       ({"dataset": "synthetic", "negation": "sign"}, "negation"),
                       ({"delta": "0"}, "delta"),
                       ({"loss": "sum"}, "loss")):
        with pytest.raises(ValueError, match=name):
            experiments.resolve(preset, over)
    cfg = experiments.resolve(preset, {"loss": "batch_sum", "init_mix": "0.5"})
    assert cfg["loss"] == "batch_sum" and cfg["init_mix"] == 0.5


def test_plots_choose_the_figures_formats_or_none(tmp_path, monkeypatch):
    from fedjax_pfl.experiments import plot_formats
    monkeypatch.delenv("FEDJAX_PFL_PLOTS", raising=False)
    assert plot_formats() == ("png", "pdf")
    assert plot_formats("SVG, .pdf") == ("svg", "pdf")
    assert plot_formats("none") == plot_formats([]) == ()
    monkeypatch.setenv("FEDJAX_PFL_PLOTS", "svg")
    assert plot_formats() == ("svg",)
    for bad in ("jpg", "png,gif", 3):
        with pytest.raises(ValueError, match="plots: formats from"):
            plot_formats(bad)
    # refused before anything is written
    with pytest.raises(ValueError, match="plots"):
        experiments.run_preset("ditto-synthetic", TINY, out=tmp_path / "bad",
                               progress=False, plots="jpg")
    assert not (tmp_path / "bad").exists()
    res = experiments.run_preset("ditto-synthetic", TINY, out=tmp_path / "svg",
                                 progress=False)
    assert [f for f in res["files"] if f.startswith("plots/")] == [
        "plots/curves.svg", "plots/clients.svg"]
    assert sorted(p.name for p in (tmp_path / "svg" / "plots").iterdir()) == [
        "clients.svg", "curves.svg"]
    res = experiments.run_preset("ditto-synthetic", TINY, out=tmp_path / "none",
                                 progress=False, plots="none")
    assert not any(f.startswith("plots/") for f in res["files"])
    assert not (tmp_path / "none" / "plots").exists()


def test_lindt_cnn_needs_cifar_and_takes_no_hidden(tmp_path):
    _fails_before_any_file(tmp_path, {"model": "cnn", "data": "synthetic"},
                           "model: 'cnn' takes CIFAR-10", name="lindt-table3")
    _fails_before_any_file(tmp_path, {"model": "cnn"},
                           "noise_std: 0.0089 is the MLP's default",
                           name="lindt-table3")
    _fails_before_any_file(tmp_path, {"model": "cnn", "hidden": "64",
                                      "noise_std": "0"},
                           "hidden: has no effect unless model is mlp",
                           name="lindt-table3")
    _fails_before_any_file(tmp_path, {"class_sigma": "-1"}, "class_sigma: ",
                           name="lindt-table3")
