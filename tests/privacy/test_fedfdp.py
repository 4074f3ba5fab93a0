"""FedFDP / FedFair (Ling et al. 2024, Algs. 1-2, Eqs. 10-15): the fairness-gradient
identity, the loss release, lam = 0 == DP-FedSGD, the server's F_hat."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_pfl as fp
from fedjax_pfl import algorithms, models, privacy
from fedjax_pfl import data as fdata

MODEL = models.mlp((6,), 3, hidden=(8,))


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=4, dim=6, num_classes=3,
                                   min_size=20, max_size=60, fractions=(0.8, 0, 0.2),
                                   seed=5)


def _diff(a, b):
    return max(float(jnp.max(jnp.abs(x - y)))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


@pytest.mark.parametrize("method", ["ghost", "vmap"])
def test_fairness_gradient_identity(method):
    """sum_j (1 + lam (l_j - F)) grad l_j / |B| == grad of
    (1/|B|) sum_j [l_j + lam/2 (l_j - F)^2] with F fixed (Eqs. 10-11)."""
    params = jax.jit(MODEL.init)(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (6, 6))
    y, mask = jnp.arange(6) % 3, jnp.array([1, 1, 1, 1, 1, 0.0])
    lam, fhat = 0.7, 0.4

    @jax.jit
    def run(params):
        per_sample, _ = privacy.clipped_grad(
            MODEL, params, x, y, mask, clip=jnp.inf, denominator=5.0, method=method,
            weight_fn=lambda l, m: 1.0 + lam * (l - fhat))

        def objective(p):
            losses = MODEL.loss(MODEL.apply(p, x), y)
            return jnp.sum((losses + lam / 2 * (losses - fhat) ** 2) * mask) / 5.0

        batch, _ = privacy.clipped_grad(
            MODEL, params, x, y, mask, clip=jnp.inf, denominator=5.0, method=method,
            weight_fn=lambda l, m: jnp.full_like(l, 1.0 + lam * (
                jnp.sum(l * m) / jnp.sum(m) - fhat)))
        plain = jax.grad(lambda p: models.batch_loss(MODEL, p, x, y, mask))(params)
        mean_loss = models.batch_loss(MODEL, params, x, y, mask)
        return per_sample, jax.grad(objective)(params), batch, plain, mean_loss

    per_sample, direct, batch, plain, mean_loss = run(params)
    assert _diff(per_sample, direct) < 1e-5
    scaled = jax.tree.map(lambda g: (1 + lam * (mean_loss - fhat)) * g, plain)
    assert _diff(batch, scaled) < 1e-5  # FedFair's batch-level weight
    assert _diff(per_sample, batch) > 1e-4  # the two forms differ in general


def test_loss_release():
    losses, mask = jnp.array([1.0, 3.0, 5.0, 9.0]), jnp.array([1.0, 1.0, 1.0, 0.0])
    out = privacy.release_loss(losses, mask, 2.5, 5.0 * 0, jax.random.key(0))
    assert float(out) == pytest.approx(2.0)  # clipped [1, 2.5, 2.5] -> 2.0
    out = privacy.release_loss(losses, mask, jnp.inf, 0.0, jax.random.key(0))
    assert float(out) == pytest.approx(3.0)  # no clip, no noise: the mean
    # a lower bound (ALI-DPFL's loss changes): [-2, 3, 5] clipped to [-1, 2.5]
    out = privacy.release_loss(jnp.array([-2.0, 3.0, 5.0, -9.0]), mask, 2.5, 0.0,
                               jax.random.key(0), lower=-1.0)
    assert float(out) == pytest.approx(4.0 / 3)
    draws = jax.jit(jax.vmap(lambda k: privacy.release_loss(
        losses, mask, 2.5, 2.0, k)))(jax.random.split(jax.random.key(1), 20000))
    d = np.asarray(draws)
    assert abs(d.mean() - 2.0) < 4 * (2.0 * 2.5 / 3) / np.sqrt(d.size)  # unbiased
    assert abs(d.std() / (2.0 * 2.5 / 3) - 1) < 0.03


def test_lam_zero_is_dp_fedsgd_and_server_state(data):
    """lam = 0, sigma = 0 (any C): FedFDP's model update is DP-FedSGD with the
    same clipping; F_hat is the weighted mean of the released losses,
    which become the clients' next loss bounds."""
    kw = {"clip": 0.5, "noise_multiplier": 0.0, "sampling_rate": 0.3,
                      "client_lr": 0.5}
    unroll1 = fp.EngineConfig(unroll=1)
    alg0 = algorithms.dp_fedavg(MODEL, num_local_steps=1, cohort="full", **kw)
    s0 = alg0.init(jax.random.key(1), data)
    ref, _ = jax.jit(lambda s, d: fp.core.run_rounds(
        alg0, s, d, jax.random.key(0), 1, engine=unroll1))(s0, data)

    def make(lam, clip):
        return algorithms.fedfdp(MODEL, lam=lam, loss_noise_multiplier=0.0,
                                 num_local_steps=1, cohort_size=None, cohort="full",
                                 **dict(kw, clip=clip))

    state = make(0.0, 0.5).init(jax.random.key(1), data)
    run = jax.jit(lambda lam, clip, s, d: fp.core.run_rounds(
        make(lam, clip), s, d, jax.random.key(0), 1, engine=unroll1))
    out, _m = run(jnp.float32(0.0), jnp.float32(0.5), state, data)
    assert _diff(ref.server.params, out.server.params) < 1e-7
    n = np.asarray(data.train.counts, np.float64)
    bounds = np.asarray(out.clients.loss_clip)
    assert np.all(bounds >= 0) and np.all(bounds <= 2.5 + 1e-6)
    assert float(out.server.fhat) == pytest.approx(np.sum(n * bounds) / n.sum(),
                                                   rel=1e-5)
    # same program, other (lam, C): with every example clipped (F_hat = 0 in
    # round 0, so all weights exceed 1) fairness is lost (Eq. 13) ...
    out2, m2 = run(jnp.float32(2.0), jnp.float32(0.5), state, data)
    assert float(m2["train/dp/clipped_fraction"]) == 1.0
    assert _diff(out2.server.params, out.server.params) < 1e-6
    # ... while without clipping lam reweights the examples
    a, _ = run(jnp.float32(0.0), jnp.float32(np.inf), state, data)
    b, _ = run(jnp.float32(2.0), jnp.float32(np.inf), state, data)
    assert _diff(a.server.params, b.server.params) > 1e-3


def test_server_optimizer_is_dp_fedavgs(data):
    """``server_optimizer``: lam = 0 and no noise, FedFDP with a server momentum
    follows DP-FedAvg with the same server optimizer over 3 rounds; sgd(1.0)
    is the paper's plain step; the declared epsilon does not change (the server
    step is post-processing)."""
    kw = {"clip": 0.5, "noise_multiplier": 0.0, "sampling_rate": 0.3,
          "client_lr": 0.5, "num_local_steps": 1, "cohort": "full"}
    unroll1 = fp.EngineConfig(unroll=1)

    def run(alg):
        s = alg.init(jax.random.key(1), data)
        return jax.jit(lambda s, d: fp.core.run_rounds(
            alg, s, d, jax.random.key(0), 3, engine=unroll1))(s, data)[0]

    def fdp(opt):
        return algorithms.fedfdp(MODEL, lam=0.0, loss_noise_multiplier=0.0,
                                 cohort_size=None, server_optimizer=opt, **kw)
    momentum = optax.sgd(1.0, momentum=0.9)
    ref = run(algorithms.dp_fedavg(MODEL, server_optimizer=momentum, **kw))
    out = run(fdp(momentum))
    assert _diff(ref.server.params, out.server.params) < 1e-6
    plain = run(fdp(None))
    assert _diff(plain.server.params, run(fdp(optax.sgd(1.0))).server.params) < 1e-7
    assert _diff(plain.server.params, out.server.params) > 1e-3
    noisy = dict(kw, noise_multiplier=1.0)
    eps = [privacy.epsilon(algorithms.fedfdp(
        MODEL, cohort_size=None, server_optimizer=opt, **noisy).privacy(data).event(10),
        1e-5) for opt in (None, momentum)]
    assert eps[0] == eps[1]


def test_fedfair_runs_and_keeps_bounds(data):
    alg = algorithms.fedfair(MODEL, lam=0.5, sampling_rate=0.3, client_lr=0.3,
                             num_local_steps=1, cohort_size=None, cohort="full")
    s = alg.init(jax.random.key(1), data)
    s, m = jax.jit(lambda s, d: fp.core.run_rounds(
        alg, s, d, jax.random.key(0), 2, engine=fp.EngineConfig(unroll=1)))(s, data)
    assert np.all(np.isinf(np.asarray(s.clients.loss_clip)))  # no adaptive bound
    assert np.isfinite(float(s.server.fhat)) and float(s.server.fhat) > 0
    assert float(m["train/dp/clipped_fraction"]) == 0.0


def test_fair_weight_metrics(data):
    """The reported fairness weights are 1 + lam (L_k - F_hat) with the F_hat the
    clients saw: their mean is linear in the clients' mean loss; min <= mean
    <= max, the spread grows with lam, and lam = 0 gives 1 for every client."""
    def alg(lam):
        return algorithms.fedfair(MODEL, lam=lam, sampling_rate=0.3, client_lr=0.3,
                                  num_local_steps=1, cohort_size=None, cohort="full")
    s = alg(0.5).init(jax.random.key(1), data)
    run = jax.jit(lambda lam, s, d: fp.core.run_rounds(
        alg(lam), s, d, jax.random.key(0), 1, engine=fp.EngineConfig(unroll=1)))
    s1, m = run(jnp.float32(0.5), s, data)  # round 0: F_hat = 0
    _, m2 = run(jnp.float32(0.5), s1, data)  # round 1: F_hat of round 0
    assert float(s1.server.fhat) > 0
    for out, fhat in ((m, 0.0), (m2, float(s1.server.fhat))):
        fw, lo, hi = (float(out[k]) for k in ("train/fair_weight",
                                              "server/fair_weight_min",
                                              "server/fair_weight_max"))
        assert fw == pytest.approx(1 + 0.5 * (float(out["train/loss"]) - fhat),
                                   rel=1e-6)
        assert lo < fw < hi
    _, m3 = run(jnp.float32(1.0), s1, data)
    spread = [float(x["server/fair_weight_max"] - x["server/fair_weight_min"])
              for x in (m2, m3)]
    assert spread[1] == pytest.approx(2 * spread[0], rel=1e-5)  # one step: same losses
    _, m0 = run(jnp.float32(0.0), s1, data)
    assert float(m0["server/fair_weight_min"]) == float(
        m0["server/fair_weight_max"]) == 1.0


def test_bad_arguments():
    for kw, name in [({"weighting": "x"}, "weighting"), ({"lam": -1.0}, "lam"),
                     ({"loss_clip": 0.0}, "loss_clip"),
                     ({"loss_noise_multiplier": -1.0}, "loss_noise_multiplier"),
                     ({"fair_clip": "abs"}, "fair_clip"),
                     ({"sampling_rate": 2.0}, "sampling_rate")]:
        with pytest.raises(ValueError, match=name):
            algorithms.fedfdp(MODEL, **kw)
    with pytest.raises(ValueError, match="clip"):
        algorithms.fedfair(MODEL, clip=1.0)
