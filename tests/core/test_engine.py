"""The engine's central guarantees (docs/extending.md §8)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedjax_pfl as fp
from fedjax_pfl import algorithms, models
from fedjax_pfl import data as fdata
from fedjax_pfl.core import EngineConfig, KeyTag, execution
from fedjax_pfl.core._local import local_train

MODEL = models.mlp((12,), 4, hidden=(8,))
VMAP = EngineConfig("vmap")


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(
        1.0, 1.0, num_clients=7, dim=12, num_classes=4, max_size=40, min_size=9,
        seed=3,
    )


def _alg(**kw):
    base = dict(client_lr=0.1, num_local_steps=3, batch_size=5, cohort="full",
                cohort_size=7)
    base.update(kw)
    return algorithms.fedavg(MODEL, **base)


def _one_round(alg, data, key=jax.random.key(0), jit=True, engine=VMAP):
    state = alg.init(jax.random.key(1), data)
    step = jax.jit(alg.round_step) if jit else alg.round_step
    with execution(engine):
        return state, step(state, data, key)


def test_round_equals_python_loop_over_clients(data):
    """vmap == lax.map == unrolled == a Python loop of one jitted client update
    per client; local steps as a lax.scan (unroll=1) == as a Python loop."""
    key = jax.random.key(0)
    state, (new_vmap, _) = _one_round(_alg(), data, key, engine=VMAP)
    _, (new_map, _) = _one_round(_alg(), data, key, engine=EngineConfig("map", 2))
    _, (new_map1, _) = _one_round(_alg(), data, key,
                                  engine=EngineConfig("map", 1, unroll=1))
    _, (new_unr, _) = _one_round(_alg(), data, key,
                                 engine=EngineConfig("unroll", unroll=True))
    w = state.server.params
    rkey = jax.random.fold_in(jax.random.fold_in(key, 0), KeyTag.CLIENT)
    train = jax.jit(lambda c, k: local_train(
        MODEL, w, data.train, c, k, optimizer=optax.sgd(0.1), num_steps=3,
        batch_size=5)[0])
    deltas, weights = [], []
    for c in range(data.num_clients):
        ck = jax.random.fold_in(rkey, data.key_ids[c])
        deltas.append(jax.tree.map(jnp.subtract, train(c, ck), w))
        weights.append(float(data.train.counts[c]))
    weights = np.asarray(weights) / np.sum(weights)
    expected = jax.tree.map(
        lambda p, *d: p + sum(wi * di for wi, di in zip(weights, d)), w, *deltas)
    chex.assert_trees_all_close(new_vmap.server.params, expected, atol=1e-6)
    chex.assert_trees_all_close(new_map.server.params, expected, atol=1e-6)
    chex.assert_trees_all_close(new_unr.server.params, expected, atol=1e-6)
    # same client order and summation order as map with one client per step
    chex.assert_trees_all_close(new_unr.server.params, new_map1.server.params,
                                atol=1e-7)


def test_jit_equals_no_jit(data):
    alg = _alg()
    _, (a, ma) = _one_round(alg, data, jit=True)
    with jax.disable_jit():
        _, (b, mb) = _one_round(alg, data, jit=False)
    chex.assert_trees_all_close(a.server.params, b.server.params, atol=1e-6)
    np.testing.assert_allclose(ma["train/loss"], mb["train/loss"], rtol=1e-5)


def test_fedavg_one_full_batch_step_is_centralized_gd(data):
    alg = _alg(num_local_steps=1, sampling="full_batch")
    state = alg.init(jax.random.key(1), data)
    w = state.server.params
    x, y = data.train.x, data.train.y
    pooled = jax.jit(jax.grad(
        lambda p: jnp.mean(MODEL.loss(MODEL.apply(p, x), y))))
    step = jax.jit(alg.round_step)
    with execution(VMAP):
        for _ in range(4):
            state, _ = step(state, data, jax.random.key(0))
            w = jax.tree.map(lambda a, g: a - 0.1 * g, w, pooled(w))
    chex.assert_trees_all_close(state.server.params, w, atol=1e-5)


def test_compiles_once_across_rounds(data):
    alg = _alg(cohort="uniform", cohort_size=3)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(state, d, key):
        return alg.round_step(state, d, key)

    state = alg.init(jax.random.key(0), data)
    with execution(VMAP):
        for _ in range(4):
            state, _ = step(state, data, jax.random.key(0))
    assert int(state.round) == 4


def test_same_key_same_history_and_different_key_differs(data):
    alg = _alg(cohort="uniform", cohort_size=3)
    run = lambda k: fp.simulate(alg, data, num_rounds=4, eval_every=2,
                                key=jax.random.key(k), progress=False,
                                engine=VMAP).history
    h1, h2, h3 = run(0), run(0), run(1)
    strip = lambda h: [{k: v for k, v in r.items() if k != "seconds"} for r in h]
    assert strip(h1) == strip(h2)
    assert strip(h1) != strip(h3)
    assert [r["round"] for r in h1] == [0, 2, 4]


def test_permuting_clients_permutes_per_client_results(data):
    perm = np.array([3, 0, 6, 1, 5, 2, 4])
    clients = [data.train.client(c) for c in range(data.num_clients)]
    tests = [data.test.client(c) for c in range(data.num_clients)]
    ids = data.client_ids
    permuted = fdata.from_client_arrays(
        [clients[i] for i in perm], None, [tests[i] for i in perm],
        client_ids=[ids[i] for i in perm])
    alg = algorithms.local_only(MODEL, client_lr=0.1, num_local_steps=3,
                                batch_size=5, cohort="full", cohort_size=7)
    st_a = fp.simulate(alg, data, num_rounds=2, key=jax.random.key(0),
                       progress=False).state
    st_b = fp.simulate(alg, permuted, num_rounds=2, key=jax.random.key(0),
                       progress=False).state
    chex.assert_trees_all_close(
        jax.tree.map(lambda a: a[perm], st_a.clients), st_b.clients, atol=1e-6)
    ev = lambda st, d: fp.metrics.evaluate_split(
        fp.core.ModelView(MODEL, st.clients, True), d.test)["accuracy"]
    np.testing.assert_allclose(np.asarray(ev(st_a, data))[perm],
                               ev(st_b, permuted), atol=1e-6)


def test_sharded_equals_unsharded(data):
    assert jax.device_count() >= 4, "conftest sets 4 fake CPU devices"
    mesh = jax.make_mesh((4,), ("clients",),
                         axis_types=(jax.sharding.AxisType.Auto,))
    kw = dict(cohort="uniform", cohort_size=4)
    a = fp.simulate(_alg(**kw), data, num_rounds=3, key=jax.random.key(0),
                    progress=False, engine=VMAP)
    b = fp.simulate(_alg(**kw), data, num_rounds=3, key=jax.random.key(0),
                    progress=False, engine=EngineConfig("vmap", mesh=mesh))
    chex.assert_trees_all_close(a.state.server.params, b.state.server.params,
                                atol=1e-6)


def test_local_only_unselected_clients_untouched(data):
    alg = algorithms.local_only(MODEL, client_lr=0.1, num_local_steps=2,
                                batch_size=4, cohort_size=2)
    state = alg.init(jax.random.key(0), data)
    new, _ = jax.jit(alg.round_step)(state, data, jax.random.key(5))
    changed = np.asarray(jnp.any(new.clients["Dense_0"]["kernel"]
                                 != state.clients["Dense_0"]["kernel"], axis=(1, 2)))
    assert changed.sum() == 2


def test_size_weighted_cohort_prefers_large_clients():
    counts = jnp.array([1, 1, 1, 1000])
    hits = sum(int(3 in fp.core.sample_cohort(jax.random.key(i), counts, 1,
                                               "size_weighted"))
               for i in range(200))
    assert hits > 190
    ids = fp.core.sample_cohort(jax.random.key(0), jnp.ones(10, jnp.int32), 4,
                                "uniform")
    assert len(set(np.asarray(ids).tolist())) == 4


def test_finetune_improves_local_fit(data):
    alg = _alg(finetune_steps=20, cohort="uniform", cohort_size=3)
    res = fp.simulate(alg, data, num_rounds=2, key=jax.random.key(0),
                      progress=False, splits=("train",), engine=VMAP)
    last = res.history[-1]
    assert (last["finetuned/train/accuracy/mean"]
            > last["global/train/accuracy/mean"])


def test_traced_learning_rate_allowed(data):
    def loss_after(lr):
        alg = _alg(client_lr=lr)
        st, (new, _) = _one_round(alg, data, jit=False)
        return optax.tree.norm(new.server.params)

    out = jax.jit(jax.vmap(loss_after))(jnp.array([0.01, 0.1]))
    assert out.shape == (2,) and np.all(np.isfinite(out))


def test_active_steps_equal_fewer_steps():
    """Client-dependent step counts (epochs): steps past ``active_steps`` are
    no-ops, so 10 steps with 3 active == 3 steps (full-batch: same batches)."""
    fed = fdata.fedprox_synthetic(1.0, 1.0, num_clients=3, max_size=50, seed=1)
    model = models.logistic_regression((60,), 10)
    p0 = model.init(jax.random.key(0))
    kw = dict(optimizer=optax.sgd(0.1), batch_size=4, sampling="full_batch")
    cid, key = jnp.int32(1), jax.random.key(2)
    short, loss_s = local_train(model, p0, fed.train, cid, key, num_steps=3, **kw)
    long, loss_l = local_train(model, p0, fed.train, cid, key, num_steps=10,
                               active_steps=jnp.int32(3), **kw)
    full, _ = local_train(model, p0, fed.train, cid, key, num_steps=10, **kw)
    chex.assert_trees_all_close(short, long, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(loss_s, loss_l, rtol=1e-6)
    assert not np.allclose(jax.tree.leaves(full)[0], jax.tree.leaves(short)[0])
