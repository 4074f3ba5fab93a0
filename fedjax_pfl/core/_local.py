"""The one-client local training kernel (minibatch SGD or any optax optimizer)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.data._federated import Split, client_batch_indices, gather_batch
from fedjax_pfl.models._model import Model, Params, batch_loss


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
        r, m = inputs
        b = gather_batch(split, r, m)
        (_, loss), g = jax.value_and_grad(objective, has_aux=True)(p, b.x, b.y, b.mask)
        upd, opt_state = optimizer.update(g, opt_state, p)
        return (optax.apply_updates(p, upd), opt_state), loss

    (params, _), losses = jax.lax.scan(
        step, (params, optimizer.init(params)), (rows, mask), unroll=unroll
    )
    return params, jnp.mean(losses)
