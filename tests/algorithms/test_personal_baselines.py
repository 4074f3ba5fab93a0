"""The Ditto paper's personalization baselines (its Tables 2 and 7): APFL,
L2SGD, EWC, SKL, Per-FedAvg, mapper, MOCHA. Hand-computed oracles of each
update, their reductions (to FedAvg, local training or plain finetuning), vmap
== lax.map == a Python loop over clients, compile-once, composition with
attacks and aggregators, input validation."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.linalg
from helpers import engine_cohort, run_jitted
from helpers import take as _take

from fedjax_pfl import aggregators, algorithms, attacks, models
from fedjax_pfl import data as fdata
from fedjax_pfl.algorithms._ewc import diag_fisher
from fedjax_pfl.algorithms._perfedavg import per_fedavg_step
from fedjax_pfl.algorithms._skl import kl_penalty, symmetric_kl
from fedjax_pfl.core import EngineConfig, execution
from fedjax_pfl.core._local import local_train, prox_penalty
from fedjax_pfl.data._federated import client_batch_indices, gather_batch
from fedjax_pfl.models._model import batch_loss

MODEL = models.logistic_regression((6,), 3)
KW = dict(num_local_steps=2, batch_size=4, cohort_size=3)
UNROLL1 = EngineConfig(unroll=1)  # the engine of every round here
ENGINES = (EngineConfig("vmap", unroll=1), EngineConfig("map", 1, unroll=1))
OLD = dict(cohort="size_weighted", weighted=False)  # the oracles' cohort and mean


def _run(alg, data, num_rounds, engine=UNROLL1):
    return run_jitted(alg, data, num_rounds, engine=engine)


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(
        1.0, 1.0, num_clients=7, dim=6, num_classes=3, min_size=20, max_size=80,
        fractions=(0.72, 0.08, 0.2), seed=3)


@pytest.fixture(scope="module")
def reg():
    """Linear regression without bias (``F_k = ||X w - y||^2 / (2 n)``): every
    Hessian is ``X^T X / n``, so finite-difference HVPs are exact."""
    lr = fdata.linear_regression_problem(num_clients=4, n=10, dim=5, beta=5.0,
                                         sigma=1.0, tau=0.3, seed=1)
    model = models.Model(lambda key: {"w": jnp.zeros((5,), jnp.float32) + 0.3},
                         lambda p, x: (x @ p["w"])[:, None], models.squared_error,
                         lambda out, y: -models.squared_error(out, y))
    return model, lr.data


_ORACLES = {}  # each Python-loop oracle runs once for both engines


def _oracle(name, fn, *args, **kwargs):
    if name not in _ORACLES:
        _ORACLES[name] = fn(*args, **kwargs)
    return _ORACLES[name]



def _tmap(f, *trees):
    return jax.tree.map(f, *trees)


def _mean(trees):
    return _tmap(lambda *a: sum(a) / len(a), *trees)


def _set(stacked, c, value):
    return _tmap(lambda a, v: a.at[c].set(v), stacked, value)


def _views(alg, state, data, key, engine=UNROLL1):
    """``{view: params}`` of ``alg.eval_models``, jitted under ``engine``."""
    with execution(engine):
        return jax.jit(lambda s, d, k: {n: v.params for n, v in alg.eval_models(
            s, d, k).items()})(state, data, key)


def _grad(model, p, b):
    return jax.grad(lambda q: batch_loss(model, q, b.x, b.y, b.mask))(p)


# ----------------------------------------------------------------------- APFL


def _apfl_loop(data, rounds, alpha, lr, alpha_lr, adaptive):
    """APFL by hand (Deng et al. Alg. 1): a Python loop over clients (each
    client's two steps written out and jitted)."""

    @jax.jit
    def client(w, vk, ak, c, k):
        rows, mask = client_batch_indices(data.train, c, k, num_steps=2,
                                          batch_size=4)
        wk = w
        for s in range(2):
            b = gather_batch(data.train, rows[s], mask[s])
            vbar = _tmap(lambda x, y, a=ak: a * x + (1 - a) * y, vk, wk)
            gw, gb = _grad(MODEL, wk, b), _grad(MODEL, vbar, b)
            dot = sum(jnp.vdot(x - y, g) for x, y, g in zip(
                *map(jax.tree.leaves, (vk, wk, gb))))
            wk = _tmap(lambda p, g: p - lr * g, wk, gw)
            vk = _tmap(lambda p, g, a=ak: p - lr * a * g, vk, gb)
            if adaptive:
                ak = jnp.clip(ak - alpha_lr * dot, 0.0, 1.0)
        return wk, vk, ak

    w = MODEL.init(jax.random.key(1))
    v = _tmap(lambda a: jnp.broadcast_to(a, (7, *a.shape)), w)
    a = jnp.full((7,), alpha)
    for t in range(rounds):
        deltas = []
        for c, k in engine_cohort(data, jax.random.key(0), t, 3, "size_weighted"):
            wk, vk, ak = client(w, _take(v, c), a[c], c, k)
            deltas.append(_tmap(jnp.subtract, wk, w))
            v, a = _set(v, c, vk), a.at[c].set(ak)
        w = _tmap(jnp.add, w, _mean(deltas))
    return w, v, a


@pytest.mark.parametrize("engine", ENGINES, ids=["vmap", "map"])
def test_apfl_equals_python_loop(data, engine):
    w, v, a = _oracle("apfl", _apfl_loop, data, 2, 0.4, 0.2, 0.5, adaptive=True)
    st = _run(algorithms.apfl(MODEL, alpha=0.4, alpha_lr=0.5, client_lr=0.2,
                              **OLD, **KW), data, 2, engine=engine)
    chex.assert_trees_all_close(st.server.params, w, atol=1e-6)
    chex.assert_trees_all_close(st.clients.local, v, atol=1e-6)
    np.testing.assert_allclose(st.clients.alpha, a, atol=1e-6)
    assert np.sum(np.asarray(a) != 0.4) >= 3  # alpha did adapt


def test_apfl_alpha_zero_fixed_is_fedavg(data):
    kw = dict(client_lr=0.2, cohort="size_weighted", weighted=False, **KW)
    st = _run(algorithms.apfl(MODEL, alpha=0.0, adaptive_alpha=False, **kw), data, 3)
    ref = _run(algorithms.fedavg(MODEL, **kw), data, 3)
    chex.assert_trees_all_close(st.server.params, ref.server.params, atol=1e-6)
    views = _views(algorithms.apfl(MODEL, alpha=0.0, adaptive_alpha=False, **kw
                            ), st, data, jax.random.key(0))
    chex.assert_trees_all_equal(views["personal"], _tmap(
        lambda x: jnp.broadcast_to(x, (7, *x.shape)), views["global"]))


# ---------------------------------------------------------------------- L2SGD


@pytest.mark.parametrize("mode,engine", [("exact", ENGINES[0]), ("code", ENGINES[1])])
def test_l2sgd_equals_python_loop(data, mode, engine):
    lam, lr = 0.7, 0.2
    train = jax.jit(lambda p, c, k, anchor: local_train(
        MODEL, p, data.train, c, k, optimizer=optax.sgd(lr), num_steps=2,
        batch_size=4, penalty=prox_penalty(lam, anchor))[0])
    wbar = MODEL.init(jax.random.key(1))
    ws = _tmap(lambda a: jnp.broadcast_to(a, (7, *a.shape)), wbar)
    for t in range(3):
        ups = []
        for c, k in engine_cohort(data, jax.random.key(0), t, 3, "size_weighted"):
            old = _take(ws, c)
            new = train(old, c, k, wbar)
            ups.append(_tmap(jnp.subtract, new, old if mode == "exact" else wbar))
            ws = _set(ws, c, new)
        wbar = _tmap(lambda a, d: a + 3 / 7 * d, wbar, _mean(ups))
    st = _run(algorithms.l2sgd(MODEL, lam=lam, client_lr=lr, mean_update=mode,
                               cohort="size_weighted", **KW), data, 3, engine=engine)
    chex.assert_trees_all_close(st.clients, ws, atol=1e-6)
    chex.assert_trees_all_close(st.server.mean, wbar, atol=1e-6)
    exact_mean = _tmap(lambda a: a.mean(0), ws)
    if mode == "exact":  # the paper's wbar IS the mean of all personal models
        chex.assert_trees_all_close(st.server.mean, exact_mean, atol=1e-6)
    else:  # the code's running estimate is not
        assert max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(
            jax.tree.leaves(st.server.mean), jax.tree.leaves(exact_mean))) > 1e-3


def test_l2sgd_lam_zero_is_local_training(data):
    kw = dict(client_lr=0.2, cohort="size_weighted", **KW)
    st = _run(algorithms.l2sgd(MODEL, lam=0.0, **kw), data, 3)
    ref = _run(algorithms.local_only(MODEL, **kw), data, 3)
    chex.assert_trees_all_close(st.clients, ref.clients, atol=1e-7)


# ------------------------------------------------------------ EWC and SKL


def test_ewc_finetuning_matches_hand_computed_steps(reg):
    """Full-batch finetuning of a quadratic: two steps by hand, with the Fisher
    (every Fisher batch is the full data: F = grad^2 at w*); vmap engine (the
    lax.map engine is checked against ``fedavg``'s finetuning below)."""
    model, d = reg
    lam, lr = 3.0, 0.05
    alg = algorithms.ewc(model, lam=lam, client_lr=lr, finetune_steps=2,
                         sampling="full_batch", cohort="full", cohort_size=4,
                         batch_size=1)
    st = alg.init(jax.random.key(0), d)
    w = np.asarray(st.server.params["w"], np.float64)
    tuned = _views(alg, st, d, jax.random.key(5), ENGINES[0])["personal"]["w"]
    for c in range(4):
        x, y = (np.asarray(a, np.float64) for a in d.train.client(c))
        grad = lambda p, x=x, y=y: x.T @ (x @ p - y[:, 0]) / len(y)
        fisher = grad(w) ** 2
        p1 = w - lr * grad(w)
        p2 = p1 - lr * (grad(p1) + lam * fisher * (p1 - w))
        np.testing.assert_allclose(tuned[c], p2, rtol=1e-5)
        f = diag_fisher(model, st.server.params, d, c, jax.random.key(0),
                        num_batches=4, batch_size=1, sampling="full_batch")
        np.testing.assert_allclose(f["w"], fisher, rtol=1e-5)


def test_ewc_fisher_is_mean_of_squared_minibatch_gradients(data):
    p = MODEL.init(jax.random.key(2))
    key = jax.random.key(3)
    f = diag_fisher(MODEL, p, data, 4, key, num_batches=3, batch_size=5)
    rows, mask = client_batch_indices(data.train, 4, key, num_steps=3, batch_size=5)
    gs = [_grad(MODEL, p, gather_batch(data.train, rows[i], mask[i])) for i in range(3)]
    chex.assert_trees_all_close(f, _mean([_tmap(jnp.square, g) for g in gs]),
                                rtol=1e-5)


@pytest.mark.parametrize("factory", [algorithms.ewc, algorithms.skl])
def test_lam_zero_is_plain_finetuning(data, factory):
    kw = dict(client_lr=0.2, cohort="size_weighted", **KW)
    alg = factory(MODEL, lam=0.0, finetune_steps=4, **kw)
    st = alg.init(jax.random.key(1), data)
    key = jax.random.key(7)
    got = _views(alg, st, data, key)["personal"]
    ref = _views(algorithms.fedavg(MODEL, finetune_steps=4, **kw), 
        st, data, key)["finetuned"]
    chex.assert_trees_all_close(got, ref, atol=1e-7)
    if factory is algorithms.ewc:
        return  # EWC's lam > 0 is checked by hand above
    moved = _views(factory(MODEL, lam=5.0, finetune_steps=4, **kw), 
        st, data, key)["personal"]
    assert max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
        jax.tree.leaves(moved), jax.tree.leaves(ref))) > 1e-4  # lam > 0 matters


def test_symmetric_kl_matches_numpy_and_pulls_toward_reference(data):
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    mask = np.array([1, 1, 1, 0, 1.0])
    p = np.exp(a) / np.exp(a).sum(1, keepdims=True)
    q = np.exp(b) / np.exp(b).sum(1, keepdims=True)
    per = (p * np.log(p / q)).sum(1) + (q * np.log(q / p)).sum(1)
    np.testing.assert_allclose(symmetric_kl(a, b, mask), (per * mask).sum() / 4,
                               rtol=1e-5)
    # SKL's gradient vanishes at w*: the first finetuning step is plain SGD's
    kw = dict(client_lr=0.2, finetune_steps=1, cohort="size_weighted", **KW)
    st = algorithms.skl(MODEL, **kw).init(jax.random.key(1), data)
    key = jax.random.key(7)
    skl_1 = _views(algorithms.skl(MODEL, lam=10.0, **kw), st, data, key,
                   ENGINES[0])  # vmap engine here, lax.map for plain_1
    plain_1 = _views(algorithms.skl(MODEL, lam=0.0, **kw), st, data, key)
    chex.assert_trees_all_close(skl_1["personal"], plain_1["personal"],
                                atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 7, 32, 1000])
def test_kl_penalty_in_chunks_is_the_full_set_kl(data, chunk):
    """The chunked penalty (chunks past a client's rows skipped) has the value
    and the gradient of the symmetrized KL over the client's whole training
    set in one batch, for chunks smaller than, near and larger than it."""
    w_star = MODEL.init(jax.random.key(2))
    leaves, tree = jax.tree.flatten(w_star)
    keys = jax.random.split(jax.random.key(5), len(leaves))
    p = jax.tree.unflatten(tree, [a + 0.5 * jax.random.normal(k, a.shape)
                                  for a, k in zip(leaves, keys)])
    for cid in (0, 3):
        x = jnp.asarray(data.train.client(cid)[0])
        full = lambda q, x=x: symmetric_kl(MODEL.apply(q, x), MODEL.apply(w_star, x),
                                           jnp.ones(len(x)))
        pen = jax.jit(lambda q, c=cid: kl_penalty(MODEL, w_star, data.train, c,
                                                  chunk)(q))
        assert float(full(p)) > 1e-2  # p is far enough from w* to matter
        np.testing.assert_allclose(pen(p), full(p), rtol=1e-5)
        chex.assert_trees_all_close(jax.grad(pen)(p), jax.grad(full)(p), rtol=1e-5,
                                    atol=1e-7)
        assert float(pen(w_star)) < 1e-6  # zero at w*


# ------------------------------------------------------------------ Per-FedAvg


@pytest.mark.parametrize("hessian,rtol", [("hf", 2e-3), ("exact", 1e-5), ("fo", 1e-5)])
def test_per_fedavg_step_matches_hand_computed_quadratic(reg, hessian, rtol):
    """Full batches on a quadratic: ``w - beta (I - alpha H) grad F(w - alpha
    grad F(w))`` (the central difference is exact up to rounding here)."""
    model, d = reg
    alpha, beta = 0.3, 0.2
    w = np.full(5, 0.3)
    for c in range(2):
        x, y = (np.asarray(a, np.float64) for a in d.train.client(c))
        grad = lambda p, x=x, y=y: x.T @ (x @ p - y[:, 0]) / len(y)
        g = grad(w - alpha * grad(w))
        hv = np.zeros(5) if hessian == "fo" else x.T @ x / len(y) @ g
        expected = w - beta * (g - alpha * hv)
        rows, mask = client_batch_indices(d.train, c, jax.random.key(0), num_steps=1,
                                          batch_size=1, sampling="full_batch")
        b = gather_batch(d.train, rows[0], mask[0])
        got, _ = per_fedavg_step(model, {"w": jnp.asarray(w, jnp.float32)},
                                 [b, b, b], alpha=alpha, beta=beta, delta=1e-3,
                                 hessian=hessian)
        assert np.max(np.abs(expected - w)) > 1e-2
        np.testing.assert_allclose(got["w"], expected, rtol=rtol)


def _per_fedavg_loop(data):
    @jax.jit
    def client(w, c, k):
        streams = [client_batch_indices(data.train, c, jax.random.fold_in(k, i),
                                        num_steps=2, batch_size=4) for i in range(3)]
        for s in range(2):
            bs = [gather_batch(data.train, r[s], m[s]) for r, m in streams]
            w, _ = per_fedavg_step(MODEL, w, bs, alpha=0.1, beta=0.3, delta=1e-3,
                                   hessian="hf")
        return w

    w = MODEL.init(jax.random.key(1))
    for t in range(2):
        deltas = []
        for c, k in engine_cohort(data, jax.random.key(0), t, 3, "size_weighted"):
            deltas.append(_tmap(jnp.subtract, client(w, c, k), w))
        w = _tmap(jnp.add, w, _mean(deltas))
    return w


@pytest.mark.parametrize("engine", ENGINES, ids=["vmap", "map"])
def test_per_fedavg_equals_python_loop(data, engine):
    w = _oracle("per_fedavg", _per_fedavg_loop, data)
    st = _run(algorithms.per_fedavg(MODEL, alpha=0.1, beta=0.3, finetune_steps=1,
                                    **OLD, **KW), data, 2, engine=engine)
    # central differences divide rounding errors by 2 delta: 1e-5, not 1e-6
    chex.assert_trees_all_close(st.server.params, w, atol=1e-5)


# ---------------------------------------------------------------------- mapper


def test_mapper_reductions(data):
    """lam_grid = (1,): h trains alone (local training with r + 1 steps) and the
    global model never moves; lam_grid = (0,): h never moves and the global
    step is one FedAvg step (full batches: the minibatch key does not matter).
    The first runs on the vmap engine, the second on lax.map, each against its
    oracle."""
    kw = dict(client_lr=0.2, cohort="size_weighted", **KW)
    st = _run(algorithms.mapper(MODEL, lam_grid=(1.0,), finetune_steps=1,
                                weighted=False, **kw), data, 3, engine=ENGINES[0])
    local = _run(algorithms.local_only(MODEL, **dict(kw, num_local_steps=3)), data, 3)
    chex.assert_trees_all_close(st.clients.local, local.clients, atol=1e-6)
    w0 = MODEL.init(jax.random.key(1))
    chex.assert_trees_all_close(st.server.params, w0, atol=0)
    kw["sampling"] = "full_batch"
    st = _run(algorithms.mapper(MODEL, lam_grid=(0.0,), finetune_steps=1,
                                weighted=False, **kw), data, 3)
    ref = _run(algorithms.fedavg(MODEL, weighted=False, **dict(kw, num_local_steps=1)),
               data, 3)
    chex.assert_trees_all_close(st.server.params, ref.server.params, atol=1e-6)
    chex.assert_trees_all_close(st.clients.local, _tmap(
        lambda a: jnp.broadcast_to(a, (7, *a.shape)), w0), atol=0)


# ----------------------------------------------------------------------- MOCHA


def test_mocha_task_covariance_closed_form():
    w = jnp.array([[2.0, 0.0], [0.0, 3.0]])  # W^T W = diag(4, 9)
    np.testing.assert_allclose(algorithms.task_covariance(w), np.diag([0.4, 0.6]),
                               rtol=1e-6)
    rng = np.random.default_rng(0)
    w = rng.normal(size=(5, 4))
    root = np.real(scipy.linalg.sqrtm(w.T @ w))
    np.testing.assert_allclose(algorithms.task_covariance(jnp.asarray(w)),
                               root / np.trace(root), atol=1e-5)


def test_mocha_round_matches_hand_computed_block_step(reg):
    """Round 2 (after Omega's first closed-form step): one full-batch step of
    ``F_k + lam1 tr(W Omega W^T) + lam2 ||W||^2`` in w_k, the others fixed
    (vmap engine; the lax.map engine is checked against local training)."""
    model, d = reg
    lam1, lam2, lr = 0.2, 0.1, 0.3
    alg = algorithms.mocha(model, lam1=lam1, lam2=lam2, client_lr=lr,
                           num_local_steps=1, batch_size=1, cohort="full",
                           cohort_size=4, sampling="full_batch")
    step = jax.jit(alg.round_step)
    with execution(EngineConfig("vmap")):
        st1, _ = step(alg.init(jax.random.key(1), d), d, jax.random.key(0))
        st2, _ = step(st1, d, jax.random.key(0))
    W = np.asarray(st1.server.W["w"], np.float64)  # [N, P]
    omega = np.asarray(st1.server.omega, np.float64)
    root = np.real(scipy.linalg.sqrtm(W @ W.T + 1e-6 * np.eye(4)))
    np.testing.assert_allclose(st1.server.sigma, root / np.trace(root), atol=1e-3)
    np.testing.assert_allclose(omega @ np.asarray(st1.server.sigma), np.eye(4),
                               atol=1e-2)
    assert np.max(np.abs(omega - np.diag(np.diag(omega)))) > 0.1  # coupled tasks
    for c in range(4):
        x, y = (np.asarray(a, np.float64) for a in d.train.client(c))
        g = x.T @ (x @ W[c] - y[:, 0]) / len(y) + 2 * lam1 * omega[c] @ W + \
            2 * lam2 * W[c]
        np.testing.assert_allclose(st2.server.W["w"][c], W[c] - lr * g, rtol=1e-4)


def test_mocha_no_regularization_is_local_training(data):
    kw = dict(client_lr=0.2, cohort="size_weighted", **KW)
    st = _run(algorithms.mocha(MODEL, lam1=0.0, lam2=0.0, **kw), data, 3, ENGINES[1])
    ref = _run(algorithms.local_only(MODEL, **kw), data, 3, ENGINES[1])
    chex.assert_trees_all_close(st.server.W, ref.clients, atol=1e-7)


# ------------------------------------------- every method: engine guarantees


def _global(state):
    s = state.server
    return getattr(s, "params", None) or getattr(s, "mean", None) or s.W


ALL = {
    "apfl": lambda **k: algorithms.apfl(MODEL, alpha=0.3, **k),
    "l2sgd": lambda **k: algorithms.l2sgd(MODEL, lam=0.5, **k),
    "ewc": lambda **k: algorithms.ewc(MODEL, lam=1.0, finetune_steps=1, **k),
    "skl": lambda **k: algorithms.skl(MODEL, lam=1.0, finetune_steps=1, **k),
    "per_fedavg": lambda **k: algorithms.per_fedavg(MODEL, finetune_steps=1, **k),
    "mapper": lambda **k: algorithms.mapper(MODEL, finetune_steps=1, **k),
    "mocha": lambda **k: algorithms.mocha(MODEL, **k),
}


@pytest.mark.parametrize("name", sorted(ALL))
def test_compiles_once_and_zeroed_attack_freezes_the_shared_model(data, name):
    """Every client malicious with A3 scaled by 0: the uploads are all zero, so
    the shared model (global / wbar / W) never moves, while training runs and
    the round compiles once."""
    chex.clear_trace_counter()
    alg = ALL[name](attack=attacks.model_replacement(0.0),
                    malicious=np.ones(7, bool), **KW)
    state = alg.init(jax.random.key(1), data)
    start = _global(state)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(s, d, k):
        return alg.round_step(s, d, k)

    with execution(UNROLL1):
        for _ in range(3):
            state, metrics = step(state, data, jax.random.key(0))
    assert int(state.round) == 3 and int(metrics["nonfinite_clients"]) == 0
    if name == "mapper":  # selected clients picked a lambda of the grid
        lam = np.asarray(state.clients.lam)
        assert set(lam[lam > 0].tolist()) <= {0.25, 0.5, 0.75} and (lam > 0).sum() >= 3
    assert np.isfinite(float(metrics["train/loss"]))
    chex.assert_trees_all_close(_global(state), start, atol=0)


def test_loss_based_aggregator_composes(data):
    """k-loss needs each client's round-start loss (reported by the upload
    helper APFL, Per-FedAvg and mapper share): APFL with alpha = 0 is FedAvg,
    so with k-loss it must pick exactly FedAvg + k-loss's updates."""
    agg = aggregators.k_loss(1)
    a = _run(algorithms.apfl(MODEL, alpha=0.0, adaptive_alpha=False,
                             aggregator=agg, cohort="size_weighted", **KW), data, 2)
    b = _run(algorithms.fedavg(MODEL, aggregator=agg, cohort="size_weighted", **KW),
             data, 2)
    chex.assert_trees_all_close(a.server.params, b.server.params, atol=1e-6)


@pytest.mark.parametrize("factory,kwargs,match", [
    (algorithms.apfl, dict(alpha=1.5), "alpha"),
    (algorithms.apfl, dict(alpha_lr=-1.0), "alpha_lr"),
    (algorithms.l2sgd, dict(lam=-1.0), "lam"),
    (algorithms.l2sgd, dict(mean_update="running"), "mean_update"),
    (algorithms.l2sgd, dict(aggregator=aggregators.k_loss(1)), "aggregator"),
    (algorithms.l2sgd, dict(attack=attacks.model_replacement()), "malicious"),
    (algorithms.ewc, dict(fisher_batches=0), "fisher_batches"),
    (algorithms.ewc, dict(finetune_steps=0), "finetune_steps"),
    (algorithms.skl, dict(kl_weight="half"), "kl_weight"),
    (algorithms.skl, dict(lam=float("nan")), "lam"),
    (algorithms.per_fedavg, dict(hessian="newton"), "hessian"),
    (algorithms.per_fedavg, dict(beta=0.0), "beta"),
    (algorithms.per_fedavg, dict(delta=-1e-3), "delta"),
    (algorithms.mapper, dict(lam_grid=(0.5, 1.5)), "lam_grid"),
    (algorithms.mapper, dict(lam_grid=()), "lam_grid"),
    (algorithms.mocha, dict(regularizer="l1"), "regularizer"),
    (algorithms.mocha, dict(omega_every=0), "omega_every"),
    (algorithms.mocha, dict(lam1=-1.0), "lam1"),
])
def test_invalid_input(factory, kwargs, match):
    with pytest.raises(ValueError, match=match):
        factory(MODEL, **kwargs)


def test_wrong_malicious_shape_raises(data):
    for name in ("apfl", "l2sgd", "mocha"):
        alg = ALL[name](attack=attacks.model_replacement(), malicious=np.ones(3, bool))
        with pytest.raises(ValueError, match="malicious"):
            alg.init(jax.random.key(0), data)
