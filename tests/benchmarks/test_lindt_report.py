"""benchmarks/lindt_nfl.py's report: one table per setting with the paper's
column of the matching data and environment, seeds summarised as mean +- std;
and LINDT's Shakespeare data as the benchmark builds it (real data only)."""

import functools
import json
import os

import numpy as np
import pytest
from helpers import load_benchmark

ln = load_benchmark("lindt_nfl")


def _rec(seed, method, beta, **kw):
    r = {"data": "cifar10", "scheme": "mixed", "num_clients": 100, "cohort_size": 10,
         "attack_ratio": 0.2, "hidden": [128, 64], "params": 107338, "rounds": 200,
         "lr": 0.05, "lr_decay": 0.995, "clip": 15.0, "noise_std": 0.0089,
         "eps": 0.1, "r_prime": 100, "tail": 3, "seed": seed, "method": method,
         "central": 40.0 + seed, "local": 45.0 + beta, "beta": beta,
         "beta_all": beta, "in_nfl": beta < 0, "detect_round": 101}
    r.update(kw)
    return r


def test_report_groups_settings_and_seeds(tmp_path):
    path = tmp_path / "r.jsonl"
    recs = [_rec(0, "fedavg", -3.0),  # an old record: no epochs / steps keys
            _rec(1, "fedavg", 1.0, epochs=1.0, steps=50, batch_size=10),
            _rec(0, "lindt", 4.0, epochs=1.0),
            _rec(0, "fedavg", 6.0, data="shakespeare", scheme="by_role",
                 attack_ratio=0.0, lstm_hidden=64, hidden=None)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    blocks = ln.report(str(path)).split("\n\n")
    assert len(blocks) == 4  # a heading and a table per setting
    assert blocks[0].startswith("**cifar10, nfl**")
    cifar = blocks[1].splitlines()
    # the old record and the new one are the same setting: two seeds
    assert cifar[2].startswith("| FedAvg (2 seeds) | 40.50 +- 0.71 | 44.00 +- 2.83 | "
                               "-1.00 +- 2.83 |")
    assert "| 1/2 | 101 | 55.63 | 56.19 | -17.83 |" in cifar[2]
    assert cifar[3].startswith("| LINDT | 40.00 | 49.00 | +4.00 |")
    assert blocks[2].startswith("**shakespeare, normal** (by_role, attackers 0, "
                                "LSTM 2x64, 200 rounds, lr 0.05 x 0.995 a round, "
                                "noise std 0.0089, FB 100 steps at lr 0.01, local "
                                "models random)")
    shake = blocks[3].splitlines()[2]
    assert shake.endswith("| 52.93 | 53.42 | +6.16 |")  # the paper's SHAKE/Normal
    # one setting alone prints no heading (the tables in docs/results/lindt.md)
    path.write_text(json.dumps(recs[2]) + "\n")
    assert ln.report(str(path)).startswith("| method | central |")


@pytest.mark.skipif(not os.environ.get("FEDJAX_PFL_DATA_DIR"),
                    reason="needs FEDJAX_PFL_DATA_DIR (tinyshakespeare/)")
def test_shakespeare_data():
    from fedjax_pfl.experiments import _presets_lindt as lindt

    fd, mal, seq = lindt.lindt_data("shakespeare", None, 0.16, 0, "by_role",
                                    test_cap=7)
    assert seq == 80 and fd.num_clients == mal.size == 34  # roles >= 10,000 windows
    assert int(mal.sum()) == 5  # int(0.16 * 34)
    points = np.asarray(fd.train.counts)
    assert points.min() >= 0.9 * lindt.SHAKE_MIN_POINTS - 80
    assert np.all(np.asarray(fd.test.counts) == 7)
    for c in range(fd.num_clients):
        y = fd.train.client(c)[1]
        assert np.all(y == 0) == bool(mal[c])  # attackers: every label is '\n'
    sub, _, _ = lindt.lindt_data("shakespeare", 5, 0.0, 3, "by_role")
    again, _, _ = lindt.lindt_data("shakespeare", 5, 0.0, 3, "by_role")
    assert sub.client_ids == again.client_ids and set(sub.client_ids) < set(
        fd.client_ids)
    with pytest.raises(ValueError, match="num_clients"):
        lindt.lindt_data("shakespeare", 35, 0.0, 0, "by_role")
    with pytest.raises(ValueError, match="scheme"):
        lindt.lindt_data("shakespeare", None, 0.0, 0, "mixed")


def test_shakespeare_test_cap_is_checked_before_loading(monkeypatch):
    """A bad ``test_cap`` is refused before the corpus is read."""
    from fedjax_pfl import data
    from fedjax_pfl.experiments import _presets_lindt as lindt

    def no_load(**kw):
        raise AssertionError("the corpus was loaded")

    monkeypatch.setattr(data, "load_shakespeare", no_load)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="test_cap"):
            lindt.shakespeare_data(None, 0.16, 0, test_cap=bad)


def test_report_names_the_cnn():
    rec = _rec(0, "fedavg", -3.0, model="cnn", hidden=None, params=940362)
    assert ln.model_name(rec) == "CNN 32x32"
    assert ln.model_name(_rec(0, "fedavg", -3.0)) == "MLP [128, 64]"  # no model key


@pytest.mark.skipif(not os.environ.get("FEDJAX_PFL_DATA_DIR"),
                    reason="needs FEDJAX_PFL_DATA_DIR (cifar10/)")
def test_cifar_image_sizes(monkeypatch):
    """32x32 keeps the paper's images; 16x16 is their 2x2 means. Both are
    standardized per input, on the same clients and backdoor."""
    from fedjax_pfl import data
    from fedjax_pfl.experiments import _presets_lindt as lindt

    # both sizes from one read of the files (decompressing them is most of a load)
    monkeypatch.setattr(data, "load_cifar10",
                        functools.lru_cache(maxsize=1)(data.load_cifar10))
    small, mal16, d16 = lindt.lindt_data("cifar10", 10, 0.2, 0)
    full, mal32, d32 = lindt.lindt_data("cifar10", 10, 0.2, 0, image_size=32)
    assert (d16, d32) == (16 * 16 * 3, 32 * 32 * 3)
    assert np.array_equal(mal16, mal32)
    assert np.array_equal(np.asarray(small.train.counts), np.asarray(full.train.counts))
    assert np.array_equal(small.train.y, full.train.y)
    x = np.asarray(full.train.x)
    assert abs(x.mean()) < 0.05 and abs(x.std() - 1) < 0.05


def test_image_size_is_checked_before_loading(monkeypatch):
    from fedjax_pfl import data
    from fedjax_pfl.experiments import _presets_lindt as lindt

    monkeypatch.setattr(data, "load_cifar10", lambda **k: pytest.fail("loaded"))
    with pytest.raises(ValueError, match="image_size: must be one of"):
        lindt.lindt_data("cifar10", 10, 0.2, 0, image_size=24)


def test_lindt_nfl_class_sigma_is_a_setting_of_its_own(tmp_path):
    path = tmp_path / "r.jsonl"
    recs = [_rec(0, "fedavg", -3.0),  # older records ran balanced classes (0)
            _rec(1, "fedavg", 1.0, class_sigma=0.0),
            _rec(0, "fedavg", -5.0, class_sigma=1.5),
            _rec(0, "fedavg", -4.0, class_sigma=1.5, grad_clip=5.0)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    blocks = ln.report(str(path)).split("\n\n")
    assert len(blocks) == 6
    assert "gradient norm bound" not in blocks[2]
    assert ", gradient norm bound 5)" in blocks[4]
    assert "class proportions" not in blocks[0]
    assert "(mixed, class proportions log-normal sigma 1.5, attackers" in blocks[2]
    assert "| FedAvg (2 seeds) |" in blocks[1] and "| FedAvg | " in blocks[3]


def test_lindt_private_groups_and_report(tmp_path):
    lp = load_benchmark("lindt_private")
    from fedjax_pfl import data as fdata

    # 4 clients: two with 10 classes (one skewed), one with 5, one attacker
    ys = [np.arange(20) % 10, np.r_[np.zeros(16, int), np.arange(1, 5)],
          np.arange(10) % 5, np.zeros(6, int)]
    fd = fdata.from_client_arrays(
        [(np.zeros((len(y), 1), np.float32), y) for y in ys])
    ks = np.array([10, 10, 5, 2])
    benign = np.array([True, True, True, False])
    acc = np.array([0.3, 0.8, 0.6, 0.99])
    g = lp.group_stats(fd, ks, benign, acc)
    assert list(g) == ["10", "5"]  # the attacker's group has no benign client
    assert g["10"]["clients"] == 2 and g["10"]["private_acc"] == pytest.approx(55.0)
    assert g["10"]["majority_share"] == pytest.approx(100 * (0.1 + 0.8) / 2)
    assert g["5"]["train_mean"] == 10 and g["5"]["train_std"] == 0
    rec = {"model": "cnn", "hidden": None, "scheme": "mixed", "class_sigma": 1.5,
           "attack_ratio": 0.2, "private_rounds": 20, "private_steps": 50,
           "lr": 0.1, "batch_size": 10, "seed": 0, "private_acc_benign": 56.67,
           "groups": g}
    iid = dict(rec, scheme="iid", class_sigma=0.0, groups={"10": g["10"]})
    normal = dict(rec, attack_ratio=0.0)
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (rec, iid, normal)))
    rows = lp.report(str(path)).splitlines()
    assert rows[2] == ("| CNN 32x32, mixed, class sigma 1.5, attackers 0.2, 20 x 50 "
                       "steps at lr 0.1, batch 10, seed 0 | 56.67 (74.02) | "
                       "55.00 (65.23) | 60.00 (76.49) | - | 45 / 20 / - |")
    # IID has its own paper value, not the non-IID(10) one
    assert rows[3].startswith("| CNN 32x32, iid, class sigma 0, attackers 0.2, "
                              "20 x 50 steps at lr 0.1, batch 10, seed 0 | 56.67 "
                              "(43.76) | 55.00 (-) | - | - |")
    # the paper's private mean moves with the attacker share (benign averages)
    assert "attackers 0, 20 x 50 steps at lr 0.1, batch 10, seed 0 | 56.67 (72.64)" \
        in rows[4]


def test_lindt_nfl_trim_is_a_setting_of_its_own(tmp_path):
    path = tmp_path / "r.jsonl"
    recs = [_rec(0, "lindt_tm", 1.0),  # older records ran the default 0.1
            _rec(1, "lindt_tm", 2.0, trim=0.1),
            _rec(0, "lindt_tm", 3.0, trim=0.2),
            _rec(0, "lindt_tm", 4.0, trim=0.3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    blocks = ln.report(str(path)).split("\n\n")
    assert len(blocks) == 6
    assert "TrimmedMean" not in blocks[0]
    assert ", TrimmedMean 0.2 a side)" in blocks[2]
    assert ", TrimmedMean 0.3 a side)" in blocks[4]
    assert "| LINDT-TM (2 seeds) |" in blocks[1] and "| LINDT-TM | " in blocks[3]


def test_lindt_nfl_apfl_alpha_is_a_setting_of_its_own(tmp_path):
    path = tmp_path / "r.jsonl"
    recs = [_rec(0, "apfl", 1.0),  # older records ran 0.01, adaptive
            _rec(1, "apfl", 2.0, apfl_alpha=0.01, apfl_alpha_mode="adaptive"),
            _rec(0, "apfl", 3.0, apfl_alpha=0.5, apfl_alpha_mode="fixed"),
            _rec(0, "apfl", 4.0, apfl_alpha=0.5, apfl_alpha_mode="adaptive")]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    blocks = ln.report(str(path)).split("\n\n")
    assert len(blocks) == 6
    assert "APFL alpha" not in blocks[0] and "| APFL (2 seeds) |" in blocks[1]
    assert blocks[2].endswith(", APFL alpha 0.5 fixed)")
    assert blocks[4].endswith(", APFL alpha 0.5 adaptive)")


def test_lindt_nfl_fb_layers_is_a_setting_of_its_own(tmp_path):
    path = tmp_path / "r.jsonl"
    recs = [_rec(0, "fb", 1.0),  # older records finetuned the top layer only
            _rec(1, "fb", 2.0, fb_layers=1),
            _rec(0, "fb", 3.0, fb_layers=5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    blocks = ln.report(str(path)).split("\n\n")
    assert len(blocks) == 4
    assert "top" not in blocks[0] and "| FB (2 seeds) |" in blocks[1]
    assert "FB 100 steps at lr 0.01 on the top 5 layers," in blocks[2]


def test_lindt_nfl_fb_layers_is_checked_before_training(monkeypatch):
    monkeypatch.setattr(ln, "cached_private_accuracy", lambda *a: pytest.fail(
        "trained before checking --fb-layers"))
    with pytest.raises(SystemExit):
        ln.main(["--data", "synthetic", "--hidden", "8", "--fb-layers", "3",
                 "--rounds", "1"])


def test_report_counts_a_seed_run_twice_once(tmp_path):
    """A seed recorded twice in one setting (a rerun) is one seed: its latest
    record, not a second sample of the mean and std."""
    path = tmp_path / "r.jsonl"
    recs = [_rec(0, "fedavg", -3.0), _rec(1, "fedavg", 1.0),
            _rec(1, "fedavg", 5.0)]  # seed 1 again
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    row = ln.report(str(path)).splitlines()[2]
    assert row.startswith("| FedAvg (2 seeds) | 40.50 +- 0.71 | 46.00 +- 5.66 | "
                          "+1.00 +- 5.66 |")
