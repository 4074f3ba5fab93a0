"""The FedFDP paper's DP baselines (DP-FedProx, DP-SCAFFOLD, DP-FedDyn,
DP-q-FFL): without clipping or noise each is its non-private counterpart (the
correction terms are right), each declares the mechanism it runs (the same
epsilon as DP-FedAvg, or as FedFDP for DP-q-FFL), the noise enters, bad
arguments are refused by name, and ``dp_local_train``'s ``correction`` hook
adds its term outside the clip and changes nothing when absent."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pfl as fp
from fedjax_pfl import aggregators, algorithms, models, privacy
from fedjax_pfl import data as fdata
from fedjax_pfl.core import EngineConfig

MODEL = models.logistic_regression((6,), 3)
ENGINE = EngineConfig("vmap", unroll=1)
ROUNDS = 3
LR = 0.3
# Deterministic batches (all of a client's rows, divided by n_k) and every
# client every round: a run's key then only draws the DP noise.
FULL = dict(client_lr=LR, num_local_steps=2, sampling="full_batch",
            normalize="realized", cohort="full")
NO_CLIP = 1e6  # a clip that never binds (traced: the clipping path runs)
HPARAM = {"dp_fedprox": ("mu", 0.5), "dp_scaffold": ("global_lr", 0.8),
          "dp_feddyn": ("alpha", 0.2), "dp_qffl": ("q", 1.5)}


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=4, dim=6, num_classes=3,
                                   min_size=8, max_size=20, seed=4)


def _dp(name, clip, sigma, hp):
    """The DP factory ``name`` with FULL settings (clip, noise and the
    method's hyperparameter may be traced)."""
    key, _ = HPARAM[name]
    kw = dict(FULL, clip=clip, noise_multiplier=sigma, **{key: hp})
    if name == "dp_qffl":  # one step; the loss is released as the gradient is
        del kw["num_local_steps"]
        kw.update(loss_clip=clip, loss_noise_multiplier=sigma)
    return getattr(algorithms, name)(MODEL, **kw)


def _plain(name, hp):
    """The non-private counterpart with the same settings."""
    kw = {k: FULL[k] for k in ("client_lr", "num_local_steps", "sampling", "cohort")}
    if name == "dp_fedprox":
        return algorithms.fedprox(MODEL, mu=hp, **kw)
    if name == "dp_scaffold":
        return algorithms.scaffold(MODEL, global_lr=hp, **kw)
    if name == "dp_feddyn":
        return algorithms.feddyn(MODEL, alpha=hp, **kw)
    return algorithms.qffl(MODEL, q=hp, variant="qfedsgd", lipschitz_L=1.0 / LR,
                           cohort="full")


def _runner(make, data):
    """``(args..., key) -> state`` of ROUNDS jitted rounds of ``make(*args)``
    (one compile for every value of the traced arguments and key)."""
    def run(*args):
        *hp, key = args
        alg = make(*hp)
        state = alg.init(jax.random.key(1), data)
        return fp.core.run_rounds(alg, state, data, key, ROUNDS, engine=ENGINE)[0]

    return jax.jit(run)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)
            if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)]


def _same(a, b, **tol):
    for x, y in zip(_leaves(a), _leaves(b), strict=True):
        np.testing.assert_allclose(x, y, **tol)


@pytest.mark.parametrize("name", sorted(HPARAM))
def test_no_clip_no_noise_is_the_nonprivate_method_and_noise_enters(name, data):
    """(a) clip that never binds, sigma 0: the non-private method's server and
    client states over 3 rounds (SCAFFOLD's c and c_k, FedDyn's h and grad_k),
    so the terms added outside the clip are the non-private objective's
    gradients. (c) sigma 0: two keys give the same states (the batches are
    deterministic); sigma 1 with a binding clip: two keys differ."""
    _, hp = HPARAM[name]
    f32 = jnp.float32
    run = _runner(lambda c, z, h: _dp(name, c, z, h), data)
    k0, k1 = jax.random.key(0), jax.random.key(1)
    exact = run(f32(NO_CLIP), f32(0.0), f32(hp), k0)
    ref = jax.jit(lambda key: fp.core.run_rounds(
        _plain(name, hp), _plain(name, hp).init(jax.random.key(1), data), data,
        key, ROUNDS, engine=ENGINE)[0])(k0)
    _same(exact[:2], ref[:2], rtol=2e-5, atol=2e-6)
    assert max(float(np.max(np.abs(x))) for x in _leaves(exact.server)) > 0.05

    _same(run(f32(NO_CLIP), f32(0.0), f32(hp), k1)[:2], exact[:2], rtol=0, atol=0)
    noisy0 = run(f32(0.5), f32(1.0), f32(hp), k0)
    noisy1 = run(f32(0.5), f32(1.0), f32(hp), k1)
    diffs = [np.max(np.abs(a - b)) for a, b in zip(_leaves(noisy0.server),
                                                    _leaves(noisy1.server))]
    assert max(diffs) > 1e-3


def test_dp_fedprox_mu_zero_is_dp_fedavg_with_noise(data):
    """(e) at the algorithm level: a correction of zeros (``mu = 0``) leaves
    DP-FedAvg's noisy Poisson rounds unchanged."""
    kw = dict(client_lr=LR, num_local_steps=2, clip=0.5, noise_multiplier=1.0,
              sampling_rate=0.4, max_batch_size=16, cohort_size=3)
    run = _runner(lambda mu: algorithms.dp_fedprox(MODEL, mu=mu, **kw), data)
    ref = _runner(lambda: algorithms.dp_fedavg(MODEL, **kw), data)(jax.random.key(0))
    _same(run(jnp.float32(0.0), jax.random.key(0)).server.params, ref.server.params,
          rtol=1e-6, atol=1e-7)
    other = run(jnp.float32(0.5), jax.random.key(0)).server.params
    assert max(np.max(np.abs(a - b)) for a, b in zip(
        _leaves(other), _leaves(ref.server.params))) > 1e-4


def test_correction_hook_is_outside_the_clip_and_absent_is_unchanged(data):
    """(e) ``dp_local_train``: ``correction=None`` and a correction of zeros
    give the same model (Poisson batches, noise); a constant correction ``c``
    with a tiny clip moves one step by ``-lr c`` more, unclipped."""
    dp = privacy.make_dp_config(1e-3, 1.0, "poisson", 0.5, max_batch_size=20)
    w = MODEL.init(jax.random.key(2))
    c = jax.tree.map(lambda p: jnp.full_like(p, 2.0), w)

    def train(correction):
        return jax.jit(lambda key: privacy.dp_local_train(
            MODEL, w, data.train, jnp.int32(1), key, lr=LR, num_steps=1,
            batch_size=4, sampling="poisson", dp=dp, correction=correction)[0])

    key = jax.random.key(5)
    plain = train(None)(key)
    _same(train(lambda p: jax.tree.map(jnp.zeros_like, p))(key), plain, rtol=0,
          atol=0)
    moved = train(lambda p: c)(key)
    _same(jax.tree.map(lambda a, b: a - b, plain, moved),
          jax.tree.map(lambda x: LR * x, c), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["dp_fedprox", "dp_scaffold", "dp_feddyn"])
def test_declared_mechanism_is_dp_fedavgs(name, data):
    """(b) the same event as DP-FedAvg: the same epsilon, settings and
    truncation term for the same q, sigma, steps and rounds."""
    kw = dict(clip=0.1, noise_multiplier=2.0, sampling_rate=0.05,
              num_local_steps=3)
    mech = getattr(algorithms, name)(MODEL, **kw).privacy(data)
    ref = algorithms.dp_fedavg(MODEL, **kw).privacy(data)
    assert mech.accounted and mech.level == "sample"
    assert mech.settings == ref.settings
    assert mech.truncation_per_round == ref.truncation_per_round
    eps = privacy.epsilon(mech.event(50), 1e-5)
    assert eps == privacy.epsilon(ref.event(50), 1e-5)
    assert eps == privacy.epsilon(privacy.dp_sgd_event(0.05, 2.0, 50, 3), 1e-5)
    assert name.split("_")[1] in mech.description.lower()
    # sampling without Poisson, or no noise: runs, not accounted
    assert not getattr(algorithms, name)(
        MODEL, **dict(kw, sampling="with_replacement")).privacy(data).accounted
    assert not getattr(algorithms, name)(
        MODEL, **dict(kw, noise_multiplier=0.0)).privacy(data).accounted


def test_dp_qffl_declares_fedfdps_composition(data):
    """(b) DP-q-FFL: one gradient step and one loss release per round, the
    event (and epsilon) of FedFDP with one local step."""
    mech = algorithms.dp_qffl(MODEL, clip=0.1, noise_multiplier=2.0,
                              sampling_rate=0.05, loss_clip=2.5,
                              loss_noise_multiplier=5.0).privacy(data)
    ref = algorithms.fedfdp(MODEL, clip=0.1, noise_multiplier=2.0, sampling_rate=0.05,
                            loss_clip=2.5, loss_noise_multiplier=5.0,
                            num_local_steps=1).privacy(data)
    assert mech.accounted
    assert mech.truncation_per_round == ref.truncation_per_round
    eps = privacy.epsilon(mech.event(40), 1e-5)
    assert eps == privacy.epsilon(ref.event(40), 1e-5)
    assert eps == privacy.epsilon(privacy.fedfdp_event(0.05, 2.0, 40, 5.0, 1), 1e-5)
    assert eps > privacy.epsilon(privacy.dp_sgd_event(0.05, 2.0, 40, 1), 1e-5)
    for bad in ({"loss_noise_multiplier": 0.0}, {"loss_clip": np.inf},
                {"normalize": "realized"}):
        kw = dict(clip=0.1, noise_multiplier=2.0, sampling_rate=0.05, **bad)
        assert not algorithms.dp_qffl(MODEL, **kw).privacy(data).accounted


DP = dict(clip=1.0, noise_multiplier=1.0, sampling_rate=0.1)


@pytest.mark.parametrize("name,kw,arg", [
    ("dp_fedprox", {"mu": -0.1}, "mu"),
    ("dp_fedprox", {"mu": np.inf}, "mu"),
    ("dp_feddyn", {"alpha": -0.1}, "alpha"),
    ("dp_feddyn", {"alpha": 0.0}, "alpha"),
    ("dp_scaffold", {"global_lr": 0.0}, "global_lr"),
    ("dp_qffl", {"q": -1.0}, "q"),
    ("dp_qffl", {"loss_floor": 0.0}, "loss_floor"),
    ("dp_qffl", {"loss_clip": 0.0}, "loss_clip"),
    ("dp_qffl", {"loss_noise_multiplier": -1.0}, "loss_noise_multiplier"),
    ("dp_fedprox", {"aggregator": aggregators.tilted_mean(1.0)}, "aggregator"),
    ("dp_scaffold", {"aggregator": aggregators.k_loss(1)}, "aggregator"),
    ("dp_feddyn", {"aggregator": aggregators.tilted_mean(1.0)}, "aggregator"),
    ("dp_scaffold", {"clip": -1.0}, "clip"),
    ("dp_feddyn", {"sampling_rate": None}, "sampling_rate"),
    ("dp_qffl", {"noise_multiplier": -1.0}, "noise_multiplier"),
])
def test_bad_arguments_are_refused_by_name(name, kw, arg):
    """(d) at the factory call, before any work."""
    with pytest.raises(ValueError, match=rf"^{arg}:"):
        getattr(algorithms, name)(MODEL, **{**DP, **kw})
