"""Ditto (Li et al., ICML 2021): the simulator against the paper's closed forms,
its reductions (lam = 0 is local, lam -> inf is global, the global model is
FedAvg's), the engine guarantees (docs/extending.md §8) and the lambda-selection
modes. Paper: Algs. 1-2, §3.3 and App. A (theory), §4 and App. D.2 (lambda)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import leaves_equal as _leaves_equal
from helpers import rows_changed as _rows_changed
from helpers import run_jitted as _run
from helpers import take as _take

import fedjax_pfl as fp
from fedjax_pfl import aggregators, algorithms, attacks, models
from fedjax_pfl import data as fdata
from fedjax_pfl.algorithms import (
    ditto_expected_mse,
    ditto_expected_variance,
    ditto_lambda_star,
    ditto_linear_regression_solution,
    ditto_point_estimate_solution,
)
from fedjax_pfl.core import EngineConfig, KeyTag, execution, sample_cohort
from fedjax_pfl.core._local import client_loss, local_train, prox_penalty

MODEL = models.logistic_regression((6,), 3)
POINT = models.mean_model(1)

# The paper's Figure 1 configurations (sigma, n, tau, K, K_a, tau_a).
CLEAN = (0.8, 30, 0.1, 8, 0, 0.0)
ADV = (0.8, 30, 0.1, 16, 8, 0.5)


@pytest.fixture(scope="module")
def data():
    """7 clients with train/val/test; some have < 4 validation rows, some more."""
    return fdata.fedprox_synthetic(
        1.0, 1.0, num_clients=7, dim=6, num_classes=3, min_size=20, max_size=80,
        fractions=(0.72, 0.08, 0.2), seed=3)


UNROLL1 = EngineConfig(unroll=1)  # the engine of every _ditto run


def _ditto(**kw):
    base = dict(lam=0.5, client_lr=0.2, personal_lr=0.1, num_local_steps=2,
                personal_steps=3, batch_size=4, cohort_size=3,
                cohort="size_weighted", weighted=False)
    base.update(kw)
    return algorithms.ditto(MODEL, **base)


def _linear_no_bias(dim):
    """``x . w`` with the squared loss: ``F_k = ||X w - y||^2 / (2n)``, no bias."""
    return models.Model(
        lambda key: {"w": jnp.zeros((dim,), jnp.float32)},
        lambda p, x: (x @ p["w"])[:, None],
        models.squared_error,
        lambda out, y: -models.squared_error(out, y))


# ------------------------------------------------- 1. simulator vs closed form


def test_point_estimation_matches_lemma9_and_global_is_mean():
    """Lemma 9's closed form: exact gradients, full participation, r = 1."""
    pe = fdata.point_estimation_problem(num_clients=8, n=30, sigma=0.8, tau=0.1,
                                        seed=0)
    lams = [0.0, 0.5, 2.0, 10.0, 1000.0]

    def make(lam):  # personal rate |1 - 0.8| per step for every lambda
        return algorithms.ditto(POINT, lam=lam, client_lr=0.5,
                                personal_lr=0.8 / (1.0 + lam), num_local_steps=1,
                                personal_steps=3, batch_size=1, cohort="full",
                                sampling="full_batch", weighted=False)

    states, _ = fp.sweep(make, {"lam": lams}, pe.data, num_rounds=40,
                         key=jax.random.key(0), splits=("train",))
    w_star = pe.w_hat.astype(np.float64).mean()
    np.testing.assert_allclose(states.server.params["w"][:, 0], w_star, atol=1e-6)
    personal = np.asarray(states.clients.personal["w"][..., 0])  # [lams, K]
    for i, lam in enumerate(lams):
        np.testing.assert_allclose(
            personal[i], ditto_point_estimate_solution(pe.w_hat, lam), atol=1e-6)
    spread = np.ptp(pe.w_hat)
    assert spread > 0.1  # the models are really different...
    np.testing.assert_allclose(personal[0], pe.w_hat, atol=1e-6)  # ...lam=0: local
    assert np.max(np.abs(personal[-1] - w_star)) < 2e-3 * spread  # lam big: global


def test_linear_regression_matches_eq23_no_bias():
    """X_k^T X_k = beta I and no bias: eq. (23) = eq. (31) of the paper."""
    lr = fdata.linear_regression_problem(num_clients=6, n=20, dim=3, beta=7.0,
                                         sigma=1.0, tau=0.3, seed=1)
    g = 7.0 / 20  # curvature beta/n of every F_k
    lams = [0.0, 0.3, 4.0]

    def make(lam):
        return algorithms.ditto(_linear_no_bias(3), lam=lam, client_lr=0.7 / g,
                                personal_lr=0.7 / (g + lam), num_local_steps=1,
                                personal_steps=2, batch_size=1, cohort="full",
                                sampling="full_batch", weighted=False)

    states, _ = fp.sweep(make, {"lam": lams}, lr.data, num_rounds=40,
                         key=jax.random.key(0), splits=("train",))
    xs = [lr.data.train.client(k)[0] for k in range(6)]
    ys = [lr.data.train.client(k)[1] for k in range(6)]
    for i, lam in enumerate(lams):
        v, w_star = ditto_linear_regression_solution(xs, ys, lam)
        np.testing.assert_allclose(states.server.params["w"][i], w_star, atol=1e-5)
        np.testing.assert_allclose(states.clients.personal["w"][i], v, atol=1e-5)
    np.testing.assert_allclose(w_star, lr.w_ols.mean(0), atol=1e-5)  # Thm 2 setup


def test_linear_regression_with_bias_and_per_client_lam_matches_eq23():
    """The zoo model has a bias (penalized like every parameter): eq. (23) on
    ``[X, 1]``; one lambda per client."""
    lr = fdata.linear_regression_problem(num_clients=6, n=20, dim=3, beta=7.0,
                                         sigma=1.0, tau=0.3, seed=2)
    xs = [np.c_[lr.data.train.client(k)[0], np.ones(20)] for k in range(6)]
    ys = [lr.data.train.client(k)[1] for k in range(6)]
    lam = np.array([0.0, 0.1, 0.5, 1.0, 2.0, 5.0], np.float32)
    grams = [x.T @ x / 20 for x in xs]
    big = max(np.linalg.eigvalsh(gm).max() for gm in grams)
    small = np.linalg.eigvalsh(sum(grams) / 6).min()
    alg = algorithms.ditto(models.linear_regression((3,), 1), lam=jnp.asarray(lam),
                           client_lr=1.0 / big, personal_lr=1.0 / (big + 5.0),
                           num_local_steps=1, personal_steps=5, batch_size=1,
                           cohort="full", sampling="full_batch", weighted=False)
    assert (1 - small / big) ** 150 < 1e-8  # enough rounds for the slowest mode
    state = _run(alg, lr.data, 150)
    v, w_star = ditto_linear_regression_solution(xs, ys, lam)
    p = state.server.params["Dense_0"]
    np.testing.assert_allclose(np.r_[p["kernel"][:, 0], p["bias"]], w_star,
                               atol=1e-5)
    pp = state.clients.personal["Dense_0"]
    np.testing.assert_allclose(np.c_[pp["kernel"][..., 0], pp["bias"]], v,
                               atol=1e-5)
    np.testing.assert_array_equal(state.clients.lam, lam)


# ------------------------------------------------------------- 2. the limits


LOCAL = dict(num_local_steps=3, batch_size=5, cohort="uniform", cohort_size=3)


@pytest.fixture(scope="module")
def local_runs(data):
    """sampling -> the 'local' baseline's final state after 3 rounds."""
    cache = {}

    def get(sampling):
        if sampling not in cache:
            cache[sampling] = _run(algorithms.local_only(
                MODEL, client_lr=0.1, sampling=sampling, **LOCAL), data, 3,
                engine=UNROLL1)
        return cache[sampling]

    return get


@pytest.mark.parametrize("batches,sampling", [("shared", "with_replacement"),
                                              ("independent", "full_batch")])
def test_lam_zero_is_local_training(data, local_runs, batches, sampling):
    """lam = 0 gives the 'local' baseline's models. With shared
    minibatches the personal update draws the same batches as local_only."""
    ditto_state = _run(_ditto(lam=0.0, personal_lr=0.1, personal_steps=3,
                              batches=batches, sampling=sampling, **LOCAL), data, 3,
                       engine=UNROLL1)
    local_state = local_runs(sampling)
    chex.assert_trees_all_close(ditto_state.clients.personal, local_state.clients,
                                atol=1e-6)
    w0 = _ditto().init(jax.random.key(1), data).clients.personal
    assert _rows_changed(w0, local_state.clients).sum() >= 3  # models did train


def test_huge_lam_tracks_round_start_global_model(data):
    """lam = 1e4, personal_lr (1 + lam) = 0.5: v_k -> w^t, the global model
    received at the START of the round (not the one after it), as in Alg. 1."""
    lam = 1e4
    alg = _ditto(lam=lam, personal_lr=0.5 / (1 + lam), personal_steps=20,
                 cohort="full")
    step = jax.jit(alg.round_step)
    states = [alg.init(jax.random.key(1), data)]
    with execution(UNROLL1):
        for _ in range(3):
            states.append(step(states[-1], data, jax.random.key(0))[0])
    before, after = states[-2:]
    w_start, w_end = before.server.params, after.server.params
    gap = lambda a, b: max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(
        jax.tree.leaves(a), jax.tree.leaves(b)))
    moved = gap(w_end, w_start)
    assert moved > 1e-2
    v = after.clients.personal
    assert gap(v, jax.tree.map(lambda a: a[None], w_start)) < 1e-3
    assert gap(v, jax.tree.map(lambda a: a[None], w_end)) > 0.5 * moved


# ------------------------------------------------- 3. modularity: w is FedAvg's


@pytest.mark.parametrize("case", ["clean", "A2+TERM"])
def test_global_trajectory_is_fedavg_bit_for_bit(data, case):
    """Alg. 1: v_k never feeds into w, so Ditto's w^t IS FedAvg's (same cohort,
    aggregator, weighting, attack)."""
    kw = dict(client_lr=0.2, num_local_steps=2, batch_size=4, cohort_size=3,
              cohort="size_weighted")
    if case == "clean":
        kw.update(weighted=False)
    else:  # Ditto + a robust (here: fair) aggregator under attack, the paper's §4.4
        kw.update(cohort="uniform", aggregator=aggregators.tilted_mean(1.0, True),
                  attack=attacks.gaussian_updates(),
                  malicious=attacks.malicious_clients(7, 0.4, seed=1))
    d = _run(algorithms.ditto(MODEL, lam=0.3, **kw), data, 4)
    f = _run(algorithms.fedavg(MODEL, **kw), data, 4)
    _leaves_equal(d.server.params, f.server.params)
    start = algorithms.fedavg(MODEL, **kw).init(jax.random.key(1), data)
    assert _rows_changed(jax.tree.map(lambda a: a[None], start.server.params),
                         jax.tree.map(lambda a: a[None], f.server.params)).all()


# ---------------------------------------------------- 4. engine guarantees


def _loop_rounds(data, key, num_rounds, *, lam, cohort_size, client_lr,
                 personal_lr, num_local_steps, personal_steps, batch_size):
    """Ditto written as a Python loop over clients of one-client updates."""
    state = _ditto().init(jax.random.key(1), data)
    w, v = state.server.params, state.clients.personal
    train = jax.jit(lambda p, c, k, lr, n_steps, pen_lam, anchor: local_train(
        MODEL, p, data.train, c, k, optimizer=optax.sgd(lr), num_steps=n_steps,
        batch_size=batch_size, penalty=prox_penalty(pen_lam, anchor))[0],
        static_argnums=4)
    for t in range(num_rounds):
        rkey = jax.random.fold_in(key, t)
        ids = sample_cohort(jax.random.fold_in(rkey, KeyTag.COHORT), data.train.counts,
                            cohort_size, "size_weighted")
        deltas = []
        for c in np.asarray(ids):
            ck = jax.random.fold_in(jax.random.fold_in(rkey, KeyTag.CLIENT),
                                    data.key_ids[c])
            w_c = train(w, c, ck, client_lr, num_local_steps, 0.0, w)
            deltas.append(jax.tree.map(jnp.subtract, w_c, w))
            v_c = train(_take(v, c), c,
                        jax.random.fold_in(ck, KeyTag.PERSONAL), personal_lr,
                        personal_steps, lam, w)
            v = fp.core.tree_scatter(v, jnp.array([c]), _take(v_c, None))
        w = jax.tree.map(lambda p, *ds: p + sum(ds) / len(ds), w, *deltas)
    return w, v


def test_vmap_equals_map_equals_python_loop(data):
    hp = dict(lam=0.5, cohort_size=5, client_lr=0.2, personal_lr=0.1,
              num_local_steps=2, personal_steps=3, batch_size=4)
    w_loop, v_loop = _loop_rounds(data, jax.random.key(0), 2, **hp)
    for engine in (EngineConfig("vmap", unroll=1), EngineConfig("map", 1, unroll=1)):
        st = _run(_ditto(cohort="size_weighted", **hp), data, 2, engine=engine)
        chex.assert_trees_all_close(st.server.params, w_loop, atol=1e-6)
        chex.assert_trees_all_close(st.clients.personal, v_loop, atol=1e-6)


def test_jit_equals_no_jit():
    pe = fdata.point_estimation_problem(num_clients=5, n=8, seed=0)
    alg = algorithms.ditto(POINT, lam=0.7, client_lr=0.3, personal_lr=0.2,
                           num_local_steps=2, personal_steps=2, batch_size=3,
                           cohort_size=3, cohort="size_weighted", weighted=False)
    state = alg.init(jax.random.key(1), pe.data)
    with execution(EngineConfig("vmap")):
        a, ma = jax.jit(alg.round_step)(state, pe.data, jax.random.key(0))
        with jax.disable_jit():
            b, mb = alg.round_step(state, pe.data, jax.random.key(0))
    assert _rows_changed(state.clients.personal, b.clients.personal).sum() == 3
    chex.assert_trees_all_close(a, b, atol=1e-6)
    np.testing.assert_allclose(ma["train/personal_loss"], mb["train/personal_loss"],
                               rtol=1e-5)


def test_permuting_clients_permutes_personal_models(data):
    perm = np.array([3, 0, 6, 1, 5, 2, 4])
    split = lambda s: [s.client(c) for c in perm]
    permuted = fdata.from_client_arrays(split(data.train), split(data.val),
                                        split(data.test),
                                        client_ids=[data.client_ids[i] for i in perm])
    alg = _ditto(cohort="full", sampling="epoch")
    a, b = _run(alg, data, 2, engine=UNROLL1), _run(alg, permuted, 2, engine=UNROLL1)
    chex.assert_trees_all_close(_take(a.clients, perm), b.clients, atol=1e-6)
    chex.assert_trees_all_close(a.server.params, b.server.params, atol=1e-6)


# ---------------------------------------------- 5. state: w^0 start, selection


def test_personal_models_start_at_w0_and_only_selected_clients_change(data):
    """v_k starts at w^0 and changes only in rounds where k is selected (Alg. 1);
    also compiles once across rounds."""
    alg = _ditto(cohort_size=2, cohort="size_weighted")
    state = alg.init(jax.random.key(1), data)
    chex.assert_trees_all_equal(
        state.clients.personal,
        jax.tree.map(lambda a: jnp.broadcast_to(a, (7, *a.shape)),
                     state.server.params))

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(s, d, k):
        return alg.round_step(s, d, k)

    key, seen = jax.random.key(9), set()
    for t in range(4):
        rkey = jax.random.fold_in(key, t)
        ids = set(np.asarray(sample_cohort(jax.random.fold_in(rkey, KeyTag.COHORT),
                                           data.train.counts, 2,
                                           "size_weighted")).tolist())
        with execution(UNROLL1):
            new, _ = step(state, data, key)
        changed = _rows_changed(state.clients.personal, new.clients.personal)
        assert set(np.flatnonzero(changed).tolist()) == ids
        same = ~changed
        _leaves_equal(_take(state.clients.personal, same),
                      _take(new.clients.personal, same))
        state, seen = new, seen | ids
    assert int(state.round) == 4
    never = np.setdiff1d(np.arange(7), sorted(seen))
    assert len(never) > 0  # precondition of the check below (fixed key)
    w0 = alg.init(jax.random.key(1), data).server.params
    for c in never:  # never selected: still w^0
        chex.assert_trees_all_equal(_take(state.clients.personal, c), w0)


# --------------------------------------------------------- 6. sweep over lam


def test_sweep_over_lam_equals_separate_runs(data):
    lams = [0.0, 0.5, 3.0]
    make = lambda lam: _ditto(lam=lam)
    run = dict(num_rounds=4, eval_every=2, key=jax.random.key(3), splits=("test",))
    states, hist = fp.sweep(make, {"lam": lams}, data, engine=UNROLL1, **run)
    for i, lam in enumerate(lams):
        res = fp.simulate(make(lam), data, progress=False, engine=UNROLL1, **run)
        chex.assert_trees_all_close(_take(states.clients, i), res.state.clients,
                                    atol=1e-5)
        chex.assert_trees_all_close(_take(states.server.params, i),
                                    res.state.server.params, atol=1e-5)
        for k in ("personal/test/loss/mean", "global/test/accuracy/mean"):
            np.testing.assert_allclose(hist[k][i], [r[k] for r in res.history],
                                       atol=1e-5)
    assert not np.allclose(states.clients.personal["Dense_0"]["kernel"][0],
                           states.clients.personal["Dense_0"]["kernel"][2])


# ------------------------------------------------------ 7. per-client lambda


def test_per_client_lam_vector(data, local_runs):
    kw = dict(batches="shared", personal_lr=0.1, personal_steps=3, **LOCAL)
    c = 2.0
    scalar = _run(_ditto(lam=c, **kw), data, 3, engine=UNROLL1)
    vector = _run(_ditto(lam=jnp.full((7,), c), **kw), data, 3, engine=UNROLL1)
    chex.assert_trees_all_close(scalar.clients, vector.clients, atol=1e-6)
    _leaves_equal(scalar.server.params, vector.server.params)
    mixed = _run(_ditto(lam=jnp.array([0.0] + [c] * 6), **kw), data, 3,
                 engine=UNROLL1)
    local = local_runs("with_replacement")
    first = lambda t: jax.tree.map(lambda a: a[:1], t)
    rest = lambda t: jax.tree.map(lambda a: a[1:], t)
    chex.assert_trees_all_close(first(mixed.clients.personal), first(local.clients),
                                atol=1e-6)  # client 0 (lam = 0): local training
    chex.assert_trees_all_close(rest(mixed.clients.personal),
                                rest(scalar.clients.personal), atol=1e-6)
    assert _rows_changed(scalar.clients.personal, local.clients)[0]  # lam matters


# ----------------------------------------------------- 8. lambda selection


GRID, FALLBACK = (0.0, 0.5, 5.0), 0.25


def _expected_selection(data, alg_state, key, metric, grid, fallback, min_val, *,
                        lr, steps, batch_size):
    """Per client: train v from w^0 with each candidate (the round's personal
    batches), keep the best on validation; the fallback below ``min_val`` rows."""
    w = alg_state.server.params
    rkey = jax.random.fold_in(key, 0)

    @jax.jit
    def candidate(c, lam_c):
        ck = jax.random.fold_in(jax.random.fold_in(rkey, KeyTag.CLIENT),
                                data.key_ids[c])
        pk = jax.random.fold_in(ck, KeyTag.PERSONAL)
        v = local_train(MODEL, w, data.train, c, pk,
                        optimizer=optax.sgd(lr), num_steps=steps,
                        batch_size=batch_size, penalty=prox_penalty(lam_c, w))[0]
        score = client_loss(MODEL, v, data.val, c, metric=metric == "accuracy")
        return v, jnp.where(metric == "accuracy", -score, score)

    lams, vs, decisive = [], [], 0
    for c in range(data.num_clients):
        outs = [candidate(c, jnp.float32(lc)) for lc in grid + (fallback,)]
        scores = [float(o[1]) for o in outs[:len(grid)]]
        if int(data.val.counts[c]) < min_val:
            i = len(grid)
        else:  # first best on ties, as argmin
            i = int(np.argmin(scores))
            decisive += scores[i] < max(scores)
        lams.append((grid + (fallback,))[i])
        vs.append(outs[i][0])
    assert decisive >= 2  # the scores really discriminate between candidates
    return np.asarray(lams, np.float32), jax.tree.map(lambda *a: jnp.stack(a), *vs)


@pytest.mark.parametrize("metric,kw,grid,fallback,min_val", [
    ("loss", dict(lam_grid=GRID, fallback_lam=FALLBACK), GRID, FALLBACK, 4),
    ("accuracy", dict(lam_grid=GRID, fallback_lam=FALLBACK, min_val_examples=5),
     GRID, FALLBACK, 5),
    # the paper's strong-attack defaults: grid {0.05, 0.1, 0.2}, fallback 0.1
    ("loss", dict(strong_attack=True), (0.05, 0.1, 0.2), 0.1, 4),
])
def test_paper_selection_keeps_best_validation_candidate(data, metric, kw, grid,
                                                         fallback, min_val):
    counts = np.asarray(data.val.counts)
    assert (counts < min_val).any() and (counts >= min_val).any()  # both rules
    alg = _ditto(lam_selection="paper", selection_metric=metric, cohort="full",
                 personal_lr=0.3, personal_steps=4, **kw)
    state = alg.init(jax.random.key(1), data)
    assert np.all(np.asarray(state.clients.lam) == 0.5)  # the lam argument
    with execution(UNROLL1):
        new, metrics = jax.jit(alg.round_step)(state, data, jax.random.key(0))
    lams, vs = _expected_selection(data, state, jax.random.key(0), metric, grid,
                                   fallback, min_val, lr=0.3, steps=4, batch_size=4)
    got = np.asarray(new.clients.lam)
    assert set(got[counts >= min_val].tolist()) <= set(np.float32(grid).tolist())
    np.testing.assert_array_equal(got[counts < min_val], np.float32(fallback))
    np.testing.assert_array_equal(got, lams)
    np.testing.assert_allclose(metrics["train/lam"], got.mean(), rtol=1e-6)
    chex.assert_trees_all_close(new.clients.personal, vs, atol=1e-5)


def test_greedy_step_lams_in_grid_and_one_step_equals_paper_rule(data):
    grid, fallback = (0.0, 0.5, 5.0), 0.5  # fallback in the grid
    kw = dict(lam_grid=grid, fallback_lam=fallback, cohort="full", personal_lr=0.3)
    # With one personal step, per-step greedy selection IS the paper rule (and
    # the paper rule's vmap over candidates inside a vmapped cohort == map's).
    a = _run(_ditto(lam_selection="greedy_step", personal_steps=1, **kw), data, 2,
             engine=UNROLL1)
    b = _run(_ditto(lam_selection="paper", personal_steps=1, **kw), data, 2,
             engine=EngineConfig("vmap", unroll=1))
    got = np.asarray(a.clients.lam)
    assert set(got.tolist()) <= set(grid)
    np.testing.assert_array_equal(got[np.asarray(data.val.counts) < 4], fallback)
    np.testing.assert_array_equal(a.clients.lam, b.clients.lam)
    chex.assert_trees_all_close(a.clients.personal, b.clients.personal, atol=1e-6)


@pytest.mark.parametrize("mode", ["paper", "greedy_step"])
def test_selection_needs_a_validation_split(mode):
    no_val = fdata.fedprox_synthetic(1.0, 1.0, num_clients=4, dim=6, num_classes=3,
                                     min_size=10, max_size=20,
                                     fractions=(0.8, 0.0, 0.2))
    assert no_val.val is None
    with pytest.raises(ValueError, match="lam_selection"):
        _ditto(lam_selection=mode).init(jax.random.key(0), no_val)


# ---------------------------------------------------------- 9. validation


@pytest.mark.parametrize("kw,name", [
    (dict(lam=-0.1), "lam"),
    (dict(lam=float("nan")), "lam"),
    (dict(lam=jnp.ones((2, 7))), "lam"),
    (dict(batches="shared", personal_steps=3, num_local_steps=2), "personal_steps"),
    (dict(batches="bogus"), "batches"),
    (dict(lam_selection="oracle"), "lam_selection"),
    (dict(lam_selection="paper", lam_grid=(0.1, -1.0)), "lam_grid"),
    (dict(selection_metric="f1"), "selection_metric"),
    (dict(min_val_examples=-1), "min_val_examples"),
    (dict(attack=attacks.model_replacement()), "malicious"),
    (dict(personal_lr=0.0), "personal_lr"),
])
def test_invalid_arguments_raise_at_construction(kw, name):
    with pytest.raises(ValueError, match=name):
        _ditto(**kw)


def test_invalid_arguments_raise_against_data(data):
    with pytest.raises(ValueError, match="lam"):
        _ditto(lam=jnp.ones(5)).init(jax.random.key(0), data)
    with pytest.raises(ValueError, match="malicious"):
        _ditto(attack=attacks.gaussian_updates(),
               malicious=np.zeros(5, bool)).init(jax.random.key(0), data)
    alg = _ditto(lam=jnp.ones(7))
    state = alg.init(jax.random.key(0), data)
    smaller = fdata.fedprox_synthetic(1.0, 1.0, num_clients=5, dim=6, num_classes=3,
                                      min_size=10, max_size=20)
    with pytest.raises(ValueError, match="lam"):
        alg.round_step(state, smaller, jax.random.key(0))


# ------------------------------------------------ 10. the paper's oracles


def test_lambda_star_and_mse_constants_of_figure_1():
    """The Figure 1 configurations' constants (Theorems 6 and 8, Lemmas 10-12)."""
    assert ditto_lambda_star(*CLEAN) == pytest.approx(2.1333, abs=1e-4)
    assert ditto_lambda_star(*CLEAN) == pytest.approx(0.8**2 / (30 * 0.1**2))
    assert ditto_lambda_star(*ADV) == pytest.approx(1.18519, abs=1e-5)
    for cfg, opt, glob in ((CLEAN, 0.0086241, 0.0114167),
                           (ADV, 0.0104859, 0.0182083)):
        ls = ditto_lambda_star(*cfg)
        assert ditto_expected_mse(ls, *cfg) == pytest.approx(opt, abs=1e-7)
        assert ditto_expected_mse(0.0, *cfg) == pytest.approx(0.0213333, abs=1e-7)
        assert ditto_expected_mse(np.inf, *cfg) == pytest.approx(glob, abs=1e-7)
        assert ditto_expected_mse(1e9, *cfg) == pytest.approx(glob, abs=1e-7)
    assert ditto_expected_variance(ditto_lambda_star(*CLEAN), *CLEAN) == \
        pytest.approx(1.2439e-4, rel=1e-3)
    assert ditto_expected_variance(ditto_lambda_star(*ADV), *ADV) == \
        pytest.approx(1.7586e-4, rel=1e-3)
    # Linear regression, X^T X = beta I (App. A.2): lam* does not depend on beta.
    lr_cfg = (1.0, 40, 0.3, 10, 3, 1.5)
    ls = ditto_lambda_star(*lr_cfg)
    assert ls == pytest.approx(0.15432, abs=1e-5)
    for lam, want in ((ls, 0.41304), (0.0, 0.71429), (np.inf, 0.80043)):
        assert ditto_expected_mse(lam, *lr_cfg, beta=7.0, dim=5) == \
            pytest.approx(want, abs=1e-5)
    # Trends of the closed form: lam* decreases with n, tau, K_a and tau_a.
    assert ditto_lambda_star(0.8, 60, 0.1, 16, 8, 0.5) < ditto_lambda_star(*ADV)
    assert ditto_lambda_star(0.8, 30, 0.2, 16, 8, 0.5) < ditto_lambda_star(*ADV)
    assert ditto_lambda_star(0.8, 30, 0.1, 16, 10, 0.5) < ditto_lambda_star(*ADV)
    assert ditto_lambda_star(0.8, 30, 0.1, 16, 8, 0.7) < ditto_lambda_star(*ADV)
    assert ditto_lambda_star(0.8, 30, 0.0, 8) == np.inf


@pytest.mark.parametrize("cfg", [CLEAN, ADV, (1.0, 20, 0.5, 20, 0, 0.0),
                                 (0.5, 10, 0.25, 10, 3, 0.1)])
def test_mse_is_minimized_at_lambda_star(cfg):
    grid = np.arange(0.0, 20.0, 1e-3)
    mse = ditto_expected_mse(grid, *cfg)
    ls = ditto_lambda_star(*cfg)
    assert abs(grid[np.argmin(mse)] - ls) <= 1e-3
    # Lemma 12: the minimum is the Bayes posterior variance sigma_w^2.
    sigma, n, tau, k, ka, tau_a = cfg
    a = k * tau**2 + sigma**2 / n + ka / (k - 1) * (tau_a**2 - tau**2)
    assert mse.min() == pytest.approx(1.0 / (n / sigma**2 + (k - 1) / a), rel=1e-6)
    assert mse.min() < min(ditto_expected_mse(0.0, *cfg),
                           ditto_expected_mse(np.inf, *cfg))


def test_paper_grid_argmins_and_variance_caveat():
    """On the authors' notebook's lambda grid (Figure 1): the MSE argmins, and under
    attack the variance minimized only near lam* (see expected_variance)."""
    grid = np.r_[np.arange(0, 3, 0.2), np.arange(3, 10, 0.5), np.arange(10, 200, 10)]
    assert grid[np.argmin(ditto_expected_mse(grid, *CLEAN))] == pytest.approx(2.2)
    assert grid[np.argmin(ditto_expected_mse(grid, *ADV))] == pytest.approx(1.2)
    fine = np.arange(0.0, 10.0, 1e-3)
    clean_var = ditto_expected_variance(fine, *CLEAN)
    assert abs(fine[np.argmin(clean_var)] - ditto_lambda_star(*CLEAN)) < 2e-3
    adv_var = ditto_expected_variance(fine, *ADV)
    assert fine[np.argmin(adv_var)] == pytest.approx(1.396, abs=0.01)  # not lam*
    at_star = ditto_expected_variance(ditto_lambda_star(*ADV), *ADV)
    assert adv_var.min() < at_star < 1.02 * adv_var.min()
    assert at_star < 0.5 * min(ditto_expected_variance(0.0, *ADV),
                               ditto_expected_variance(np.inf, *ADV))


def _monte_carlo(lams, sigma, n, tau, k, ka, tau_a, trials, seed):
    """The authors' notebook generator (point_estimation.ipynb): adversaries first."""
    rng = np.random.default_rng(seed)
    w = np.concatenate([rng.normal(0, tau_a, (trials, ka)),
                        rng.normal(0, tau, (trials, k - ka))], 1)
    w_hat = w + rng.normal(0, sigma / np.sqrt(n), (trials, k))
    out = []
    for lam in lams:
        v = ditto_point_estimate_solution(w_hat.T, lam).T  # Lemma 9 per trial
        e2 = (v - w)[:, ka:] ** 2
        out.append((e2.mean(), e2.var(axis=1).mean()))
    return np.asarray(out)


@pytest.mark.parametrize("cfg", [CLEAN, ADV])
def test_monte_carlo_matches_closed_forms(cfg):
    lams = [0.0, 0.5, ditto_lambda_star(*cfg), 5.0, 100.0]
    mc = _monte_carlo(lams, *cfg, trials=200_000, seed=0)
    np.testing.assert_allclose(mc[:, 0], ditto_expected_mse(np.asarray(lams), *cfg),
                               rtol=0.01)
    np.testing.assert_allclose(mc[:, 1],
                               ditto_expected_variance(np.asarray(lams), *cfg),
                               rtol=0.03)


def test_point_estimate_solution_is_the_minimizer():
    rng = np.random.default_rng(0)
    w_hat, lam = rng.normal(size=6), np.array([0.0, 0.3, 1.0, 2.0, 7.0, 50.0])
    v = ditto_point_estimate_solution(w_hat, lam)
    w_star = w_hat.mean()
    np.testing.assert_allclose(v + lam * (v - w_star), w_hat)  # grad h_k = 0
    # Lemma 9's second form: alpha w_hat_k + (1 - alpha) mean of the others.
    alpha = (6 + lam) / (6 * (1 + lam))
    others = (w_hat.sum() - w_hat) / 5
    np.testing.assert_allclose(v, alpha * w_hat + (1 - alpha) * others)
    np.testing.assert_allclose(ditto_point_estimate_solution(w_hat, np.inf), w_star)
    # A point estimate is least squares on a column of ones (beta = n).
    xs = [np.ones((4, 1))] * 6
    ys = [np.full(4, x) for x in w_hat]
    v_lr, w_lr = ditto_linear_regression_solution(xs, ys, lam)
    np.testing.assert_allclose(v_lr[:, 0], v)
    np.testing.assert_allclose(w_lr, [w_star])


def test_linear_regression_solution_eq31_and_lemma1():
    lr = fdata.linear_regression_problem(num_clients=5, n=12, dim=3, beta=4.0,
                                         seed=3)
    xs = [lr.data.train.client(k)[0] for k in range(5)]
    ys = [lr.data.train.client(k)[1] for k in range(5)]
    ols = np.asarray([np.linalg.lstsq(x, y[:, 0], rcond=None)[0]
                      for x, y in zip(xs, ys)])
    lams = [0.0, 0.1, 1.0, 10.0, 1e3]
    losses, dists = [], []
    for lam in lams:
        v, w_star = ditto_linear_regression_solution(xs, ys, lam)
        beta, n, k = 4.0, 12, 5  # eq. (31)
        eq31 = n / (beta + n * lam) * ((beta / n + lam / k) * ols
                                        + lam / k * (ols.sum(0) - ols))
        np.testing.assert_allclose(v, eq31, atol=1e-4)  # float32 data
        losses.append([np.sum((x @ vk - y[:, 0]) ** 2) for x, y, vk in
                       zip(xs, ys, v)])
        dists.append(np.linalg.norm(v - w_star, axis=1))
    losses, dists = np.asarray(losses), np.asarray(dists)
    assert np.all(np.diff(losses, axis=0) >= -1e-9)  # Lemma 1
    assert np.all(np.diff(dists, axis=0) <= 1e-9)
    np.testing.assert_allclose(ditto_linear_regression_solution(xs, ys, 0.0)[0], ols,
                               atol=1e-5)


@pytest.mark.parametrize("cfg", [CLEAN, ADV], ids=["clean", "adversarial"])
def test_simulator_lambda_star_beats_local_and_global(cfg):
    """The simulator on 32 seeds of the Figure 1 problem: the mean benign squared
    error of (v_k - w_k) is lowest at lam* (failure probability < 1e-3 by
    Monte Carlo of the closed form; every seed runs in one vmapped program)."""
    sigma, n, tau, k, ka, tau_a = cfg
    problems = [fdata.point_estimation_problem(
        num_clients=k, num_malicious=ka, n=n, sigma=sigma, tau=tau, tau_a=tau_a,
        seed=s) for s in range(32)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *[p.data for p in problems])
    w_true = np.stack([p.w_true for p in problems])  # [S, K]
    lams = jnp.array([0.0, ditto_lambda_star(*cfg), 100.0])

    def run(lam, d):
        alg = algorithms.ditto(POINT, lam=lam, client_lr=0.5,
                               personal_lr=0.8 / (1 + lam), num_local_steps=1,
                               personal_steps=2, cohort="full", sampling="full_batch",
                               weighted=False)
        state = fp.core.run_rounds(alg, alg.init(jax.random.key(0), d), d,
                                   jax.random.key(1), 30)[0]
        return state.clients.personal["w"][:, 0]

    v = jax.jit(jax.vmap(jax.vmap(run, (None, 0)), (0, None)))(lams, stacked)
    err = ((np.asarray(v) - w_true[None]) ** 2)[:, :, ka:].mean(axis=(1, 2))
    assert err[1] < err[0] and err[1] < err[2], err
    # and each seed's run is the closed form (Lemma 9)
    w_hat = np.stack([p.w_hat for p in problems])
    np.testing.assert_allclose(
        v[1], ditto_point_estimate_solution(w_hat.T, float(lams[1])).T, atol=1e-5)


def test_closed_forms_validate_their_inputs():
    with pytest.raises(ValueError, match="num_clients"):
        ditto_lambda_star(0.8, 30, 0.1, 1)
    with pytest.raises(ValueError, match="num_malicious"):
        ditto_lambda_star(0.8, 30, 0.1, 8, 8, 0.5)
    with pytest.raises(ValueError, match="lam"):
        ditto_expected_mse(-1.0, *CLEAN)
    with pytest.raises(ValueError, match="lam"):
        ditto_point_estimate_solution([0.0, 1.0], -0.5)
    with pytest.raises(ValueError, match="xs, ys"):
        ditto_linear_regression_solution([np.ones((3, 1))], [], 1.0)
    with pytest.raises(ValueError, match="beta"):
        ditto_expected_mse(1.0, *CLEAN, beta=0.0)


def test_finetune_step_counts_share_one_stream(data):
    """A tuple of finetuning step counts gives one view per count; a count's view
    equals finetuning with that int, and the proximal term pulls toward w."""
    key = jax.random.key(3)
    one = _ditto(finetune_steps=4, finetune_lam=0.0)
    many = _ditto(finetune_steps=(4,), finetune_lam=0.0)
    state = one.init(key, data)
    with execution(UNROLL1):
        a = one.eval_models(state, data, key)["finetuned"].params
        b = many.eval_models(state, data, key)["finetuned_4"].params
        views = _ditto(finetune_steps=(1, 6), finetune_lam=0.0).eval_models(
            state, data, key)
        prox = _ditto(finetune_steps=6, finetune_lam=5.0).eval_models(state, data,
                                                                      key)
    _leaves_equal(a, b)
    assert set(views) == {"global", "personal", "finetuned_1", "finetuned_6"}
    w = state.server.params

    def dist(p):
        return float(sum(jnp.sum((x - y[None]) ** 2) for x, y in
                         zip(jax.tree.leaves(p), jax.tree.leaves(w))))

    assert dist(views["finetuned_1"].params) < dist(views["finetuned_6"].params)
    assert dist(prox["finetuned"].params) < dist(views["finetuned_6"].params)
    with pytest.raises(ValueError, match="finetune_steps"):
        _ditto(finetune_steps=(0, 3))
