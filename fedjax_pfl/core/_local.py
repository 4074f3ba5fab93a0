"""The one-client local training kernel (minibatch SGD or any optax optimizer)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.data._federated import Split, client_batch_indices, gather_batch
from fedjax_pfl.models._model import Model, Params, batch_loss


def client_loss(model: Model, params: Params, split: Split, client: jax.Array,
                *, metric: bool = False) -> jax.Array:
    """Mean loss (or metric) of ``params`` over ALL of one client's rows of
    ``split`` (padded to the split's largest client, masked); NaN if it has none.
    The loss includes the model's regularizer, as in training."""
    rows, mask = client_batch_indices(split, client, jax.random.key(0), num_steps=1,
                                      batch_size=1, sampling="full_batch")
    b = gather_batch(split, rows[0], mask[0])
    if metric:
        out = model.metric(model.apply(params, b.x), b.y)
        val = jnp.sum(out * b.mask) / jnp.maximum(jnp.sum(b.mask), 1.0)
    else:
        val = batch_loss(model, params, b.x, b.y, b.mask)
    return jnp.where(split.counts[client] > 0, val, jnp.nan)


def prox_penalty(lam, anchor: Params) -> Callable[[Params], jax.Array]:
    """``p -> lam/2 ||p - anchor||^2`` (gradient ``lam (p - anchor)``)."""

    def penalty(p):
        sq = sum(jnp.sum(jnp.square(a - b)) for a, b in
                 zip(jax.tree.leaves(p), jax.tree.leaves(anchor)))
        return 0.5 * lam * sq

    return penalty


def scan_steps(step, carry, xs, unroll):
    """``lax.scan(step, carry, xs, unroll=unroll)``, except that a full unroll
    (``unroll is True`` or ``>=`` the length) is a Python loop: straight-line code
    with no ``while`` at all. ``lax.scan(unroll=True)`` still wraps the body in a
    one-trip ``while``, and XLA:CPU runs convolutions inside a ``while`` body
    about 10x slower (docs/engine.md)."""
    length = jax.tree.leaves(xs)[0].shape[0]
    if unroll is True or (not isinstance(unroll, bool) and unroll >= length):
        outs = []
        for t in range(length):
            carry, out = step(carry, jax.tree.map(lambda a, t=t: a[t], xs))
            outs.append(out)
        return carry, jax.tree.map(lambda *o: jnp.stack(o), *outs)
    return jax.lax.scan(step, carry, xs, unroll=unroll)


def local_train(
    model: Model,
    params: Params,
    split: Split,
    client: jax.Array,
    key: jax.Array,
    *,
    optimizer: optax.GradientTransformation,
    num_steps: int,
    batch_size: int,
    sampling: str = "with_replacement",
    penalty: Callable[[Params], jax.Array] | None = None,
    unroll: int | bool = 1,
    active_steps: jax.Array | None = None,
) -> tuple[Params, jax.Array]:
    """Runs ``num_steps`` optimizer steps on one client's data.

    Args:
      model: the model.
      params: starting parameters (one client, no client axis).
      split: the flat split to draw batches from.
      client: int32 scalar, this client's id.
      key: this client's key for batch sampling.
      optimizer: an optax transformation; its state starts fresh every call.
      num_steps, batch_size, sampling: see :func:`client_batch_indices`.
      penalty: optional ``params -> scalar`` added to the minibatch loss (e.g.
        Ditto's ``lam/2 ||v - w||^2``).
      unroll: ``lax.scan`` unroll of the step loop (``True`` = fully unrolled:
        XLA:CPU runs conv nets far faster outside while loops).
      active_steps: optional int32 scalar: only the first ``active_steps`` steps
        update the parameters (client-dependent step counts, e.g. epochs, under a
        static ``num_steps`` bound); the loss is averaged over those steps.

    Returns:
      ``(params, mean minibatch loss over the steps)``.
    """
    rows, mask = client_batch_indices(
        split, client, key, num_steps=num_steps, batch_size=batch_size,
        sampling=sampling,
    )

    def objective(p, x, y, m):
        loss = batch_loss(model, p, x, y, m)
        if penalty is not None:
            return loss + penalty(p), loss
        return loss, loss

    def step(carry, inputs):
        p, opt_state = carry
        i, r, m = inputs
        b = gather_batch(split, r, m)
        (_, loss), g = jax.value_and_grad(objective, has_aux=True)(p, b.x, b.y, b.mask)
        upd, new_opt_state = optimizer.update(g, opt_state, p)
        new = (optax.apply_updates(p, upd), new_opt_state)
        if active_steps is not None:
            on = i < active_steps
            new = jax.tree.map(lambda a, b_: jnp.where(on, a, b_), new, (p, opt_state))
        return new, loss

    steps = jnp.arange(num_steps)
    (params, _), losses = scan_steps(step, (params, optimizer.init(params)),
                                     (steps, rows, mask), unroll)
    if active_steps is None:
        return params, jnp.mean(losses)
    on = (steps < active_steps).astype(losses.dtype)
    return params, jnp.sum(losses * on) / jnp.sum(on)
