"""A convolution whose gradient runs fast inside XLA:CPU loops.

XLA:CPU runs the convolutions that ``jax.grad`` derives for a channel-last
convolution (the input gradient with a swapped, flipped kernel; the kernel
gradient with batch and feature roles exchanged) 7-10x slower inside a ``while``
body than outside one (jax-ml/jax#12868). Every client loop (``lax.map`` over
clients, ``lax.scan`` over local steps) is such a body, so on CPU a conv net's
round was ~9x slower than a Python loop over clients (docs/engine.md).

:func:`conv_general_dilated` is a drop-in for ``jax.lax.conv_general_dilated``
whose backward pass is written with explicit transposes as ordinary channel-last
(``NHWC``/``HWIO``) forward convolutions, the form XLA:CPU runs fast everywhere.
It applies to stride-1, undilated, ungrouped, channel-last convolutions on the
CPU backend; anything else (or another backend, where the native gradient is
fast) goes to ``jax.lax.conv_general_dilated`` unchanged. Values and gradients
equal the native ones to float rounding (tests/models/test_conv.py).

Use it in flax through :data:`Conv` (``flax.linen.Conv`` with this function):
the modules stay ``nn.Conv``, so the DP ghost-norm path recognizes them.
Forward-mode autodiff (``jax.jvp``) of the CPU path is not available (it is a
``jax.custom_vjp``); reverse-over-reverse works.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp


def channel_last(ndim: int) -> tuple[str, str, str]:
    """Dimension numbers of a channel-last convolution of rank ``ndim``
    (``("NHWC", "HWIO", "NHWC")`` for 4)."""
    sp = "HWDXYZ"[: ndim - 2]
    return "N" + sp + "C", sp + "IO", "N" + sp + "C"


def _pad(a, pads):
    """``lax.pad`` of the spatial axes (negative pads crop)."""
    cfg = [(0, 0, 0)] + [(lo, hi, 0) for lo, hi in pads] + [(0, 0, 0)]
    return jax.lax.pad(a, jnp.zeros((), a.dtype), cfg)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv(x, k, pads, precision):
    dn = channel_last(x.ndim)
    return jax.lax.conv_general_dilated(x, k, (1,) * (x.ndim - 2), pads,
                                        dimension_numbers=dn, precision=precision)


def _conv_fwd(x, k, pads, precision):
    return _conv(x, k, pads, precision), (x, k)


def _conv_bwd(pads, precision, res, dy):
    x, k = res
    nd = x.ndim - 2
    dn = channel_last(x.ndim)
    valid, ones = "VALID", (1,) * nd
    ks = k.shape[:nd]
    # Input gradient: dy (re-padded) convolved with the flipped kernel, I <-> O.
    k_t = jnp.swapaxes(jnp.flip(k, tuple(range(nd))), nd, nd + 1)
    dy_p = _pad(dy, [(s - 1 - lo, s - 1 - hi) for s, (lo, hi) in zip(ks, pads)])
    dx = jax.lax.conv_general_dilated(dy_p, k_t, ones, valid, dimension_numbers=dn,
                                      precision=precision)
    # Kernel gradient: the padded input with batch and channels exchanged
    # (channels as the batch, examples as the features) convolved with dy as the
    # kernel ([*spatial, N, O]); the result [C, *ks, O] transposed to [*ks, C, O].
    sp = tuple(range(1, nd + 1))
    lhs = jnp.transpose(_pad(x, pads), (nd + 1, *sp, 0))
    rhs = jnp.transpose(dy, (*sp, 0, nd + 1))
    dk = jax.lax.conv_general_dilated(lhs, rhs, ones, valid, dimension_numbers=dn,
                                      precision=precision)
    dk = jnp.transpose(dk, (*sp, 0, nd + 1))
    return dx.astype(x.dtype), dk.astype(k.dtype)


_conv.defvjp(_conv_fwd, _conv_bwd)


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None,
                         rhs_dilation=None, dimension_numbers=None,
                         feature_group_count=1, batch_group_count=1, precision=None,
                         preferred_element_type=None):
    """``jax.lax.conv_general_dilated`` with a loop-friendly gradient on CPU
    (module docstring); same signature, same values."""
    args = (lhs, rhs, window_strides, padding)
    kw = dict(lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
              dimension_numbers=dimension_numbers,
              feature_group_count=feature_group_count,
              batch_group_count=batch_group_count, precision=precision,
              preferred_element_type=preferred_element_type)
    nd = lhs.ndim - 2
    ones = (1,) * nd
    plain = (
        jax.default_backend() == "cpu"
        and nd >= 1
        and tuple(window_strides) == ones
        and tuple(lhs_dilation or ones) == ones
        and tuple(rhs_dilation or ones) == ones
        and feature_group_count == 1
        and batch_group_count == 1
        and preferred_element_type is None
        and jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
        == jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape,
                                          channel_last(lhs.ndim))
    )
    if not plain:
        return jax.lax.conv_general_dilated(*args, **kw)
    if isinstance(padding, str):
        pads = jax.lax.padtype_to_pads(lhs.shape[1:-1], rhs.shape[:nd], ones, padding)
    else:
        pads = padding
    pads = tuple((int(lo), int(hi)) for lo, hi in pads)
    return _conv(lhs, rhs, pads, precision)


#: ``flax.linen.Conv`` using :func:`conv_general_dilated` (a ``functools.partial``;
#: instances are ``nn.Conv``).
Conv = functools.partial(nn.Conv, conv_general_dilated=conv_general_dilated)
Conv.__doc__ = """``flax.linen.Conv`` convolving with :func:`conv_general_dilated`.

The same module, parameters and values as ``nn.Conv``, with a gradient that
XLA:CPU runs fast inside the client loop: use it in conv nets of your own."""


def max_pool(x, window_shape, strides=None, padding="VALID"):
    """``flax.linen.max_pool`` that computes non-overlapping pooling as a
    reshape and a max.

    When the windows tile the input exactly (``strides == window_shape`` and the
    spatial sizes are multiples of the window; ``'SAME'`` padding is then the same
    as ``'VALID'``), the pooled value is a ``max`` over reshaped axes, whose
    gradient is elementwise (a mask), instead of ``lax.reduce_window`` whose
    gradient XLA:CPU runs as a variadic reduce-window: the FedAvgCNN step took
    26 % less time with it (docs/engine.md). Same values; the gradient is the
    same except where a window has tied maxima, which share it equally here (and
    go to one of them with ``reduce_window``). Anything else goes to
    ``flax.linen.max_pool``.
    """
    window_shape = tuple(window_shape)
    nd = len(window_shape)
    spatial = x.shape[-nd - 1:-1]
    tiles = (strides is not None and tuple(strides) == window_shape
             and padding in ("VALID", "SAME")
             and all(s % w == 0 for s, w in zip(spatial, window_shape)))
    if not tiles:
        return nn.max_pool(x, window_shape, strides, padding)
    lead = x.shape[:-nd - 1]
    shape = [*lead]
    for s, w in zip(spatial, window_shape):
        shape += [s // w, w]
    y = x.reshape(*shape, x.shape[-1])
    axes = tuple(len(lead) + 2 * i + 1 for i in range(nd))
    return jnp.max(y, axis=axes)
