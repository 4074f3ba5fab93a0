"""Per-example clipping: ghost norms == nested vmap, clip factors (FedFDP's fair
clip, Eq. 13), Gaussian noise statistics, Poisson sampling, argument checks."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl import data as fdata
from fedjax_pfl import models, privacy
from fedjax_pfl.privacy._clip import example_loss


class TinyCNN(nn.Module):
    """Conv SAME -> Conv strided VALID -> Dense over a sequence -> Dense."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3), padding="SAME")(x))
        x = nn.tanh(nn.Conv(6, (3, 3), strides=(2, 2), padding="VALID")(x))  # 3x3
        x = x.reshape(x.shape[0], 3, 18)  # [B, T=3, 18]: Dense on a sequence
        x = nn.relu(nn.Dense(4)(x))  # Gram form (T^2 (i+o) < T i o)
        return nn.Dense(5, use_bias=False)(x.reshape(x.shape[0], -1))


MLP = models.mlp((7,), 5, hidden=(9, 6))
CNN = models.from_flax(TinyCNN(), (8, 8, 2))


def _batch(shape, b=7, seed=0):
    kx, ky = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (b, *shape))
    y = jax.random.randint(ky, (b,), 0, 5)
    mask = jnp.ones((b,)).at[-2:].set(0.0)  # two padded rows
    return x, y, mask


def _max_diff(a, b):
    return max(float(jnp.max(jnp.abs(u - v)))
               for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


@pytest.mark.parametrize("model,shape", [(MLP, (7,)), (CNN, (8, 8, 2))],
                         ids=["mlp", "cnn"])
def test_ghost_equals_nested_vmap(model, shape):
    params = jax.jit(model.init)(jax.random.key(1))
    x, y, mask = _batch(shape)
    assert privacy.ghost_plan(model, params, x)[0] is not None

    @jax.jit
    def both(params, clip):
        kw = {"clip": clip, "denominator": jnp.float32(5.0)}
        g1, i1 = privacy.clipped_grad(model, params, x, y, mask, method="ghost", **kw)
        g2, i2 = privacy.clipped_grad(model, params, x, y, mask, method="vmap", **kw)
        g3, _ = privacy.clipped_grad(model, params, x, y, mask, method="vmap",
                                     chunk_size=3, **kw)  # 7 = 3 + 3 + 1 (padded)
        return (g1, i1), (g2, i2), g3

    # explicit per-example gradients, one example at a time (the definition)
    one = jax.jit(jax.grad(lambda p, xi, yi: example_loss(model, p, xi, yi)))
    per = [jax.tree.map(np.asarray, one(params, x[i], y[i])) for i in range(5)]
    true_norms = np.array([np.sqrt(sum(float(jnp.sum(a * a)) for a in
                                       jax.tree.leaves(g))) for g in per])
    clip = float(np.median(true_norms))  # some clipped, some not
    (g1, i1), (g2, i2), g3 = both(params, clip)
    np.testing.assert_allclose(i1["norms"][:5], true_norms, rtol=1e-5)
    np.testing.assert_allclose(i2["norms"][:5], true_norms, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(i1["norms"][5:]), 0.0)
    assert i1["ghost"] and not i2["ghost"]
    expected = jax.tree.map(lambda *g: sum(min(1.0, clip / n) * gi for gi, n in
                                           zip(g, true_norms)) / 5.0, *per)
    assert _max_diff(g1, expected) < 1e-5
    assert _max_diff(g2, expected) < 1e-5
    assert _max_diff(g3, g2) < 1e-6
    # unclipped: the plain minibatch gradient
    g_inf, _ = both(params, jnp.inf)[0]
    plain = jax.jit(jax.grad(lambda p: models.batch_loss(model, p, x, y, mask)))(params)
    assert _max_diff(g_inf, plain) < 1e-6


def test_fallback_is_visible():
    model = models.mean_model(3)  # a raw self.param: not a Dense/Conv layer
    params = model.init(jax.random.key(0))
    x, y = jnp.zeros((4, 1)), jnp.ones((4, 3))
    plan, reason = privacy.ghost_plan(model, params, x)
    assert plan is None and "outside Dense/Conv" in reason
    with pytest.warns(UserWarning, match="falls back to nested vmap"):
        g, info = privacy.clipped_grad(model, params, x, y, jnp.ones(4), clip=0.5,
                                       denominator=4.0)
    assert info["ghost"] is False
    # each example's gradient is w - y = -1: norm sqrt(3), clipped to 0.5
    np.testing.assert_allclose(g["w"], -0.5 / np.sqrt(3), rtol=1e-6)
    with pytest.raises(ValueError, match="clip_method"):
        privacy.clipped_grad(model, params, x, y, jnp.ones(4), clip=0.5,
                             denominator=4.0, method="ghost")


def test_shared_layer_falls_back():
    class Shared(nn.Module):
        @nn.compact
        def __call__(self, x):
            d = nn.Dense(4)
            return d(nn.relu(d(x)))

    model = models.from_flax(Shared(), (4,))
    plan, reason = privacy.ghost_plan(model, model.init(jax.random.key(0)),
                                      jnp.zeros((2, 4)))
    assert plan is None and "more than once" in reason


def test_clip_factor_oracles():
    """FedFDP's fair-clip factors (Ling et al. 2024, Eq. 13) on hand values."""
    cf = privacy.clip_factor
    w = 1 + 0.1 * (3.0 - 1.0)  # 1.2
    np.testing.assert_allclose(cf(jnp.float32(0.05), 0.1, w), 1.2, rtol=1e-6)
    np.testing.assert_allclose(cf(jnp.float32(0.5), 0.1, w), 0.2, rtol=1e-6)
    np.testing.assert_allclose(cf(jnp.array([0.05, 0.5, 2.0]), 0.1),
                               [1.0, 0.2, 0.05], rtol=1e-6)  # lam = 0: DP-SGD
    np.testing.assert_allclose(cf(jnp.float32(7.0), jnp.inf, 1.7), 1.7)  # C -> inf
    np.testing.assert_array_equal(cf(jnp.float32(0.0), 0.1), 1.0)  # zero gradient
    w = 1 + 1.0 * (0.1 - 2.0)  # -0.9
    np.testing.assert_allclose(cf(jnp.float32(0.5), 0.1, w, "paper"), -0.9, rtol=1e-6)
    np.testing.assert_allclose(cf(jnp.float32(0.5), 0.1, w, "code"), 0.2, rtol=1e-4)
    np.testing.assert_allclose(cf(jnp.float32(0.5), 0.1, w), -0.2, rtol=1e-6)
    rng = np.random.default_rng(0)
    norms = jnp.asarray(rng.exponential(1.0, 1000), jnp.float32)
    ws = jnp.asarray(rng.normal(0.5, 2.0, 1000), jnp.float32)
    for c in (0.01, 0.1, 1.0):
        assert float(jnp.max(jnp.abs(cf(norms, c, ws)) * norms)) <= c + 1e-6
    with pytest.raises(ValueError, match="fair_clip"):
        cf(norms, 0.1, ws, "nope")


def test_gaussian_noise_statistics():
    tree = {"a": jnp.zeros((300, 200)), "b": {"c": jnp.zeros((50_000,))}}
    std = privacy.noise_std(0.5, 1.3)  # 0.65
    noise = jax.jit(privacy.gaussian_noise)(jax.random.key(3), tree, std)
    for leaf in jax.tree.leaves(noise):
        v = np.asarray(leaf).ravel()
        n = v.size
        assert abs(v.mean()) < 4 * 0.65 / np.sqrt(n)
        assert abs(v.std() / 0.65 - 1) < 4 / np.sqrt(2 * n)
    a, c = np.asarray(noise["a"]).ravel()[:50_000], np.asarray(noise["b"]["c"])
    assert abs(np.corrcoef(a, c)[0, 1]) < 4 / np.sqrt(50_000)  # independent leaves
    assert float(privacy.noise_std(jnp.inf, 0.0)) == 0.0  # not NaN
    zero = privacy.gaussian_noise(jax.random.key(0), tree, privacy.noise_std(jnp.inf, 0))
    assert all(float(jnp.max(jnp.abs(z))) == 0.0 for z in jax.tree.leaves(zero))


def test_private_grad_noise_scale():
    """Over many keys, private_grad - clipped_grad ~ N(0, (sigma C / den)^2)."""
    model = models.logistic_regression((3,), 2)
    params = model.init(jax.random.key(0))
    x, y, mask = jax.random.normal(jax.random.key(1), (6, 3)), jnp.arange(6) % 2, \
        jnp.ones(6)
    clip, sigma, den = 0.3, 2.0, 4.0
    exact, _ = privacy.clipped_grad(model, params, x, y, mask, clip=clip,
                                    denominator=den)

    @jax.jit
    def draws(keys):
        return jax.vmap(lambda k: privacy.private_grad(
            model, params, x, y, mask, k, clip=clip, noise_multiplier=sigma,
            denominator=den)[0])(keys)

    g = draws(jax.random.split(jax.random.key(7), 3000))
    z = np.concatenate([np.asarray(a - e[None]).reshape(3000, -1) for a, e in
                        zip(jax.tree.leaves(g), jax.tree.leaves(exact))], axis=1)
    target = sigma * clip / den
    assert abs(z.mean()) < 4 * target / np.sqrt(z.size)
    assert abs(z.std() / target - 1) < 0.03
    # a concrete multiplier 0 skips the draw; a traced 0 draws zero-scaled noise
    def noised(z):
        return privacy.private_grad(model, params, x, y, mask, jax.random.key(3),
                                    clip=clip, noise_multiplier=z, denominator=den)[0]

    assert "random_bits" not in str(jax.make_jaxpr(lambda: noised(0.0))())
    assert "random_bits" in str(jax.make_jaxpr(noised)(0.0))
    skip, traced = jax.jit(lambda: noised(0.0))(), jax.jit(noised)(0.0)
    assert _max_diff(skip, traced) == 0.0 and _max_diff(skip, exact) < 1e-7


def test_poisson_sampling():
    data = fdata.from_client_arrays([(np.arange(n, dtype=np.float32)[:, None],
                                      np.zeros(n, np.int32)) for n in (40, 200, 7)])
    split, q = data.train, 0.1
    cap = privacy.default_max_batch_size(q, split.max_count)
    # the smallest cap whose truncation chance, with one more record, is <= 1e-12
    assert privacy.truncation_probability(q, 201, cap) <= 1e-12
    assert privacy.truncation_probability(q, 201, cap - 1) > 1e-12

    @jax.jit
    def draw(key, client):
        return privacy.poisson_batch_indices(split, client, key, q=q, num_steps=400,
                                             max_batch_size=cap)

    for c, n in enumerate((40, 200, 7)):
        rows, mask, trunc = draw(jax.random.key(c), jnp.int32(c))
        sizes = np.asarray(mask.sum(1))
        assert abs(sizes.mean() - q * n) < 4 * np.sqrt(q * (1 - q) * n / 400)
        assert abs(sizes.var() / (q * (1 - q) * n) - 1) < 0.25
        used = np.asarray(rows)[np.asarray(mask) > 0]
        o = int(split.offsets[c])
        assert used.min() >= o and used.max() < o + n  # only this client's rows
        for r, m in zip(np.asarray(rows), np.asarray(mask)):  # no duplicates
            assert len(set(r[m > 0])) == int(m.sum())
        assert int(trunc.sum()) == 0
    # inclusion frequency of each row ~ q
    rows, mask, _ = draw(jax.random.key(9), jnp.int32(1))
    freq = np.bincount(np.asarray(rows)[np.asarray(mask) > 0] - 40, minlength=200) / 400
    assert abs(freq.mean() - q) < 0.01 and freq.max() < q + 5 * np.sqrt(q / 400)
    # a tiny cap truncates and counts it; an empty batch is allowed
    rows, mask, trunc = privacy.poisson_batch_indices(
        split, jnp.int32(1), jax.random.key(0), q=0.5, num_steps=5, max_batch_size=3)
    assert np.all(np.asarray(mask.sum(1)) == 3) and np.all(np.asarray(trunc) > 50)
    _, mask, _ = privacy.poisson_batch_indices(
        split, jnp.int32(2), jax.random.key(0), q=1e-6, num_steps=3, max_batch_size=2)
    assert float(mask.sum()) == 0.0


def test_bad_arguments():
    m = MLP
    p = m.init(jax.random.key(0))
    x, y, mask = _batch((7,))
    with pytest.raises(ValueError, match="clip_method"):
        privacy.clipped_grad(m, p, x, y, mask, clip=1.0, denominator=1.0, method="x")
    with pytest.raises(ValueError, match="chunk_size"):
        privacy.clipped_grad(m, p, x, y, mask, clip=1.0, denominator=1.0,
                             method="vmap", chunk_size=0)
    for kw, name in [({"clip": 0.0}, "clip"), ({"noise_multiplier": -1.0},
                                                 "noise_multiplier"),
                     ({"sampling_rate": None}, "sampling_rate"),
                     ({"sampling_rate": 1.5}, "sampling_rate"),
                     ({"normalize": "mean"}, "normalize"),
                     ({"normalize": -2.0}, "normalize"),
                     ({"max_batch_size": 0}, "max_batch_size"),
                     ({"max_batch_size": True}, "max_batch_size"),
                     ({"chunk_size": False}, "chunk_size"),
                     ({"clip": "1.0"}, "clip"),
                     ({"clip": float("nan")}, "clip"),
                     ({"sampling": "bootstrap"}, "sampling"),
                     ({"fair_clip": "x"}, "fair_clip")]:
        base = {"clip": 1.0, "noise_multiplier": 1.0, "sampling": "poisson",
                    "sampling_rate": 0.1}
        base.update(kw)
        with pytest.raises(ValueError, match=name):
            privacy.make_dp_config(**base)


def test_ghost_adds_the_unclipped_regularizer_gradient():
    model = models.ditto_vehicle_svm(input_dim=7, l2=0.5)
    params = jax.tree.map(lambda a: jax.random.normal(jax.random.key(3), a.shape),
                          model.init(jax.random.key(1)))  # the SVM starts at 0
    x, _, mask = _batch((7,))
    y = jnp.where(jnp.arange(7) % 2 == 0, 1.0, -1.0)
    kw = {"clip": 0.3, "denominator": jnp.float32(5.0)}
    g_ghost, info = privacy.clipped_grad(model, params, x, y, mask, method="ghost",
                                         **kw)
    g_vmap, _ = privacy.clipped_grad(model, params, x, y, mask, method="vmap", **kw)
    assert info["ghost"] and _max_diff(g_ghost, g_vmap) < 1e-6
    reg = jax.grad(model.regularizer)(params)
    assert _max_diff(reg, jax.tree.map(jnp.zeros_like, reg)) > 0.01  # it matters
