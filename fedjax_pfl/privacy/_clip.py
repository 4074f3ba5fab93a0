"""Per-example clipping inside ONE client's step: nested vmap or ghost norms.

Both paths return the same clipped gradient ``(sum_i c_i m_i g_i) / denominator``
(``g_i`` the gradient of example i's loss, ``m_i`` the batch mask, ``c_i`` the
clip factor) plus the gradient of the model's regularizer, which is
data-independent and therefore neither clipped nor noised.

* ``"vmap"``: ``vmap(value_and_grad)`` over the examples materializes every
  per-example gradient (``B x |params|`` floats; ``chunk_size=k`` bounds that to
  ``k x |params|`` with a ``lax.scan`` over chunks of k examples).
* ``"ghost"``: per-example norms from one backward pass w.r.t. the Dense/Conv
  outputs (:mod:`._ghost`); the clipped gradient from the same layer inputs and
  output gradients reweighted by the clip factors (no second backward pass).
* ``"auto"``: ghost when every parameter belongs to a supported Dense/Conv
  layer; otherwise nested vmap, with a ``UserWarning`` and ``ghost = False`` in
  the returned info (the DP algorithms report it as the ``dp/ghost`` metric).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.models import Model, Params
from fedjax_pfl.validation import is_concrete

from ._ghost import ghost_losses_and_norms, ghost_plan, ghost_weighted_grad

METHODS = ("auto", "ghost", "vmap")
FAIR_CLIP_MODES = ("sign_preserving", "paper", "code")


def clip_factor(norms: jax.Array, clip, weights=None,
                mode: str = "sign_preserving") -> jax.Array:
    """Factors ``c_i`` such that ``c_i g_i`` is example i's clipped gradient.

    Without ``weights``: ``min(1, clip / ||g_i||)`` (DP-SGD; 1 when the norm is
    0; ``clip = inf`` gives 1). With fairness weights ``w_i`` (FedFDP eq. 13,
    ``w_i = 1 + lam (loss_i - F_hat)``):

    * ``"sign_preserving"`` (default, DP-safe): ``w_i min(1, clip / (|w_i| ||g_i||))``,
      so ``||c_i g_i|| <= clip`` always; equals the paper's formula when ``w_i >= 0``.
    * ``"paper"``: ``min(w_i, clip / ||g_i||)``, literal; unbounded when
      ``w_i < 0`` (NOT differentially private then).
    * ``"code"``: the authors' ``w_i min(clip / (w_i ||g_i|| + 1e-6), 1)``.
    """
    if mode not in FAIR_CLIP_MODES:
        raise ValueError(f"fair_clip: must be one of {FAIR_CLIP_MODES}, got {mode!r}")
    norms = jnp.asarray(norms)
    w = jnp.ones_like(norms) if weights is None else jnp.asarray(weights, norms.dtype)
    if mode == "sign_preserving":
        scaled = jnp.abs(w) * norms
        ok = scaled > 0
        return w * jnp.where(ok, jnp.minimum(1.0, clip / jnp.where(ok, scaled, 1.0)),
                             1.0)
    if mode == "paper":
        ok = norms > 0
        return jnp.minimum(w, jnp.where(ok, clip / jnp.where(ok, norms, 1.0), jnp.inf))
    return w * jnp.minimum(clip / (w * norms + 1e-6), 1.0)


def tree_sq_norms(tree) -> jax.Array:
    """Per-row squared L2 norms ``[B]`` of a pytree whose leaves are ``[B, ...]``."""
    return sum(jnp.sum(jnp.square(a.reshape(a.shape[0], -1)), axis=1)
               for a in jax.tree.leaves(tree))


def example_loss(model: Model, params: Params, x, y) -> jax.Array:
    """Loss of ONE example (no batch axis), regularizer excluded."""
    return model.loss(model.apply(params, x[None]), y[None])[0]


def resolve_method(model: Model, params, x, method: str):
    """``(layers or None, reason)``: the ghost plan, or None for nested vmap."""
    if method not in METHODS:
        raise ValueError(f"clip_method: must be one of {METHODS}, got {method!r}")
    if method == "vmap":
        return None, "clip_method='vmap'"
    layers, reason = ghost_plan(model, params, x)
    if layers is None:
        if method == "ghost":
            raise ValueError(f"clip_method: 'ghost' does not apply to this model "
                             f"({reason}); use 'auto' or 'vmap'")
        warnings.warn(f"per-example clipping falls back to nested vmap: {reason}",
                      UserWarning, stacklevel=3)
    return layers, reason


def _vmap_chunk(model, params, x, y, mask, weights, clip, fair_clip):
    losses, grads = jax.vmap(jax.value_and_grad(
        lambda p, xi, yi: example_loss(model, p, xi, yi)), in_axes=(None, 0, 0))(
        params, x, y)
    norms = jnp.sqrt(tree_sq_norms(grads)) * mask  # padded rows: 0, as with ghost
    c = clip_factor(norms, clip, weights, fair_clip) * mask
    total = jax.tree.map(lambda g: jnp.tensordot(c.astype(g.dtype), g, axes=1), grads)
    return total, (losses, norms, c)


def _vmap_clipped_sum(model, params, x, y, mask, clip, weight_fn, fair_clip,
                      chunk_size):
    b = x.shape[0]
    weights = None
    if weight_fn is not None:  # the whole batch's losses first (a forward pass)
        losses = jax.vmap(lambda xi, yi: example_loss(model, params, xi, yi))(x, y)
        weights = weight_fn(losses, mask)
    if chunk_size is None or chunk_size >= b:
        return _vmap_chunk(model, params, x, y, mask, weights, clip, fair_clip)
    k = chunk_size
    n = -(-b // k)
    pad = n * k - b

    def chunked(a):
        a = jnp.concatenate([a, jnp.zeros((pad, *a.shape[1:]), a.dtype)]) if pad else a
        return a.reshape(n, k, *a.shape[1:])

    ws = chunked(jnp.ones((b,), jnp.float32) if weights is None else weights)
    xs, ys, ms = chunked(x), chunked(y), chunked(mask)
    zero = jax.tree.map(jnp.zeros_like, params)

    def body(acc, inp):
        xc, yc, mc, wc = inp
        s, info = _vmap_chunk(model, params, xc, yc, mc, wc, clip, fair_clip)
        return jax.tree.map(jnp.add, acc, s), info

    total, info = jax.lax.scan(body, zero, (xs, ys, ms, ws))
    info = jax.tree.map(lambda a: a.reshape(n * k)[:b], info)
    return total, info


def _unclipped_grad(model, params, x, y, mask, denominator, weight_fn):
    def objective(p):
        per = model.loss(model.apply(p, x), y)
        c = mask
        if weight_fn is not None:
            c = c * weight_fn(jax.lax.stop_gradient(per), mask)
        c = jax.lax.stop_gradient(c)
        out = jnp.sum(per * c) / denominator
        if model.regularizer is not None:
            out = out + model.regularizer(p)
        return out, (jax.lax.stop_gradient(per), c)

    grad, (losses, c) = jax.grad(objective, has_aux=True)(params)
    return grad, {"losses": losses, "norms": jnp.zeros_like(losses), "factors": c,
                  "ghost": False}


def clipped_grad(
    model: Model,
    params: Params,
    x: jax.Array,
    y: jax.Array,
    mask: jax.Array,
    *,
    clip,
    denominator,
    method: str = "auto",
    chunk_size: int | None = None,
    weight_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
    fair_clip: str = "sign_preserving",
) -> tuple[Params, dict]:
    """The clipped minibatch gradient of one client (no noise).

    Args:
      model, params: the model and ONE client's parameters.
      x, y, mask: a padded batch ``[B, ...]``; rows with ``mask = 0`` do not count.
      clip: the per-example L2 bound C (may be traced; ``inf`` disables clipping).
      denominator: the normaliser (realised or expected batch size).
      method: ``"auto"``, ``"ghost"`` or ``"vmap"`` (see the module docstring).
      chunk_size: examples per chunk of the nested-vmap path (memory bound).
      weight_fn: optional ``(per-example losses [B], mask [B]) -> weights [B]``
        (FedFDP's fairness weights); the factors become :func:`clip_factor`
        with weights. The losses are at ``params``, so the weights may use the
        whole batch (e.g. FedFair's batch-mean loss).
      fair_clip: the weighted clip rule (:func:`clip_factor`).

    Returns:
      ``(grad, info)``: ``grad = sum_i c_i m_i g_i / denominator + grad(reg)``;
      ``info`` has per-example ``losses``, ``norms`` (0 for padded rows),
      ``factors`` (``c_i m_i``) and the static bool ``ghost``.
    """
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size: must be a positive integer, got {chunk_size!r}")
    mask = mask.astype(jnp.float32)
    if is_concrete(clip) and np.all(np.isinf(np.asarray(clip))):
        # no clipping: the (weighted) gradient needs no per-example norms, one
        # forward and one backward pass, like a plain step (norms reported as 0)
        return _unclipped_grad(model, params, x, y, mask, denominator, weight_fn)
    layers, _ = resolve_method(model, params, x, method)
    if layers is not None:
        losses, norms, (acts, deltas) = ghost_losses_and_norms(
            model, layers, params, x, y, mask)
        w = None if weight_fn is None else weight_fn(losses, mask)
        c = jax.lax.stop_gradient(clip_factor(norms, clip, w, fair_clip) * mask)
        grad = jax.tree.map(lambda g: g / denominator,
                            ghost_weighted_grad(layers, params, acts, deltas, c))
        if model.regularizer is not None:
            grad = jax.tree.map(jnp.add, grad, jax.grad(model.regularizer)(params))
        return grad, {"losses": losses, "norms": norms, "factors": c, "ghost": True}
    total, (losses, norms, c) = _vmap_clipped_sum(
        model, params, x, y, mask, clip, weight_fn, fair_clip, chunk_size)
    grad = jax.tree.map(lambda s: s / denominator, total)
    if model.regularizer is not None:
        grad = jax.tree.map(jnp.add, grad, jax.grad(model.regularizer)(params))
    return grad, {"losses": losses, "norms": norms, "factors": c, "ghost": False}
