"""LINDT: attaching module, dual model, detection/recovery inside the round
(Lin et al., arXiv 2020: Eqs. 8-10, Alg. 2, recovery as in Sec. 5.3)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import run_jitted

from fedjax_pfl import algorithms, attacks, data, models
from fedjax_pfl.core import EngineConfig, execution


def _data(n=4, rows=12, dim=4, classes=3, same=False, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for c in range(n):
        r = np.random.default_rng(seed) if same else rng
        y = r.integers(0, classes, rows)
        x = (r.normal(size=(rows, dim)) + y[:, None]).astype(np.float32)
        out.append((x, y))
    return data.from_client_arrays(out, test=out)


DUAL = algorithms.dual_mlp((4,), 3, (5,))
UNROLL1 = EngineConfig(unroll=1)

# ------------------------------------------------------------- attaching module


def test_attach_hand_values():
    L, G = jnp.array([[1.0, 0.0]]), jnp.array([[2.0, 2.0]])
    h, s = algorithms.attach(L, G)
    sig2 = 1 / (1 + np.exp(-2.0))  # <L, G> / ||L|| = 2
    np.testing.assert_allclose(s, [sig2], rtol=1e-6)
    np.testing.assert_allclose(h, sig2 * G + (1 - sig2) * L, rtol=1e-6)
    # L = G: score sigmoid(||G||), h = G
    h, s = algorithms.attach(G, G)
    np.testing.assert_allclose(s, [1 / (1 + np.exp(-np.sqrt(8.0)))], rtol=1e-6)
    np.testing.assert_allclose(h, G, rtol=1e-6)
    # G orthogonal to L: 0.5, h = (G + L) / 2; G = 0: h = L / 2
    h, s = algorithms.attach(L, jnp.array([[0.0, 3.0]]))
    np.testing.assert_allclose(s, [0.5]) and np.testing.assert_allclose(h, [[0.5, 1.5]])
    h, _ = algorithms.attach(L, jnp.zeros_like(L))
    np.testing.assert_allclose(h, L / 2)
    # per sample over the flattened map; nonnegative (post-ReLU) maps: score >= 0.5
    rng = np.random.default_rng(0)
    Lm, Gm = (jnp.abs(jnp.asarray(rng.normal(size=(3, 2, 2, 4)), jnp.float32))
              for _ in range(2))
    h, s = algorithms.attach(Lm, Gm)
    assert s.shape == (3,) and np.all(np.asarray(s) >= 0.5)
    lf, gf = Lm.reshape(3, -1), Gm.reshape(3, -1)
    ref = jax.nn.sigmoid(jnp.sum(lf * gf, 1) / jnp.linalg.norm(lf, axis=1))
    np.testing.assert_allclose(s, ref, rtol=1e-6)
    np.testing.assert_allclose(h[1], s[1] * Gm[1] + (1 - s[1]) * Lm[1], rtol=1e-6)
    # cosine variant (not the paper); ||L|| = 0 is guarded
    _, s = algorithms.attach(L, G, variant="cosine")
    np.testing.assert_allclose(s, [1 / (1 + np.exp(-np.sqrt(0.5)))], rtol=1e-6)
    h, s = algorithms.attach(jnp.zeros_like(L), G)
    assert np.all(np.isfinite(h)) and float(s[0]) == 0.5
    with pytest.raises(ValueError, match="score_variant"):
        algorithms.attach(L, G, variant="dot")


@pytest.mark.parametrize("variant", ["paper", "cosine"])
def test_attach_gradient_is_finite_at_a_zero_representation(variant):
    """A sample whose local map is all zero (every ReLU off) once made the
    gradient NaN (the norm's 0 / 0) and so both models NaN after one step (the
    LINDT CNN on unbalanced clients at lr 0.1). Now it scores 0.5 with no
    gradient through the score; other samples keep the formula's gradient."""
    L = jnp.array([[0.0, 0.0], [1.0, 0.0]])
    G = jnp.array([[2.0, 2.0], [2.0, 2.0]])

    def total(local, glob):
        return jnp.sum(algorithms.attach(local, glob, variant=variant)[0])

    dl, dg = jax.grad(total, argnums=(0, 1))(L, G)
    assert np.all(np.isfinite(dl)) and np.all(np.isfinite(dg))
    # the zero sample: h = (G + L) / 2, so dh/dL = dh/dG = 1/2
    np.testing.assert_allclose(dl[0], [0.5, 0.5])
    np.testing.assert_allclose(dg[0], [0.5, 0.5])

    def ref(local, glob):  # the formula itself, well defined away from zero
        lf, gf = local[1:], glob[1:]
        den = jnp.linalg.norm(lf, axis=1) * (
            jnp.linalg.norm(gf, axis=1) if variant == "cosine" else 1.0)
        s = jax.nn.sigmoid(jnp.sum(lf * gf, 1) / den)[:, None]
        return jnp.sum(s * gf + (1 - s) * lf)

    rl, rg = jax.grad(ref, argnums=(0, 1))(L, G)
    np.testing.assert_allclose(dl[1], rl[1], rtol=1e-6)
    np.testing.assert_allclose(dg[1], rg[1], rtol=1e-6)
    if variant == "cosine":  # and a zero global map too
        dl, dg = jax.grad(total, argnums=(0, 1))(G, jnp.zeros_like(G))
        assert np.all(np.isfinite(dl)) and np.all(np.isfinite(dg))


def test_score_extremes_reduce_to_global_or_local():
    """score == 1: local layer m+1 reads G^m; score == 0: the pure local model."""
    def lin(name):
        return lambda p, h: h @ p[name]

    dual = algorithms.DualModel(None, (lin("a"), lin("b")), ("a",), "b")
    rng = np.random.default_rng(0)
    v = {"a": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
         "b": jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)}
    x = jnp.asarray(rng.normal(size=(5, 3)), jnp.float32)
    for c, expect_score in ((1e4, 1.0), (-1e4, 0.0)):
        w = {"a": c * v["a"], "b": jnp.ones((4, 2))}  # G^1 = c L^1
        g, out, s = algorithms.dual_apply(dual, w, v, x)
        np.testing.assert_array_equal(s, expect_score)
        feats = x @ w["a"] if expect_score == 1.0 else x @ v["a"]
        np.testing.assert_allclose(out, feats @ v["b"], rtol=1e-6)
        np.testing.assert_allclose(g, x @ w["a"] @ w["b"], rtol=1e-6)


def test_dual_models_compose_and_parameter_counts():
    cnn = algorithms.dual_lindt_cnn()
    p = jax.eval_shape(cnn.model.init, jax.random.key(0))
    assert models.num_params(p) == 940_362  # App. C.2's CNN, valid padding
    assert 0.001 * np.sqrt(940_362) == pytest.approx(0.9697, abs=1e-4)  # ||noise||
    lstm = jax.eval_shape(models.lindt_shakespeare_lstm().init, jax.random.key(0))
    assert models.num_params(lstm) == 819_920  # PyTorch-style double bias
    assert cnn.top == "Dense_2" and len(cnn.layers) == 5 and len(cnn.names) == 4

    def composed_minus_apply(p, x):
        h = x
        for layer in cnn.layers:
            h = layer(p, h)
        return jnp.max(jnp.abs(h - cnn.model.apply(p, x)))

    rng = np.random.default_rng(0)
    p = jax.tree.map(lambda s: rng.normal(0, 0.05, s.shape).astype(np.float32), p)
    x = rng.normal(size=(1, 32, 32, 3)).astype(np.float32)
    assert float(jax.jit(composed_minus_apply)(p, x)) < 1e-4
    pm = DUAL.model.init(jax.random.key(0))
    assert models.num_params(pm) == 4 * 5 + 5 + 5 * 3 + 3
    xm = jax.random.normal(jax.random.key(2), (6, 4))
    g, out, _s = algorithms.dual_apply(DUAL, pm, pm, xm)  # L = G at every layer
    np.testing.assert_allclose(out, g, atol=1e-6)
    v = DUAL.model.init(jax.random.key(3))
    head = algorithms.local_head_model(DUAL, pm)
    np.testing.assert_array_equal(head.apply((v, jnp.bool_(False)), xm),
                                  DUAL.model.apply(pm, xm))
    np.testing.assert_allclose(head.apply((v, jnp.bool_(True)), xm),
                               algorithms.dual_apply(DUAL, pm, v, xm)[1])


# --------------------------------------------------------------------- rounds


def test_off_is_fedavg():
    d = _data()
    kw = {"client_lr": 0.1, "num_local_steps": 3, "batch_size": 4, "cohort_size": 2}
    a = run_jitted(algorithms.lindt(DUAL, mode="off", **kw), d, 3, engine=UNROLL1)
    b = run_jitted(algorithms.fedavg(DUAL.model, weighted=False, **kw), d, 3,
                   engine=UNROLL1)
    for x, y in zip(jax.tree.leaves(a.server.params), jax.tree.leaves(b.server.params),
                    strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6)


def test_vmap_equals_loop_and_compiles_once():
    d = _data()
    mal = np.array([True, False, False, False])
    d = attacks.semantic_backdoor(d, mal, mapping=((1, 2),), batch_size=4,
                                  poison_per_batch=1)
    out = {}
    for strategy in ("vmap", "map"):
        alg = algorithms.lindt(DUAL, mode="always", local_epochs=1.0, batch_size=4,
                               cohort_size=3, clip=0.5,
                               malicious=mal, malicious_multiplier=2,
                               lr_decay=0.9)
        step = jax.jit(chex.assert_max_traces(
            lambda s, d, k, alg=alg: alg.round_step(s, d, k), n=1))
        s = alg.init(jax.random.key(0), d)
        with execution(EngineConfig(strategy, 1, unroll=1)):
            for _ in range(3):
                s, m = step(s, d, jax.random.key(5))
        out[strategy] = (s, m)
        chex.clear_trace_counter()
    (s1, m1), (s2, m2) = out["vmap"], out["map"]
    for x, y in zip(jax.tree.leaves(s1), jax.tree.leaves(s2), strict=True):
        np.testing.assert_allclose(x, y, atol=2e-5)
    for k in m1:
        np.testing.assert_allclose(m1[k], m2[k], atol=2e-5, err_msg=k)
    assert 0.5 <= float(m1["train/score_dense0"]) < 1  # post-ReLU taps
    assert np.asarray(s1.clients.has_local).sum() >= 3


def test_detect_then_recover_then_stop():
    """FedAvg until count > r' (round r' + 1), dual model from the next round;
    strategy 1 stops once every client has trained it."""
    d = _data()
    alg = algorithms.lindt(DUAL, mode="detect", cohort="full", num_local_steps=2,
                           batch_size=4, eps=1e-6, r_prime=1, stop="all_trained_once")
    step = jax.jit(alg.round_step)
    s0 = s = alg.init(jax.random.key(0), d)
    trace = []
    for _ in range(5):
        with execution(UNROLL1):
            s, m = step(s, d, jax.random.key(1))
        trace.append((int(m["nfl/detect_round"]), bool(m["lindt/dual_on"]),
                      bool(m["lindt/stopped"]), float(m["train/local_loss"])))
        if len(trace) == 2:  # FedAvg so far: local models untouched
            for x, y in zip(jax.tree.leaves(s.clients.local),
                            jax.tree.leaves(s0.clients.local)):
                np.testing.assert_array_equal(x, y)

            @jax.jit
            def personal_minus_global(s, x):
                view = alg.eval_models(s, d, jax.random.key(0))["personal"]
                out = view.model.apply(jax.tree.map(lambda t: t[0], view.params), x)
                return jnp.max(jnp.abs(out - DUAL.model.apply(s.server.params, x)))

            # no local model yet: the personal view is the global model
            assert float(personal_minus_global(s, d.test.x[:5])) == 0.0
    assert [t[0] for t in trace] == [-1, 2, 2, 2, 2]
    assert [t[1] for t in trace] == [False, True, False, False, False]
    assert [t[2] for t in trace] == [False, False, True, True, True]
    assert [t[3] > 0 for t in trace] == [False, False, True, False, False]
    assert bool(np.all(s.clients.has_local))


def test_noise_only_divergence_and_traced_sigma():
    """Identical clients, full-batch GD: every w_k is the mean, so w_div =
    ||noise|| and Delta = 0; sigma traced (vmapped) in one program."""
    d = _data(same=True)

    def run(sigma):
        alg = algorithms.lindt(DUAL, mode="off", cohort="full", num_local_steps=2,
                               sampling="full_batch", noise_std=sigma, batch_size=10)
        s = alg.init(jax.random.key(0), d)
        return alg.round_step(s, d, jax.random.key(1))[1]

    with execution(UNROLL1):
        m = jax.jit(jax.vmap(run))(jnp.array([0.0, 0.05]))
    np.testing.assert_allclose(m["nfl/w_div"], [0.0, m["nfl/noise_norm"][1]],
                               atol=1e-5)
    np.testing.assert_allclose(m["nfl/delta"], 0.0, atol=1e-5)
    # every client moved by the same u, below the clip: the mean of their step
    # sizes is the aggregate's norm
    assert float(m["nfl/client_update_norm"][0]) > 0
    np.testing.assert_allclose(m["nfl/client_update_norm"], m["server/update_norm"],
                               rtol=1e-5)
    dim = models.num_params(DUAL.model.init(jax.random.key(0)))
    assert abs(float(m["nfl/noise_norm"][1]) - 0.05 * np.sqrt(dim)) < 0.25 * 0.05 * (
        np.sqrt(dim))


def test_invalid_arguments():
    for kw, name in (({"mode": "sometimes"}, "mode"), ({"stop": "x"}, "stop"),
                     ({"v_init": "zeros"}, "v_init"), ({"clip": 0.0}, "clip"),
                     ({"noise_std": -1.0}, "noise_std"), ({"eps": 0.0}, "eps"),
                     ({"malicious_multiplier": 0}, "malicious_multiplier"),
                     ({"score_variant": "dot"}, "score_variant"),
                     ({"client_lr": -0.1}, "client_lr"), ({"r_prime": -1}, "r_prime"),
                     ({"stop_streak": 0}, "stop_streak")):
        with pytest.raises(ValueError, match=name):
            algorithms.lindt(DUAL, **kw)
    with pytest.raises(ValueError, match="malicious"):
        algorithms.lindt(DUAL, malicious=np.zeros(3, bool)).init(
            jax.random.key(0), _data())
    with pytest.raises(ValueError, match="hidden"):
        algorithms.dual_mlp((4,), 3, ())


def test_semantic_backdoor():
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(70, 2)).astype(np.float32), np.repeat(np.arange(7), 10))
               for _ in range(2)]
    clients.append((np.zeros((14, 2), np.float32), np.zeros(14, np.int64)))
    d = data.from_client_arrays(clients, test=clients)
    mal = np.array([True, False, True])
    p = attacks.semantic_backdoor(d, mal, mapping=((4, 6), (5, 3)), seed=1)
    _x0, y0 = p.train.client(0)
    assert not np.any(np.isin(y0, [4, 5]))  # source rows all relabelled
    assert len(y0) == 50 + round(50 * 3 / 7)  # 3 of 10 poisoned in expectation
    np.testing.assert_array_equal(p.train.client(1)[1], d.train.client(1)[1])
    np.testing.assert_array_equal(p.test.y, d.test.y)
    _, y2 = p.train.client(2)  # no source rows of its own: drawn from the pool
    assert set(y2[14:].tolist()) <= {6, 3} and len(y2) == 14 + 6
    assert attacks.backdoor_success(np.array([6, 6, 3, 0]), np.array([4, 4, 5, 0]),
                                    ((4, 6), (5, 3))) == 1.0
    with pytest.raises(ValueError, match="poison_per_batch"):
        attacks.semantic_backdoor(d, mal, poison_per_batch=10)


def test_target_backdoor():
    """LINDT's Shakespeare attack: every training label of an attacker becomes
    the target; inputs, benign clients and test splits are untouched."""
    rng = np.random.default_rng(0)
    clients = [(rng.integers(0, 9, (5, 3)).astype(np.uint8), rng.integers(1, 9, 5))
               for _ in range(3)]
    d = data.from_client_arrays(clients, test=clients)
    p = attacks.target_backdoor(d, np.array([False, True, True]), target=0)
    np.testing.assert_array_equal(p.train.client(0)[1], clients[0][1])
    for c in (1, 2):
        np.testing.assert_array_equal(p.train.client(c)[1], np.zeros(5))
        np.testing.assert_array_equal(p.train.client(c)[0], clients[c][0])
    np.testing.assert_array_equal(p.test.y, d.test.y)
    for bad in (9, -1, 1.5, True):
        with pytest.raises(ValueError, match="target"):
            attacks.target_backdoor(d, np.array([False, True, True]), target=bad)
    with pytest.raises(ValueError, match="malicious"):
        attacks.target_backdoor(d, np.array([True]), target=0)


def test_flat_clip_keeps_direction():
    """Clip(u, S) of Eq. 4: norm min(||u||, S) over the whole model, same direction."""
    from fedjax_pfl import privacy

    u = {"a": jnp.array([[3.0, 0.0], [0.3, 0.0]]), "b": jnp.array([[4.0], [0.4]])}
    c, norms = privacy.clip_updates(u, 2.0)
    np.testing.assert_allclose(norms, [5.0, 0.5], rtol=1e-6)
    np.testing.assert_allclose(c["a"], [[1.2, 0.0], [0.3, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(c["b"], [[1.6], [0.4]], rtol=1e-6)


def test_lstm_dual_and_timestep_granularity():
    lstm = algorithms.dual_lindt_lstm(seq_len=4, tap_embedding=True)
    assert lstm.names == ("embed", "lstm1", "lstm2") and lstm.top == "Dense_0"

    @jax.jit
    def check(x):
        p = lstm.model.init(jax.random.key(0))
        h = x
        for layer in lstm.layers:
            h = layer(p, h)
        _, out, _ = algorithms.dual_apply(lstm, p, p, x)  # L = G: local == global
        ref = lstm.model.apply(p, x)
        return jnp.max(jnp.abs(h - ref)), jnp.max(jnp.abs(out - ref))

    d1, d2 = check(jnp.array([[1, 2, 3, 4], [5, 6, 7, 8]]))
    assert float(d1) == 0.0 and float(d2) < 1e-5
    # timestep scores on hand-made [B, T, H] maps: one score per (sample, step)
    dual = algorithms.DualModel(None, (lambda p, x: x * p["a"],
                                       lambda p, h: (h * p["b"]).sum((1, 2))),
                                ("a",), "b", "timestep")
    x = jnp.array([[[1.0, 0.0], [0.0, 2.0]]])  # B = 1, T = 2, H = 2
    w, v = {"a": jnp.array([2.0, 2.0]), "b": 1.0}, {"a": jnp.array([1.0, 1.0]), "b": 1.0}
    _, out, s = algorithms.dual_apply(dual, w, v, x)
    s_t = 1 / (1 + np.exp(-np.array([2.0, 4.0])))  # <L, G>/||L|| per step
    np.testing.assert_allclose(s, [[s_t.mean()]], rtol=1e-6)  # [taps, B]
    np.testing.assert_allclose(out, [(s_t * np.array([2.0, 4.0]) + (1 - s_t)
                                      * np.array([1.0, 2.0])).sum()], rtol=1e-6)
    with pytest.raises(ValueError, match="granularity"):
        algorithms.dual_lindt_lstm(granularity="token")
    narrow = algorithms.dual_lindt_lstm(seq_len=4, hidden=8)
    p = narrow.model.init(jax.random.key(0))
    # embedding 80x8, two PyTorch LSTMs (4 gates, two biases), dense 8 -> 80
    lstm_params = 2 * 4 * 8 * (8 + 8 + 2)
    assert models.num_params(p) == 80 * 8 + lstm_params + 8 * 80 + 80
    assert narrow.model.apply(p, jnp.zeros((2, 4), jnp.int32)).shape == (2, 80)
    with pytest.raises(ValueError, match="hidden"):
        algorithms.dual_lindt_lstm(hidden=0)


# ------------------------------------------------------------------- FB baseline


def _fb(dual, params, fd, limit):
    return algorithms.finetune_top(dual, params, fd, jax.random.key(3), steps=7,
                                   lr=0.3, batch_size=5, feature_cache_bytes=limit)


@pytest.mark.parametrize("which", ["mlp", "lstm"])
def test_fb_on_cached_features_equals_the_whole_model(which):
    """FB trains only the top layer: on the lower layers' cached features it
    gives the parameters of training through the whole model with the lower
    layers frozen (same minibatches and steps), the lower layers unchanged."""
    if which == "mlp":
        dual, fd = DUAL, _data(rows=13)
    else:
        dual = algorithms.dual_lindt_lstm(seq_len=6, vocab_size=80, hidden=4)
        rng = np.random.default_rng(0)
        rows = [(rng.integers(0, 80, (9 + c, 6)).astype(np.int32),
                 rng.integers(0, 80, 9 + c)) for c in range(3)]
        fd = data.from_client_arrays(rows)
    params = dual.model.init(jax.random.key(0))
    cached, whole = _fb(dual, params, fd, 2**30), _fb(dual, params, fd, 0)
    chex.assert_trees_all_close(cached, whole, atol=1e-5, rtol=1e-5)
    for k in params:
        stacked = jax.tree.map(lambda a: a[0], cached[k])
        if k == dual.top:
            assert not np.allclose(jax.tree.leaves(stacked)[0],
                                   jax.tree.leaves(params[k])[0])
        else:
            chex.assert_trees_all_equal(stacked, params[k])


@pytest.mark.parametrize("layers", [2, 3])
def test_fb_on_more_layers_trains_exactly_those(layers):
    """``layers = k`` finetunes the top k layers (3: the whole MLP, which
    never caches: test below): cached features equal the whole-model path, the
    layers below stay as they were and each finetuned one moves."""
    dual = algorithms.dual_mlp((4,), 3, (5, 6))  # Dense_0, Dense_1, Dense_2
    fd = _data(rows=13)
    params = dual.model.init(jax.random.key(0))

    def fb(limit):
        return algorithms.finetune_top(dual, params, fd, jax.random.key(3), steps=7,
                                       lr=0.3, batch_size=5,
                                       feature_cache_bytes=limit, layers=layers)

    cached, whole = fb(2**30), fb(0)
    chex.assert_trees_all_close(cached, whole, atol=1e-5, rtol=1e-5)
    for i, k in enumerate(["Dense_0", "Dense_1", "Dense_2"]):
        first = jax.tree.map(lambda a: a[0], cached[k])
        if i >= 3 - layers:
            assert not np.allclose(first["kernel"], params[k]["kernel"]), k
        else:
            chex.assert_trees_all_equal(first, params[k])


def test_fb_on_the_whole_model_caches_nothing(monkeypatch):
    """With every layer finetuned there is nothing frozen to cache: the whole
    model trains directly, whatever ``feature_cache_bytes`` allows."""
    from fedjax_pfl.algorithms import _lindt

    def no_cache(*args, **kwargs):
        raise AssertionError("the feature cache was built")

    monkeypatch.setattr(_lindt, "_features", no_cache)
    params = DUAL.model.init(jax.random.key(0))
    out = algorithms.finetune_top(DUAL, params, _data(), jax.random.key(1), steps=2,
                                  lr=0.1, batch_size=2, feature_cache_bytes=2**30,
                                  layers=len(DUAL.layers))
    for k in params:
        assert not np.allclose(jax.tree.leaves(out[k])[0][0],
                               jax.tree.leaves(params[k])[0]), k
    with pytest.raises(AssertionError, match="feature cache"):  # the patch bites
        algorithms.finetune_top(DUAL, params, _data(), jax.random.key(1), steps=2,
                                lr=0.1, batch_size=2, feature_cache_bytes=2**30)


def test_fb_layers_is_checked():
    params = DUAL.model.init(jax.random.key(0))
    for bad in (0, 3, 1.5):
        with pytest.raises(ValueError, match="layers"):
            algorithms.finetune_top(DUAL, params, _data(), jax.random.key(0),
                                    steps=1, lr=0.1, batch_size=2, layers=bad)
    with pytest.raises(ValueError, match="finetune_top_layers"):
        algorithms.lindt(DUAL, client_lr=0.1, finetune_top_steps=1,
                         finetune_top_layers=3)


def test_fb_features_in_chunks_equal_one_pass():
    """The feature cache runs the lower layers ``chunk`` rows at a time, with
    a shorter last chunk."""
    from fedjax_pfl.algorithms import _lindt

    params = DUAL.model.init(jax.random.key(1))
    x = jnp.asarray(np.random.default_rng(2).normal(size=(13, 4)), jnp.float32)
    one = _lindt._lower(DUAL)(params, x)
    for chunk in (4, 13, 64):
        np.testing.assert_allclose(_lindt._features(DUAL, params, x, chunk), one,
                                   rtol=1e-6, atol=1e-6)
