"""benchmarks/fedfdp_tables.report: one line per record, FedFDP's variants
named beside the method, and the settings run with several seeds summarised
as mean +- std over the seeds; each run's checkpoint folder names its settings."""

import json

import pytest
from helpers import load_benchmark

ft = load_benchmark("fedfdp_tables")


def _rec(seed, acc, psi, **kw):
    return {"dataset": "mnist", "method": "fedfdp", "seed": seed, "round": 688,
            "normalize": "expected", "epsilon": 3.517, "wall_s": 80.0,
            "global/test/accuracy/mean": acc, "global/test/loss/psi": psi, **kw}


def test_report_summarises_seeds_and_names_variants(tmp_path):
    path = tmp_path / "r.jsonl"
    recs = [_rec(1, 0.80, 0.05, partition_seed=1), _rec(2, 0.84, 0.07, partition_seed=1),
            _rec(1, 0.90, 0.01, model="mlp", loss_clip_floor=1.0),
            _rec(1, 0.91, 0.01, model="mlp", loss_clip_floor=1.0, lam=10.0),
            _rec(1, 0.92, 0.01, model="mlp", loss_clip_floor=1.0, lam=10.0, clip=1.0),
            _rec(1, 0.70, 0.2, model="mlp", alpha=0.05, clients=10),
            _rec(1, 0.60, 0.3, alpha=0.1, clients=20)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    lines = ft.report(str(path)).splitlines()
    assert sum(x.startswith("| mnist | fedfdp | 688 | expected | 3.517 |")
               for x in lines) == 2
    assert any(x.startswith("| mnist | fedfdp [MLP] [loss-bound floor 1] | 688 | "
                            "expected | 3.517 | 90.00 |") for x in lines)
    assert any(x.startswith("| mnist | fedfdp [MLP] [lam 10] [loss-bound floor 1] "
                            "| 688 | expected | 3.517 | 91.00 |") for x in lines)
    assert any(x.startswith("| mnist | fedfdp [MLP] [lam 10] [C 1] [loss-bound floor 1]"
                            " | 688 | expected | 3.517 | 92.00 |") for x in lines)
    # two seeds of the paper's setting: 82.00 +- 2.83 (ddof 1); the MLP run alone
    assert "| mnist | fedfdp | 688 | expected | 1/1, 2/1 | 82.00 +- 2.83 | " \
           "0.06 +- 0.014 | 95.13 |" in lines
    assert not any("[MLP]" in x and "+-" in x for x in lines)
    # Tables 4-5's partitions: another alpha, another client count
    assert any(x.startswith("| mnist | fedfdp [MLP] [alpha 0.05] | 688 |") for x in lines)
    assert any(x.startswith("| mnist | fedfdp [20 clients] | 688 |") for x in lines)


def test_report_has_no_seed_table_for_single_runs(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_rec(1, 0.8, 0.05)) + "\n")
    assert "several seeds" not in ft.report(str(path))


def test_report_lists_the_curve_of_each_record_that_has_one(tmp_path):
    path = tmp_path / "r.jsonl"
    recs = [_rec(1, 0.95, 0.01, method="fedavg", round=200,
                 curve=[[0, 0.1, 0.2], [100, 0.9, 0.02], [200, 0.95, 0.01]]),
            _rec(2, 0.8, 0.05)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    lines = ft.report(str(path)).splitlines()
    assert "| mnist | fedavg | 1 | 0: 10.00, 100: 90.00, 200: 95.00 |" in lines
    assert not any(x.startswith("| mnist | fedfdp | 2 |") for x in lines)  # no curve
    path.write_text(json.dumps(recs[1]) + "\n")
    assert "every evaluation" not in ft.report(str(path))


def test_report_lists_the_fairness_weights_of_each_record_that_has_them(tmp_path):
    path = tmp_path / "r.jsonl"
    recs = [_rec(1, 0.95, 0.01, method="fedfair", round=200,
                 fair_weights=[[100, 0.3, 0.99, 1.0, 1.02],
                               [200, 0.1, 0.998, 0.999, 1.0004]]),
            _rec(2, 0.8, 0.05)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    lines = ft.report(str(path)).splitlines()
    assert ("| mnist | fedfair | 1 | 100: 0.9900 / 1.0000 / 1.0200, "
            "200: 0.9980 / 0.9990 / 1.0004 |") in lines
    assert not any(x.startswith("| mnist | fedfdp | 2 |") for x in lines)
    path.write_text(json.dumps(recs[1]) + "\n")
    assert "Fairness weights" not in ft.report(str(path))


def test_checkpoint_folder_names_every_setting_but_the_rounds():
    """Runs that differ in the model, lambda or the loss-clip floor get different
    checkpoint folders; more rounds (a resumed, longer run) keep the folder."""
    import argparse

    base = {"model": "cnn", "lam": 10.0, "loss_clip_floor": 1.0, "seed": 1,
            "alpha": 0.1, "rounds": 100, "target_epsilon": 3.52, "eval_every": 50,
            "out": None}
    tag = ft.run_tag(argparse.Namespace(**base))
    assert tag.startswith("cnn-")
    for change in ({"model": "mlp"}, {"lam": 0.1}, {"loss_clip_floor": None},
                   {"alpha": 0.05}):
        assert ft.run_tag(argparse.Namespace(**{**base, **change})) != tag, change
    for same in ({"rounds": 900, "target_epsilon": None}, {"eval_every": 100}):
        assert ft.run_tag(argparse.Namespace(**{**base, **same})) == tag, same


def test_report_names_a_nonprivate_lr_and_marks_a_diverged_run(tmp_path):
    """A non-private row at another lr than 0.1 says so, and a run whose test
    loss is not finite is marked as diverged instead of showing a bare 9.92 %."""
    path = tmp_path / "r.jsonl"
    base = {"dataset": "fmnist", "method": "fedavg", "seed": 1, "round": 1000,
            "wall_s": 78.0, "global/test/loss/psi": float("nan")}
    recs = [{**base, "lr": 1.0, "global/test/accuracy/mean": 0.0992,
             "global/test/loss/mean": float("nan")},
            {**base, "lr": 0.1, "global/test/accuracy/mean": 0.87,
             "global/test/loss/mean": 0.4, "global/test/loss/psi": 0.3}]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    lines = ft.report(str(path)).splitlines()
    assert any(x.startswith("| fmnist | fedavg [lr 1] | 1000 | - | - | 9.92 "
                            "(diverged: test loss not finite) |") for x in lines)
    assert any(x.startswith("| fmnist | fedavg | 1000 | - | - | 87.00 |") for x in lines)


def test_report_names_a_baselines_own_hyperparameter(tmp_path):
    """A FedDyn row at another alpha than FEDFDP_BASELINES' (1) says so; a
    record made before the option ran at 0.01 and says so too; the option
    never labels another method's row."""
    path = tmp_path / "r.jsonl"
    base = {"dataset": "mnist", "method": "feddyn", "seed": 1, "round": 782,
            "wall_s": 60.0, "lr": 0.1, "global/test/accuracy/mean": 0.9,
            "global/test/loss/psi": 0.01}
    recs = [base, {**base, "feddyn_alpha": 1.0, "global/test/accuracy/mean": 0.95},
            {**base, "feddyn_alpha": 0.1, "global/test/accuracy/mean": 0.75},
            {**base, "method": "dp_feddyn", "clip": 0.1, "feddyn_alpha": 1.0},
            {**base, "method": "fedavg", "global/test/accuracy/mean": 0.94},
            {**base, "method": "dp_fedavg", "clip": 0.1, "server_momentum": 0.9},
            {**base, "method": "fedfdp", "clip": 0.1, "server_momentum": 0.9}]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    lines = ft.report(str(path)).splitlines()
    for start in ("| mnist | feddyn [feddyn alpha 0.01] | 782 | - | - | 90.00 |",
                  "| mnist | feddyn | 782 | - | - | 95.00 |",
                  "| mnist | feddyn [feddyn alpha 0.1] | 782 | - | - | 75.00 |",
                  "| mnist | dp_feddyn | 782 |", "| mnist | fedavg | 782 | - | - | 94.00 |",
                  "| mnist | dp_fedavg [server momentum 0.9] | 782 |",
                  "| mnist | fedfdp [server momentum 0.9] | 782 |"):
        assert any(x.startswith(start) for x in lines), start


def test_bad_baseline_hyperparameters_are_refused_by_name(capsys):
    for bad, name in ((["--feddyn-alpha", "0"], "--feddyn-alpha"),
                      (["--fedprox-mu", "-1"], "--fedprox-mu"),
                      (["--qffl-q", "nan"], "--qffl-q"),
                      (["--server-momentum", "1"], "--server-momentum"),
                      (["--val-fraction", "1"], "--val-fraction")):
        with pytest.raises(SystemExit):
            ft.main(["--datasets", "mnist", *bad])
        assert name in capsys.readouterr().err


def test_report_chooses_each_seeds_hyperparameter_on_validation(tmp_path):
    """With --val-fraction, each seed's alpha is the one of the highest
    validation accuracy; the test accuracy reported is that run's, beside the
    grid's best test accuracy; runs without a validation split stay out."""
    path = tmp_path / "r.jsonl"
    base = {"dataset": "mnist", "method": "dp_feddyn", "round": 782, "wall_s": 60.0,
            "clip": 0.1, "model": "mlp", "val_fraction": 0.1,
            "global/test/loss/psi": 0.05}

    def rec(seed, alpha, val, test):
        return {**base, "seed": seed, "feddyn_alpha": alpha,
                "global/val/accuracy/mean": val, "global/test/accuracy/mean": test}
    recs = [rec(1, 0.1, 0.90, 0.88), rec(1, 1.0, 0.85, 0.91),  # val picks 0.1
            rec(2, 0.1, 0.80, 0.80), rec(2, 1.0, 0.86, 0.84),  # val picks 1
            {**rec(3, 0.1, 0.99, 0.99), "val_fraction": 0.0}]  # no validation
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    lines = ft.report(str(path)).splitlines()
    chosen = lines[next(i for i, x in enumerate(lines) if "chosen on validation" in x):]
    [row] = [x for x in chosen if x.startswith("| mnist | dp_feddyn [MLP] [val 0.1] | 782")]
    assert "| feddyn alpha 0.1; feddyn alpha 1 |" in row
    assert "| 1: feddyn alpha 0.1; 2: feddyn alpha 1 |" in row
    # chosen: 88 and 84 -> 86.00 +- 2.83; best on test: 91 and 84 -> 87.50 +- 4.95
    assert row.endswith("| 86.00 +- 2.83 | 0.05 +- 0 | 87.50 +- 4.95 |"), row
