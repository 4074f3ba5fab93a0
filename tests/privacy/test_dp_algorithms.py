"""DP-FedAvg (local DP-SGD) and client-level DP: reductions to FedAvg, vmap ==
map == a Python loop over clients, visible fallback, argument checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pfl as fp
from fedjax_pfl import aggregators, algorithms, models, privacy
from fedjax_pfl import data as fdata
from fedjax_pfl.core import EngineConfig, KeyTag, round_cohort
from fedjax_pfl.core._clients import client_keys

MODEL = models.mlp((6,), 3, hidden=(8,))
LOCAL = {"client_lr": 0.2, "num_local_steps": 2, "batch_size": 4, "cohort_size": 3}
UNROLL1 = EngineConfig(unroll=1)


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=5, dim=6, num_classes=3,
                                   min_size=10, max_size=40, fractions=(0.8, 0, 0.2),
                                   seed=3)


def _run(alg, data, rounds=2, engine=UNROLL1):
    state = alg.init(jax.random.key(1), data)
    return jax.jit(lambda s, d: fp.core.run_rounds(
        alg, s, d, jax.random.key(0), rounds, engine=engine))(state, data)


def _run_swept(factory, data, values, rounds=1):
    """``_run(factory(v))`` for each v, compiled once (v traced, as in sweep)."""
    state = factory(values[0]).init(jax.random.key(1), data)
    run = jax.jit(lambda v, s, d: fp.core.run_rounds(
        factory(v), s, d, jax.random.key(0), rounds, engine=UNROLL1))
    return [run(jnp.float32(v), state, data) for v in values]


def _diff(a, b):
    return max(float(jnp.max(jnp.abs(x - y)))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def test_no_clip_no_noise_is_fedavg(data):
    """clip = inf, sigma = 0 with FedAvg's sampling: FedAvg, bit for bit (a
    concrete inf clip takes the unclipped one-backward-pass shortcut: same keys,
    same batches, same loss program). A finite clip that never binds exercises
    the ghost and nested-vmap paths, equal up to summation order."""
    kw = dict(LOCAL, sampling="with_replacement")
    ref, ref_m = _run(algorithms.fedavg(MODEL, **kw), data)
    fast, m = _run(algorithms.dp_fedavg(MODEL, clip=jnp.inf, noise_multiplier=0.0,
                                        **kw), data)
    for a, b in zip(jax.tree.leaves(ref.server.params),
                    jax.tree.leaves(fast.server.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(m["train/loss"]) == float(ref_m["train/loss"])
    assert float(m["train/dp/clipped_fraction"]) == 0.0
    for method, ghost in (("ghost", 1.0), ("vmap", 0.0)):
        s, m = _run(algorithms.dp_fedavg(MODEL, clip=1e30, noise_multiplier=0.0,
                                         clip_method=method, **kw), data)
        assert _diff(ref.server.params, s.server.params) < 1e-6  # summation order
        assert float(m["train/dp/ghost"]) == ghost
        assert float(m["train/dp/clipped_fraction"]) == 0.0


def test_dp_round_vmap_equals_map_equals_python_loop(data):
    kw = dict(LOCAL, clip=0.5, noise_multiplier=1.0, sampling_rate=0.3)
    outs = []
    for engine in (EngineConfig("vmap", unroll=1), EngineConfig("map", 1, unroll=1)):
        s, m = _run(algorithms.dp_fedavg(MODEL, **kw), data, rounds=1, engine=engine)
        outs.append(s.server.params)
    assert _diff(outs[0], outs[1]) < 1e-5
    assert 0 < float(m["train/dp/clipped_fraction"]) <= 1
    assert float(m["train/dp/truncated"]) == 0.0

    # the same round by hand: one jitted client update per cohort member
    key = jax.random.key(0)
    w = jax.jit(MODEL.init)(jax.random.key(1))
    ids = round_cohort(data, jnp.int32(0), key, 3, "uniform")
    keys = client_keys(jax.random.fold_in(jax.random.fold_in(key, 0), KeyTag.CLIENT),
                       data.key_ids[ids])
    dp = privacy.make_dp_config(0.5, 1.0, "poisson", 0.3)
    local = jax.jit(lambda cid, k: privacy.dp_local_train(
        MODEL, w, data.train, cid, k, lr=0.2, num_steps=2, batch_size=4,
        sampling="poisson", dp=dp)[0])
    deltas, counts = [], []
    for cid, k in zip(np.asarray(ids), keys):
        deltas.append(jax.tree.map(jnp.subtract, local(jnp.int32(cid), k), w))
        counts.append(float(data.train.counts[cid]))
    c = np.asarray(counts) / sum(counts)
    expected = jax.tree.map(lambda p, *d: p + sum(ci * di for ci, di in zip(c, d)),
                            w, *deltas)
    assert _diff(expected, outs[0]) < 1e-5


def test_dp_noise_changes_with_key_and_scales(data):
    """Same batches, different noise keys: the update difference has the noise
    scale sigma C lr / |B| (checked loosely: ratio of two sigmas)."""
    kw = dict(LOCAL, clip=0.5, sampling="with_replacement", num_local_steps=1,
              cohort_size=5, cohort="full")
    runs = _run_swept(lambda z: algorithms.dp_fedavg(MODEL, noise_multiplier=z, **kw),
                      data, [0.0, 1.0, 4.0])
    base = runs[0][0]
    d = {}
    for sigma, (s, _) in zip((1.0, 4.0), runs[1:]):
        d[sigma] = np.concatenate([np.ravel(a - b) for a, b in zip(
            jax.tree.leaves(s.server.params), jax.tree.leaves(base.server.params))])
    # noise enters linearly with one step: exactly proportional to sigma
    np.testing.assert_allclose(d[4.0], 4.0 * d[1.0], rtol=1e-3, atol=1e-6)
    # its std: mean over 5 clients (weights n_k/n) of lr sigma C / 4 per coordinate
    n = np.asarray(data.train.counts, np.float64)
    std = 0.2 * 1.0 * 0.5 / 4 * np.sqrt(np.sum((n / n.sum()) ** 2))
    assert abs(d[1.0].std() / std - 1) < 0.25  # 83 coordinates


def test_fallback_is_visible_in_metrics():
    rng = np.random.default_rng(0)
    d = fdata.from_client_arrays([(np.zeros((n, 1), np.float32),
                                   rng.normal(size=(n, 2)).astype(np.float32))
                                  for n in (5, 8)])
    alg = algorithms.dp_fedavg(models.mean_model(2), clip=1.0, noise_multiplier=0.5,
                               sampling_rate=0.5, cohort_size=2, num_local_steps=1)
    with pytest.warns(UserWarning, match="nested vmap"):
        _, m = _run(alg, d, 1)
    assert float(m["train/dp/ghost"]) == 0.0


def test_dp_fedavg_bad_arguments():
    for kw, name in [({"clip": -1.0}, "clip"), ({"noise_multiplier": -0.5},
                                                  "noise_multiplier"),
                     ({"sampling_rate": 0.0}, "sampling_rate"),
                     ({"sampling_rate": None}, "sampling_rate"),
                     ({"normalize": "batch"}, "normalize"),
                     ({"clip_method": "fast"}, "clip_method"),
                     ({"chunk_size": 1.5}, "chunk_size"),
                     ({"client_lr": 0.0}, "client_lr"),
                     ({"num_local_steps": 0}, "num_local_steps")]:
        base = {"clip": 1.0, "noise_multiplier": 1.0, "sampling_rate": 0.1}
        base.update(kw)
        with pytest.raises(ValueError, match=name):
            algorithms.dp_fedavg(MODEL, **base)


# ------------------------------------------------------------- client-level DP


def _updates():
    u = {"a": jnp.asarray([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [6.0, 8.0]]),
         "b": jnp.zeros((4, 1))}
    return u, jnp.ones(4), jnp.ones(4)


def test_client_level_clip_and_reduction():
    u, w, mask = _updates()
    inner = aggregators.mean(weighted=False)
    agg = privacy.client_level_dp(inner, jnp.inf, 0.0)
    assert agg.linear_weights is None  # clipping needs the stacked uploads
    out, _ = agg.aggregate((), u, w, mask, jax.random.key(0))
    ref, _ = inner.aggregate((), u, w, mask, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out["a"]), np.asarray(ref["a"]))
    out, _ = privacy.client_level_dp(inner, 1.0, 0.0).aggregate(
        (), u, w, mask, jax.random.key(0))
    # norms 5, 0.5, 0, 10 -> clipped rows (0.6, 0.8), (0.3, 0.4), 0, (0.6, 0.8)
    np.testing.assert_allclose(out["a"], [1.5 / 4, 2.0 / 4], rtol=1e-6)
    clipped, norms = privacy.clip_updates(u, 1.0)
    np.testing.assert_allclose(norms, [5, 0.5, 0, 10], rtol=1e-6)
    assert float(jnp.max(jnp.linalg.norm(clipped["a"], axis=1))) <= 1.0 + 1e-6


def test_client_level_noise_statistics():
    u, w, mask = _updates()
    u = {"a": jnp.tile(u["a"], (1, 500))}  # 1000 coordinates
    agg = privacy.client_level_dp(aggregators.mean(weighted=False), 2.0, 1.5)
    clean, _ = privacy.client_level_dp(aggregators.mean(weighted=False), 2.0, 0.0
                                       ).aggregate((), u, w, mask, jax.random.key(0))
    outs = jax.jit(jax.vmap(lambda k: agg.aggregate((), u, w, mask, k)[0]["a"]))(
        jax.random.split(jax.random.key(5), 200))
    z = np.asarray(outs - clean["a"][None])
    std = 1.5 * 2.0 / 4
    assert abs(z.mean()) < 4 * std / np.sqrt(z.size)
    assert abs(z.std() / std - 1) < 0.02
    with pytest.raises(ValueError, match="clip"):
        privacy.client_level_dp(aggregators.mean(), 0.0, 1.0)
    with pytest.raises(ValueError, match="noise_multiplier"):
        privacy.client_level_dp(aggregators.mean(), 1.0, -1.0)


def test_client_level_dp_in_fedavg(data):
    kw = dict(LOCAL, client_lr=1.0, num_local_steps=3)
    _, m0 = _run(algorithms.fedavg(MODEL, aggregator=aggregators.mean(False), **kw),
                 data, 1)
    s = float(m0["server/update_norm"]) / 4  # well below the clients' norms
    (_, m), (_, mn) = _run_swept(lambda z: algorithms.fedavg(
        MODEL, aggregator=privacy.client_level_dp(aggregators.mean(False), s, z),
        **kw), data, [0.0, 1.0])
    assert float(m["server/update_norm"]) <= s + 1e-6
    assert np.isfinite(float(mn["server/update_norm"]))
    assert float(mn["server/update_norm"]) != float(m["server/update_norm"])


# Ditto with DP: the global update is DP-FedAvg's, the personal models stay local
# (Ditto paper §3.2: the same epsilon as private global training).
DITTO = dict(LOCAL, cohort="size_weighted", weighted=False)


def _assert_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_global_model_is_dp_fedavgs_and_personal_models_stay_noise_free(data):
    dp = dict(clip=0.5, noise_multiplier=1.0, sampling_rate=0.3)
    ref, _ = _run(algorithms.dp_fedavg(MODEL, **dp, **DITTO), data)
    cfg = privacy.make_dp_config(dp["clip"], dp["noise_multiplier"], "poisson",
                                 dp["sampling_rate"])
    st, m = _run(algorithms.ditto(MODEL, lam=1.0, dp=cfg, **DITTO), data)
    _assert_equal(ref.server.params, st.server.params)  # the released trajectory
    assert 0 < float(m["train/dp/clipped_fraction"]) <= 1
    # v_k is anchored at the round-start w^t and trains without noise: after one
    # round (same w^0, same cohort, same keys) it equals non-private Ditto's
    one_dp, _ = _run(algorithms.ditto(MODEL, lam=1.0, dp=cfg, **DITTO), data, 1)
    one, _ = _run(algorithms.ditto(MODEL, lam=1.0, **DITTO), data, 1)
    _assert_equal(one.clients.personal, one_dp.clients.personal)
    assert _diff(one.server.params, one_dp.server.params) > 0  # noise is there


def test_no_clip_no_noise_equals_plain_ditto(data):
    cfg = privacy.make_dp_config(jnp.inf, 0.0, "with_replacement")
    plain, _ = _run(algorithms.ditto(MODEL, lam=0.5, **DITTO), data)
    dp, _ = _run(algorithms.ditto(MODEL, lam=0.5, dp=cfg, **DITTO), data)
    _assert_equal(plain.server.params, dp.server.params)
    _assert_equal(plain.clients.personal, dp.clients.personal)


def test_shared_batches_with_dp_rejected():
    cfg = privacy.make_dp_config(1.0, 1.0, "poisson", 0.1)
    with pytest.raises(ValueError, match="batches"):
        algorithms.ditto(MODEL, dp=cfg, batches="shared")
