"""Fed+ (Kundu et al., arXiv 2009.06303): the simulator against closed forms
derived from the paper: local-step closed forms (Prop. 1), quadratic fixed points
(Thm 2; E-independent for lambda = 0, E-dependent for lambda = 1), monotone
F_sigma (Thm 1), Table 1 reductions (FedAvg, FedProx, local, RFA, coordinatewise
median), and the engine guarantees of docs/extending.md §8."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import leaves_equal as _leaves_equal
from helpers import rows_changed as _rows_changed
from helpers import run_jitted
from helpers import take as _take

import fedjax_pfl as fp
from fedjax_pfl import aggregators, algorithms, attacks, models
from fedjax_pfl import data as fdata
from fedjax_pfl.aggregators import moreau
from fedjax_pfl.algorithms._fedplus import fedplus_sgd
from fedjax_pfl.core import EngineConfig, KeyTag, execution, sample_cohort
from fedjax_pfl.core._local import local_train, prox_penalty
from fedjax_pfl.data._federated import client_batch_indices, gather_batch
from fedjax_pfl.models._model import batch_loss

MODEL = models.logistic_regression((5,), 3)
UNROLL1 = EngineConfig(unroll=1)  # the engine of every round here


def _run(alg, data, num_rounds, **kw):
    """``helpers.run_jitted`` under ``UNROLL1`` unless ``engine=`` says."""
    return run_jitted(alg, data, num_rounds, **{"engine": UNROLL1, **kw})


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=7, dim=5, num_classes=3,
                                   min_size=12, max_size=40,
                                   fractions=(0.8, 0.0, 0.2), seed=4)


def _linear_no_bias(dim):
    """``x . w`` with the squared loss: ``f_k = ||X w - y||^2 / (2n)``."""
    return models.Model(
        lambda key: {"w": jnp.zeros((dim,), jnp.float32)},
        lambda p, x: (x @ p["w"])[:, None],
        models.squared_error,
        lambda out, y: -models.squared_error(out, y))


def _quadratics(num_clients=4, n=12, dim=3, seed=0):
    """Least-squares parties: ``f_k(w) = 1/2 w'A_k w - b_k'w + c_k`` with
    anisotropic ``A_k = X_k'X_k/n`` and spread-out minimizers."""
    rng = np.random.default_rng(seed)
    clients, quads = [], []
    for k in range(num_clients):
        x = (rng.normal(size=(n, dim)) * rng.uniform(0.5, 1.5, dim)).astype(np.float32)
        y = (x @ (2.0 * rng.normal(size=dim) + k) + 0.1 * rng.normal(size=n))
        y = y[:, None].astype(np.float32)
        clients.append((x, y))
        xd, yd = x.astype(np.float64), y[:, 0].astype(np.float64)
        quads.append((xd.T @ xd / n, xd.T @ yd / n, yd @ yd / (2 * n)))
    lf = max(np.linalg.eigvalsh(a).max() for a, _, _ in quads)
    return fdata.from_client_arrays(clients), quads, lf


def _fixed_point(quads, gamma):
    """Thm 2: ``[sum A_k (A_k + g I)^-1] w~ = sum (A_k + g I)^-1 b_k`` and
    ``w_k = (A_k + g I)^-1 (b_k + g w~)``."""
    eye = np.eye(quads[0][0].shape[0])
    inv = [np.linalg.inv(a + gamma * eye) for a, _, _ in quads]
    lhs = sum(a @ i for (a, _, _), i in zip(quads, inv))
    w = np.linalg.solve(lhs, sum(i @ b for (_, b, _), i in zip(quads, inv)))
    return w, np.stack([i @ (b + gamma * w) for (_, b, _), i in zip(quads, inv)])


def _with_clients(state, params):
    """``state`` with every party's personal model replaced (marked trained)."""
    n = jax.tree.leaves(params)[0].shape[0]
    return state._replace(clients=state.clients._replace(
        params=params, trained=jnp.ones((n,), bool)))


def _flat(tree):
    return np.concatenate([np.asarray(a, np.float64).reshape(-1)
                           for a in jax.tree.leaves(tree)])


def _stack_flat(tree):
    leaves = jax.tree.leaves(tree)
    return np.concatenate([np.asarray(a, np.float64).reshape(a.shape[0], -1)
                           for a in leaves], axis=1)


# ------------------------------------------------------- O3: the local step


def test_fused_step_is_literal_form_and_prop1():
    """One update of ``fedplus_sgd`` equals ``kappa (w - eta g) + (1-kappa) z``
    and Prop. 1's ``w - eta kappa (g + sigma (w - z))`` (float64)."""
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        w, g, z = ({"a": jnp.asarray(rng.normal(size=(3, 2))),
                    "b": jnp.asarray(rng.normal(size=4))} for _ in range(3))
        for eta, sigma in ((0.1, 15.0), (0.02, 0.0), (1e-4, 1.0)):
            kappa = 1.0 / (1.0 + eta * sigma)
            upd, _ = fedplus_sgd(eta, sigma, z).update(g, optax.EmptyState(), w)
            new = optax.apply_updates(w, upd)
            literal = jax.tree.map(
                lambda p, q, c, k=kappa, e=eta: k * (p - e * q) + (1 - k) * c, w, g, z)
            prop1 = jax.tree.map(
                lambda p, q, c, k=kappa, e=eta, s=sigma: p - e * k * (q + s * (p - c)),
                w, g, z)
            chex.assert_trees_all_close(new, literal, atol=1e-14)
            chex.assert_trees_all_close(new, prop1, atol=1e-14)


def _zero_loss_model(dim):
    return models.Model(lambda key: {"w": jnp.zeros((dim,), jnp.float32)},
                        lambda p, x: jnp.zeros((x.shape[0], 1)) + 0.0 * jnp.sum(p["w"]),
                        models.squared_error, lambda out, y: jnp.zeros(out.shape[0]))


def test_zero_loss_local_solve_contracts_to_anchor():
    """O3 with f = 0: ``w_E = z + kappa^E (w0 - z)`` with ``z = w~ + theta``,
    ``theta = (w_k - w~)/(1 + delta)`` (FedAvg+), ``w0 = (1-lam) w_k + lam w~``;
    per-client E_k."""
    rng = np.random.default_rng(1)
    fed = fdata.from_client_arrays([(np.zeros((3, 2), np.float32),
                                     np.zeros((3, 1), np.float32))] * 3)
    eta, sigma, delta, lam, e_k = 0.1, 5.0, 0.4, 0.3, np.array([1, 3, 7])
    alg = algorithms.fedavg_plus(_zero_loss_model(4), sigma=sigma, delta=delta,
                                 client_lr=eta, local_steps_per_client=e_k,
                                 init_mix=lam, batch_size=2, cohort="full")
    state = alg.init(jax.random.key(0), fed)
    w_t = rng.normal(size=4).astype(np.float32)
    w_k = rng.normal(size=(3, 4)).astype(np.float32)
    state = _with_clients(state._replace(server=state.server._replace(
        params={"w": jnp.asarray(w_t)})), {"w": jnp.asarray(w_k)})
    with execution(UNROLL1):
        new, _ = jax.jit(alg.round_step)(state, fed, jax.random.key(0))
    kappa = 1.0 / (1.0 + eta * sigma)
    z = w_t + (w_k - w_t) / (1 + delta)
    w0 = (1 - lam) * w_k + lam * w_t
    want = z + kappa ** e_k[:, None] * (w0 - z)
    np.testing.assert_allclose(new.clients.params["w"], want, rtol=1e-5, atol=1e-6)


def test_quadratic_full_batch_closed_form():
    """O3: ``f = 1/2 ||w - c||^2`` (the point model on rows ``c``), full batch:
    ``w_E = w* + (kappa (1 - eta))^E (w0 - w*)``, ``w* = (c + sigma z)/(1 + sigma)``,
    here with GeoMed+'s block soft-threshold ``theta``."""
    rng = np.random.default_rng(2)
    c = rng.normal(size=(3, 2)).astype(np.float32) * 3
    fed = fdata.from_client_arrays([(np.zeros((4, 1), np.float32),
                                     np.repeat(c[k][None], 4, 0)) for k in range(3)])
    eta, sigma, delta, e_k = 0.2, 3.0, 0.5, np.array([2, 5, 4])
    alg = algorithms.fedgeomed_plus(models.mean_model(2), sigma=sigma, delta=delta,
                                    client_lr=eta, local_steps_per_client=e_k,
                                    batch_size=1, sampling="full_batch", cohort="full")
    state = alg.init(jax.random.key(0), fed)
    w_t = rng.normal(size=2).astype(np.float32)
    w_k = (w_t + np.array([[0.1, 0.1], [2.0, -1.0], [-3.0, 0.5]])).astype(np.float32)
    state = _with_clients(state._replace(server=state.server._replace(
        params={"w": jnp.asarray(w_t)})), {"w": jnp.asarray(w_k)})
    with execution(UNROLL1):
        new, _ = jax.jit(alg.round_step)(state, fed, jax.random.key(0))
    u = w_k - w_t
    norm = np.linalg.norm(u, axis=1, keepdims=True)
    z = w_t + np.maximum(0, 1 - delta / norm) * u  # party 0: ||u|| < delta, theta = 0
    kappa = 1.0 / (1.0 + eta * sigma)
    w_star = (c + sigma * z) / (1 + sigma)
    want = w_star + (kappa * (1 - eta)) ** e_k[:, None] * (w_k - w_star)
    np.testing.assert_allclose(new.clients.params["w"], want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------ O4: quadratic fixed points


def _quad_alg(psi, e, sigma, lf, lam=0.0, **kw):
    steps = dict(local_steps_per_client=np.asarray(e)) if np.ndim(e) else dict(
        num_local_steps=e)
    return algorithms.fedplus(_linear_no_bias(3), psi=psi, sigma=sigma,
                              client_lr=1.0 / lf, init_mix=lam, batch_size=1,
                              sampling="full_batch", cohort="full", weighted=False,
                              **steps, **kw)


@pytest.mark.parametrize("psi", ["ind0", "sq"])
def test_quadratic_fixed_point_is_independent_of_E(psi):
    """O4: lambda = 0, full participation, exact gradients, exact (mean)
    aggregation: the limit is the closed form for E = 1, 5 and E_k = [1, 3, 7, 2]
    (gamma = sigma for Psi = ind0, sigma delta/(1+delta) for FedAvg+)."""
    fed, quads, lf = _quadratics()
    sigma, delta = 2.0, 0.5
    gamma = sigma if psi == "ind0" else sigma * delta / (1 + delta)
    w_star, wk_star = _fixed_point(quads, gamma)
    for e in (1, 5, [1, 3, 7, 2]):
        st = _run(_quad_alg(psi, e, sigma, lf, delta=delta), fed, 400)
        np.testing.assert_allclose(st.server.params["w"], w_star, atol=2e-4, rtol=1e-4)
        np.testing.assert_allclose(st.clients.params["w"], wk_star, atol=2e-4,
                                   rtol=1e-4)
    assert np.ptp(wk_star, axis=0).max() > 1.0  # personal models really differ


def test_fedprox_fixed_point_depends_on_E():
    """O4: with lambda = 1 (FedProx: Psi = ind0, restart from w~) the limit moves
    with E (objective inconsistency), unlike lambda = 0 above."""
    fed, quads, lf = _quadratics()
    sigma = 2.0
    w_star, _ = _fixed_point(quads, sigma)
    ends = {e: np.asarray(_run(_quad_alg("ind0", e, sigma, lf, lam=1.0), fed,
                               400).server.params["w"]) for e in (1, 5)}
    gap = np.abs(ends[1] - ends[5]).max()
    assert gap > 0.05, gap
    assert np.abs(ends[1] - w_star).max() > 0.05
    # E = 1 restarted from w~ is full-batch GD on the average f_k: its minimizer.
    a, b = sum(q[0] for q in quads), sum(q[1] for q in quads)
    np.testing.assert_allclose(ends[1], np.linalg.solve(a, b), atol=2e-4, rtol=1e-4)


def _huber(r, delta):
    return np.where(r <= delta, 0.5 * r ** 2, delta * r - 0.5 * delta ** 2)


def _robust_center(points, delta, psi, iters=3000):
    """argmin_w sum_k h_delta(||p_k - w||) (l2) or sum_kj h_delta(|p_kj - w_j|)
    (l1) in float64 by IRLS (smoothed Weiszfeld with nu = delta)."""
    w = points.mean(0)
    for _ in range(iters):
        r = points - w
        beta = 1.0 / np.maximum(delta, np.linalg.norm(r, axis=1, keepdims=True)
                                if psi == "l2" else np.abs(r))
        w = (beta * points).sum(0) / beta.sum(0)
    return w


def _f_sigma(quads, wk, sigma, delta, psi):
    """F_sigma(W) = 1/N sum_k f_k(w_k) + min_w 1/N sum_k Psi^(w_k - w) (eq. (28))."""
    f = np.mean([0.5 * w @ a @ w - b @ w + c for (a, b, c), w in zip(quads, wk)])
    if psi == "sq":
        u = wk - wk.mean(0)
        return f + sigma * delta / (2 * (1 + delta)) * np.mean(np.sum(u * u, 1))
    u = wk - _robust_center(wk, delta, psi)
    if psi == "l2":
        return f + sigma * np.mean(_huber(np.linalg.norm(u, axis=1), delta))
    return f + sigma * np.mean(np.sum(_huber(np.abs(u), delta), 1))


def _joint_objective(quads, psi, sigma, delta):
    """``v = (W, w~) -> (H, grad H)``: 1/N sum_k f_k(w_k) + sigma h(w_k - w~)
    (min over w~ of it is F_sigma(W), eq. (28)), for L-BFGS."""
    n, d = len(quads), quads[0][0].shape[0]

    def fun(v):
        wk, w = v[:-d].reshape(n, d), v[-d:]
        u = wk - w
        if psi == "l2":
            r = np.linalg.norm(u, axis=1)
            pen = _huber(r, delta).sum()
            du = u * (np.minimum(1.0, delta / np.maximum(r, 1e-300)))[:, None]
        else:
            pen = _huber(np.abs(u), delta).sum()
            du = np.clip(u, -delta, delta)
        f = sum(0.5 * x @ a @ x - b @ x + c for (a, b, c), x in zip(quads, wk))
        gk = np.stack([a @ x - b for (a, b, _), x in zip(quads, wk)]) + sigma * du
        return (f + sigma * pen) / n, np.r_[gk.reshape(-1), -sigma * du.sum(0)] / n

    return fun


@pytest.mark.parametrize("psi", ["l2", "l1"])
def test_robust_variants_reach_the_joint_minimizer(psi):
    """O4: GeoMed+ / CoMed+ (lambda = 0, full batch, full participation, exact
    aggregation) converge to min_W F_sigma(W), found here by L-BFGS over
    (W, w~) in float64 (N = 5 is odd: the CoMed+ aggregate is unique)."""
    from scipy.optimize import minimize

    fed, quads, lf = _quadratics(num_clients=5, seed=3)
    sigma, delta = 1.0, 0.5
    st = _run(_quad_alg(psi, 3, sigma, lf, delta=delta, agg_tol=1e-7, agg_iters=200),
              fed, 100)
    wk = np.asarray(st.clients.params["w"], np.float64)
    res = minimize(_joint_objective(quads, psi, sigma, delta), np.zeros(18), jac=True,
                   method="L-BFGS-B", options=dict(maxiter=20000, gtol=1e-12,
                                                   ftol=1e-15))
    got = _f_sigma(quads, wk, sigma, delta, psi)
    assert abs(got - res.fun) < 1e-5 * max(1.0, abs(res.fun)), (got, res.fun)
    np.testing.assert_allclose(wk, res.x[:15].reshape(5, 3), atol=1e-3)
    start = _f_sigma(quads, np.zeros((5, 3)), sigma, delta, psi)
    assert start - res.fun > 1.0  # the run really descended


# ------------------------------------------------------ O5: monotone F_sigma


def _f_sigma_trajectory(psi, agg_set, lam, rounds=25):
    fed, quads, lf = _quadratics(num_clients=6, seed=5)
    sigma, delta = 5.0, 1.0
    e_k = np.random.default_rng(0).integers(1, 10, size=6)
    alg = algorithms.fedplus(_linear_no_bias(3), psi=psi, sigma=sigma, delta=delta,
                             client_lr=1.0 / lf, init_mix=lam,
                             local_steps_per_client=e_k, batch_size=1,
                             sampling="full_batch", cohort_size=3, agg_set=agg_set,
                             agg_tol=1e-7, agg_iters=500, weighted=False)
    step = jax.jit(alg.round_step)
    state = alg.init(jax.random.key(0), fed)
    out = []
    for _ in range(rounds):
        with execution(UNROLL1):
            state, _ = step(state, fed, jax.random.key(7))
        out.append(_f_sigma(quads, np.asarray(state.clients.params["w"], np.float64),
                            sigma, delta, psi))
    return np.asarray(out)


@pytest.mark.parametrize("psi", ["sq", "l2"])
def test_f_sigma_is_monotone_with_all_n_aggregation(psi):
    """O5 / Thm 1: eta = 1/L_f, full-batch GD, lambda = 0, random cohorts of 3 of
    6, E_k in 1..9, exact aggregation over ALL N (stale copies included):
    F_sigma(W^t) never increases. Aggregating only the cohort breaks it (the
    control shows the check can fail)."""
    f = _f_sigma_trajectory(psi, "all", 0.0)
    tol = 1e-5 * max(1.0, np.abs(f).max())
    assert np.max(np.diff(f)) <= tol, np.diff(f)
    assert f[0] - f[-1] > 0.5  # it descended
    bad = _f_sigma_trajectory(psi, "sampled", 0.0)
    assert np.max(np.diff(bad)) > 100 * tol


# --------------------------------------------- O6 / Table 1: the reductions


FEDAVG_KW = dict(client_lr=0.2, num_local_steps=3, batch_size=4, cohort_size=3)


def test_sigma0_lambda1_mean_is_fedavg_bit_for_bit(data):
    """Table 1 'FedAvg': sigma = 0, lambda = 1, a mean of the cohort's uploads,
    equal E: the same server model as algorithms.fedavg, bit for bit (same
    client keys; with an attack on 2 of the 7 clients)."""
    kw = dict(FEDAVG_KW, attack=attacks.gaussian_updates(),
              malicious=attacks.malicious_clients(7, 0.3, seed=2))
    plus = algorithms.fedplus(MODEL, sigma=0.0, init_mix=1.0, agg_set="sampled",
                              aggregator=aggregators.mean(), **kw)
    a, b = _run(plus, data, 3), _run(algorithms.fedavg(MODEL, **kw), data, 3)
    _leaves_equal(a.server.params, b.server.params)
    w0 = plus.init(jax.random.key(1), data).server.params
    assert _flat(jax.tree.map(jnp.subtract, a.server.params, w0)).std() > 1e-3


def test_fedavg_with_the_moreau_mean_over_all_parties(data):
    """Table 1 'FedAvg' with Fed+'s own aggregator: Psi = ind0 (theta = 0, the
    unweighted mean), full participation, agg_set='all'."""
    kw = dict(FEDAVG_KW, cohort="full")
    plus = algorithms.fedplus(MODEL, psi="ind0", sigma=0.0, init_mix=1.0,
                              weighted=False, **kw)
    a = _run(plus, data, 3)
    b = _run(algorithms.fedavg(MODEL, weighted=False, **kw), data, 3)
    chex.assert_trees_all_close(a.server.params, b.server.params, atol=1e-6)


def test_sigma0_lambda0_is_local_training(data):
    """Table 1 'Local SGD without FL': sigma = 0, lambda = 0 gives
    algorithms.local_only's models bit for bit, whatever Psi and aggregate."""
    kw = dict(FEDAVG_KW)
    a = _run(algorithms.fedgeomed_plus(MODEL, sigma=0.0, init_mix=0.0, **kw), data, 4)
    b = _run(algorithms.local_only(MODEL, **kw), data, 4)
    _leaves_equal(a.clients.params, b.clients)
    init = algorithms.local_only(MODEL, **kw).init(jax.random.key(1), data).clients
    assert _rows_changed(init, b.clients).sum() >= 3  # personal models trained


@jax.jit
def _prox_sgd(w, split, c, key, lr, sigma):
    """FedProx's local solve by plain SGD: 3 steps of batch 4 with lr
    ``lr kappa`` on ``f + sigma/2 ||v - w||^2`` (Prop. 1)."""
    kappa = 1.0 / (1.0 + lr * sigma)
    return local_train(MODEL, w, split, c, key, optimizer=optax.sgd(lr * kappa),
                       num_steps=3, batch_size=4, penalty=prox_penalty(sigma, w),
                       unroll=1)[0]


def _cohort_local_models(data, key, t, m, w, lr, sigma=0.0):
    """Python loop: the cohort of round t and each member's local model."""
    rkey = jax.random.fold_in(key, t)
    ids = np.asarray(sample_cohort(jax.random.fold_in(rkey, KeyTag.COHORT),
                                   data.train.counts, m, "uniform"))
    return ids, [_prox_sgd(w, data.train, c, jax.random.fold_in(jax.random.fold_in(
        rkey, KeyTag.CLIENT), data.key_ids[c]), lr, sigma) for c in ids]


def test_fedprox_is_ind0_lambda1(data):
    """Table 1 'FedProx': Psi = ind0 (theta = 0), lambda = 1, sigma = mu: each
    member minimizes f + mu/2 ||v - w~||^2 by SGD with lr eta kappa, the server
    averages (uniform cohort of 3, agg_set='sampled')."""
    mu, key = 3.0, jax.random.key(0)
    alg = algorithms.fedplus(MODEL, psi="ind0", sigma=mu, init_mix=1.0,
                             agg_set="sampled", weighted=False, **FEDAVG_KW)
    st = alg.init(jax.random.key(1), data)
    w = st.server.params
    for t in range(2):
        _, vs = _cohort_local_models(data, key, t, 3, w, 0.2, sigma=mu)
        w = jax.tree.map(lambda *a: sum(a) / len(a), *vs)
    got = _run(alg, data, 2, key=0, state=st)
    chex.assert_trees_all_close(got.server.params, w, atol=1e-6)


def _weiszfeld(points, iters=5000):
    w = points.mean(0)
    for _ in range(iters):
        d = np.maximum(np.linalg.norm(points - w, axis=1), 1e-14)
        w = (points / d[:, None]).sum(0) / (1.0 / d).sum()
    return w


@pytest.mark.parametrize("psi", ["l2", "l1"])
def test_rfa_and_coordinatewise_median_rows(data, psi):
    """Table 1 'RFA' / 'Coordinatewise median': sigma = 0, lambda = 1, equal E and
    a delta below every distance to the median: w~ moves by the exact geometric
    median (Weiszfeld, float64) / coordinatewise median of the 5 local updates."""
    key = jax.random.key(0)
    kw = dict(FEDAVG_KW, cohort_size=5)
    alg = algorithms.fedplus(MODEL, psi=psi, delta=1e-4, sigma=0.0, init_mix=1.0,
                             agg_set="sampled", agg_tol=1e-8, agg_iters=500,
                             weighted=False, **kw)
    st = alg.init(jax.random.key(1), data)
    w = st.server.params
    _, vs = _cohort_local_models(data, key, 0, 5, w, 0.2)
    pts = np.stack([_flat(v) for v in vs])
    center = _weiszfeld(pts) if psi == "l2" else np.median(pts, axis=0)
    gap = np.abs(pts - center)
    assert (np.linalg.norm(pts - center, axis=1).min() if psi == "l2"
            else gap[gap > 0].min()) > 1e-3  # delta really is below the distances
    got = _run(alg, data, 1, key=0, state=st)
    np.testing.assert_allclose(_flat(got.server.params), center, atol=2e-5)
    assert np.abs(center - pts.mean(0)).max() > 1e-3  # not the mean


# --------------------------------------------------- engine guarantees


LOOP = dict(sigma=2.0, delta=0.05, client_lr=0.2, init_mix=0.3, batch_size=4,
            cohort_size=3, local_steps_per_client=np.array([3, 1, 2, 3, 2, 1, 3]),
            weighted=False)


def _np_prox_l2(u, delta):
    n = np.sqrt(sum(float(np.sum(np.square(a))) for a in jax.tree.leaves(u)))
    s = max(0.0, 1.0 - delta / n) if n > 0 else 0.0
    return jax.tree.map(lambda a: s * a, u)


@jax.jit
def _literal_steps(v, z, split, c, key, e):
    """The literal fused step ``kappa (v - eta g) + (1 - kappa) z`` on the
    round's minibatches, the first ``e`` of 3 steps (LOOP's settings)."""
    eta, sigma = LOOP["client_lr"], LOOP["sigma"]
    kappa = 1.0 / (1.0 + eta * sigma)
    rows, mask = client_batch_indices(split, c, key, num_steps=3, batch_size=4)
    def loss(p, b):
        return batch_loss(MODEL, p, b.x, b.y, b.mask)

    for i in range(3):
        g = jax.grad(loss)(v, gather_batch(split, rows[i], mask[i]))
        new = jax.tree.map(lambda p, q, a: kappa * (p - eta * q) + (1 - kappa) * a,
                           v, g, z)
        v = jax.tree.map(lambda a, o, on=i < e: jnp.where(on, a, o), new, v)
    return v


@jax.jit
def _moreau_l2(upd):
    n = jax.tree.leaves(upd)[0].shape[0]
    agg = moreau("l2", LOOP["delta"])
    return agg.aggregate(agg.init(None), upd, jnp.ones(n), jnp.ones(n),
                         jax.random.key(0))[0]


def _loop_rounds(data, key, num_rounds, agg_set):
    """Fed+ with psi='l2' as a Python loop over parties: numpy prox, literal
    fused steps, then the Moreau aggregate of the held models' deltas."""
    init = algorithms.fedplus(MODEL, **LOOP).init(jax.random.key(1), data)
    w, wk = init.server.params, init.clients.params
    lam, e_k = LOOP["init_mix"], LOOP["local_steps_per_client"]
    for t in range(num_rounds):
        rkey = jax.random.fold_in(key, t)
        ids = np.asarray(sample_cohort(jax.random.fold_in(rkey, KeyTag.COHORT),
                                       data.train.counts, 3, "uniform"))
        new = []
        for c in ids:
            ck = jax.random.fold_in(jax.random.fold_in(rkey, KeyTag.CLIENT),
                                    data.key_ids[c])
            mine = _take(wk, c)
            theta = _np_prox_l2(jax.tree.map(jnp.subtract, mine, w), LOOP["delta"])
            z = jax.tree.map(jnp.add, w, theta)
            v = jax.tree.map(lambda a, b: (1 - lam) * a + lam * b, mine, w)
            new.append(_literal_steps(v, z, data.train, c, ck, e_k[c]))
        new = jax.tree.map(lambda *a: jnp.stack(a), *new)
        wk = fp.core.tree_scatter(wk, jnp.asarray(ids), new)
        held = wk if agg_set == "all" else new
        w = jax.tree.map(jnp.add, w, _moreau_l2(jax.tree.map(
            lambda a, b: a - b[None], held, w)))
    return w, wk


@pytest.mark.parametrize("agg_set,engines", [
    ("all", (EngineConfig("vmap", unroll=1), EngineConfig("map", 1, unroll=1))),
    ("sampled", (EngineConfig("map", 2, unroll=1),))])
def test_vmap_equals_map_equals_python_loop(data, agg_set, engines):
    """Every engine == a Python loop over parties (l2 prox,
    lambda = 0.3, E_k in {1, 2, 3}, 3 of 7 parties a round, 3 rounds)."""
    w_loop, wk_loop = _loop_rounds(data, jax.random.key(0), 3, agg_set)
    for engine in engines:
        st = _run(algorithms.fedplus(MODEL, agg_set=agg_set, **LOOP), data, 3,
                  engine=engine)
        chex.assert_trees_all_close(st.server.params, w_loop, atol=2e-5)
        chex.assert_trees_all_close(st.clients.params, wk_loop, atol=2e-5)
    assert np.asarray(st.clients.trained).sum() >= 4


def _small(**kw):
    """GeoMed+ on 4 least-squares parties (cheap to compile and to run eagerly)."""
    fed, _, lf = _quadratics()
    base = dict(sigma=2.0, delta=0.05, client_lr=0.5 / lf, init_mix=0.3,
                local_steps_per_client=np.array([1, 3, 2, 3]), batch_size=4,
                cohort_size=3, weighted=False)
    base.update(kw)
    return fed, lambda **k: algorithms.fedplus(_linear_no_bias(3), **dict(base, **k))


def test_jit_equals_no_jit():
    fed, make = _small(cohort="full", agg_iters=4)
    vmap = EngineConfig("vmap", unroll=1)
    alg = make()
    state = _run(alg, fed, 2, engine=vmap)  # theta != 0 from here on
    with execution(vmap):
        a, ma = jax.jit(alg.round_step)(state, fed, jax.random.key(0))
        with jax.disable_jit():
            b, mb = alg.round_step(state, fed, jax.random.key(0))
    chex.assert_trees_all_close(a, b, atol=1e-5, rtol=1e-5)
    for k in ("train/loss", "train/offset_norm", "server/update_norm"):
        np.testing.assert_allclose(ma[k], mb[k], rtol=1e-5)
    assert float(ma["train/offset_norm"]) > 0 and int(ma["server/agg_iters"]) == 4


def test_compiles_once_only_cohort_changes_and_untrained_use_global(data):
    """Compiles once; unselected parties keep w_k; the 'personal' view gives a
    party never sampled the global model (docs/fedplus.md, decision 7)."""
    alg = algorithms.fedplus(MODEL, **dict(LOOP, cohort_size=2))

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(s, d, k):
        return alg.round_step(s, d, k)

    state = alg.init(jax.random.key(1), data)
    key, seen = jax.random.key(9), set()
    for t in range(4):
        ids = set(np.asarray(sample_cohort(
            jax.random.fold_in(jax.random.fold_in(key, t), KeyTag.COHORT),
            data.train.counts, 2, "uniform")).tolist())
        with execution(UNROLL1):
            new, metrics = step(state, data, key)
        changed = _rows_changed(state.clients.params, new.clients.params)
        assert set(np.flatnonzero(changed).tolist()) == ids
        assert float(metrics["server/update_norm"]) > 0
        state, seen = new, seen | ids
    np.testing.assert_array_equal(np.asarray(state.clients.trained),
                                  np.isin(np.arange(7), sorted(seen)))
    never = np.setdiff1d(np.arange(7), sorted(seen))
    assert len(never) > 0  # precondition (fixed key)
    view = alg.eval_models(state, data, key)["personal"].params
    for c in range(7):
        want = state.server.params if c in never else _take(state.clients.params, c)
        chex.assert_trees_all_equal(_take(view, c), want)


def test_sweep_over_sigma_and_init_mix_equals_separate_runs():
    """sigma and lambda may be traced (docs/extending.md §1): fp.sweep == separate
    runs."""
    fed, make = _small()
    hp = {"sigma": [0.0, 8.0], "init_mix": [1.0, 0.0]}
    key = jax.random.key(3)
    states, _ = fp.sweep(make, hp, fed, num_rounds=3, key=key, splits=("train",),
                         engine=UNROLL1)
    init_key, run_key = jax.random.split(key)

    @jax.jit  # one un-vmapped run per value (traced scalars: compiled once)
    def separate(sigma, init_mix):
        alg = make(sigma=sigma, init_mix=init_mix)
        return fp.core.run_rounds(alg, alg.init(init_key, fed), fed, run_key, 3,
                                  engine=UNROLL1)[0]

    for i in range(2):
        st = separate(jnp.float32(hp["sigma"][i]), jnp.float32(hp["init_mix"][i]))
        chex.assert_trees_all_close(_take(states, i), st, atol=1e-5)
    assert np.abs(np.asarray(states.clients.params["w"][0] - states.clients.params[
        "w"][1])).max() > 1e-2


def test_attack_hits_the_servers_copy_not_the_party():
    """agg_set='all' with an attack: the server keeps each party's last upload
    (attacked for malicious parties) and aggregates those; the parties' own
    models are what they trained."""
    mal = np.array([False, True, False, False])
    fed, make = _small(cohort="full")
    clean, hit = make(), make(attack=attacks.gaussian_updates(), malicious=mal)
    a, b = _run(clean, fed, 1), _run(hit, fed, 1)
    _leaves_equal(a.clients.params, b.clients.params)
    sent_gap = np.abs(_stack_flat(b.clients.sent) - _stack_flat(b.clients.params))
    assert sent_gap[mal].min() > 0 and sent_gap[~mal].max() < 1e-6
    w0 = hit.init(jax.random.key(1), fed).server.params
    agg = moreau("l2", 0.05)
    step, _ = agg.aggregate(agg.init(w0), jax.tree.map(
        lambda s, w: s - w[None], b.clients.sent, w0), jnp.ones(4), jnp.ones(4),
        jax.random.key(0))
    chex.assert_trees_all_close(b.server.params, jax.tree.map(jnp.add, w0, step),
                                atol=1e-6)
    assert np.abs(_flat(a.server.params) - _flat(b.server.params)).max() > 1e-4


# ------------------------------------------------------------- validation


@pytest.mark.parametrize("kw,name", [
    (dict(psi="l3"), "psi"),
    (dict(delta=0.0), "delta"),
    (dict(sigma=-1.0), "sigma"),
    (dict(init_mix=1.5), "init_mix"),
    (dict(init_mix=-0.1), "init_mix"),
    (dict(agg_set="some"), "agg_set"),
    (dict(agg_method="newton"), "agg_method"),
    (dict(agg_iters=0), "agg_iters"),
    (dict(agg_tol=-1.0), "agg_tol"),
    (dict(local_steps_per_client=np.array([1, 0, 2])), "local_steps_per_client"),
    (dict(num_local_steps=2, local_steps_per_client=np.array([1, 3])),
     "local_steps_per_client"),
    (dict(local_steps_per_client=np.array([1.5, 2.0])), "local_steps_per_client"),
    (dict(local_steps_per_client=np.array([1, 2]), local_epochs=1.0),
     "local_steps_per_client"),
    (dict(num_local_steps=0), "num_local_steps"),
    (dict(client_lr=-0.1), "client_lr"),
    (dict(cohort="best"), "cohort"),
    (dict(attack=attacks.gaussian_updates()), "malicious"),
])
def test_bad_arguments_raise(kw, name):
    base = dict(sigma=1.0)
    base.update(kw)
    with pytest.raises(ValueError, match=name):
        algorithms.fedplus(MODEL, **base)


def test_bad_arguments_that_need_the_data_raise(data):
    alg = algorithms.fedplus(MODEL, sigma=1.0, local_steps_per_client=np.array([1, 2]))
    with pytest.raises(ValueError, match="local_steps_per_client"):
        alg.init(jax.random.key(0), data)
    alg = algorithms.fedplus(MODEL, sigma=1.0, attack=attacks.gaussian_updates(),
                             malicious=np.zeros(3, bool))
    with pytest.raises(ValueError, match="malicious"):
        alg.init(jax.random.key(0), data)
    with pytest.raises(ValueError, match="cohort_size"):
        alg = algorithms.fedplus(MODEL, sigma=1.0, cohort_size=8)
        alg.round_step(alg.init(jax.random.key(0), data), data, jax.random.key(0))
    with pytest.raises(ValueError, match="aggregator"):
        algorithms.fedplus(MODEL, sigma=1.0, aggregator=aggregators.tilted_mean())


def test_presets_pick_psi():
    """The presets build the same program as fedplus(psi=...) (jaxprs compared:
    no compilation); a different psi gives a different program."""
    fed, _, lf = _quadratics(num_clients=3)
    kw = dict(sigma=1.0, delta=0.2, client_lr=1.0 / lf, num_local_steps=2,
              batch_size=1, sampling="full_batch", cohort="full")

    def program(alg):
        state = alg.init(jax.random.key(0), fed)
        with execution(UNROLL1):
            return str(jax.make_jaxpr(alg.round_step)(state, fed, jax.random.key(0)))

    progs = {psi: program(algorithms.fedplus(_linear_no_bias(3), psi=psi, **kw))
             for psi in ("sq", "l2", "l1")}
    assert len(set(progs.values())) == 3
    for preset, psi in ((algorithms.fedavg_plus, "sq"),
                        (algorithms.fedgeomed_plus, "l2"),
                        (algorithms.fedcomed_plus, "l1")):
        assert program(preset(_linear_no_bias(3), **kw)) == progs[psi]


@pytest.mark.parametrize("psi", ["sq", "l2", "l1"])
def test_anchor_view_is_global_plus_prox_offset(data, psi):
    """The ``anchor`` view is ``w~ + prox_Psi(w_k - w~)`` per party (the paper's
    ``w~ + theta_k``), with ``w~`` for a party never sampled."""
    alg = algorithms.fedplus(MODEL, psi=psi, **dict(LOOP, cohort_size=2, delta=0.3))
    state = _run(alg, data, 3)
    views = alg.eval_models(state, data, jax.random.key(0))
    w_t = state.server.params
    for c in range(7):
        w_k = _take(views["personal"].params, c)
        theta = aggregators.prox(psi, jax.tree.map(jnp.subtract, w_k, w_t), 0.3)
        want = jax.tree.map(jnp.add, w_t, theta)
        chex.assert_trees_all_close(_take(views["anchor"].params, c), want,
                                    rtol=1e-6, atol=1e-6)
    gap = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))),
                       views["anchor"].params, views["personal"].params)
    assert max(jax.tree.leaves(gap)) > 1e-3  # the offsets were shrunk


def test_summed_loss_equals_rescaled_lr_and_sigma(data):
    """The loss reading of the Table 2 preset: Fed+ on the minibatch SUM of the
    loss with ``(eta, sigma)`` is Fed+ on the mean with ``(B eta, sigma / B)``
    (the same kappa), which is why the paper's sigma means different coupling
    under the two readings (docs/fedplus.md, decision 13)."""
    from fedjax_pfl.experiments import _presets

    b = 4
    kw = dict(LOOP, batch_size=b, local_steps_per_client=None, num_local_steps=3)
    summed = algorithms.fedplus(_presets.scaled_loss(MODEL, float(b)),
                                **dict(kw, client_lr=0.05, sigma=2.0))
    mean = algorithms.fedplus(MODEL, **dict(kw, client_lr=0.05 * b, sigma=2.0 / b))
    s1, s2 = _run(summed, data, 3), _run(mean, data, 3)
    chex.assert_trees_all_close(s1.clients.params, s2.clients.params, rtol=1e-5,
                                atol=1e-6)
    chex.assert_trees_all_close(s1.server.params, s2.server.params, rtol=1e-5,
                                atol=1e-6)
    assert _presets.scaled_loss(MODEL, 1.0) is MODEL
