"""ALI-DPFL: the closed-form tau against the formula, the estimators against
numpy, tau local steps are tau DP-SGD steps, R_s >= R_c is DP-FedAvg's run,
the step budget is never exceeded, the loss change and Gamma are what the
definitions say, and the declared mechanism bounds every round."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pfl as fp
from fedjax_pfl import algorithms, models, privacy
from fedjax_pfl import data as fdata
from fedjax_pfl.core import EngineConfig, execution

MODEL = models.logistic_regression((6,), 3)
ENGINE = EngineConfig("vmap", unroll=1)
LR = 0.3
# deterministic batches (all of a client's rows) and no noise
EXACT = dict(clip=1e6, noise_multiplier=0.0, client_lr=LR, sampling="full_batch",
             normalize="realized", cohort="full")
POISSON = dict(clip=0.5, noise_multiplier=1.0, sampling_rate=0.4, max_batch_size=16,
               client_lr=LR, cohort="full")


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=4, dim=6, num_classes=3,
                                   min_size=8, max_size=20, seed=4)


def _rounds(alg, data, n, seed=0):
    """States and metrics of ``n`` jitted rounds."""
    key = jax.random.key(seed)
    step = jax.jit(lambda s: alg.round_step(s, data, key))
    state = alg.init(jax.random.key(1), data)
    states, metrics = [], []
    with execution(ENGINE):
        for _ in range(n):
            state, m = step(state)
            states.append(state)
            metrics.append(jax.tree.map(np.asarray, m))
    return states, metrics


def _close(a, b, **tol):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **tol)


def _tau_oracle(mu, gamma, clip, sigma, d, b, rs, rc, tau, tau_max):
    t = min(rs * tau, rc)
    noise = sigma ** 2 * clip ** 2 * d / b ** 2
    num = (4 / mu ** 2 if mu else math.inf) + 3 * clip ** 2 + 2 * gamma * t * mu + noise
    den = (2 + 2 / t) * (clip ** 2 + noise)
    raw = math.sqrt(1 + num / (den + 1e-6))
    return tau_max if math.isinf(raw) else min(max(int(raw + 0.5), 1), tau_max)


@pytest.mark.parametrize("mu,gamma,rs,tau", [
    (0.5, 0.02, 100, 1), (2.0, 0.3, 50, 4), (0.05, 0.0, 10, 2), (1.0, 5.0, 300, 1),
    (0.0, 0.1, 100, 3), (30.0, 1e-4, 20, 7)])
def test_tau_is_the_closed_form(mu, gamma, rs, tau):
    kw = dict(clip=0.1, noise_multiplier=2.0, dim=582026, batch_hat=34.0,
              num_rounds=rs, max_steps=1137, tau=tau, tau_max=100)
    got = int(algorithms.ali_tau(mu, gamma, **kw))
    assert got == _tau_oracle(mu, gamma, 0.1, 2.0, 582026, 34, rs, 1137, tau, 100)
    if mu == 0.0:
        assert got == 100
    # a NaN estimate keeps tau; the clamp holds
    assert int(algorithms.ali_tau(jnp.nan, gamma, **kw)) == tau
    assert int(algorithms.ali_tau(mu, gamma, **{**kw, "tau_max": 2})) <= 2


def test_estimates_are_the_weighted_ratios():
    rng = np.random.default_rng(0)
    m = 5
    delta = {"a": rng.normal(size=(m, 3)), "b": rng.normal(size=(m, 2, 2))}
    last = {"a": rng.normal(size=(m, 3)), "b": rng.normal(size=(m, 2, 2))}
    change = rng.normal(size=m)
    w = rng.uniform(1, 9, size=m)
    mask = np.array([1, 1, 0, 1, 1.0])
    p = w * mask / np.sum(w * mask)
    agg = {k: np.tensordot(p, v, axes=1) for k, v in delta.items()}

    def norm(tree, i):
        return math.sqrt(sum(float(np.sum(v[i] ** 2)) for v in tree.values()))

    dist = [math.sqrt(sum(float(np.sum((delta[k][i] - agg[k]) ** 2)) for k in delta))
            for i in range(m)]
    mu_ref = sum(p[i] * norm(last, i) / (dist[i] + 1e-6) for i in range(m))
    mu, gamma = algorithms._ali_dpfl.ali_estimates(
        jax.tree.map(jnp.asarray, delta), jax.tree.map(jnp.asarray, last),
        jnp.asarray(change), jax.tree.map(jnp.asarray, agg), jnp.asarray(w),
        jnp.asarray(mask))
    np.testing.assert_allclose(float(mu), mu_ref, rtol=1e-5)
    np.testing.assert_allclose(float(gamma), abs(float(np.dot(p, change))), rtol=1e-5)


def test_tau_steps_are_dp_fedavg_steps(data):
    """Fixed tau = 3 without noise on full batches: the same global models as
    DP-FedAvg with 3 local steps (the first two steps and the last run as two
    loops, the same updates)."""
    ali = algorithms.ali_dpfl(MODEL, num_rounds=10, max_steps=100, tau_init=3,
                              tau_max=5, adaptive=False, **EXACT)
    ref = algorithms.dp_fedavg(MODEL, num_local_steps=3, **EXACT)
    a, am = _rounds(ali, data, 3)
    r, _ = _rounds(ref, data, 3)
    for sa, sr in zip(a, r):
        _close(sa.server.params, sr.server.params, rtol=2e-5, atol=2e-6)
    assert [int(m["ali/tau"]) for m in am] == [3, 3, 3]
    assert [int(m["ali/steps"]) for m in am] == [3, 6, 9]


def test_rs_at_least_rc_is_dp_fedavg_with_noise(data):
    """R_s >= R_c: tau stays 1 (the authors' rule) and the run is DP-FedAvg's
    one-step run with the same keys, bit for bit (Poisson batches and noise
    included)."""
    ali = algorithms.ali_dpfl(MODEL, num_rounds=50, max_steps=50, tau_init=4,
                              **POISSON)
    ref = algorithms.dp_fedavg(MODEL, num_local_steps=1, **POISSON)
    a, am = _rounds(ali, data, 3)
    r, _ = _rounds(ref, data, 3)
    _close(a[-1].server.params, r[-1].server.params, rtol=0, atol=0)
    assert [int(m["ali/tau"]) for m in am] == [1, 1, 1]
    assert ali.privacy(data).settings["tau_init"] == 1


def test_the_step_budget_is_never_exceeded(data):
    """R_c = 5 with tau = 2: 2, 2, 1, then 0 steps; once spent, rounds leave
    the model unchanged."""
    ali = algorithms.ali_dpfl(MODEL, num_rounds=3, max_steps=5, tau_init=2,
                              tau_max=4, adaptive=False, **POISSON)
    states, metrics = _rounds(ali, data, 5)
    assert [int(m["ali/tau"]) for m in metrics] == [2, 2, 1, 0, 0]
    assert [int(s.server.steps) for s in states] == [2, 4, 5, 5, 5]
    _close(states[3].server.params, states[2].server.params, rtol=0, atol=0)
    _close(states[4].server.params, states[2].server.params, rtol=0, atol=0)


def test_exact_gamma_is_the_last_steps_loss_change(data):
    """One full-batch step from w^0 (tau 1, 'exact'): each client's loss change
    is F_k(w^0 - lr grad F_k(w^0)) - F_k(w^0), Gamma the |weighted mean|, and
    mu the weighted ratio of the step's size to the distance to w^1."""
    ali = algorithms.ali_dpfl(MODEL, num_rounds=5, max_steps=50, estimates="exact",
                              **EXACT)
    w0 = ali.init(jax.random.key(1), data).server.params
    (state,), (m,) = _rounds(ali, data, 1)
    tr = data.train
    changes, steps, n = [], [], []
    for k in range(data.num_clients):
        off, cnt = int(tr.offsets[k]), int(tr.counts[k])
        x, y = tr.x[off:off + cnt], tr.y[off:off + cnt]

        def loss(p, x=x, y=y):
            return jnp.mean(MODEL.loss(MODEL.apply(p, x), y))

        g = jax.grad(loss)(w0)
        w1 = jax.tree.map(lambda p, d: p - LR * d, w0, g)
        changes.append(float(loss(w1) - loss(w0)))
        steps.append(w1)
        n.append(cnt)
    p = np.array(n, float) / sum(n)
    np.testing.assert_allclose(float(m["ali/gamma"]), abs(np.dot(p, changes)),
                               rtol=1e-4, atol=1e-7)
    new = state.server.params
    flat = lambda t: np.concatenate([np.ravel(v) for v in jax.tree.leaves(t)])
    mu = sum(p[k] * np.linalg.norm(flat(steps[k]) - flat(w0))
             / (np.linalg.norm(flat(steps[k]) - flat(new)) + 1e-6)
             for k in range(len(n)))
    np.testing.assert_allclose(float(m["ali/mu"]), mu, rtol=1e-4)


def test_adaptive_tau_moves_within_bounds_and_noise_enters(data):
    ali = algorithms.ali_dpfl(MODEL, num_rounds=4, max_steps=40, tau_max=6,
                              **POISSON)
    states, metrics = _rounds(ali, data, 4)
    taus = [int(m["ali/next_tau"]) for m in metrics]
    assert all(1 <= t <= 6 for t in taus)
    assert int(states[-1].server.steps) <= 40
    assert all(np.isfinite(m["ali/mu"]) and m["ali/mu"] > 0 for m in metrics)
    _, om = _rounds(ali, data, 1, seed=5)
    assert float(om[0]["ali/gamma"]) != float(metrics[0]["ali/gamma"])


def test_declared_mechanism(data):
    kw = dict(POISSON, num_rounds=4, max_steps=10, tau_max=3)
    mech = algorithms.ali_dpfl(MODEL, **kw).privacy(data)
    assert mech.accounted and mech.level == "sample"
    for t in (1, 2, 4, 7):
        ref = algorithms.ali_dpfl_event(0.4, 1.0, min(3 * t, 10), 5.0, t)
        assert privacy.epsilon(mech.event(t), 1e-5) == pytest.approx(
            privacy.epsilon(ref, 1e-5))
    # more rounds cannot add steps past R_c, only loss releases
    assert privacy.epsilon(mech.event(5), 1e-5) > privacy.epsilon(mech.event(4), 1e-5)
    exact = algorithms.ali_dpfl(MODEL, estimates="exact", **kw).privacy(data)
    assert not exact.accounted and "exact" in exact.reason
    mon = privacy.Monitor(mech, 1e-5)
    res = fp.simulate(algorithms.ali_dpfl(MODEL, **kw), data, num_rounds=2,
                      eval_every=2, key=jax.random.key(0), privacy=mon,
                      engine=ENGINE)
    assert res.history[-1]["privacy/epsilon"] == pytest.approx(
        privacy.epsilon(mech.event(2), 1e-5), rel=1e-6)


def test_max_steps_is_the_largest_within_budget():
    kw = dict(sampling_rate=0.05, noise_multiplier=2.0, num_rounds=100,
              loss_noise_multiplier=5.0)
    rc = algorithms.ali_dpfl_max_steps(3.52, 1e-5, **kw)
    ev = lambda s: algorithms.ali_dpfl_event(0.05, 2.0, s, 5.0, 100)
    assert privacy.epsilon(ev(rc), 1e-5) <= 3.52 < privacy.epsilon(ev(rc + 1), 1e-5)
    # without loss releases more steps fit
    assert algorithms.ali_dpfl_max_steps(
        3.52, 1e-5, **{**kw, "loss_noise_multiplier": None}) > rc


@pytest.mark.parametrize("kw,name", [
    (dict(tau_init=5, tau_max=4), "tau_init"),
    (dict(estimates="noisy"), "estimates"),
    (dict(adaptive=1), "adaptive"),
    (dict(max_steps=0), "max_steps"),
])
def test_bad_arguments_are_refused_by_name(kw, name):
    base = dict(POISSON, num_rounds=4, max_steps=10)
    with pytest.raises(ValueError, match=name):
        algorithms.ali_dpfl(MODEL, **{**base, **kw})
