"""models.conv_general_dilated: same values and gradients as lax, loop-friendly
backward on CPU, native lax for everything it does not cover."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl import models

LAX = jax.lax.conv_general_dilated


def _dn(nd):
    sp = "HWD"[:nd]
    return "N" + sp + "C", sp + "IO", "N" + sp + "C"


def _loss(conv, nd, pad, strides=None):
    strides = strides or (1,) * nd
    return lambda x, k: jnp.sum(jnp.sin(conv(x, k, strides, pad,
                                             dimension_numbers=_dn(nd))))


def _arrays(x_shape, k_shape):
    x = jax.random.normal(jax.random.key(0), x_shape, jnp.float32)
    k = jax.random.normal(jax.random.key(1), k_shape, jnp.float32)
    return x, k


def _uses_custom_vjp(fn, *args):
    return "custom_vjp_call" in str(jax.make_jaxpr(fn)(*args))


@pytest.mark.parametrize("x_shape,k_shape,pad", [
    ((2, 9, 8, 3), (5, 5, 3, 4), "SAME"),
    ((2, 9, 8, 3), (3, 2, 3, 4), "VALID"),
    ((2, 9, 8, 3), (4, 3, 3, 4), "SAME"),              # even kernel: uneven pads
    ((2, 9, 8, 3), (3, 3, 3, 4), ((2, 0), (1, 3))),    # explicit pads
    ((2, 9, 8, 3), (3, 3, 3, 4), ((-1, 0), (1, 5))),   # negative pad crops
    ((3, 11, 2), (4, 2, 5), "SAME"),                   # 1-D
    ((2, 6, 5, 4, 2), (2, 3, 2, 2, 3), "SAME"),        # 3-D
])
def test_values_and_gradients_equal_lax(x_shape, k_shape, pad):
    x, k = _arrays(x_shape, k_shape)
    nd = len(x_shape) - 2
    ours, ref = _loss(models.conv_general_dilated, nd, pad), _loss(LAX, nd, pad)
    assert _uses_custom_vjp(jax.grad(ours, (0, 1)), x, k)
    np.testing.assert_allclose(ours(x, k), ref(x, k), rtol=1e-5)
    for g, h in zip(jax.grad(ours, (0, 1))(x, k), jax.grad(ref, (0, 1))(x, k)):
        np.testing.assert_allclose(g, h, rtol=1e-4, atol=1e-4)


def test_second_order_reverse_over_reverse_equals_lax():
    x, k = _arrays((2, 7, 7, 2), (3, 3, 2, 3))
    v = jax.random.normal(jax.random.key(2), k.shape)

    def hvp(conv):
        f = _loss(conv, 2, "SAME")
        return jax.grad(lambda kk: jnp.vdot(jax.grad(f, 1)(x, kk), v))(k)

    np.testing.assert_allclose(hvp(models.conv_general_dilated), hvp(LAX),
                               rtol=1e-4, atol=1e-4)


def test_per_example_gradients_under_vmap_equal_lax():
    x, k = _arrays((5, 6, 6, 2), (3, 3, 2, 4))

    def per_example(conv):
        f = _loss(conv, 2, "SAME")
        return jax.vmap(lambda xi: jax.grad(f, 1)(xi[None], k))(x)

    np.testing.assert_allclose(per_example(models.conv_general_dilated),
                               per_example(LAX), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kw", [
    dict(strides=(2, 2)),
    dict(dn=("NCHW", "OIHW", "NCHW")),
    dict(rhs_dilation=(2, 1)),
    dict(feature_group_count=2),
])
def test_other_convolutions_fall_back_to_lax(kw):
    if "dn" in kw:
        x, k = _arrays((2, 4, 8, 8), (6, 4, 3, 3))
        dn = kw["dn"]
    else:
        x, k = _arrays((2, 8, 8, 4), (3, 3, 4 // kw.get("feature_group_count", 1), 6))
        dn = _dn(2)
    args = dict(window_strides=kw.get("strides", (1, 1)), padding="SAME",
                rhs_dilation=kw.get("rhs_dilation"), dimension_numbers=dn,
                feature_group_count=kw.get("feature_group_count", 1))
    f = lambda conv: (lambda x, k: jnp.sum(conv(x, k, **args) ** 2))  # noqa: E731
    assert not _uses_custom_vjp(jax.grad(f(models.conv_general_dilated), 1), x, k)
    np.testing.assert_array_equal(jax.grad(f(models.conv_general_dilated), 1)(x, k),
                                  jax.grad(f(LAX), 1)(x, k))


def test_zoo_convs_are_flax_conv_with_the_loop_friendly_gradient():
    m = models.ditto_fmnist_cnn()
    params = m.init(jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (3, 784))
    y = jnp.array([0, 1, 2])
    loss = lambda p, x: models.cross_entropy(m.apply(p, x), y).mean()  # noqa: E731
    assert isinstance(models.Conv(4, (3, 3)), nn.Conv)  # the DP ghost path's test
    assert _uses_custom_vjp(jax.grad(loss), params, x)
    # inside a client loop (lax.map) == the same gradients one by one
    xs = jnp.stack([x, 2 * x])
    mapped = jax.jit(lambda p, xs: jax.lax.map(lambda xi: jax.grad(loss)(p, xi), xs))
    for i in range(2):
        one = jax.jit(jax.grad(loss))(params, xs[i])
        for a, b in zip(jax.tree.leaves(mapped(params, xs)), jax.tree.leaves(one)):
            np.testing.assert_allclose(a[i], b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window, strides, padding, shape", [
    ((2, 2), (2, 2), "VALID", (3, 8, 6, 4)), ((2, 2), (2, 2), "SAME", (2, 4, 4, 3)),
    ((3, 3), (3, 3), "VALID", (2, 9, 6, 2)), ((2, 2), (1, 1), "VALID", (2, 5, 5, 2)),
    ((2, 2), (2, 2), "VALID", (2, 5, 4, 2))])  # last two: flax's path
def test_max_pool_equals_flax(window, strides, padding, shape):
    """Same values and (without ties) the same gradient as nn.max_pool; with
    tied maxima the gradient is shared, so each window's total is the same."""
    x = jnp.asarray(np.random.default_rng(0).normal(size=shape), jnp.float32)
    ours = models.max_pool(x, window, strides, padding)
    np.testing.assert_array_equal(ours, nn.max_pool(x, window, strides, padding))
    g = [jax.grad(lambda a, f=f: jnp.sum(jnp.sin(f(a, window, strides, padding))))(x)
         for f in (models.max_pool, nn.max_pool)]
    np.testing.assert_allclose(g[0], g[1], atol=1e-6)
    ties = jnp.zeros((1, 4, 4, 1))
    gt = jax.grad(lambda a: jnp.sum(models.max_pool(a, (2, 2), (2, 2))))(ties)
    np.testing.assert_allclose(gt, 0.25)
