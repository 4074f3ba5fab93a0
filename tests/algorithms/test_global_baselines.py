"""Global-solver and fairness baselines: FedProx, SCAFFOLD, FedDyn, q-FFL, AFL,
pFedMe (issue #8). Each method is checked against a float64 NumPy oracle written
as a Python loop over clients on the point-estimation model (full-batch
gradients are then exact: ``grad F_k(w) = w - ybar_k``), against its exact
reduction to FedAvg / plain SGD where one holds, and for the engine guarantees
(vmap == lax.map, compiles once, runs under simulate/sweep). The oracle runs take
their hyperparameters as traced arrays, as ``fp.sweep`` passes them."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import leaves_equal as _leaves_equal
from helpers import run_jitted as _run
from helpers import take as _take

import fedjax_pfl as fp
from fedjax_pfl import algorithms, attacks, models
from fedjax_pfl import data as fdata
from fedjax_pfl.algorithms import project_simplex
from fedjax_pfl.algorithms._pfedme import prox_solve
from fedjax_pfl.core import EngineConfig, round_cohort

MODEL = models.logistic_regression((6,), 3)
POINT = models.mean_model(1)
KEY = jax.random.key(0)  # the run key of helpers.run_jitted
UNROLL1 = EngineConfig(unroll=1)
VMAP1 = EngineConfig("vmap", unroll=1)  # the point oracles' engine (FULL)


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=5, dim=6, num_classes=3,
                                   min_size=10, max_size=30, seed=3)


def _point_data(sizes=(3, 6, 4, 8, 5), seed=0):
    """Point estimation: client k's ``y`` ~ N(mu_k, 1); returns the data, the
    client means and the client losses' constants (``F_k(w) = (w - ybar_k)^2 / 2
    + var_k / 2``)."""
    rng = np.random.default_rng(seed)
    ys = [rng.normal(rng.normal(0, 2), 1, (n, 1)).astype(np.float32) for n in sizes]
    d = fdata.from_client_arrays([(np.zeros_like(y), y) for y in ys])
    y64 = [y[:, 0].astype(np.float64) for y in ys]
    return d, np.array([y.mean() for y in y64]), np.array([y.var() for y in y64])


def _cohorts(d, rounds, m, cohort="uniform"):
    return [np.asarray(round_cohort(d, t, KEY, m, cohort)) for t in range(rounds)]


def _traced(make, d, rounds, **hparams):
    """``rounds`` jitted rounds of ``make(**hparams)`` under ``VMAP1`` with the
    hyperparameters passed as traced float32 arrays (as ``fp.sweep`` passes
    them)."""
    run = jax.jit(lambda hp: _run(make(**hp), d, rounds, engine=VMAP1))
    return run({k: jnp.float32(v) for k, v in hparams.items()})


def _w(state_params):
    return float(np.asarray(state_params["w"])[0])


FULL = {"sampling": "full_batch", "batch_size": 1}  # run under VMAP1


# ---------------------------------------------------------------- FedProx


def test_fedprox_mu_zero_is_fedavg_bit_for_bit(data):
    """With a robust aggregator and an attack too (FedProx takes every fedavg
    option through the same global_solver)."""
    kw = {"client_lr": 0.3, "num_local_steps": 3, "batch_size": 4, "cohort_size": 3,
          "aggregator": fp.aggregators.coordinate_median(),
          "attack": attacks.model_replacement(),
          "malicious": np.array([1, 0, 0, 1, 0], bool)}
    a = _run(algorithms.fedprox(MODEL, mu=0.0, **kw), data, 3, engine=UNROLL1)
    b = _run(algorithms.fedavg(MODEL, **kw), data, 3, engine=UNROLL1)
    _leaves_equal(a.server.params, b.server.params)  # mu > 0 differs: the sweep


def test_fedprox_matches_point_oracle():
    """Local GD on ``F_k + mu/2 (w - w^t)^2`` contracts toward ``w^t``."""
    d, ybar, _ = _point_data()
    mu, lr, steps, rounds = 2.0, 0.2, 3, 3
    make = lambda mu, lr: algorithms.fedprox(
        POINT, mu=mu, client_lr=lr, num_local_steps=steps, cohort_size=3,
        weighted=True, **FULL)
    n = np.asarray(d.train.counts, np.float64)
    w = 0.0
    for ids in _cohorts(d, rounds, 3):
        ws = []
        for k in ids:
            y = w
            for _ in range(steps):
                y -= lr * ((y - ybar[k]) + mu * (y - w))
            ws.append(y)
        w = float(np.sum(n[ids] * np.array(ws)) / n[ids].sum())
    st = _traced(make, d, rounds, mu=mu, lr=lr)
    np.testing.assert_allclose(_w(st.server.params), w, atol=1e-5)


def test_fedprox_sweep_over_mu_equals_separate_runs(data):
    """One vmapped program over traced mu == one run per mu (the same jitted
    run called with each value)."""
    mus = [0.0, 3.0]
    make = lambda mu: algorithms.fedprox(MODEL, mu=mu, client_lr=0.3,
                                         num_local_steps=3, batch_size=4,
                                         cohort_size=3)
    key = jax.random.key(3)
    states, hist = fp.sweep(make, {"mu": mus}, data, num_rounds=3, key=key,
                            splits=("test",), engine=UNROLL1)
    init_key, run_key = jax.random.split(key)
    alone = jax.jit(lambda mu: fp.core.run_rounds(
        make(mu), make(mu).init(init_key, data), data, run_key, 3,
        engine=UNROLL1)[0])
    for i, mu in enumerate(mus):
        chex.assert_trees_all_close(_take(states.server, i),
                                    alone(jnp.float32(mu)).server, atol=1e-6)
    loss = hist["global/test/loss/mean"]
    assert loss.shape == (2, 2) and abs(loss[0, -1] - loss[1, -1]) > 1e-3


# --------------------------------------------------------------- SCAFFOLD


def test_scaffold_matches_point_oracle_and_c_is_mean_of_ck():
    d, ybar, _ = _point_data()
    lr, glr, steps, rounds, m, num = 0.3, 0.7, 3, 4, 3, 5
    make = lambda lr, glr: algorithms.scaffold(
        POINT, client_lr=lr, global_lr=glr, num_local_steps=steps, cohort_size=m,
        weighted=False, **FULL)
    x, c, ck = 0.0, 0.0, np.zeros(num)
    for ids in _cohorts(d, rounds, m):
        dys, dcs = [], []
        for k in ids:
            y = x
            for _ in range(steps):
                y -= lr * ((y - ybar[k]) - ck[k] + c)
            new = ck[k] - c + (x - y) / (steps * lr)
            dys.append(y - x)
            dcs.append(new - ck[k])
            ck[k] = new
        x += glr * np.mean(dys)
        c += m / num * np.mean(dcs)
    st = _traced(make, d, rounds, lr=lr, glr=glr)
    np.testing.assert_allclose(_w(st.server.params), x, atol=1e-5)
    np.testing.assert_allclose(_w(st.server.control), c, atol=1e-5)
    np.testing.assert_allclose(np.asarray(st.clients["w"])[:, 0], ck, atol=1e-5)
    assert np.all(ck != 0) and abs(c - ck.mean()) < 1e-12  # the oracle's invariant
    np.testing.assert_allclose(_w(st.server.control),
                               np.asarray(st.clients["w"]).mean(), atol=1e-6)


def test_scaffold_one_client_is_local_sgd():
    """N = 1, full participation: c = c_1 after every round (c_1 starts at c = 0,
    and c <- c + (1/1)(c_1+ - c_1)), so every local step is plain SGD
    (``- c_1 + c = 0``) and ``x <- x + eta_g (y - x)``: FedAvg with one client and
    server optimizer sgd(eta_g) (the point oracle covers eta_g != 1). With
    eta_g = 1, ``x^t`` is K SGD steps per round continuing across rounds from
    ``x^0`` on the same minibatch stream: local_only's model (to float rounding:
    ``c_1 - c`` may be a few ulps instead of 0)."""
    one = fdata.fedprox_synthetic(1.0, 1.0, num_clients=1, dim=6, num_classes=3,
                                  min_size=20, max_size=30, seed=1)
    kw = {"client_lr": 0.3, "num_local_steps": 4, "batch_size": 5, "cohort": "full"}
    s = _run(algorithms.scaffold(MODEL, global_lr=1.0, **kw), one, 3, engine=UNROLL1)
    loc = _run(algorithms.local_only(MODEL, **kw), one, 3, engine=UNROLL1)
    chex.assert_trees_all_close(s.server.params, jax.tree.map(
        lambda a: a[0], loc.clients), atol=1e-6)
    chex.assert_trees_all_close(s.server.control, jax.tree.map(lambda a: a[0],
                                                               s.clients), atol=1e-6)


# ----------------------------------------------------------------- FedDyn


def test_feddyn_matches_point_oracle():
    """The quadratic hand case (two rounds, so grad_k is non-zero in round 2)."""
    d, ybar, _ = _point_data()
    alpha, lr, steps, m, num = 0.5, 0.2, 3, 3, 5
    make = lambda alpha: algorithms.feddyn(
        POINT, alpha=alpha, client_lr=lr, num_local_steps=steps, cohort_size=m,
        weighted=False, **FULL)
    w, h, g = 0.0, 0.0, np.zeros(num)
    for ids in _cohorts(d, 3, m):
        ws = []
        for k in ids:
            y = w
            for _ in range(steps):
                y -= lr * ((y - ybar[k]) - g[k] + alpha * (y - w))
            g[k] -= alpha * (y - w)
            ws.append(y)
        h -= alpha / num * np.sum(np.array(ws) - w)
        w = np.mean(ws) - h / alpha
    st = _traced(make, d, 3, alpha=alpha)
    np.testing.assert_allclose(_w(st.server.params), w, atol=1e-5)
    np.testing.assert_allclose(_w(st.server.h), h, atol=1e-5)
    np.testing.assert_allclose(np.asarray(st.clients["w"])[:, 0], g, atol=1e-5)


def test_feddyn_one_local_step_is_a_momentum_method():
    """With one local step and every client every round (FedFDP's tables),
    FedDyn is a momentum method (docs/baselines-global.md): with the mean
    gradient ``d_t = mean_k grad F_k(w_t)`` and ``g_t = mean_k grad_k``,
    ``w_{t+1} = w_t - g_t / alpha - 2 lr (d_t - g_t)`` and
    ``g_{t+1} = g_t + alpha lr (d_t - g_t)``: the model moves by ``1/alpha``
    times a running average of the gradients with weight ``alpha lr``."""
    d, ybar, _ = _point_data()
    num, lr = 5, 0.2
    for alpha in (0.1, 1 / lr):
        w, g = 0.0, 0.0
        for _ in range(6):
            grad = np.mean(w - ybar)
            w, g = w - g / alpha - 2 * lr * (grad - g), g + alpha * lr * (grad - g)
        alg = algorithms.feddyn(POINT, alpha=alpha, client_lr=lr, num_local_steps=1,
                                cohort_size=num, cohort="full", weighted=False, **FULL)
        st = _run(alg, d, 6, engine=VMAP1)
        np.testing.assert_allclose(_w(st.server.params), w, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ q-FFL


@pytest.mark.parametrize("variant,qs", [("qfedavg", (2.0, 0.5)),
                                        ("qfedsgd", (1.0, 0.0))])
def test_qffl_matches_point_oracle(variant, qs):
    """q traced: one compiled run per variant, called with each q."""
    d, ybar, var = _point_data()
    L, lr, steps, m = 4.0, 0.3, 2, 3
    run = jax.jit(lambda q: _run(algorithms.qffl(
        POINT, q=q, lipschitz_L=L, variant=variant, client_lr=lr,
        num_local_steps=steps, cohort_size=m, **FULL), d, 3, engine=VMAP1).server)
    for q in qs:
        w = 0.0
        for ids in _cohorts(d, 3, m):
            num, den = 0.0, 0.0
            for k in ids:
                f = 0.5 * (w - ybar[k]) ** 2 + 0.5 * var[k]
                if variant == "qfedavg":
                    y = w
                    for _ in range(steps):
                        y -= lr * (y - ybar[k])
                    delta = L * (w - y)
                else:
                    delta = w - ybar[k]
                num += f**q * delta
                den += q * f ** (q - 1) * delta**2 + L * f**q
            w -= num / den
        np.testing.assert_allclose(_w(run(jnp.float32(q))), w, atol=1e-5)


def test_qffl_q_zero_is_unweighted_fedavg(data):
    """q = 0: h_k = L, so ``w - sum Delta_k / (|S| L) = mean_S w_k`` (q-FedSGD at
    q = 0 is the point oracle's gradient step at 1/L)."""
    L = 5.0
    kw = {"client_lr": 0.3, "num_local_steps": 3, "batch_size": 4,
          "cohort_size": 3}
    a = _run(algorithms.qffl(MODEL, q=0.0, lipschitz_L=L, **kw),
             data, 3, engine=UNROLL1)
    b = _run(algorithms.fedavg(MODEL, weighted=False, **kw), data, 3, engine=UNROLL1)
    chex.assert_trees_all_close(a.server, b.server.params, atol=1e-6)


# -------------------------------------------------------------------- AFL


def _bisect_simplex(v):
    """Projection onto the simplex by bisection on tau (float64)."""
    lo, hi = v.min() - 1.0, v.max()
    for _ in range(200):
        tau = 0.5 * (lo + hi)
        lo, hi = (tau, hi) if np.maximum(v - tau, 0).sum() > 1 else (lo, tau)
    return np.maximum(v - 0.5 * (lo + hi), 0)


def test_project_simplex_oracles():
    cases = np.array([(0.5, 0.5, 0.5), (2.0, 0.0, 0.0), (0.8, 0.6, 0.0),
                      (0.1, 0.2, 0.7), (-1.0, 3.0, 2.5), (7.0, 7.0, -7.0)])
    want = [(1 / 3, 1 / 3, 1 / 3), (1, 0, 0), (0.6, 0.4, 0.0), (0.1, 0.2, 0.7),
            (0.0, 0.75, 0.25), (0.5, 0.5, 0.0)]
    proj = jax.jit(jax.vmap(project_simplex))
    np.testing.assert_allclose(proj(jnp.asarray(cases, jnp.float32)), want, atol=1e-6)
    rng = np.random.default_rng(0)
    for n in (1, 40):
        vs = rng.normal(0, 1, (6, n)) * np.array([0.01, 0.1, 1, 3, 10, 100])[:, None]
        got = np.asarray(proj(jnp.asarray(vs, jnp.float32)))
        np.testing.assert_allclose(got, [_bisect_simplex(v) for v in vs], atol=1e-5)
        assert got.min() >= 0 and np.abs(got.sum(1) - 1).max() < 1e-5


def test_afl_matches_point_oracle():
    """Full participation, one full-batch step: projected gradient
    descent-ascent on ``sum_k lam_k F_k(w)``; lambda_lr large enough that the
    projection clips some lam_k to 0."""
    d, ybar, var = _point_data()
    lr, lam_lr, num = 0.4, 0.3, 5
    make = lambda lam_lr: algorithms.afl(POINT, lambda_lr=lam_lr, client_lr=lr,
                                         num_local_steps=1, cohort="full", **FULL)
    w, lam = 0.0, np.full(num, 1.0 / num)
    for _ in range(4):
        f = 0.5 * (w - ybar) ** 2 + 0.5 * var
        w = w + np.sum(lam * (-lr * (w - ybar)))
        lam = _bisect_simplex(lam + lam_lr * f)
    st = _traced(make, d, 4, lam_lr=lam_lr)
    np.testing.assert_allclose(_w(st.server.params), w, atol=1e-5)
    np.testing.assert_allclose(st.server.lam, lam, atol=1e-5)
    assert (lam == 0).any() and (lam > 0).sum() >= 2


def test_afl_lambda_lr_zero_is_unweighted_fedavg(data):
    kw = {"client_lr": 0.3, "num_local_steps": 3, "batch_size": 4, "cohort": "full",
          "sampling": "with_replacement"}
    a = _run(algorithms.afl(MODEL, lambda_lr=0.0, **kw), data, 3, engine=UNROLL1)
    b = _run(algorithms.fedavg(MODEL, weighted=False, **kw), data, 3, engine=UNROLL1)
    chex.assert_trees_all_close(a.server.params, b.server.params, atol=1e-6)
    np.testing.assert_array_equal(a.server.lam, np.full(5, 0.2, np.float32))


# ----------------------------------------------------------------- pFedMe


def test_pfedme_inner_solver_is_the_quadratic_prox():
    """For f(theta) = mean 0.5 (theta - y_i)^2 each step contracts toward the prox
    ``theta* = (ybar + lam w) / (1 + lam)`` by ``1 - lr (1 + lam)``."""
    y = jnp.array([[1.0], [2.0], [6.0]])
    x, mask = jnp.zeros_like(y), jnp.ones(3)
    lam, lr, w, start = 3.0, 0.1, 0.5, -1.0
    prox = (3.0 + lam * w) / (1 + lam)
    for steps in (1, 4, 200):
        got = prox_solve(POINT, {"w": jnp.array([w])}, {"w": jnp.array([start])}, x,
                         y, mask, lam=lam, lr=lr, steps=steps)
        want = prox + (1 - lr * (1 + lam)) ** steps * (start - prox)
        np.testing.assert_allclose(got["w"][0], want, atol=1e-6)
    np.testing.assert_allclose(got["w"][0], prox, atol=1e-6)


def _pfedme_oracle(d, ybar, ids_per_round, *, lam, inner_steps, inner_lr, lr,
                   steps, beta, num):
    w, theta_all = 0.0, np.zeros(num)
    for ids in ids_per_round:
        wks = []
        for k in ids:
            wk = theta = w
            for _ in range(steps):
                for _ in range(inner_steps):
                    theta -= inner_lr * ((theta - ybar[k]) + lam * (theta - wk))
                wk -= lr * lam * (wk - theta)
            wks.append(wk)
            theta_all[k] = theta
        w = (1 - beta) * w + beta * np.mean(wks)
    return w, theta_all


def test_pfedme_matches_point_oracle():
    """beta traced: one compiled run, called with beta = 1 and 1.5."""
    d, ybar, _ = _point_data()
    hp = {"lam": 2.0, "inner_steps": 3, "inner_lr": 0.1}
    run = jax.jit(lambda beta: _run(algorithms.pfedme(
        POINT, client_lr=0.2, num_local_steps=3, cohort_size=3, beta=beta, **hp,
        weighted=False, **FULL), d, 3, engine=VMAP1))
    for beta in (1.0, 1.5):
        w, theta = _pfedme_oracle(d, ybar, _cohorts(d, 3, 3), lr=0.2, steps=3,
                                  num=5, beta=beta, **hp)
        st = run(jnp.float32(beta))
        np.testing.assert_allclose(_w(st.server.params), w, atol=1e-5)
        np.testing.assert_allclose(np.asarray(st.clients["w"])[:, 0], theta,
                                   atol=1e-5)
        assert np.ptp(theta) > 0.1  # the personal models really differ


def test_pfedme_beta_mixes_round_start_and_beta_one_model(data):
    """One round: ``w_beta = (1 - beta) w^t + beta w_{beta=1}`` (same cohort and
    minibatches); the personal models do not depend on beta."""
    kw = {"lam": 5.0, "inner_steps": 2, "inner_lr": 0.05, "client_lr": 0.1,
          "num_local_steps": 3, "batch_size": 4, "cohort_size": 3}
    state = algorithms.pfedme(MODEL, **kw).init(jax.random.key(1), data)
    w0 = state.server.params
    run = jax.jit(lambda beta: fp.core.run_rounds(
        algorithms.pfedme(MODEL, beta=beta, **kw), state, data, KEY, 1,
        engine=UNROLL1)[0])
    one, mixed = run(jnp.float32(1.0)), run(jnp.float32(0.3))
    chex.assert_trees_all_close(mixed.server.params, jax.tree.map(
        lambda a, b: 0.7 * a + 0.3 * b, w0, one.server.params), atol=1e-6)
    _leaves_equal(one.clients, mixed.clients)


# ------------------------------------------------------ all: the engine


METHODS = {
    "fedprox": lambda **kw: algorithms.fedprox(MODEL, mu=0.5, **kw),
    "scaffold": lambda **kw: algorithms.scaffold(  # a robust rule on dy
        MODEL, global_lr=0.9, aggregator=fp.aggregators.coordinate_median(), **kw),
    "feddyn": lambda **kw: algorithms.feddyn(
        MODEL, alpha=0.1, aggregator=fp.aggregators.coordinate_median(), **kw),
    "qffl": lambda **kw: algorithms.qffl(MODEL, q=1.0, lipschitz_L=5.0, **kw),
    "afl": lambda **kw: algorithms.afl(MODEL, lambda_lr=0.5, **kw),
    "pfedme": lambda **kw: algorithms.pfedme(MODEL, lam=5.0, inner_steps=2,
                                             inner_lr=0.05, **kw),
}
BASE = {"client_lr": 0.2, "num_local_steps": 2, "batch_size": 4, "cohort_size": 3,
        "cohort": "uniform", "sampling": "with_replacement"}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_simulate_vmap_equals_map_and_compiles_once(data, name):
    """simulate with vmap == a jitted lax.map loop over the same rounds (traced
    once), under a (deterministic) update attack and, for SCAFFOLD and FedDyn, a
    robust aggregator; the metrics are finite and every view is evaluated."""
    mal = np.array([0, 1, 0, 0, 0], bool)
    kw = dict(BASE, attack=attacks.model_replacement(-2.0), malicious=mal)
    key = jax.random.key(5)
    res = fp.simulate(METHODS[name](**kw), data, num_rounds=3, key=key,
                      progress=False, splits=("test",), engine=VMAP1)
    alg = METHODS[name](**kw)
    init_key, run_key = jax.random.split(key)
    state = alg.init(init_key, data)
    chex.clear_trace_counter()

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(s, d):
        return alg.round_step(s, d, run_key)

    with fp.core.execution(EngineConfig("map", 1, unroll=1)):
        for _ in range(3):
            state, metrics = step(state, data)
    chex.assert_trees_all_close(state, res.state, atol=1e-5)
    last = res.history[-1]
    assert np.isfinite(last["global/test/accuracy/mean"])
    if name == "pfedme":
        assert np.isfinite(last["personal/test/accuracy/mean"])
    if name == "scaffold":  # c = mean of ALL c_k, with minibatches and sampling
        chex.assert_trees_all_close(state.server.control, jax.tree.map(
            lambda a: a.mean(0), state.clients), atol=1e-6)
        assert float(jnp.abs(state.server.control["Dense_0"]["kernel"]).max()) > 1e-3
    assert all(np.isfinite(v) for v in jax.tree.leaves(metrics))


# ---------------------------------------------------------- validation


@pytest.mark.parametrize("make,name", [
    (lambda: algorithms.fedprox(MODEL, mu=-1.0), "mu"),
    (lambda: algorithms.scaffold(MODEL, global_lr=0.0), "global_lr"),
    (lambda: algorithms.feddyn(MODEL, alpha=0.0), "alpha"),
    (lambda: algorithms.feddyn(MODEL, alpha=float("inf")), "alpha"),
    (lambda: algorithms.qffl(MODEL, q=-0.5), "q"),
    (lambda: algorithms.qffl(MODEL, lipschitz_L=0.0), "lipschitz_L"),
    (lambda: algorithms.qffl(MODEL, variant="qfedprox"), "variant"),
    (lambda: algorithms.afl(MODEL, lambda_lr=-0.1), "lambda_lr"),
    (lambda: algorithms.pfedme(MODEL, lam=0.0), "lam"),
    (lambda: algorithms.pfedme(MODEL, inner_steps=0), "inner_steps"),
    (lambda: algorithms.pfedme(MODEL, beta=-1.0), "beta"),
    (lambda: algorithms.pfedme(MODEL, inner_lr=jnp.ones(2)), "inner_lr"),
    (lambda: algorithms.scaffold(MODEL, attack=attacks.gaussian_updates()),
     "malicious"),
    (lambda: algorithms.afl(MODEL, client_lr=0.0), "client_lr"),
])
def test_invalid_arguments_raise(make, name):
    with pytest.raises(ValueError, match=name):
        make()
