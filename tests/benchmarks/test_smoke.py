"""Tiny runs of every benchmark script so none can rot.

Marked ``slow``: the default test command skips them (the suite stays under ten
minutes on two cores); run them with ``python -m pytest -n 2 -m slow``.
"""

import importlib.util
import json
import math
import os

import numpy as np
import pytest
from helpers import load_benchmark

pytestmark = pytest.mark.slow

_load = load_benchmark


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
    table = _load("ditto_cost").report(str(tmp_path / "d.jsonl"))
    assert "| logreg | 6 | 2 | 1 |" in table and "Ditto / FedAvg" in table


def _small_ditto_fmnist():
    """ditto_fmnist on the recipe's first 20 clients, a few rows each."""
    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    mod = _load("ditto_fmnist")
    real_load = mod.load

    def small_load(seed, num_clients):  # the recipe's 20 clients hold 54k rows:
        fed = real_load(seed, num_clients)  # evaluate on a few of them only
        from fedjax_pfl.data import from_client_arrays

        def head(split, k):
            x, y = np.asarray(split.x), np.asarray(split.y)
            return [(x[o:o + min(k, c)], y[o:o + min(k, c)]) for o, c in
                    zip(map(int, split.offsets), map(int, split.counts), strict=True)]

        return from_client_arrays(head(fed.train, 40), head(fed.val, 10),
                                  head(fed.test, 20))

    mod.load = small_load
    return mod


def test_ditto_fmnist_smoke(tmp_path):
    mod = _small_ditto_fmnist()
    args = ["--num-clients", "20", "--rounds", "2", "--eval-every", "1",
            "--attack", "A1", "--ratio", "0.5", "--lam-selection", "fixed",
            "--splits", "val", "test", "--checkpoint-dir", str(tmp_path / "ck"),
            "--resume", "--out", str(tmp_path / "f.jsonl")]
    recs = mod.main(args)
    *rows, groups = recs
    assert [r["round"] for r in rows] == [0, 1, 2] and groups["round"] == 2
    assert 0 <= rows[-1]["personal/val/accuracy/mean"] <= 1
    assert rows[-1]["config"]["client_lr"] == 0.05
    assert rows[-1]["git_sha"] and not groups["stopped_early"]
    # resuming the finished run runs nothing and records the same evaluations
    again = mod.main(args)
    assert [r["round"] for r in again[:-1]] == [0, 1, 2]
    assert again[-2]["personal/test/accuracy/mean"] == rows[-1][
        "personal/test/accuracy/mean"]
    # --snapshot: the evaluations in the checkpoint's history, marked, no training
    snap = mod.main([*args[:-1], str(tmp_path / "s.jsonl"), "--snapshot"])
    assert [r["round"] for r in snap] == [0, 1, 2] and all(r["in_progress"] for r in snap)
    assert snap[-1]["personal/test/accuracy/mean"] == rows[-1][
        "personal/test/accuracy/mean"]
    assert "snapshot" not in snap[-1]["config"]


def test_ditto_fmnist_snapshot_of_a_history_dir(tmp_path):
    """A run given --history-dir leaves its evaluations and a meta file beside
    them; --snapshot turns them into in_progress records that carry the meta
    file's machine, commit and date (the process that ran, e.g. on a GPU),
    not those of the process taking the snapshot."""
    mod = _small_ditto_fmnist()
    hist = tmp_path / "hist"
    args = ["--num-clients", "20", "--rounds", "2", "--eval-every", "1",
            "--lam-selection", "fixed", "--splits", "val", "test",
            "--history-dir", str(hist)]
    rows = mod.main([*args, "--out", str(tmp_path / "f.jsonl")])[:-1]
    made = json.loads((hist / "ditto.meta.json").read_text())
    assert made["config"]["rounds"] == 2 and made["run"] == "ditto"
    made.update(git_sha="a1b2c3d", device_kind="NVIDIA H200", date="2026-11-28T05:30:00")
    (hist / "ditto.meta.json").write_text(json.dumps(made))
    snap = mod.main([*args, "--out", str(tmp_path / "s.jsonl"), "--snapshot"])
    assert [r["round"] for r in snap] == [0, 1, 2] and all(r["in_progress"] for r in snap)
    assert {(r["git_sha"], r["device_kind"], r["date"]) for r in snap} == {
        ("a1b2c3d", "NVIDIA H200", "2026-11-28T05:30:00")}
    assert snap[-1]["personal/test/accuracy/mean"] == rows[-1][
        "personal/test/accuracy/mean"]


def test_ditto_fmnist_term(tmp_path):
    """TERM (--runs term) at tilt 0 is the plain mean: Ditto's global model
    (FedAvg's trajectory), evaluation for evaluation; the report names it
    beside the paper's Table 1 TERM value."""
    mod = _small_ditto_fmnist()
    common = ["--num-clients", "20", "--rounds", "2", "--eval-every", "1",
              "--lam-selection", "fixed", "--out", str(tmp_path / "t.jsonl")]
    ditto = mod.main(common + ["--runs", "ditto"])
    term0 = mod.main(common + ["--runs", "term", "--term-t", "0"])
    term1 = mod.main(common + ["--runs", "term"])
    k = "global/test/accuracy/mean"
    rows = [[r[k] for r in recs if "by_participation" not in r]
            for recs in (ditto, term0, term1)]
    assert rows[0] == rows[1] and len(rows[2]) == 3
    assert term1[-1]["term_t"] == 1.0 and "personal/test/accuracy/mean" not in term1[0]
    table = mod.report(str(tmp_path / "t.jsonl"))
    assert "| clean | TERM (t=1) | 1 | 2 |" in table and "| 0.909 (.07) |" in table
    assert "| clean | TERM (t=0) | 1 | 2 |" in table


def test_ditto_fmnist_local_columns_equal_attacked_runs(tmp_path):
    """The attack columns a clean local run derives are what local runs under
    each attack measure on their benign clients."""
    mod = _small_ditto_fmnist()
    common = ["--num-clients", "20", "--rounds", "3", "--eval-every", "3",
              "--runs", "local", "--splits", "val", "test", "--seed", "1"]
    clean = mod.main(common + ["--derive-ratios", "0.25", "0.5",
                               "--out", str(tmp_path / "c.jsonl")])
    derived = {(r["attack"], r["ratio"]): r for r in clean
               if r.get("derived_from_clean_run")}
    assert sorted(derived) == [(a, q) for a in ("A1", "A2", "A3") for q in (0.25, 0.5)]
    for attack, ratio in (("A1", 0.5), ("A3", 0.25)):
        run = mod.main(common + ["--attack", attack, "--ratio", str(ratio),
                                 "--out", str(tmp_path / "a.jsonl")])
        measured = [r for r in run if "by_participation" not in r][-1]
        mine = derived[(attack, ratio)]
        for k in ("personal/test/accuracy/mean", "personal/test/accuracy/std",
                  "personal/val/accuracy/worst10", "personal/test/loss/mean"):
            np.testing.assert_allclose(mine[k], measured[k], rtol=1e-6, err_msg=k)
    table = mod.report(str(tmp_path / "c.jsonl"))
    assert table.count("| local (the clean run's models, benign devices) |") == 6
    # the masks matter: a quarter malicious leaves another mean than none
    clean_final = [r for r in clean if r["attack"] == "none"
                   and "by_participation" not in r][-1]
    assert derived[("A3", 0.25)]["personal/test/accuracy/mean"] != pytest.approx(
        clean_final["personal/test/accuracy/mean"])


def test_privacy_smoke(tmp_path):
    out = tmp_path / "p.jsonl"
    recs = _load("privacy").main(["--models", "tiny_mlp", "--clients", "2", "--batch", "4",
                                  "--variants", "plain", "vmap_chunk2",
                                  "--repeats", "1", "--out", str(out)])
    assert [r["variant"] for r in recs] == ["plain", "vmap_chunk2"]
    assert recs[0]["ghost_vs_vmap_max_abs_diff"] < 1e-5  # same clipped gradient
    assert all(r["step_s"] > 0 and r["compile_s"] > 0 for r in recs)
    # memory: at least the clients' inputs (2 x 4 x 16 floats) and the parameters
    assert all(r["planned_mib"] * 2**20 > 4 * (2 * 4 * 16 + 226) for r in recs)
    assert len(out.read_text().splitlines()) == 2
    table = _load("privacy").report([str(out)])
    assert table.count("| tiny_mlp | 2 |") == 2


def test_aggregators_smoke(tmp_path):
    out = tmp_path / "a.jsonl"
    mod = _load("aggregators")
    recs = mod.main(["--clients", "8", "--params", "12", "--rules", "mean",
                     "coordinate_median", "krum", "moreau_l2", "--repeats", "1",
                     "--moreau-clients", "5", "--moreau-params", "6",
                     "--out", str(out)])
    agg = [r for r in recs if r["measure"] == "aggregate"]
    assert [r["aggregator"] for r in agg] == ["mean", "coordinate_median", "krum",
                                              "moreau_l2"]
    assert all(r["finite"] and r["time_s"] > 0 and r["ratio_vs_mean"] > 0 for r in agg)
    mor = [r for r in recs if r["measure"] == "moreau_solver"]
    assert {r["psi"] for r in mor} == {"l2", "l1"}
    for r in mor:  # both solvers reach the same aggregate (odd m: unique)
        assert r["irls_iters"] >= 1 and r["paper_iters"] >= 1
        assert r["max_abs_diff"] < 1e-2
    assert len(out.read_text().splitlines()) == len(recs)
    table = mod.report([str(out)])
    assert "coordinate_median" in table and "paper / IRLS" in table


def test_fedplus_table2_smoke(tmp_path):
    out = tmp_path / "f.jsonl"
    recs = _load("fedplus_table2").main([
        "--datasets", "synthetic", "--methods", "fedgeomed_plus", "fedavg",
        "--rounds", "2", "--eval-every", "2", "--local-steps", "2", "--out", str(out)])
    last = {r["method"]: r for r in recs if r["round"] == 2}
    assert set(last) == {"fedgeomed_plus", "fedavg"}
    assert last["fedgeomed_plus"]["view"] == "personal"
    assert last["fedavg"]["view"] == "global"
    assert all(r["weighted"] > 0 for r in last.values())  # test MSE
    assert len(last["fedgeomed_plus"]["offset_norms"]) == 10
    table = _load("fedplus_table2").report(str(out))
    assert "| FedGeoMed+ | personal | 1 |" in table and "1048" in table


def test_fedplus_fig4_smoke(tmp_path):
    out, png = tmp_path / "f.jsonl", tmp_path / "f.png"
    mod = _load("fedplus_fig4")
    recs = mod.main([
        "--datasets", "synthetic", "--methods", "fedprox", "fedavg_plus",
        "--seeds", "0", "1", "--set", "rounds=2", "eval_every=1", "parties=12",
        "local_epochs=0.2", "mu=0.5", "--out", str(out)])
    last = {(r["method"], r["seed"]): r for r in recs if r["round"] == 2}
    assert len(last) == 4 and len(recs) == 12  # rounds 0, 1, 2 of four runs
    assert last[("fedprox", 0)]["view"] == "global"
    assert last[("fedprox", 0)]["mu"] == 0.5  # --set reaches the runs it applies to
    plus = last[("fedavg_plus", 1)]
    assert plus["view"] == "personal" and plus["delta"] == 0.001
    assert plus["trained_parties"] <= 12 and "git_sha" in plus
    assert (plus["alpha"], plus["beta"]) == (1000.0, 10.0)  # the paper's default
    # FedProx's usual Synthetic(1, 1) under the same tag stays apart from it
    mod.main(["--datasets", "synthetic", "--methods", "fedprox", "--seeds", "0",
              "--set", "rounds=2", "eval_every=1", "parties=12",
              "local_epochs=0.2", "alpha=1", "beta=1", "--out", str(out)])
    table = mod.report(str(out))
    assert "| FedAvg+ | personal | 2 |" in table and "best Fed+ (FedAvg+" in table
    paper, usual = table.split("**Synthetic(1, 1) (FedProx's usual), N = 12**")
    assert paper.startswith("**Synthetic(1000, 10) (the paper's), N = 12**")
    assert "| FedProx | global | 2 |" in paper and "| FedProx | global | 1 |" in usual
    assert mod.plot(str(out), str(png)) == [str(png), str(tmp_path / "f.pdf")]
    assert png.stat().st_size > 0


def test_lindt_nfl_smoke(tmp_path):
    out, png = tmp_path / "l.jsonl", tmp_path / "l.png"
    recs = _load("lindt_nfl").main([
        "--data", "synthetic", "--num-clients", "10", "--cohort-size", "3",
        "--rounds", "2", "--eval-every", "2", "--tail", "1", "--hidden", "4",
        "--fb-steps", "2", "--private-rounds", "1", "--private-steps", "2",
        "--methods", "fedavg", "fb", "lindt_detect", "--r-prime", "0",
        "--noise-std", "0", "--eps", "1e-6", "--out", str(out), "--plot", str(png)])
    by = {r["method"]: r for r in recs}
    assert set(by) == {"fedavg", "fb", "lindt_detect"}
    assert by["lindt_detect"]["detect_round"] == 1  # Delta > eps in round 1: count > 0
    series = by["fedavg"]["per_round"]  # the detector's inputs, every round
    assert set(series) == set(_load("lindt_nfl").SERIES)
    assert all(len(v) == 2 for v in series.values())
    for r in recs:  # Local - beta = the benign clients' mean private accuracy
        assert abs(r["local"] - r["beta"] - r["private_acc_benign"]) < 1e-3
        assert 0 < r["round_s_median"] < r["seconds"]
    assert png.stat().st_size > 0 and len(out.read_text().splitlines()) == 3
    table = _load("lindt_nfl").report(str(out))
    assert "| FB | - |" in table and "81.17" in table


def test_lindt_nfl_stop_strategies_and_attackers_that_stop(tmp_path):
    """``--stop`` ends LINDT's dual training (recorded as ``stop_round`` and in
    the report); ``--attacks-until 0`` (attackers honest from round 1, clean
    data) trains the same global model as a federation without attackers."""
    ln = _load("lindt_nfl")
    common = ["--data", "synthetic", "--num-clients", "10", "--rounds", "3",
              "--eval-every", "3", "--tail", "1", "--hidden", "4",
              "--private-rounds", "1", "--private-steps", "2", "--noise-std", "0"]
    out = tmp_path / "s.jsonl"
    never, once, below = (ln.main(common + [
        "--cohort-size", "10", "--methods", "lindt", "--stop", stop, "--eps", "1e6",
        "--stop-streak", "1", "--out", str(out)])[0]
        for stop in ("never", "all_trained_once", "delta_below"))
    # every client trains the dual model in round 1 and Delta < eps there: both
    # rules end dual training at the end of round 1
    assert once["stop_round"] == below["stop_round"] == 1
    assert never["stop_round"] == -1
    table = ln.report(str(out))
    assert "stop delta_below (1 rounds)" in table and "dual stopped at 1" in table
    with pytest.raises(SystemExit):
        ln.main(common + ["--attacks-until", "3"])
    honest, clean = (ln.main(common + ["--cohort-size", "3", "--methods", "fedavg",
                                       *extra])[0]
                     for extra in (["--attacks-until", "0"], ["--attack-ratio", "0"]))
    assert honest["attacks_until"] == 0 and honest["attack_ratio"] > 0
    assert honest["central"] == clean["central"]


def test_lindt_nfl_apfl_alpha(tmp_path):
    """``--apfl-alpha`` / ``--apfl-alpha-mode``: APFL's evaluations record the
    benign clients' mean mixing weight; fixed, it stays at ``--apfl-alpha``,
    adaptive it moves; a weight outside [0, 1] is refused before any work."""
    ln = _load("lindt_nfl")
    common = ["--data", "synthetic", "--num-clients", "10", "--cohort-size", "10",
              "--rounds", "2", "--eval-every", "1", "--tail", "1", "--hidden", "4",
              "--private-rounds", "1", "--private-steps", "2", "--methods", "apfl",
              "--apfl-alpha", "0.5"]
    fixed = ln.main(common + ["--apfl-alpha-mode", "fixed"])[0]
    adaptive = ln.main(common)[0]
    assert fixed["apfl_alpha_mode"] == "fixed" and fixed["apfl_alpha"] == 0.5
    assert [h["apfl/alpha"] for h in fixed["history"]] == [0.5, 0.5]
    moved = [h["apfl/alpha"] for h in adaptive["history"]]
    assert all(0 <= a <= 1 and a != 0.5 for a in moved)
    with pytest.raises(SystemExit):
        ln.main(common[:-1] + ["1.5"])


def test_lindt_nfl_private_cache(tmp_path, monkeypatch):
    """``--private-cache``: a second run with the same settings reads the private
    accuracies back instead of training the private models again; other
    settings get their own file."""
    ln = _load("lindt_nfl")
    cache = tmp_path / "cache"
    args = ["--data", "synthetic", "--num-clients", "6", "--cohort-size", "3",
            "--rounds", "1", "--eval-every", "1", "--tail", "1", "--hidden", "4",
            "--private-rounds", "1", "--private-steps", "2", "--methods", "fedavg",
            "--private-cache", str(cache)]
    first = ln.main(args)[0]
    assert first["private_cache"].startswith(str(cache))
    monkeypatch.setattr(ln.experiments, "private_accuracy",
                        lambda *a, **k: pytest.fail("private models retrained"))
    again = ln.main(args)[0]
    assert again["private_acc_benign"] == first["private_acc_benign"]
    assert again["private_cache"] == first["private_cache"]
    with pytest.raises(pytest.fail.Exception, match="retrained"):
        ln.main(args + ["--private-steps", "3"])


def test_lindt_nfl_checkpoints_resume_exactly(tmp_path, monkeypatch):
    """``--checkpoint-dir``/``--resume``: a run stopped after its round-2
    checkpoint and resumed writes the same records (evaluations, per-round
    detector series, central/local/beta) as one run straight through; a
    checkpoint written with other settings is refused."""
    ln = _load("lindt_nfl")
    common = ["--data", "synthetic", "--num-clients", "10", "--cohort-size", "3",
              "--rounds", "4", "--eval-every", "1", "--tail", "2", "--hidden", "4",
              "--private-rounds", "1", "--private-steps", "2",
              "--methods", "fedavg", "fb", "lindt"]
    straight = ln.main(common)
    ck = ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "2",
          "--resume"]
    save = ln.Progress.save

    def save_then_stop(self, r, *a):
        save(self, r, *a)
        if r == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(ln.Progress, "save", save_then_stop)
    with pytest.raises(KeyboardInterrupt):
        ln.main(common + ck)
    monkeypatch.setattr(ln.Progress, "save", save)
    # fedavg was stopped at round 2; lindt had not started
    assert json.loads((tmp_path / "ck" / "fedavg" / "progress.json").read_text())[
        "round"] == 2
    resumed = ln.main(common + ck)
    assert [r["resumed_from"] for r in resumed] == [2, 2, 0]
    for a, b in zip(straight, resumed):
        assert a["method"] == b["method"]
        for k in ("central", "local", "beta", "beta_all", "history", "per_round",
                  "detect_round", "in_nfl"):
            assert a[k] == b[k], (a["method"], k)
    with pytest.raises(SystemExit, match="lr differ"):
        ln.main(common + ck + ["--lr", "0.01"])
    # a checkpoint written before --apfl-alpha existed ran its default
    for method in ("fedavg", "lindt"):
        prog = tmp_path / "ck" / method / "progress.json"
        saved = json.loads(prog.read_text())
        for k in ("apfl_alpha", "apfl_alpha_mode"):
            del saved["fingerprint"][k]
        prog.write_text(json.dumps(saved))
    assert [r["history"] for r in ln.main(common + ck)] == [
        r["history"] for r in straight]
    with pytest.raises(SystemExit, match="apfl_alpha differ"):
        ln.main(common + ck + ["--apfl-alpha", "0.5"])
    with pytest.raises(SystemExit):
        ln.main(common + ["--checkpoint-dir", str(tmp_path), "--checkpoint-every", "3",
                          "--eval-every", "2"])


@pytest.mark.skipif(not os.environ.get("FEDJAX_PFL_DATA_DIR"),
                    reason="needs FEDJAX_PFL_DATA_DIR (cifar10/)")
def test_lindt_nfl_paper_cnn(tmp_path):
    """``--model cnn``: the paper's CNN on 32x32 CIFAR-10, its noise std (the
    paper's sigma 0.001 on 940,362 parameters) by default."""
    ln = _load("lindt_nfl")
    rec = ln.main(["--model", "cnn", "--num-clients", "10", "--cohort-size", "2",
                   "--rounds", "1", "--eval-every", "1", "--tail", "1", "--epochs",
                   "0", "--steps", "2", "--private-rounds", "1", "--private-steps",
                   "2", "--methods", "lindt", "--out", str(tmp_path / "c.jsonl")])[0]
    assert rec["model"] == "cnn" and rec["params"] == 940_362 and rec["hidden"] is None
    assert abs(rec["noise_std"] - 0.001) < 1e-6
    assert abs(rec["local"] - rec["beta"] - rec["private_acc_benign"]) < 1e-3
    with pytest.raises(SystemExit):
        ln.main(["--model", "cnn", "--data", "synthetic"])


def test_baselines_synthetic_smoke(tmp_path):
    out = tmp_path / "b.jsonl"
    mod = _load("baselines_synthetic")
    recs = mod.main(["--methods", "pfedme", "--num-clients", "5", "--cohort", "2",
                     "--rounds", "2", "--steps", "2", "--batch", "4",
                     "--out", str(out)])
    assert [(r["method"], r["view"]) for r in recs] == [("pfedme", "global"),
                                                        ("pfedme", "personal")]
    for r in recs:
        assert 0 <= r["test_accuracy_worst10"] <= r["test_accuracy_mean"] <= 1
        assert r["test_accuracy_std"] >= 0 and r["seconds"] > 0
    assert len(out.read_text().splitlines()) == 2
    table = mod.report(str(out))
    assert "| pfedme | personal | 5 | 2 | 1 |" in table


def test_ditto_table2_smoke(tmp_path):
    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    out = tmp_path / "t2.jsonl"
    mod = _load("ditto_table2")
    recs = mod.main(["--num-clients", "8", "--cohort-size", "2", "--rounds", "1",
                     "--local-steps", "1", "--finetune-steps", "1", "--attack", "A1",
                     "--methods", "ditto", "--ewc-lams", "10", "--skl-lams", "1",
                     "--out", str(out)])
    rows = [r["row"] for r in recs]
    assert rows == ["global", "Ditto", "plain finetuning", "EWC", "SKL"]
    for r in recs:
        assert 0 <= r["mean"] <= 1 and r["std"] >= 0 and r["attack"] == "A1"
        assert 0 <= r["val_mean"] <= 1  # hyperparameters are chosen on val
    # the trained rows group the benign writers (4 of 8) by their rounds: one
    # round of 2 writers, so 2 took part once and 2 never (or 1 and 3 if an
    # attacker was drawn)
    for r, view in zip(recs[:2], ("global", "personal")):
        groups = r["by_participation"]
        assert sum(g["clients"] for g in groups) == 4
        assert sum(g["clients"] for g in groups if g["min_rounds"] == 0) >= 2
        assert all((g[view] is None) == (g["clients"] == 0) for g in groups)
        took = r["took_part"]
        assert took["writers"] == sum(g["clients"] for g in groups
                                      if g["min_rounds"] > 0)
        if took["writers"]:
            assert 0 <= took["worst10"] <= took["mean"] <= 1 and took["std"] >= 0
        else:  # nobody benign was drawn: no summary, not a number
            assert math.isnan(took["mean"])
    assert len(out.read_text().splitlines()) == 5
    table = mod.report(str(out))
    assert "| EWC |" in table and "0.810 (.11)" in table
    assert "(on test)" not in table
    assert "| A1 50% | Ditto | lam=1 | 0 | 0-0 |" in table


def test_ditto_table2_lambda_grid(tmp_path):
    """Several ``--lam`` values: one Ditto run each (its own checkpoint folder),
    the global and finetuning rows once (from the first), and the report picks
    Ditto's lambda on validation; a repeated value is refused before loading."""
    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    mod = _load("ditto_table2")
    out, ck = tmp_path / "t2.jsonl", tmp_path / "ck"
    argv = ["--num-clients", "8", "--cohort-size", "2", "--rounds", "2",
            "--local-steps", "1", "--finetune-steps", "1", "--methods", "ditto",
            "--ewc-lams", "10", "--skl-lams", "1", "--checkpoint-dir", str(ck),
            "--checkpoint-every", "1", "--out", str(out)]
    recs = mod.main(argv + ["--lam", "0.5", "1"])
    assert [(r["row"], r["config"]) for r in recs] == [
        ("global", None), ("Ditto", "lam=0.5"), ("plain finetuning", "lam=0"),
        ("EWC", "lam=10"), ("SKL", "lam=1"), ("Ditto", "lam=1")]
    assert {r["run"] for r in recs if r["row"] in ("global", "Ditto")} == {"ditto"}
    assert sorted(os.listdir(ck)) == ["ditto", "ditto_lam0.5"]
    single = mod.main(argv + ["--lam", "1", "--out", str(tmp_path / "one.jsonl"),
                              "--checkpoint-dir", str(tmp_path / "ck1")])
    assert (single[1]["row"], single[1]["mean"]) == ("Ditto", recs[-1]["mean"])
    assert mod.main(argv + ["--lam", "0.5", "1", "--resume"]) == []
    # a finished run's checkpoint evaluated again into another file, no finetuning
    again = mod.main(argv + ["--lam", "0.5", "--resume", "--skip-finetune", "--out",
                             str(tmp_path / "again.jsonl")])
    assert [(r["row"], r["mean"]) for r in again] == [
        (r["row"], r["mean"]) for r in recs[:2]]
    best = max((r for r in recs if r["row"] == "Ditto"), key=lambda r: r["val_mean"])
    line = next(x for x in mod.report(str(out)).splitlines() if x.startswith("| Ditto |"))
    assert best["config"] in line, line
    with pytest.raises(SystemExit):
        mod.main(argv + ["--lam", "1", "1"])


def test_ditto_table2_configurations_do_not_share_checkpoints(tmp_path):
    """APFL with its default alpha, then adaptive, in one checkpoint directory:
    the second trains from scratch in its own folder instead of resuming the
    first's final state."""
    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    mod = _load("ditto_table2")
    ck = tmp_path / "ck"
    argv = ["--num-clients", "8", "--cohort-size", "2", "--rounds", "1",
            "--local-steps", "1", "--methods", "apfl", "--checkpoint-dir", str(ck),
            "--checkpoint-every", "1", "--resume", "--out", str(tmp_path / "t.jsonl")]
    first = mod.main(argv)
    second = mod.main(argv + ["--apfl-alpha", "0.01", "--apfl-adaptive"])
    assert sorted(os.listdir(ck)) == ["apfl", "apfl_alpha0=0.01_adaptive"]
    assert [r["config"] for r in first + second] == ["alpha=0.5 fixed",
                                                     "alpha0=0.01 adaptive"]
    assert not second[0]["resumed"]


def test_ditto_table2_finetuning_methods_skip_checkpoint_evaluations(tmp_path):
    """Per-FedAvg finetunes every writer to evaluate: its checkpoints record
    the training metrics only, and its row still carries validation and test."""
    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    mod = _load("ditto_table2")
    ck = tmp_path / "ck"
    recs = mod.main(["--num-clients", "8", "--cohort-size", "2", "--rounds", "2",
                     "--local-steps", "1", "--finetune-steps", "1", "--methods",
                     "per_fedavg", "--checkpoint-dir", str(ck), "--checkpoint-every",
                     "1", "--out", str(tmp_path / "t.jsonl")])
    rows = [json.loads(line) for line in
            (ck / "per_fedavg" / "history.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1, 2]
    assert not any("/val/" in k for r in rows for k in r)
    assert "train/loss" in rows[-1]
    assert 0 <= recs[0]["val_mean"] <= 1 and 0 <= recs[0]["mean"] <= 1


def test_ditto_table2_mapper_records_the_models_it_starts_from(tmp_path):
    """mapper's row (the finetuned interpolation) comes with two diagnostic
    rows, its global model and the interpolation before finetuning, listed
    under every configuration run but not in the main table."""
    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    mod = _load("ditto_table2")
    out = tmp_path / "m.jsonl"
    recs = mod.main(["--num-clients", "8", "--cohort-size", "2", "--rounds", "2",
                     "--local-steps", "1", "--finetune-steps", "1", "--methods",
                     "mapper", "--out", str(out)])
    assert [r["row"] for r in recs] == ["mapper", "mapper: its global model",
                                        "mapper: the interpolation, not finetuned"]
    assert len({r["mean"] for r in recs}) > 1  # three different models
    table = mod.report(str(out))
    main_table = table.split("Every configuration run")[0]
    assert "| mapper | " in main_table and "its global model" not in main_table
    assert "| clean | mapper: its global model | - | 1 |" in table


def test_ditto_table2_resume_skips_recorded_rows(tmp_path):
    """A Ditto run stopped after its first rows resumes from its final
    checkpoint and writes only the missing finetuning rows, with the numbers an
    uninterrupted run gives; a run whose rows are all recorded trains nothing."""
    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    mod = _load("ditto_table2")
    out = tmp_path / "t2.jsonl"
    argv = ["--num-clients", "8", "--cohort-size", "2", "--rounds", "2",
            "--local-steps", "1", "--finetune-epochs", "0.5", "--methods", "ditto",
            "--ewc-lams", "10", "--skl-lams", "1", "--checkpoint-dir",
            str(tmp_path / "ck"), "--checkpoint-every", "1", "--out", str(out)]
    full = mod.main(argv)
    assert [r["config"] for r in full[2:]] == [
        "lam=0, 0.5 epochs", "lam=10, 0.5 epochs", "lam=1, 0.5 epochs"]
    out.write_text("".join(out.read_text().splitlines(True)[:2]))
    again = mod.main(argv + ["--resume"])
    assert [(r["row"], r["config"]) for r in again] == [
        (r["row"], r["config"]) for r in full[2:]]
    for a, b in zip(again, full[2:]):
        assert (a["mean"], a["std"], a["val_mean"]) == (b["mean"], b["std"],
                                                       b["val_mean"])
        assert a["resumed"] and not b["resumed"]
    assert mod.main(argv + ["--resume"]) == []
    assert len(out.read_text().splitlines()) == 5
    # a row recorded twice (e.g. by a second finetuning-length run) is one seed
    out.write_text(out.read_text() + out.read_text().splitlines(True)[0])
    line = next(x for x in mod.report(str(out)).splitlines()
                if x.startswith("| global |"))
    assert line.endswith("| 1 /  |"), line


def test_fedfdp_tables_smoke(tmp_path):
    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    out = tmp_path / "f.jsonl"
    recs = _load("fedfdp_tables").main([
        "--clients", "3", "--max-examples", "600", "--rounds", "2", "--eval-every", "2",
        "--methods", "dp_fedavg", "fedfdp", "--out", str(out)])
    by = {r["method"]: r for r in recs}
    # the same epsilon budget: DP-FedAvg (no loss releases) gets more rounds
    assert by["fedfdp"]["round"] == 2 and by["dp_fedavg"]["round"] >= 2
    assert by["dp_fedavg"]["epsilon"] <= by["fedfdp"]["target_epsilon"] + 1e-9
    assert "| mnist | fedfdp [3 clients] | 2 |" in _load("fedfdp_tables").report(str(out))
    # FedFDP's fairness weights (round, F_hat, min, mean, max); none for DP-FedAvg
    [(rnd, fhat, lo, mean, hi)] = by["fedfdp"]["fair_weights"]
    assert rnd == 2 and fhat > 0 and lo <= mean <= hi
    assert "fair_weights" not in by["dp_fedavg"]
    # the global model's size, from its evaluation view
    assert all(np.isfinite(r["global/param_norm"]) and r["global/param_norm"] > 1
               for r in recs)
    # a validation split (from the training rows) is evaluated beside test
    [val] = _load("fedfdp_tables").main([
        "--clients", "3", "--max-examples", "600", "--rounds", "2", "--eval-every", "1",
        "--methods", "fedavg", "--val-fraction", "0.2", "--out", str(out)])
    assert val["val_fraction"] == 0.2 and 0 <= val["global/val/accuracy/mean"] <= 1
    # a non-private run spends no budget: neither epsilon nor a target
    assert val["epsilon"] is None and val["target_epsilon"] is None
    assert val["strategy"] == "auto" and val["batch_ladder"] == "auto"
    # every evaluation's (round, test accuracy, Psi), the last one the record's
    assert [c[0] for c in val["curve"]] == [0, 1, 2]  # round 0: the initial model
    assert val["curve"][-1][1:] == [val["global/test/accuracy/mean"],
                                    val["global/test/loss/psi"]]


def test_fedfdp_tables_ali_dpfl_smoke(tmp_path):
    """ALI-DPFL runs its R_s rounds within the budget and records R_c and its
    (round, steps a round, steps spent, mu, Gamma) curve."""
    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    out = tmp_path / "a.jsonl"
    [rec] = _load("fedfdp_tables").main([
        "--model", "mlp", "--clients", "3", "--max-examples", "600", "--rounds", "2",
        "--eval-every", "1", "--methods", "ali_dpfl", "--ali-rounds", "3",
        "--target-epsilon", "0.5", "--out", str(out)])
    assert rec["round"] == 3 and rec["ali_rounds"] == 3 and rec["ali_max_steps"] >= 1
    assert rec["epsilon"] <= rec["target_epsilon"] and rec["not_accounted"] is None
    assert [c[0] for c in rec["ali_curve"]] == [1, 2, 3]
    assert rec["ali_curve"][-1][2] <= rec["ali_max_steps"]
    assert "| mnist | ali_dpfl [MLP] [3 clients] | 3 |" in _load(
        "fedfdp_tables").report(str(out))


def test_batch_ladder_smoke(tmp_path):
    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    out = tmp_path / "b.jsonl"
    recs = _load("batch_ladder").main([
        "--model", "mlp", "--max-examples", "8000", "--methods", "dp_fedavg",
        "--repeats", "1", "--out", str(out)])
    on, off = (next(r for r in recs if r["batch_ladder"] is b) for b in (True, False))
    assert off["rows_per_round"] == 10 * off["cap"] > on["rows_per_round"]
    assert on["sampled_rows"] < on["rows_per_round"]
    assert on["max_abs_diff"] < 1e-5 and on["round_s"] > 0
    assert "| mnist | mlp | dp_fedavg | unroll | on |" in _load("batch_ladder").report(str(out))


def test_xla_cpu_flags_smoke(tmp_path):
    """Both settings run in fresh processes and say which they ran with."""
    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    out = tmp_path / "x.jsonl"
    mod = _load("xla_cpu_flags")
    recs = mod.main([
        "--benchmarks", "privacy", "fedfdp", "--privacy-models", "tiny_mlp",
        "--batch", "8", "--repeats", "1", "--fedfdp-data", "mnist",
        "--fedfdp-rounds", "1", "--fedfdp-extra",
        "--clients 3 --max-examples 600 --model mlp",
        "--ynn", "no_conv=-individual_convolution",
        "--env", "off=FEDJAX_PFL_XLA_CPU_DEFAULTS=0,MALLOC_ARENA_MAX=1",
        "--out", str(out)])
    flags = {r["setting"]: (r["xla_flags"], r["xla_cpu_setting"]) for r in recs}
    assert flags["xla"][1] == "disabled" and "ynn" not in flags["xla"][0]
    assert flags["package"][1] in ("applied", "jaxlib")
    assert flags["no_conv"][0].endswith(  # after the caller's (conftest's) flags
        "--xla_cpu_experimental_ynn_fusion_type=-individual_convolution")
    assert flags["no_conv"][1] == "disabled"
    assert flags["off"][1] == "disabled"  # --env's variables reach the children
    assert {r["setting"]: r["env"] for r in recs if "user_s" in r}["off"] == {
        "FEDJAX_PFL_XLA_CPU_DEFAULTS": "0", "MALLOC_ARENA_MAX": "1"}
    [fed] = [r for r in recs if r["bench"] == "fedfdp" and r["setting"] == "package"
             and "round_s" in r]  # the per-round time; the other: CPU times
    assert fed["rounds"][1] > fed["rounds"][0] and math.isfinite(fed["round_s"])
    assert len({r["run"] for r in recs}) == 1  # one invocation
    table = mod.report([str(out)])
    assert table.startswith("Run 1: git ") and "Run 2" not in table
    assert "| fedfdp | mlp_mnist | 3 | dp_fedavg:unroll |" in table
    assert table.count("| tiny_mlp |") == 2  # plain and ghost, all settings
    assert "| package s (speedup) | no_conv s (speedup) | off s (speedup) |" in table
    with pytest.raises(SystemExit, match="--ynn: expected NAME=VALUE"):
        mod.main(["--ynn", "package=", "--out", str(out)])
    with pytest.raises(SystemExit, match="--env: expected NAME=VAR=VALUE"):
        mod.main(["--env", "m=MALLOC_ARENA_MAX", "--out", str(out)])


def test_conv_loop_smoke(tmp_path):
    out = tmp_path / "c.jsonl"
    mod = _load("conv_loop")
    recs = mod.main(["--clients", "2", "--batch", "2", "--repeats", "1",
                     "--out", str(out)])
    assert [r["conv"] for r in recs] == ["lax", "fedjax_pfl"]
    assert all(r["max_abs_diff"] < 1e-5 and r["map_s"] > 0 for r in recs)
    assert recs[0]["max_abs_diff_lax_vs_ours"] < 1e-5  # same gradients
    assert mod.report([str(out)]).count("| 2 x 2 |") == 2


def test_fedfdp_sweeps_smoke(tmp_path):
    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    out = tmp_path / "s.jsonl"
    mod = _load("fedfdp_sweeps")
    recs = mod.main(["--sweep", "clip", "--values", "0.1", "1", "--rounds", "3",
                     "--eval-every", "3", "--max-examples", "1000", "--out", str(out)])
    assert [r["clip"] for r in recs] == [0.1, 1.0] and recs[0]["lam"] == 0.1
    assert recs[0]["epsilon"] == recs[1]["epsilon"] > 0  # same noise, same budget
    assert recs[0]["accuracy"] != recs[1]["accuracy"]  # the swept value is used
    assert mod.report([str(out)]).count("| mlp | 3 |") == 2
    with pytest.raises(SystemExit):
        mod.main(["--sweep", "clip", "--values", "0"])  # C must be positive


def test_w1_pytorch_smoke(tmp_path):
    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    impls = ["fedjax"] + (["torch"] if importlib.util.find_spec("torch") else [])
    out = tmp_path / "w1.jsonl"
    mod = _load("w1_pytorch")
    recs = mod.main(["--clients", "2", "--rounds", "1", "--impl", *impls,
                     "--out", str(out)])
    assert [r["impl"] for r in recs] == impls
    for r in recs:
        assert r["clients"] == 2 and r["rounds"] == 1 and r["git_sha"] and r["cores"]
        for k in ("round_s", "round_eval_s", "eval_s", "global_acc", "personal_acc"):
            assert np.isfinite(r[k]) and r[k] >= 0, k
    assert recs[0]["compile_s"] > 0
    assert len(out.read_text().splitlines()) == len(impls)
    assert mod.report(str(out)).count("| 2 | 1 |") == len(impls)


def test_w1_pytorch_same_numbers():
    """With the same w^0 and the same batches (one-batch clients and a client
    of identical rows, so the shuffle cannot matter), two Ditto rounds of the
    PyTorch side and of fedjax_pfl give the same global and personal models."""
    import argparse

    import jax

    pytest.importorskip("torch")
    mod = _load("w1_pytorch")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(11, 28, 28, 1)).astype(np.float32)
    y = rng.integers(0, 10, 11)
    train = [(x[:10], y[:10]), (np.repeat(x[10:], 20, 0), np.repeat(y[10:], 20))]
    args = argparse.Namespace(lr=0.05, lam=1.0, batch_size=10, seed=0, devices=1)
    fed, alg, _, state, key = mod.fedjax_setup(train, train, args)
    w0 = jax.tree.map(np.array, state.server.params)
    tdit = mod.TorchDitto(train, train, w0, lr=0.05, lam=1.0, batch_size=10, seed=0)
    assert jax.tree.all(jax.tree.map(np.array_equal, mod.params_from_torch(tdit.glob),
                                     w0))  # the layout round trip is exact
    step = jax.jit(alg.round_step)
    for _ in range(2):  # round 2: v_k != w^t, the proximal term is exercised
        state = step(state, fed, jax.random.split(key)[1])[0]
        tdit.round()
    pairs = [(state.server.params, mod.params_from_torch(tdit.glob))] + [
        (jax.tree.map(lambda a, k=k: a[k], state.clients.personal),
         mod.params_from_torch(tdit.personal[k])) for k in range(2)]
    for ours, theirs in pairs:
        diff = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - b))),
                            ours, theirs)
        assert max(jax.tree.leaves(diff)) < 1e-5, diff
    moved = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - b))),
                         state.server.params, w0)
    assert max(jax.tree.leaves(moved)) > 1e-3  # the check is not vacuous


def test_ditto_scale_smoke(tmp_path):
    """Every phase of the scale benchmark on a synthetic 6-client setting (in
    process, no data needed): the streamed checkpoint restores the state, the
    personal models stay in place across rounds, old and new evaluations agree."""
    out = tmp_path / "s.jsonl"
    recs = _load("ditto_scale").main([
        "--synthetic", "--num-clients", "6", "--model", "logreg", "--rounds", "2",
        "--evals", "1", "--sim-rounds", "2", "--eval-every", "1",
        "--before-clients", "4", "--in-process", "--tmp", str(tmp_path),
        "--out", str(out)])
    by = {(r["phase"], r["variant"]): r for r in recs}
    assert by[("round", "after")]["personal_in_place"]
    assert by[("checkpoint", "after")]["restored_sums_equal"]
    ev = by[("eval", "after")], by[("eval", "before")]
    assert ev[0]["personal_test_accuracy"] == pytest.approx(
        ev[1]["personal_test_accuracy"], abs=1e-6)
    assert ev[0]["gflop_needed"] > 0 and ev[0]["flops_per_example"] > 0
    assert by[("simulate", "checkpoint")]["checkpoint_save_s"]
    assert "skipped" in by[("simulate", "preset")]  # needs Fashion-MNIST
    assert all(r["config"]["seed"] == 0 and r["git_sha"] for r in recs)
    table = _load("ditto_scale").report(str(out))
    assert "| round | after |" in table and "Per round at eval_every=50" in table


def test_cnn_step_smoke(tmp_path):
    out = tmp_path / "c.jsonl"
    recs = _load("cnn_step").main(["--variants", "per_core", "--steps", "2",
                                   "--repeats", "1", "--out", str(out)])
    assert [r["variant"] for r in recs] == ["per_core"]
    assert recs[0]["ms_per_step"] > 0
    assert recs[0]["models_in_parallel"] == recs[0]["cores"]
    assert "per_core" in _load("cnn_step").report(str(out))


def test_privacy_audit_smoke(tmp_path):
    """Every audit and mechanism of the audit benchmark at 200 runs per world
    (too few to catch a broken mechanism: the benchmark's own size does)."""
    out = tmp_path / "a.jsonl"
    mod = _load("privacy_audit")
    recs = mod.main(["--smoke", "--out", str(out)])
    assert len(recs) == 6 and len(out.read_text().splitlines()) == 6
    assert {r["mechanism"] for r in recs} == {"honest", "noise_off", "clip_off"}
    for r in recs:
        assert 0.0 <= r["audit_result"]["epsilon"] <= r["max_epsilon"] + 1e-9
        assert r["accountant_epsilon"] > 0
    assert "honest" in mod.report(str(out))


def test_ditto_vehicle_smoke(tmp_path):
    if not os.environ.get("FEDJAX_PFL_DATA_DIR"):
        pytest.skip("FEDJAX_PFL_DATA_DIR is not set")
    out = tmp_path / "v.jsonl"
    mod = _load("ditto_vehicle")
    recs = mod.main(["--rows", "global", "Ditto, lam=1", "k-loss", "Ditto + Krum, lam=1",
                     "--columns", "clean", "A3 50%", "--rounds", "2", "--out", str(out)])
    assert len(recs) == 8 and len(out.read_text().splitlines()) == 8
    for r in recs:
        assert r["round"] == 2 and 0.0 <= r["accuracy_mean"] <= 1.0
        assert r["config"]["seed"] == 0 and r["git_sha"]
    combined = [r for r in recs if r["row"] == "Ditto + Krum, lam=1"]
    assert {(r["config"]["method"], r["config"]["aggregator"], r["config"]["lam"])
            for r in combined} == {("ditto", "krum", 1.0)}
    table = mod.report(str(out))
    assert "| Ditto, lam=1 |" in table and "| Ditto + Krum, lam=1 | " in table


def test_preset_cost_smoke(tmp_path, capsys):
    mod = _load("preset_cost")
    out = tmp_path / "c.jsonl"
    tiny = ["clients=12", "max_size=60", "rounds=2", "eval_every=2",
            "local_steps=2", "batch_size=5", "cohort_size=4"]
    mod.main(["--presets", "ditto-synthetic", *[f"--set={s}" for s in tiny],
              "--out", str(out)])
    rec = json.loads(out.read_text())
    assert rec["returncode"] == 0, rec["stderr_tail"]
    assert rec["seconds"] > 0 and 0.05 < rec["peak_rss_gib"] < 24
    assert rec["git_sha"] and rec["cpu_count"] == os.cpu_count()
    # smoke records (with --set) never reach the package's costs
    pkg = tmp_path / "costs.json"
    mod.main(["--write-package", str(out), "--package-file", str(pkg)])
    assert json.loads(pkg.read_text()) == {}
    rec["sets"] = []
    out.write_text(json.dumps(rec) + "\n")
    mod.main(["--write-package", str(out), "--package-file", str(pkg)])
    line = json.loads(pkg.read_text())["ditto-synthetic"]
    assert f"on {os.cpu_count()} CPU cores" in line and "GiB" in line


def test_lindt_fb_cost_smoke(tmp_path):
    out = tmp_path / "fb.jsonl"
    mod = _load("lindt_fb_cost")
    recs = mod.main(["--clients", "2", "--rows", "12", "--steps", "3", "6",
                     "--out", str(out)])
    assert [(r["steps"], r["path"]) for r in recs] == [
        (3, "cached"), (3, "whole"), (6, "cached")]
    assert recs[1]["max_abs_diff"] < 1e-5 and all(r["seconds"] > 0 for r in recs)
    assert "| 2 x 12 | 1 | 3 | whole |" in mod.report(str(out))
    # the whole model finetuned: nothing to cache, one path
    recs = mod.main(["--clients", "2", "--rows", "12", "--steps", "3", "6", "--layers",
                     "5", "--out", str(out)])
    assert [(r["layers"], r["steps"], r["path"]) for r in recs] == [
        (5, 3, "whole"), (5, 6, "whole")]
    assert "| 2 x 12 | 5 | 3 | whole | " in mod.report(str(out))
    with pytest.raises(SystemExit):
        mod.main(["--layers", "6", "--out", str(out)])
