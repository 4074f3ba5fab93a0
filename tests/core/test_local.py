"""The local-training layer: epochs with drop_last, per-client trip counts (a
client costs its own steps, not the largest client's), any optax optimizer, and
the lifted algorithms equal to a per-client loop with each client's own steps."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_pfl import algorithms, models, privacy
from fedjax_pfl import data as fdata
from fedjax_pfl.core import (
    EngineConfig,
    KeyTag,
    client_loss,
    client_steps,
    execution,
    local_train,
    make_local_config,
    run_local,
)
from fedjax_pfl.core._clients import client_keys
from fedjax_pfl.core._local import passes_needed, prox_penalty

MODEL = models.mlp((6,), 3, hidden=(5,))
SIZES = (23, 7, 12, 3, 16)
B = 5


@pytest.fixture(scope="module")
def fed():
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(n, 6)).astype(np.float32),
                rng.integers(0, 3, size=n)) for n in SIZES]
    return fdata.from_client_arrays(clients)


def _own_steps(epochs, drop_last):
    n = np.asarray(SIZES)
    if drop_last:
        return np.floor(epochs * (n // B)).astype(int)
    return np.maximum(1, np.ceil(epochs * n / B)).astype(int)


@pytest.mark.parametrize("epochs, drop_last", [(1.0, False), (1.0, True),
                                               (2.0, True), (0.5, False)])
def test_client_steps(fed, epochs, drop_last):
    cfg = make_local_config(0.1, 1, B, "epoch", epochs, drop_last=drop_last)
    own = _own_steps(epochs, drop_last)
    for c in range(len(SIZES)):
        bound, steps = client_steps(cfg, fed.train, jnp.int32(c))
        assert bound == max(1, own.max()) and int(steps) == own[c]
    assert client_steps(make_local_config(0.1, 4, B, "epoch"), fed.train,
                        jnp.int32(0)) == (4, None)


def test_drop_last_passes_are_whole_batches_of_one_permutation(fed):
    """Client 0 (23 rows, B=5), 2 epochs with drop_last: 2 passes of 4 whole
    batches; each pass draws 20 distinct rows of the client; passes differ."""
    rows, mask = fdata.client_batch_indices(
        fed.train, jnp.int32(0), jax.random.key(3), num_steps=8, batch_size=B,
        sampling="epoch", drop_last=True, num_passes=2)
    rows = np.asarray(rows)
    assert rows.shape == (8, B) and np.all(np.asarray(mask) == 1)
    for p in (rows[:4].ravel(), rows[4:].ravel()):
        assert len(set(p.tolist())) == 20 and p.min() >= 0 and p.max() < 23
    assert not np.array_equal(rows[:4], rows[4:])
    # without drop_last a pass is ceil(23/5) = 5 batches: the first 23 positions
    # are the whole client once, the last 2 come from the next permutation
    rows, _ = fdata.client_batch_indices(
        fed.train, jnp.int32(0), jax.random.key(3), num_steps=5, batch_size=B,
        sampling="epoch", num_passes=2)
    assert sorted(np.asarray(rows).ravel()[:23].tolist()) == list(range(23))


def test_batches_do_not_depend_on_the_step_bound(fed):
    """A client's batches are the same whatever the static bound (so running
    its own number of steps equals the masked run to the bound)."""
    for drop_last in (False, True):
        kw = dict(batch_size=B, sampling="epoch", drop_last=drop_last, num_passes=3)
        a, _ = fdata.client_batch_indices(fed.train, jnp.int32(2), jax.random.key(1),
                                          num_steps=3, **kw)
        b, _ = fdata.client_batch_indices(fed.train, jnp.int32(2), jax.random.key(1),
                                          num_steps=9, **kw)
        np.testing.assert_array_equal(a, b[:3])


def test_each_client_runs_its_own_steps(fed):
    """Under the CPU default (a loop over clients), a client's local loop runs
    its own trip count: the steps executed add up to the clients' own counts,
    not clients x the largest count."""
    calls = []

    def penalty(p):
        jax.debug.callback(lambda: calls.append(1))
        return 0.0 * optax.tree.norm(p)

    cfg = make_local_config(0.1, 1, B, "epoch", 1.0, drop_last=True)
    p0 = MODEL.init(jax.random.key(0))
    ids = jnp.arange(len(SIZES), dtype=jnp.int32)
    keys = client_keys(jax.random.key(2), fed.key_ids)

    def one(cid, k):
        return run_local(MODEL, p0, fed, cid, k, cfg, penalty=penalty)

    out, losses = jax.jit(EngineConfig("map", 1).lift(one))(ids, keys)
    jax.effects_barrier()
    own = _own_steps(1.0, True)
    assert len(calls) == own.sum() < len(SIZES) * own.max()
    assert np.isnan(losses[3]) and np.all(np.isfinite(np.delete(losses, 3)))
    assert all(np.all(np.isfinite(a)) for a in jax.tree.leaves(out))


def test_client_loss_runs_only_its_own_rows(fed):
    """``client_loss`` over a client's own rows (dynamic trip counts) equals the
    padded full batch (``differentiable=True``) for loss with a regularizer and
    for the metric, is NaN for a client without rows, and in a client loop the
    rows the model sees add up to the clients' own rows (the last chunk of 8
    masked), not clients x the largest client."""
    reg = MODEL._replace(regularizer=lambda p: 0.01 * optax.tree.norm(p, squared=True))
    p0 = MODEL.init(jax.random.key(0))
    one = (np.ones((4, 6), np.float32), np.zeros((4,), np.int64))
    empty = fdata.from_client_arrays(
        [one, one], val=[(np.zeros((0, 6), np.float32), np.zeros((0,), np.int64)),
                         one]).val
    for split, ids in ((fed.train, range(len(SIZES))), (empty, (0, 1))):
        for c in ids:
            for metric in (False, True):
                got = client_loss(reg, p0, split, jnp.int32(c), metric=metric)
                want = client_loss(reg, p0, split, jnp.int32(c), metric=metric,
                                   differentiable=True)
                np.testing.assert_allclose(got, want, rtol=1e-5, equal_nan=True)
    assert np.isnan(client_loss(reg, p0, empty, jnp.int32(0)))
    rows = []

    def apply(p, x):
        jax.debug.callback(lambda n: rows.append(int(n)), x.shape[0])
        return MODEL.apply(p, x)

    counting = MODEL._replace(apply=apply)
    ids = jnp.arange(len(SIZES), dtype=jnp.int32)
    jax.jit(lambda i: jax.lax.map(
        lambda c: client_loss(counting, p0, fed.train, c), i))(ids)
    jax.effects_barrier()
    own = -(-np.asarray(SIZES) // 8) * 8  # 23 = one full chunk of 23 rows
    own[0] = SIZES[0]
    assert sum(rows) == own.sum() < len(SIZES) * max(SIZES)


def test_any_optax_optimizer(fed):
    """``local_optimizer`` is any ``lr -> GradientTransformation``; its state
    starts fresh each round; the default is plain SGD."""
    p0 = MODEL.init(jax.random.key(0))
    key = jax.random.key(4)
    cfg = make_local_config(0.01, 4, B, "with_replacement",
                            optimizer=optax.adam)
    got, _ = run_local(MODEL, p0, fed, jnp.int32(0), key, cfg)
    want, _ = local_train(MODEL, p0, fed.train, jnp.int32(0), key,
                          optimizer=optax.adam(0.01), num_steps=4, batch_size=B)
    chex.assert_trees_all_close(got, want, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="optimizer"):
        make_local_config(0.01, 4, B, "epoch", optimizer=optax.sgd(0.1))
    with pytest.raises(ValueError, match="drop_last"):
        make_local_config(0.01, 4, B, "epoch", drop_last="yes")
    with pytest.raises(ValueError, match="buckets"):
        EngineConfig("map", 1, buckets=2)


# the CPU default (each client its own trip count) and vmap in size buckets
# (a batched loop per bucket; buckets=1 is plain vmap)
ENGINES = [EngineConfig("map", 1), EngineConfig("vmap", buckets=2)]


def _round(alg, fed, engine=None, engine_key=jax.random.key(0)):
    state = alg.init(jax.random.key(1), fed)
    with execution(engine):
        new, metrics = jax.jit(alg.round_step)(state, fed, engine_key)
    return state, new, metrics


def _client_key(c, fed, key=jax.random.key(0)):
    rkey = jax.random.fold_in(jax.random.fold_in(key, 0), KeyTag.CLIENT)
    return jax.random.fold_in(rkey, fed.key_ids[c])


def _own_local(fed, c, start, key, *, drop_last, lr=0.1, penalty=None,
               optimizer=None):
    """One client's local training with exactly its own number of steps
    (a static count: no masking, no trip-count logic)."""
    cfg = make_local_config(lr, 1, B, "epoch", 1.0, drop_last=drop_last)
    steps = int(_own_steps(1.0, drop_last)[c])
    return local_train(MODEL, start, fed.train, jnp.int32(c), key,
                       optimizer=optimizer or optax.sgd(lr), num_steps=steps,
                       batch_size=B, sampling="epoch", penalty=penalty,
                       drop_last=drop_last,
                       num_passes=passes_needed(cfg, fed.train, steps))[0]


def _weighted_mean_update(w, news):
    n = np.asarray(SIZES, np.float32) / sum(SIZES)
    return jax.tree.map(lambda p, *v: p + sum(ni * (vi - p) for ni, vi in zip(n, v)),
                        w, *news)


@pytest.mark.parametrize("drop_last", [False, True])
def test_fedavg_epochs_equal_per_client_loop(fed, drop_last):
    kw = dict(client_lr=0.1, batch_size=B, local_epochs=1.0, sampling="epoch",
              drop_last=drop_last, cohort="full", cohort_size=len(SIZES))
    results = [_round(algorithms.fedavg(MODEL, **kw), fed, e) for e in ENGINES]
    w = results[0][0].server.params
    news = [_own_local(fed, c, w, _client_key(c, fed), drop_last=drop_last)
            for c in range(len(SIZES))]
    expected = _weighted_mean_update(w, news)
    for _, new, _ in results:
        chex.assert_trees_all_close(new.server.params, expected, atol=2e-6)
    assert 0 < float(results[1][2]["engine/bucket_padding"]) < 1


def test_ditto_epochs_equal_per_client_loop(fed):
    kw = dict(lam=0.5, client_lr=0.1, batch_size=B, local_epochs=1.0,
              sampling="epoch", drop_last=True, cohort="full",
              cohort_size=len(SIZES), weighted=True)
    results = [_round(algorithms.ditto(MODEL, **kw), fed, e) for e in ENGINES]
    w = results[0][0].server.params
    for c in range(len(SIZES)):
        key = _client_key(c, fed)
        v = _own_local(fed, c, w, jax.random.fold_in(key, KeyTag.PERSONAL),
                       drop_last=True, penalty=prox_penalty(0.5, w))
        for _, new, _ in results:
            chex.assert_trees_all_close(
                jax.tree.map(lambda a, c=c: a[c], new.clients.personal), v, atol=2e-6)
    news = [_own_local(fed, c, w, _client_key(c, fed), drop_last=True)
            for c in range(len(SIZES))]
    for _, new, _ in results:
        chex.assert_trees_all_close(new.server.params, _weighted_mean_update(w, news),
                                    atol=2e-6)


def test_fedplus_epochs_equal_per_client_loop(fed):
    """Fed+ round 0 (every personal model equals w, so the anchor is w): each
    party runs its own epochs of the fused step."""
    kw = dict(sigma=2.0, client_lr=0.1, batch_size=B, local_epochs=1.0,
              sampling="epoch", cohort="full", cohort_size=len(SIZES))
    results = [_round(algorithms.fedplus(MODEL, **kw), fed, e) for e in ENGINES]
    w = results[0][0].server.params
    for c in range(len(SIZES)):
        want = _own_local(fed, c, w, _client_key(c, fed), drop_last=False,
                          optimizer=algorithms.fedplus_sgd(0.1, 2.0, w))
        for _, new, _ in results:
            chex.assert_trees_all_close(
                jax.tree.map(lambda a, c=c: a[c], new.clients.params), want, atol=2e-6)


def test_dp_sgd_epochs_equal_per_client_loop(fed):
    """Local DP-SGD (clipping and noise) with epochs: each client its own steps."""
    kw = dict(clip=0.5, noise_multiplier=0.7, client_lr=0.1, batch_size=B,
              local_epochs=1.0, sampling="epoch", cohort="full",
              cohort_size=len(SIZES), clip_method="vmap")
    results = [_round(algorithms.dp_fedavg(MODEL, **kw), fed, e) for e in ENGINES]
    w = results[0][0].server.params
    dp = privacy.make_dp_config(0.5, 0.7, "epoch", clip_method="vmap")
    cfg = make_local_config(0.1, 1, B, "epoch", 1.0)
    news = []
    for c in range(len(SIZES)):
        steps = int(_own_steps(1.0, False)[c])
        news.append(privacy.dp_local_train(
            MODEL, w, fed.train, jnp.int32(c), _client_key(c, fed), lr=0.1,
            num_steps=steps, batch_size=B, sampling="epoch", dp=dp,
            num_passes=passes_needed(cfg, fed.train, steps))[0])
    for _, new, _ in results:
        chex.assert_trees_all_close(new.server.params, _weighted_mean_update(w, news),
                                    atol=2e-6)


@pytest.mark.parametrize("aggregator", [None, "median"])
def test_one_client_loop_per_device_equals_one_device(fed, aggregator):
    """EngineConfig('map', mesh=...): every device runs its own client loop
    over a size-balanced share of the cohort (shard_map); same numbers as one
    device, for the streamed mean and for stacked uploads (median); Ditto's
    personal states land on the right clients."""
    from fedjax_pfl import aggregators
    from fedjax_pfl.core import client_mesh

    assert jax.device_count() >= 4, "conftest sets 4 fake CPU devices"
    mesh = client_mesh(jax.devices()[:2])
    agg = None if aggregator is None else aggregators.coordinate_median()
    kw = dict(lam=0.5, client_lr=0.1, batch_size=B, local_epochs=1.0,
              sampling="epoch", drop_last=True, cohort="uniform", cohort_size=4,
              aggregator=agg, weighted=False)
    one = _round(algorithms.ditto(MODEL, **kw), fed, EngineConfig("map", 1))
    two = _round(algorithms.ditto(MODEL, **kw), fed,
                 EngineConfig("map", 1, mesh=mesh))
    chex.assert_trees_all_close(two[1].server.params, one[1].server.params, atol=2e-6)
    chex.assert_trees_all_close(two[1].clients, one[1].clients, atol=2e-6)
    assert 0 <= float(two[2]["engine/shard_imbalance"]) < 1
    three = algorithms.fedavg(MODEL, cohort="uniform", cohort_size=3)
    with pytest.raises(ValueError, match="cohort_size: 3 clients"):
        _round(three, fed, EngineConfig("map", 1, mesh=mesh))
