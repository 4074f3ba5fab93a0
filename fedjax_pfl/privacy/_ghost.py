"""Ghost norms: per-example gradient norms without per-example gradients.

One forward/backward pass of the summed per-example loss, with a zero
"perturbation" added to the output of every ``flax.linen.Dense`` and
``flax.linen.Conv`` call (through :func:`flax.linen.intercept_methods`), gives
each layer's input ``a`` and output gradient ``delta`` for every example. The
per-example gradient of a layer with ``T`` positions (sequence or spatial) is
``sum_t a_t (x) delta_t``, so

  ``||g_i||^2 = sum_{t,s} (a_t . a_s)(delta_t . delta_s)``      (Gram form)

plus ``||sum_t delta_t||^2`` for the bias; with ``T = 1`` it is
``||a||^2 ||delta||^2 (+ ||delta||^2)``. A convolution is a Dense layer on its
unfolded input (``jax.lax.conv_general_dilated_patches``, im2col). Per layer the
cheaper of the Gram form and the explicit per-example layer gradient is used.

References: Goodfellow, "Efficient per-example gradient computations" (2015);
Li et al., "Large Language Models Can Be Strong Differentially Private
Learners", ICLR 2022 (ghost clipping); Bu et al., "Scalable and Efficient
Training of Large Convolutional Neural Networks with Differential Privacy",
NeurIPS 2022 (convolutions).

The clipped gradient ``sum_i c_i g_i`` then comes from the same inputs and
output gradients (:func:`ghost_weighted_grad`), without a second backward pass.

The fast path applies only when EVERY parameter of the model belongs to a Dense
or Conv layer called exactly once per forward pass, with supported settings;
:func:`ghost_plan` says why not otherwise (callers fall back to nested vmap).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_pfl.models import Model, channel_last, conv_general_dilated


class _Layer(NamedTuple):
    kind: str  # "dense" or "conv"
    path: tuple[str, ...]
    use_bias: bool
    conv: tuple | None  # (kernel_size, strides, padding, lhs_dil, rhs_dil)


def _tuple(v, n, default=1):
    if v is None:
        return (default,) * n
    if isinstance(v, int):
        return (v,) * n
    return tuple(v)


def _conv_settings(m: nn.Conv, x_ndim: int):
    """``(kernel_size, strides, padding, lhs_dil, rhs_dil)`` or a reason string."""
    ks = m.kernel_size
    ks = (ks,) if isinstance(ks, int) else tuple(ks)
    n = len(ks)
    if x_ndim != n + 2:
        return "Conv input without exactly one batch dimension"
    if m.feature_group_count != 1 or m.mask is not None:
        return "Conv with feature groups or a mask"
    pad = m.padding
    if isinstance(pad, str):
        if pad.upper() not in ("SAME", "VALID"):
            return f"Conv padding {pad!r}"
        pad = pad.upper()
    elif isinstance(pad, int):
        pad = ((pad, pad),) * n
    else:
        pad = tuple((p, p) if isinstance(p, int) else tuple(p) for p in pad)
    return (ks, _tuple(m.strides, n), pad, _tuple(m.input_dilation, n),
            _tuple(m.kernel_dilation, n))


def ghost_plan(model: Model, params, x) -> tuple[list[_Layer] | None, str]:
    """The Dense/Conv layers of ``model`` in call order, or ``(None, reason)``
    when the ghost-norm path does not apply."""
    layers: list[_Layer] = []
    reasons: list[str] = []

    def probe(next_fun, args, kwargs, ctx):
        m = ctx.module
        if ctx.method_name == "__call__" and type(m) in (nn.Dense, nn.Conv):
            inp = args[0] if args else kwargs.get("inputs")
            if type(m) is nn.Dense:
                layers.append(_Layer("dense", tuple(m.path), m.use_bias, None))
            else:
                s = _conv_settings(m, inp.ndim)
                if isinstance(s, str):
                    reasons.append(s)
                layers.append(_Layer("conv", tuple(m.path), m.use_bias,
                                     None if isinstance(s, str) else s))
        return next_fun(*args, **kwargs)

    try:
        with nn.intercept_methods(probe):
            # a fresh function each time: a cached trace would skip the interceptor
            jax.eval_shape(lambda p, x_: model.apply(p, x_), params, x)
    except Exception as e:  # noqa: BLE001 - any model that cannot be probed falls back
        return None, f"could not trace the model: {e!r}"
    if reasons:
        return None, reasons[0]
    paths = [lay.path for lay in layers]
    if len(set(paths)) != len(paths):
        return None, "a Dense/Conv layer is called more than once (shared weights)"
    covered = set()
    for lay in layers:
        covered.add(lay.path + ("kernel",))
        if lay.use_bias:
            covered.add(lay.path + ("bias",))
    leaves = set()
    for kp, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
        leaves.add(_key_path(kp))
    if leaves != covered:
        other = sorted("/".join(map(str, p)) for p in leaves - covered)
        return None, f"parameters outside Dense/Conv layers: {other[:3]}"
    return layers, ""


def _flat(a):
    """``[B, ..., d] -> [B, T, d]``."""
    return a.reshape(a.shape[0], -1, a.shape[-1])


def _patches(a, conv):
    """im2col: ``[B, *spatial, C] -> [B, T, C * prod(kernel)]``."""
    ks, strides, pad, lhs_dil, rhs_dil = conv
    a_nc = jnp.moveaxis(a, -1, 1)
    p = jax.lax.conv_general_dilated_patches(
        a_nc, ks, strides, pad, lhs_dilation=lhs_dil, rhs_dilation=rhs_dil,
        precision=jax.lax.Precision.HIGHEST)
    p = p.reshape(p.shape[0], p.shape[1], -1)  # [B, F, T]
    return jnp.swapaxes(p, 1, 2)


def _layer_sq_norms(a, d, use_bias):
    """Per-example squared gradient norm of ``y_t = a_t W + b`` (``a: [B, T, i]``,
    ``d: [B, T, o]``)."""
    _, t, i = a.shape
    o = d.shape[-1]
    hp = jax.lax.Precision.HIGHEST
    if t == 1:
        sq = jnp.sum(a[:, 0] ** 2, -1) * jnp.sum(d[:, 0] ** 2, -1)
    elif t * t * (i + o) <= t * i * o:  # Gram form is cheaper
        ga = jnp.einsum("bti,bsi->bts", a, a, precision=hp)
        gd = jnp.einsum("bto,bso->bts", d, d, precision=hp)
        sq = jnp.sum(ga * gd, axis=(1, 2))
    else:  # the per-example layer gradient itself
        g = jnp.einsum("bti,bto->bio", a, d, precision=hp)
        sq = jnp.sum(g * g, axis=(1, 2))
    if use_bias:
        sq = sq + jnp.sum(jnp.sum(d, 1) ** 2, -1)
    return sq


def ghost_losses_and_norms(model: Model, layers: list[_Layer], params, x, y, mask):
    """Per-example losses ``[B]``, gradient norms ``[B]`` (regularizer excluded;
    0 for rows with ``mask = 0``) and the layers' ``(inputs, output gradients)``
    (for :func:`ghost_weighted_grad`) from one backward pass."""
    b = x.shape[0]
    shapes: list[Any] = []

    def shape_probe(next_fun, args, kwargs, ctx):
        out = next_fun(*args, **kwargs)
        if ctx.method_name == "__call__" and type(ctx.module) in (nn.Dense, nn.Conv):
            shapes.append(jax.ShapeDtypeStruct(out.shape, out.dtype))
        return out

    with nn.intercept_methods(shape_probe):
        # a fresh function each time: a cached trace would skip the interceptor
        jax.eval_shape(lambda p, x_: model.apply(p, x_), params, x)
    zeros = [jnp.zeros(s.shape, s.dtype) for s in shapes]

    def total(perturbs):
        inputs, k = [], [0]

        def perturb(next_fun, args, kwargs, ctx):
            out = next_fun(*args, **kwargs)
            if ctx.method_name == "__call__" and type(ctx.module) in (nn.Dense, nn.Conv):
                inputs.append(args[0] if args else kwargs["inputs"])
                out = out + perturbs[k[0]]
                k[0] += 1
            return out

        with nn.intercept_methods(perturb):
            per = model.loss(model.apply(params, x), y)
        return jnp.sum(per * mask), (per, inputs)

    (_, (per, inputs)), deltas = jax.value_and_grad(total, has_aux=True)(zeros)
    sq = jnp.zeros((b,), jnp.float32)
    for lay, a, d in zip(layers, inputs, deltas, strict=True):
        a_t = _flat(a) if lay.kind == "dense" else _patches(a, lay.conv)
        sq = sq + _layer_sq_norms(a_t.astype(jnp.float32), _flat(d).astype(jnp.float32),
                                  lay.use_bias)
    return per, jnp.sqrt(sq), (inputs, deltas)


def ghost_weighted_grad(layers: list[_Layer], params, inputs, deltas, c):
    """``sum_i c_i grad loss_i`` from the layers' inputs and per-example output
    gradients of :func:`ghost_losses_and_norms`, with no second backward pass
    (the "book-keeping" trick of Bu et al., ICML 2023): a Dense kernel's gradient
    is ``a^T (c * delta)``, a Conv kernel's the kernel-VJP of the convolution at
    ``a`` with cotangent ``c * delta``, a bias's ``sum c * delta``. Returns a
    pytree like ``params``."""
    grads = {}
    for lay, a, d in zip(layers, inputs, deltas, strict=True):
        cd = d * c.reshape((-1,) + (1,) * (d.ndim - 1)).astype(d.dtype)
        kernel = _get(params, lay.path + ("kernel",))
        if lay.kind == "dense":
            gk = jnp.einsum("bti,bto->io", _flat(a), _flat(cd))
        else:
            _, strides, pad, lhs_dil, rhs_dil = lay.conv
            _, vjp = jax.vjp(lambda k, a=a: conv_general_dilated(
                a, k, strides, pad, lhs_dilation=lhs_dil, rhs_dilation=rhs_dil,
                dimension_numbers=channel_last(a.ndim)), kernel.astype(a.dtype))
            gk, = vjp(cd)
        grads[lay.path + ("kernel",)] = gk.astype(kernel.dtype)
        if lay.use_bias:
            grads[lay.path + ("bias",)] = jnp.sum(
                _flat(cd), axis=(0, 1)).astype(_get(params, lay.path + ("bias",)).dtype)
    return jax.tree_util.tree_map_with_path(
        lambda kp, _: grads[_key_path(kp)], params)


def _key_path(kp) -> tuple[str, ...]:
    return tuple(getattr(k, "key", getattr(k, "name", str(k))) for k in kp)


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree

