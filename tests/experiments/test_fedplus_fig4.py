"""Fed+'s Fig. 4: FedProx's power-law MNIST partition (``data.fedprox_mnist``)
and the ``fedplus-fig4`` preset (every method runs two rounds on tiny data)."""

import os

import jax
import numpy as np
import pytest

import fedjax_pfl as fp
from fedjax_pfl import data, experiments
from fedjax_pfl.experiments import _presets_fedplus as fig4


def _labels(n_per_class=60, classes=10):
    return np.repeat(np.arange(classes), n_per_class).astype(np.int64)


def _row_ids(fed):
    """Per party, the row ids (the features of ``x = arange(n)``) and labels of
    its train and test rows."""
    out = []
    for split in (fed.train, fed.test):
        x, y = np.asarray(split.x)[:, 0], np.asarray(split.y)
        offs, counts = np.asarray(split.offsets), np.asarray(split.counts)
        out.append([(x[o:o + c].astype(np.int64), y[o:o + c])
                    for o, c in zip(offs, counts)])
    return out


@pytest.mark.parametrize("digits", [1, 2])
def test_fedprox_mnist_parties_digits_and_no_reuse(digits):
    y = _labels()
    x = np.arange(len(y), dtype=np.float32)[:, None]  # each image is its row id
    fed = data.fedprox_mnist(x, y, 40, digits_per_client=digits, min_size=6,
                             standardize=False, seed=3)
    assert fed.num_clients == 40 and fed.val is None
    train, test = _row_ids(fed)
    ids = np.concatenate([i for i, _ in train + test])
    assert len(np.unique(ids)) == len(ids)  # no image twice, train/test disjoint
    # every share is rounded down: at most one image per (party, digit) unused
    assert len(y) - 40 * digits <= len(ids) <= len(y)
    for k, ((i_tr, y_tr), (i_te, y_te)) in enumerate(zip(train, test)):
        n = len(i_tr) + len(i_te)
        assert n >= 6 and len(i_te) == int(np.floor(0.2 * n))
        np.testing.assert_array_equal(y[i_tr], y_tr)  # labels travel with rows
        np.testing.assert_array_equal(y[i_te], y_te)
        held = {(k + j) % 10 for j in range(digits)}
        assert set(y_tr) | set(y_te) == held  # FedProx's consecutive digits
    sizes = np.asarray(fed.train.counts) + np.asarray(fed.test.counts)
    assert sizes.max() > 3 * np.median(sizes)  # power law: a few large parties
    again = data.fedprox_mnist(x, y, 40, digits_per_client=digits, min_size=6,
                               standardize=False, seed=3)
    np.testing.assert_array_equal(np.asarray(again.train.x), np.asarray(fed.train.x))


def test_fedprox_mnist_pixels():
    rng = np.random.default_rng(0)
    y = _labels(20)
    x = rng.integers(0, 256, (len(y), 4, 4)).astype(np.uint8)
    raw = data.fedprox_mnist(x, y, 10, standardize=False, min_size=4)
    assert raw.train.x.shape[1:] == (16,) and float(np.max(raw.train.x)) <= 1.0
    std = data.fedprox_mnist(x, y, 10, min_size=4)  # FedProx's standardization
    (ref,) = data.standardize_pixels(x)
    first = np.asarray(std.train.x)[0]
    assert np.any(np.all(np.isclose(ref, first, atol=1e-6), axis=1))


@pytest.mark.parametrize("kwargs, match", [
    ({"num_clients": 0}, "num_clients"),
    ({"digits_per_client": 11}, "digits_per_client"),
    ({"digits_per_client": 0}, "digits_per_client"),
    ({"min_size": 0}, "min_size"),
    ({"min_size": 100}, "min_size: digit 0 has 60 images"),
    ({"size_lognormal": (0.0, -1.0)}, "size_lognormal"),
    ({"size_lognormal": (0.0, 1.0, 2.0)}, "size_lognormal"),
    ({"size_lognormal": (0.0, float("nan"))}, "size_lognormal"),
    ({"standardize": "yes"}, "standardize"),
    ({"fractions": (0.5, 0.5, 0.5)}, "fractions"),
])
def test_fedprox_mnist_rejects_bad_arguments(kwargs, match):
    y = _labels()
    kw = {"num_clients": 20, **kwargs}
    with pytest.raises(ValueError, match=match):
        data.fedprox_mnist(np.zeros((len(y), 3), np.float32), y, **kw)


def test_fedprox_mnist_rejects_bad_arrays():
    y = _labels()
    with pytest.raises(ValueError, match="x, y"):
        data.fedprox_mnist(np.zeros((len(y) - 1, 3)), y, 20)
    with pytest.raises(ValueError, match="y:"):
        data.fedprox_mnist(np.zeros((len(y), 3)), y.astype(float), 20)


@pytest.mark.skipif(not os.environ.get("FEDJAX_PFL_DATA_DIR"),
                    reason="FEDJAX_PFL_DATA_DIR is not set")
def test_fedprox_mnist_defaults_on_mnist():
    x_tr, y_tr, x_te, y_te = data.load_mnist()
    y = np.concatenate([y_tr, y_te])
    fed = data.fedprox_mnist(np.concatenate([x_tr, x_te]), y, seed=0)
    sizes = np.asarray(fed.train.counts) + np.asarray(fed.test.counts)
    # FedProx's own 1000 users hold 69,035 images (mean 69); ours about as many
    assert fed.num_clients == 1000 and 69_000 <= sizes.sum() <= 70_000
    assert sizes.min() >= 10


# ----------------------------------------------------------------- the preset

PRESET = experiments.get_preset("fedplus-fig4")
TINY = {"parties": 12, "cohort_size": 4, "local_epochs": 0.2, "eval_every": 1}


def _fake_mnist(monkeypatch):
    rng = np.random.default_rng(0)

    def load_mnist():
        y = np.repeat(np.arange(10), 30).astype(np.uint8)
        x = rng.integers(0, 256, (len(y), 28, 28)).astype(np.uint8)
        return x[:250], y[:250], x[250:], y[250:]

    monkeypatch.setattr(data, "load_mnist", load_mnist)


# every method on the synthetic data; two on (fake) MNIST, whose algorithms are
# the same: only the data differ
@pytest.mark.parametrize("dataset, methods", [
    ("synthetic", ("fedprox", "rfa", "fedcomed_plus")),
    pytest.param("synthetic", fig4.FIG4_METHODS, marks=pytest.mark.slow),  # ~15 s
    ("mnist", ("fedavg", "fedgeomed_plus"))])
def test_preset_runs_every_method(monkeypatch, dataset, methods):
    _fake_mnist(monkeypatch)
    for method in methods:
        cfg = experiments.resolve(PRESET, {**TINY, "dataset": dataset,
                                           "method": method, "rounds": 2})
        exp = PRESET.build(cfg)
        assert exp.data.num_clients == 12 and exp.info["num_rounds"] == 2
        view = fig4.fig4_view(method)
        assert exp.views[0] == view
        res = fp.simulate(exp.algorithm, exp.data, num_rounds=2, eval_every=2,
                          key=jax.random.key(0), splits=("test",), progress=False)
        acc = res.history[-1][f"{view}/test/accuracy/mean"]
        assert res.history[-1]["round"] == 2 and 0.0 <= acc <= 1.0, method


def test_preset_paper_settings(monkeypatch):
    _fake_mnist(monkeypatch)
    cfg = experiments.resolve(PRESET, {"method": "fedavg"})
    assert (cfg["alpha"], cfg["beta"]) == (1000.0, 10.0)  # the paper's zeta, beta
    syn = PRESET.build(cfg)
    assert syn.info["num_rounds"] == 200 and syn.info["lr"] == 0.01
    assert syn.data.num_clients == 30
    cfg = experiments.resolve(PRESET, {"dataset": "mnist", "parties": 20,
                                       "method": "fedavg_plus"})
    mn = PRESET.build(cfg)
    assert mn.info["num_rounds"] == 100 and mn.info["lr"] == 0.03
    assert mn.info["delta"] == 0.001 and mn.views == ("personal", "global")


@pytest.mark.parametrize("sets, match", [
    ({"method": "ditto"}, "method: must be one of"),
    ({"dataset": "cifar10"}, "dataset: must be one of"),
    ({"local_epochs": 0}, "local_epochs: must be > 0"),
    ({"digits_per_party": 11, "dataset": "mnist"}, "digits_per_party: must be <="),
    ({"dataset": "mnist", "alpha": 2.0}, "alpha: has no effect unless dataset"),
    ({"digits_per_party": 2}, "digits_per_party: has no effect unless dataset"),
    ({"method": "fedavg", "agg_set": "all"}, "agg_set: has no effect unless"),
    ({"method": "fedavg", "sigma": 0.1}, "sigma: has no effect unless"),
    ({"method": "comed", "weighted": False}, "weighted: has no effect unless"),
    ({"agg_set": "cohort"}, "agg_set: must be one of"),
    ({"rounds": -1}, "rounds: must be >= 0"),
])
def test_preset_rejects_bad_values(sets, match):
    with pytest.raises(ValueError, match=match):
        experiments.resolve(PRESET, sets)
