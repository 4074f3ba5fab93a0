"""The FedFDP Tables' methods (``_presets.fedfdp_algorithm``): every private one
declares the accounted mechanism whose event ``fedfdp_events`` plans with, the
non-private baselines are the DP factories without clipping or noise, and the
plan gives the DP baselines DP-FedAvg's T (DP-q-FFL: FedFDP's)."""

import jax
import numpy as np
import pytest

from fedjax_pfl import data as fdata
from fedjax_pfl import models, privacy
from fedjax_pfl.core import simulate
from fedjax_pfl.experiments import _presets

MODEL = models.logistic_regression((6,), 3)
SETTING = dict(q=0.05, lr=1.0, lam=0.1, clip=0.1, sigma=2.0, sigma_loss=5.0)


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=4, dim=6, num_classes=3,
                                   min_size=8, max_size=20, seed=4)


def _alg(method, data, **overrides):
    return _presets.fedfdp_algorithm(method, MODEL, num_clients=data.num_clients,
                                     **{**SETTING, **overrides})


@pytest.mark.parametrize("method", _presets.FEDFDP_PRIVATE)
def test_private_methods_declare_the_planned_event(method, data):
    mech = _alg(method, data).privacy(data)
    assert mech.accounted and mech.settings["steps_per_round"] == 1
    event = _presets.fedfdp_events(0.05, 2.0, 5.0)[method]
    assert privacy.epsilon(mech.event(30), 1e-5) == privacy.epsilon(event(30), 1e-5)


@pytest.mark.parametrize("method", ["scaffold", "fedprox", "feddyn", "qffl"])
def test_nonprivate_baselines_have_no_clip_and_no_noise(method, data):
    mech = _alg(method, data).privacy(data)
    assert not mech.accounted
    assert mech.settings["clip"] == np.inf and mech.settings["noise_multiplier"] == 0
    assert mech.settings["sampling"] == "poisson"  # the FedAvg rows' batches


def test_plan_gives_dp_baselines_their_events_largest_t():
    eps, plan = _presets.fedfdp_plan(60, 0.05, 2.0, 5.0)
    assert plan["dp_qffl"] == plan["fedfdp"] == 60
    assert plan["dp_scaffold"] == plan["dp_fedprox"] == plan["dp_feddyn"] == \
        plan["dp_fedavg"] > 60


def test_unknown_method_is_refused(data):
    for bad in ("dp_fedfair", "dp_afl", "afl"):
        with pytest.raises(ValueError, match="^method:"):
            _alg(bad, data)


def test_table1_runs_at_a_nonprivate_lr_and_table2_at_the_papers():
    # lr 1 (the paper's, with DP) sends non-private FedFair to chance accuracy
    # (0.098) by round 50 (docs/results/preset_cost_cpu.jsonl)
    from fedjax_pfl import experiments
    assert experiments.resolve(experiments.PRESETS["fedfdp-table1"])["lr"] == 0.1
    assert experiments.resolve(experiments.PRESETS["fedfdp-table2"])["lr"] == 1.0


def test_loss_clip_floor_and_fair_clip_reach_fedfdp(data):
    import jax
    alg = _presets.fedfdp_algorithm("fedfdp", MODEL, num_clients=data.num_clients,
                                    loss_clip_floor=1.0, **SETTING)
    state = alg.init(jax.random.key(0), data)
    for _ in range(3):
        state, _ = alg.round_step(state, data, jax.random.key(1))
    assert np.all(np.asarray(state.clients.loss_clip) >= 1.0)
    paper = _presets.fedfdp_algorithm("fedfdp", MODEL, num_clients=data.num_clients,
                                      fair_clip="paper", **SETTING)
    assert not paper.privacy(data).accounted  # lam 0.1: a negative weight


def test_fedfdp_only_keys_are_refused_for_other_methods():
    from fedjax_pfl import experiments
    preset = experiments.PRESETS["fedfdp-table2"]
    assert experiments.resolve(preset)["loss_clip_floor"] == 0.0
    for key, value in (("loss_clip_floor", 0.5), ("fair_clip", "paper")):
        assert experiments.resolve(preset, {key: value})[key] == value  # fedfdp
        with pytest.raises(ValueError, match=key):
            experiments.resolve(preset, {"method": "dp_fedavg", key: value})


def test_cifar10_partition_pixels_and_alpha(monkeypatch):
    """FedFDP's CIFAR-10 rows: train+test pooled, [n, 32, 32, 3] in [-1, 1]
    (Normalize(0.5, 0.5) per channel), Dirichlet(alpha) over the clients."""
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, (400, 32, 32, 3), dtype=np.uint8)
    imgs[0] = 0
    imgs[1] = 255
    labels = np.repeat(np.arange(10), 40).astype(np.int32)
    monkeypatch.setattr(fdata, "load_cifar10", lambda: (imgs[:300], labels[:300],
                                                        imgs[300:], labels[300:]))
    fed = _presets.fedfdp_data("cifar10", 1, num_clients=4, alpha=1.0)
    x = np.concatenate([np.asarray(fed.train.x), np.asarray(fed.test.x)])
    assert x.shape[1:] == (32, 32, 3) and x.dtype == np.float32
    assert x.min() == -1.0 and x.max() == 1.0  # the all-0 and all-255 images
    assert fed.num_clients == 4
    assert fed.train.num_examples + fed.test.num_examples == 400
    # a milder concentration spreads each client over more classes
    harsh = _presets.fedfdp_data("cifar10", 1, num_clients=4, alpha=0.05)

    def classes(f):
        return np.mean([len(np.unique(f.train.client(c)[1])) for c in range(4)])
    assert classes(fed) > classes(harsh)


def test_validation_split_comes_from_training_rows_only(monkeypatch):
    """``val_fraction`` moves that share of each client's training rows to a
    validation split; the test rows are exactly those without it."""
    rng = np.random.default_rng(1)
    imgs = rng.integers(0, 256, (400, 32, 32, 3), dtype=np.uint8)
    labels = np.repeat(np.arange(10), 40).astype(np.int32)
    monkeypatch.setattr(fdata, "load_cifar10", lambda: (imgs[:300], labels[:300],
                                                        imgs[300:], labels[300:]))
    plain = _presets.fedfdp_data("cifar10", 1, num_clients=4, alpha=1.0)
    held = _presets.fedfdp_data("cifar10", 1, num_clients=4, alpha=1.0,
                                val_fraction=0.2)
    assert plain.val is None
    for c in range(4):
        np.testing.assert_array_equal(held.test.client(c)[0], plain.test.client(c)[0])
        tr, va = held.train.client(c)[0], held.val.client(c)[0]
        n_train = len(plain.train.client(c)[0])
        assert len(tr) + len(va) == n_train and 0 < len(va) <= 0.2 * n_train + 1
        # the same rows as before, now in two splits
        assert (sorted(map(bytes, np.concatenate([tr, va]).reshape(n_train, -1)))
                == sorted(map(bytes, plain.train.client(c)[0].reshape(n_train, -1))))
    with pytest.raises(ValueError, match="val_fraction"):
        _presets.fedfdp_data("cifar10", 1, num_clients=4, val_fraction=1.0)


@pytest.mark.parametrize("fedavg, fedprox", [("dp_fedavg", "dp_fedprox"),
                                             ("fedavg", "fedprox")])
def test_fedprox_equals_fedavg_with_one_local_step(fedavg, fedprox, data):
    """The tables run one local step a round, taken at the global model, where
    FedProx's proximal gradient mu (w - w_global) is zero: (DP-)FedProx is then
    (DP-)FedAvg exactly (docs/results/privacy.md, the DP baselines), with and
    without privacy; the mu of the check is large so that a proximal term
    that did act would show."""
    lr = 1.0 if fedavg.startswith("dp_") else 0.1
    algs = {fedavg: _alg(fedavg, data, lr=lr),
            fedprox: _alg(fedprox, data, lr=lr, baselines={"mu": 10.0})}
    runs = {m: simulate(algs[m], data, num_rounds=3, eval_every=3,
                        key=jax.random.key(0), progress=False).history[-1]
            for m in (fedavg, fedprox)}
    for k in ("global/test/accuracy/mean", "global/test/loss/mean"):
        assert runs[fedavg][k] == runs[fedprox][k]


def test_baselines_override_their_own_hyperparameter(data):
    """``baselines`` replaces FEDFDP_BASELINES' entries: FedDyn's alpha changes
    its run (from round 2 on, through the clients' linear terms), a server
    momentum FedAvg's and DP-FedAvg's, and a key that is not a baseline's
    hyperparameter is refused by name."""
    def run(method="feddyn", **kw):
        return simulate(_alg(method, data, **kw), data, num_rounds=3, eval_every=3,
                        key=jax.random.key(0),
                        progress=False).history[-1]["global/test/loss/mean"]
    assert run() == run(baselines={"alpha": _presets.FEDFDP_BASELINES["alpha"]})
    assert run() != run(baselines={"alpha": 0.01})
    for method in ("fedavg", "dp_fedavg"):  # with and without DP
        assert run(method) != run(method, baselines={"server_momentum": 0.9}), method
    with pytest.raises(ValueError, match=r"^baselines: unknown keys \['beta'\]"):
        _presets.fedfdp_algorithm("feddyn", MODEL, num_clients=data.num_clients,
                                  baselines={"beta": 1.0}, **SETTING)
