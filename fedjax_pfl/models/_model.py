"""Models as pure ``(init, apply)`` pairs with a per-example loss and metric."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

Params = Any


class Model(NamedTuple):
    """A model as pure functions.

    Attributes:
      init: ``key -> params``.
      apply: ``(params, x[B, ...]) -> outputs[B, ...]``.
      loss: ``(outputs, y) -> [B]`` per-example loss.
      metric: ``(outputs, y) -> [B]`` per-example score in [0, 1] (accuracy).
      regularizer: ``params -> scalar`` added once to each minibatch loss
        (e.g. the Vehicle SVM's ``0.01 ||W||^2``), or ``None``.
    """

    init: Callable[[jax.Array], Params]
    apply: Callable[[Params, jax.Array], jax.Array]
    loss: Callable[[jax.Array, jax.Array], jax.Array]
    metric: Callable[[jax.Array, jax.Array], jax.Array]
    regularizer: Callable[[Params], jax.Array] | None = None


# ----------------------------------------------------------------------------- losses


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example softmax cross-entropy with integer labels."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), -1)[..., 0]


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example 0/1 correctness of the argmax."""
    return (jnp.argmax(logits, -1) == labels).astype(jnp.float32)


def squared_error(preds: jax.Array, targets: jax.Array) -> jax.Array:
    """Per-example ``0.5 * ||pred - target||^2``."""
    d = preds.reshape(preds.shape[0], -1) - targets.reshape(targets.shape[0], -1)
    return 0.5 * jnp.sum(d * d, axis=-1)


def hinge(scores: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example hinge loss ``max(0, 1 - y s)`` with labels in {-1, +1}."""
    return jnp.maximum(0.0, 1.0 - labels * scores.reshape(labels.shape))


def sign_accuracy(scores: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-example 0/1 correctness of ``sign(score) == label`` (labels in {-1, +1})."""
    pred = jnp.where(scores.reshape(labels.shape) >= 0, 1.0, -1.0)
    return (pred == labels).astype(jnp.float32)


def neg_squared_error(preds: jax.Array, targets: jax.Array) -> jax.Array:
    """Regression 'metric': minus the per-example squared error (higher is better)."""
    return -squared_error(preds, targets)


LOSSES = {
    "cross_entropy": (cross_entropy, accuracy),
    "squared_error": (squared_error, neg_squared_error),
    "hinge": (hinge, sign_accuracy),
}


def from_flax(
    module: nn.Module,
    input_shape: tuple[int, ...],
    loss: str = "cross_entropy",
    regularizer: Callable[[Params], jax.Array] | None = None,
) -> Model:
    """Wraps a flax linen module (no mutable collections) as a :class:`Model`.

    Args:
      module: the flax module; called as ``module.apply({'params': p}, x)``.
      input_shape: shape of ONE example (no batch axis), used by ``init``.
      loss: one of ``LOSSES`` ('cross_entropy', 'squared_error', 'hinge').
    """
    if loss not in LOSSES:
        raise ValueError(f"loss: must be one of {sorted(LOSSES)}, got {loss!r}")
    loss_fn, metric_fn = LOSSES[loss]

    def init(key):
        return module.init(key, jnp.zeros((1, *input_shape), jnp.float32))["params"]

    def apply(params, x):
        return module.apply({"params": params}, x)

    return Model(init, apply, loss_fn, metric_fn, regularizer)


def batch_loss(model: Model, params: Params, x, y, mask) -> jax.Array:
    """Masked mean of the per-example loss, plus the model's regularizer."""
    per = model.loss(model.apply(params, x), y)
    out = jnp.sum(per * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    if model.regularizer is not None:
        out = out + model.regularizer(params)
    return out


def num_params(params_or_model: Any, example_input: Any = None) -> int:
    """Number of scalar parameters of a model or of its parameters.

    Nothing is allocated for a model: its ``init`` runs under ``jax.eval_shape``.

    Args:
      params_or_model: one of
        * parameters: a pytree of arrays (or ``jax.ShapeDtypeStruct``), e.g.
          ``model.init(key)``, stacked client states included (every row counts);
        * a :class:`Model` (``models.mlp(...)``, ``from_flax(...)``, the zoo);
        * a flax linen module, with ``example_input``.
      example_input: only with a flax module: a batch of inputs ``[B, ...]``
        (array or ``jax.ShapeDtypeStruct``) as ``module.init`` takes it, or the
        shape of ONE example as a tuple of ints (as :func:`from_flax` takes it).
        Only the module's ``params`` collection is counted.

    Returns:
      The total number of entries of all parameter leaves.

    Raises:
      ValueError: naming the argument, for a flax module without
        ``example_input``, an ``example_input`` with anything but a flax module,
        or a pytree with a leaf that is not an array or a number (e.g. a
        function: a model passed as something other than a :class:`Model`).
    """
    if isinstance(params_or_model, nn.Module):
        if example_input is None:
            raise ValueError(
                "example_input: a flax module needs an example input to build "
                "its parameters: num_params(module, x) with a batch x, or "
                "num_params(module, (28, 28, 1)) with the shape of one example; "
                "or pass a models.Model or the parameters themselves")
        x = example_input
        if isinstance(x, tuple) and all(isinstance(d, int) for d in x):
            x = jax.ShapeDtypeStruct((1, *x), jnp.float32)
        variables = jax.eval_shape(params_or_model.init, jax.random.key(0), x)
        return _count(variables.get("params", {}), "params_or_model")
    if example_input is not None:
        raise ValueError(
            "example_input: only used with a flax module, got "
            f"params_or_model of type {type(params_or_model).__name__}")
    if isinstance(params_or_model, Model):
        shapes = jax.eval_shape(params_or_model.init, jax.random.key(0))
        return _count(shapes, "params_or_model")
    return _count(params_or_model, "params_or_model")


def _count(params: Params, name: str) -> int:
    total = 0
    for leaf in jax.tree.leaves(params):
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            total += math.prod(leaf.shape)
        elif isinstance(leaf, (int, float, complex)) and not isinstance(leaf, bool):
            total += 1
        else:
            raise ValueError(
                f"{name}: expected parameters (a pytree of arrays), a models.Model "
                "or a flax module with example_input; found a leaf of type "
                f"{type(leaf).__name__}")
    return total
