"""Local training of one client: the one layer every algorithm's local steps go
through (any optax optimizer, steps or epochs, per-client trip counts)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_pfl.data import (
    SAMPLING_MODES,
    Split,
    client_batch_indices,
    gather_batch,
)
from fedjax_pfl.models import Model, Params, batch_loss
from fedjax_pfl.validation import check_int, check_positive

from ._eval import _client_sums
from ._round import check_unroll, current_engine


def client_loss(model: Model, params: Params, split: Split, client: jax.Array,
                *, metric: bool = False, differentiable: bool = False,
                row_chunk: int = 64) -> jax.Array:
    """Mean loss (or metric) of ``params`` over ALL of one client's rows of
    ``split``; NaN if it has none. The loss includes the model's regularizer,
    as in training.

    By default only the client's own rows are run (chunks of ``row_chunk`` rows,
    then of 8, the last one masked; dynamic trip counts): a client loop costs
    its clients' rows and a vmapped cohort its own largest client, never the
    split's largest. That loop is not reverse-differentiable; with
    ``differentiable=True`` the rows run as one batch padded to the split's
    largest client (masked), which ``jax.grad`` goes through."""
    count = split.counts[client]
    if differentiable:
        rows, mask = client_batch_indices(split, client, jax.random.key(0),
                                          num_steps=1, batch_size=1,
                                          sampling="full_batch")
        b = gather_batch(split, rows[0], mask[0])
        if metric:
            out = model.metric(model.apply(params, b.x), b.y)
            val = jnp.sum(out * b.mask) / jnp.maximum(jnp.sum(b.mask), 1.0)
        else:
            val = batch_loss(model, params, b.x, b.y, b.mask)
        return jnp.where(count > 0, val, jnp.nan)
    b = max(1, min(split.max_count, row_chunk))
    loss_sum, score_sum = _client_sums(model, params, split, client, b)
    val = (score_sum if metric else loss_sum) / jnp.maximum(count, 1).astype(
        jnp.float32)
    if not metric and model.regularizer is not None:
        val = val + model.regularizer(params)
    return jnp.where(count > 0, val, jnp.nan)


def prox_penalty(lam, anchor: Params) -> Callable[[Params], jax.Array]:
    """``p -> lam/2 ||p - anchor||^2`` (gradient ``lam (p - anchor)``)."""

    def penalty(p):
        sq = sum(jnp.sum(jnp.square(a - b)) for a, b in
                 zip(jax.tree.leaves(p), jax.tree.leaves(anchor)))
        return 0.5 * lam * sq

    return penalty


def linear_penalty(direction: Params) -> Callable[[Params], jax.Array]:
    """``p -> <direction, p>``: adds ``direction`` to every gradient (SCAFFOLD's
    and FedDyn's corrections)."""

    def penalty(p):
        return optax.tree.vdot(direction, p)

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


def run_steps(step, carry, xs, *, unroll=1, active_steps=None):
    """Runs ``step(carry, x_t) -> (carry, out)`` over the leading axis of ``xs``.

    With ``active_steps`` (an int32 scalar, e.g. one client's share of an epoch
    budget) only the first ``active_steps`` entries run, as a loop with that
    trip count: a client costs its own steps, not the static bound. Under
    ``vmap`` the loop runs to the largest count in the batch and the others'
    extra iterations are discarded (same numbers). A concrete Python int
    ``active_steps`` just shortens ``xs``.

    Returns:
      ``(carry, sum of the outs over the steps run, number of steps run)``.
    """
    length = jax.tree.leaves(xs)[0].shape[0]
    if isinstance(active_steps, (int, np.integer)):
        n = max(0, min(int(active_steps), length))
        xs, length, active_steps = jax.tree.map(lambda a: a[:n], xs), n, None
    if active_steps is None:
        if length == 0:
            out = jax.eval_shape(lambda c, x: step(c, x)[1], carry, jax.tree.map(
                lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), xs))
            return carry, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out), 0
        carry, outs = scan_steps(step, carry, xs, unroll)
        return carry, jax.tree.map(lambda o: jnp.sum(o, axis=0), outs), length
    n = jnp.clip(jnp.asarray(active_steps, jnp.int32), 0, length)
    out_shape = jax.eval_shape(lambda c, x: step(c, x)[1], carry,
                               jax.tree.map(lambda a: a[0], xs))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out_shape)

    def body(i, c):
        carry, acc = c
        carry, out = step(carry, jax.tree.map(
            lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), xs))
        return carry, jax.tree.map(jnp.add, acc, out)

    carry, total = jax.lax.fori_loop(0, n, body, (carry, zeros))
    return carry, total, n


class LocalConfig(NamedTuple):
    """How one client trains locally (validated by :func:`make_local_config`).

    Attributes:
      lr: step size (may be traced).
      num_steps: steps per round (when ``epochs`` is None).
      batch_size: minibatch size.
      sampling: a mode of :func:`fedjax_pfl.data.client_batch_indices`.
      unroll: unroll of a fixed-length step loop (``None``: the backend's
        default, :func:`default_unroll`); a client-dependent step count always
        runs as a loop with that client's trip count.
      epochs: count local work in passes over the client's data instead: client
        ``k`` takes ``ceil(epochs n_k / batch_size)`` steps, or with
        ``drop_last`` ``floor(epochs floor(n_k / batch_size))``.
      drop_last: PyTorch ``DataLoader(drop_last=True)`` epochs: every batch lies
        inside one pass (one permutation) and the last incomplete batch of each
        pass is dropped (a client with fewer than ``batch_size`` examples then
        takes no step). Without it a pass has ``ceil(n_k / B)`` batches and the
        last one is completed from the next pass's permutation.
      optimizer: ``lr -> optax.GradientTransformation`` (default ``optax.sgd``);
        its state starts fresh every round.
    """

    lr: float | jax.Array
    num_steps: int
    batch_size: int
    sampling: str
    unroll: int | bool | None
    epochs: float | None = None
    drop_last: bool = False
    optimizer: Callable[[Any], optax.GradientTransformation] = optax.sgd


def default_unroll(num_steps: int) -> bool:
    """Whether to unroll a fixed-length loop of ``num_steps`` local steps: on
    CPU up to 32 steps (XLA:CPU runs small matmuls faster outside while loops,
    benchmarks/throughput.py; full unrolling costs compile time, so it is
    capped)."""
    return jax.default_backend() == "cpu" and num_steps <= 32


def resolve_unroll(unroll: int | bool | None, num_steps: int) -> int | bool:
    """The unroll of a loop of ``num_steps`` local steps: ``unroll`` if given
    (a :class:`LocalConfig`'s own), else the engine's (:func:`current_engine`,
    read when the round is traced), else :func:`default_unroll`."""
    if unroll is None:
        unroll = current_engine().unroll
    return default_unroll(num_steps) if unroll is None else unroll


def make_local_config(client_lr, num_local_steps, batch_size, sampling,
                      epochs=None, *, drop_last: bool = False,
                      optimizer=None, unroll=None) -> LocalConfig:
    """Validates and bundles the local-training arguments (``ValueError`` naming
    the argument). ``epochs`` (``local_epochs``), when given, replaces the step
    count (see :class:`LocalConfig`). ``unroll`` is normally left to the
    engine (``None``: :func:`resolve_unroll` when the round is traced)."""
    check_positive("client_lr", client_lr)
    if epochs is not None:
        check_positive("local_epochs", epochs)
    check_int("num_local_steps", num_local_steps, lo=1)  # a bool is not a count
    check_int("batch_size", batch_size, lo=1)
    check_unroll(unroll)
    if sampling not in SAMPLING_MODES:
        raise ValueError(f"sampling: must be one of {SAMPLING_MODES}, got {sampling!r}")
    if not isinstance(drop_last, bool):
        raise ValueError(f"drop_last: must be True or False, got {drop_last!r}")
    if optimizer is None:
        optimizer = optax.sgd
    elif not callable(optimizer) or isinstance(optimizer,
                                               optax.GradientTransformation):
        raise ValueError(
            "optimizer: must be a function lr -> optax.GradientTransformation (e.g. "
            f"optax.sgd, optax.adam), got {optimizer!r}")
    return LocalConfig(client_lr, num_local_steps, batch_size, sampling, unroll,
                       epochs, drop_last, optimizer)


def _epoch_steps(cfg: LocalConfig, count):
    """Steps that ``count`` examples take under ``cfg.epochs`` (works on Python
    ints and on int32 arrays)."""
    xp = jnp if isinstance(count, jax.Array) else np
    if cfg.drop_last:
        return xp.floor(cfg.epochs * (count // cfg.batch_size))
    return xp.maximum(1, xp.ceil(cfg.epochs * count / cfg.batch_size))


def client_steps(cfg: LocalConfig, split: Split,
                 client) -> tuple[int, jax.Array | None]:
    """``(static step bound, this client's step count or None)`` under ``cfg``:
    ``(num_steps, None)`` for a fixed step count; with ``epochs``, the largest
    client's count and ``client``'s own (:class:`LocalConfig`)."""
    if cfg.epochs is None:
        return cfg.num_steps, None
    bound = max(1, int(_epoch_steps(cfg, split.max_count)))
    own = _epoch_steps(cfg, split.counts[client]).astype(jnp.int32)
    return bound, jnp.minimum(own, bound)


def passes_needed(cfg: LocalConfig, split: Split, num_steps: int) -> int:
    """How many permutations of a client's data ``'epoch'`` sampling must draw
    so that every step a client actually takes has its batch (static)."""
    b, smallest = cfg.batch_size, max(1, split.min_count)
    if cfg.drop_last:
        per_pass = max(1, smallest // b)
        need = -(-num_steps // per_pass)
        if cfg.epochs is not None:
            need = min(need, max(1, math.ceil(cfg.epochs)))
        return need
    need = min(-(-num_steps * b // smallest), num_steps * b)
    if cfg.epochs is not None:  # a client's steps cover < epochs n_k + B rows
        need = min(need, math.ceil(cfg.epochs + b / smallest) + 1)
    return max(1, need)


def run_local(model: Model, params: Params, data, cid: jax.Array, key: jax.Array,
              cfg: LocalConfig, *, penalty: Callable[[Params], jax.Array] | None = None,
              active_steps=None,
              optimizer: optax.GradientTransformation | None = None,
              ) -> tuple[Params, jax.Array]:
    """Local training of one client on its training split under ``cfg``: the
    one place every algorithm's local optimizer steps go through.

    Args:
      model, params: the model and the starting parameters (one client).
      data: the :class:`fedjax_pfl.data.FederatedData`.
      cid, key: the client's id and key.
      cfg: the :class:`LocalConfig`.
      penalty: optional ``params -> scalar`` added to every minibatch loss.
      active_steps: optional step count of this client (an int32 scalar, or a
        Python int for all clients) under ``cfg.num_steps``; ignored with
        ``cfg.epochs`` (the epoch budget sets it).
      optimizer: overrides ``cfg.optimizer(cfg.lr)`` (e.g. a step with an
        anchor, or a per-layer mask).

    Returns:
      ``(params, mean minibatch loss over the steps taken)`` (NaN if none).
    """
    split = data.train
    steps, own = client_steps(cfg, split, cid)
    active = active_steps if own is None else own
    unroll = resolve_unroll(cfg.unroll, steps)
    return local_train(
        model, params, split, cid, key,
        optimizer=cfg.optimizer(cfg.lr) if optimizer is None else optimizer,
        num_steps=steps, batch_size=cfg.batch_size, sampling=cfg.sampling,
        penalty=penalty, unroll=unroll, active_steps=active,
        drop_last=cfg.drop_last,
        num_passes=(passes_needed(cfg, split, steps) if cfg.sampling == "epoch"
                    else None),
    )


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
    active_steps: jax.Array | int | None = None,
    drop_last: bool = False,
    num_passes: int | None = None,
) -> tuple[Params, jax.Array]:
    """Runs ``num_steps`` optimizer steps on one client's data.

    Args:
      model: the model.
      params: starting parameters (one client, no client axis).
      split: the flat split to draw batches from.
      client: int32 scalar, this client's id.
      key: this client's key for batch sampling.
      optimizer: an optax transformation; its state starts fresh every call.
      num_steps, batch_size, sampling, drop_last, num_passes: see
        :func:`fedjax_pfl.data.client_batch_indices`.
      penalty: optional ``params -> scalar`` added to the minibatch loss (e.g.
        Ditto's ``lam/2 ||v - w||^2``).
      unroll: ``lax.scan`` unroll of a fixed-length step loop (``True`` = fully
        unrolled: XLA:CPU runs small models faster outside while loops).
      active_steps: optional int32 scalar: only the first ``active_steps`` steps
        run, as a loop with that trip count (client-dependent step counts, e.g.
        epochs, under the static bound ``num_steps``: see :func:`run_steps`).

    Returns:
      ``(params, mean minibatch loss over the steps taken)`` (NaN if none).
    """
    rows, mask = client_batch_indices(
        split, client, key, num_steps=num_steps, batch_size=batch_size,
        sampling=sampling, drop_last=drop_last, num_passes=num_passes,
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

    (params, _), total, n = run_steps(step, (params, optimizer.init(params)),
                                      (rows, mask), unroll=unroll,
                                      active_steps=active_steps)
    return params, mean_over_steps(total, n)


def mean_over_steps(total, n) -> jax.Array:
    """``total / n``, NaN when no step ran."""
    if isinstance(n, int):
        return total / n if n else jnp.full_like(total, jnp.nan)
    nf = n.astype(total.dtype)
    return jnp.where(n > 0, total / jnp.maximum(nf, 1), jnp.nan)
