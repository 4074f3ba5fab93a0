"""Local DP-SGD for ONE client: the private counterpart of ``core.local_train``."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.core import KeyTag, current_engine, mean_over_steps, run_steps
from fedjax_pfl.data import SAMPLING_MODES, client_batch_indices, gather_batch
from fedjax_pfl.models import Model, Params
from fedjax_pfl.validation import (
    check_choice,
    check_clip,
    check_int,
    check_nonnegative,
    check_positive,
    check_probability,
    is_concrete,
)

from ._clip import FAIR_CLIP_MODES, METHODS
from ._noise import private_grad, release_loss
from ._sampling import batch_ladder, default_max_batch_size, poisson_batch_indices

NORMALIZERS = ("expected", "realized")
DP_SAMPLING = ("poisson", *SAMPLING_MODES)


class DPConfig(NamedTuple):
    """Sample-level DP-SGD settings of the local step.

    Attributes:
      clip: per-example L2 bound C (traceable; ``inf`` = no clipping).
      noise_multiplier: sigma; the noise std is ``sigma * C`` (traceable).
      sampling_rate: q of Poisson sampling (``sampling='poisson'``), else None.
      max_batch_size: static cap of a Poisson batch (``None``: from the largest
        client, :func:`default_max_batch_size`).
      normalize: ``"expected"`` (default: q n_i, as Opacus and jax_privacy do;
        the batch size for non-Poisson sampling), a positive number (the FedFDP
        authors' code: 64), or ``"realized"`` (divide by |B_i|, FedFDP's eq. 12;
        an empty batch divides by 1). The realised size depends on the private
        data: with it, no epsilon is a proven bound, and the algorithms'
        declared mechanism says so (``Mechanism.reason``).
      clip_method, chunk_size: see :func:`fedjax_pfl.privacy.clipped_grad`.
      fair_clip: the weighted clip rule (FedFDP only).
    """

    clip: float | jax.Array
    noise_multiplier: float | jax.Array
    sampling_rate: float | jax.Array | None = None
    max_batch_size: int | None = None
    normalize: str | float = "expected"
    clip_method: str = "auto"
    chunk_size: int | None = None
    fair_clip: str = "sign_preserving"


def make_dp_config(clip, noise_multiplier, sampling, sampling_rate=None,
                   max_batch_size=None, normalize="expected", clip_method="auto",
                   chunk_size=None, fair_clip="sign_preserving") -> DPConfig:
    """Validates the DP arguments (``ValueError`` naming the argument)."""
    check_clip("clip", clip)
    check_nonnegative("noise_multiplier", noise_multiplier)
    check_choice("sampling", sampling, DP_SAMPLING)
    if sampling == "poisson":
        if sampling_rate is None:
            raise ValueError("sampling_rate: Poisson sampling needs the rate q in "
                             "(0, 1]")
        check_probability("sampling_rate", sampling_rate)
    check_int("max_batch_size", max_batch_size, lo=1, allow_none=True)
    if isinstance(normalize, str):
        if normalize not in NORMALIZERS:
            raise ValueError(f"normalize: must be one of {NORMALIZERS} or a positive "
                             f"number, got {normalize!r}")
    else:
        check_positive("normalize", normalize)
    check_choice("clip_method", clip_method, METHODS)
    check_int("chunk_size", chunk_size, lo=1, allow_none=True)
    check_choice("fair_clip", fair_clip, FAIR_CLIP_MODES)
    return DPConfig(clip, noise_multiplier,
                    sampling_rate if sampling == "poisson" else None, max_batch_size,
                    normalize, clip_method, chunk_size, fair_clip)


def dp_batches(split, client, key, *, num_steps, batch_size, sampling, dp: DPConfig,
               drop_last: bool = False, num_passes: int | None = None):
    """``(rows, mask, truncated)`` for ``num_steps`` steps (``truncated`` is 0
    without Poisson sampling). Non-Poisson modes draw exactly the rows that
    :func:`fedjax_pfl.core.local_train` draws with the same key."""
    if sampling == "poisson":
        cap = dp.max_batch_size
        if cap is None:
            if not is_concrete(dp.sampling_rate):
                raise ValueError("max_batch_size: needed when sampling_rate is traced")
            cap = default_max_batch_size(float(dp.sampling_rate), split.max_count)
        return poisson_batch_indices(split, client, key, q=dp.sampling_rate,
                                     num_steps=num_steps, max_batch_size=cap)
    rows, mask = client_batch_indices(split, client, key, num_steps=num_steps,
                                      batch_size=batch_size, sampling=sampling,
                                      drop_last=drop_last, num_passes=num_passes)
    return rows, mask, jnp.zeros((num_steps,), jnp.int32)


def dp_denominator(dp: DPConfig, mask, count, batch_size) -> jax.Array:
    """The normaliser of a DP sum over a batch with ``mask`` from a client of
    ``count`` examples: ``|B|`` (at least 1) for ``'realized'``, ``q count``
    (``batch_size`` without Poisson sampling) for ``'expected'``, else the
    number ``dp.normalize``."""
    if dp.normalize == "realized":
        return jnp.maximum(jnp.sum(mask), 1.0)
    if dp.normalize == "expected":
        if dp.sampling_rate is not None:
            return jnp.maximum(dp.sampling_rate * count.astype(jnp.float32), 1e-12)
        return jnp.float32(batch_size)
    return jnp.float32(dp.normalize)


def on_sampled_rows(fn: Callable, rows: jax.Array, mask: jax.Array, dp: DPConfig):
    """``fn(rows, mask)`` of one step's padded batch, on fewer rows when it can:
    for a Poisson batch (its sampled rows come first, :func:`poisson_batch_indices`)
    under an engine with :attr:`~fedjax_pfl.core.EngineConfig.uses_batch_ladder`,
    ``fn(rows[:c], mask[:c])`` for the smallest rung ``c`` of
    :func:`batch_ladder` that holds the sampled rows (``lax.switch``). ``fn``'s
    outputs must not depend on the number of rows (sums, scalars, gradients);
    they equal the whole batch's up to float rounding (the rows left out are
    padding)."""
    cap = rows.shape[0]
    rungs = (batch_ladder(cap) if dp.sampling_rate is not None
             and current_engine().uses_batch_ladder else (cap,))
    if len(rungs) == 1:
        return fn(rows, mask)
    k = jnp.searchsorted(jnp.asarray(rungs, jnp.float32), jnp.sum(mask))
    return jax.lax.switch(jnp.minimum(k, len(rungs) - 1),
                          [lambda c=c: fn(rows[:c], mask[:c]) for c in rungs])


def _private_step(model, split, client, key, dp: DPConfig, batch_size, weight_fn,
                  ghost: list):
    """``(params, step, rows, mask) -> (private gradient, (loss, |B|, clipped))``
    of one DP-SGD step of ``client`` (noise key ``fold_in(fold_in(key,
    KeyTag.DP_NOISE), step)``); appends the clip path's ghost flag to
    ``ghost``."""
    nkey = jax.random.fold_in(key, KeyTag.DP_NOISE)
    count = split.counts[client]

    def grad(p, i, r, m):
        return on_sampled_rows(lambda rr, mm: one(p, i, rr, mm), r, m, dp)

    def one(p, i, r, m):
        b = gather_batch(split, r, m)
        den = dp_denominator(dp, b.mask, count, batch_size)
        g, info = private_grad(
            model, p, b.x, b.y, b.mask, jax.random.fold_in(nkey, i), clip=dp.clip,
            noise_multiplier=dp.noise_multiplier, denominator=den,
            method=dp.clip_method, chunk_size=dp.chunk_size, weight_fn=weight_fn,
            fair_clip=dp.fair_clip)
        ghost.append(info["ghost"])
        n_real = jnp.sum(b.mask)
        loss = jnp.sum(info["losses"] * b.mask) / jnp.maximum(n_real, 1.0)
        if model.regularizer is not None:
            loss = loss + model.regularizer(p)
        w = 1.0 if weight_fn is None else jnp.abs(weight_fn(info["losses"], b.mask))
        clipped = jnp.sum((jnp.abs(info["factors"]) < w * (1 - 1e-6)) * b.mask)
        return g, (loss, n_real, clipped)

    return grad


def _dp_metrics(size_sum, clipped, trunc, n, ghost) -> dict:
    return {
        "dp/batch_size": mean_over_steps(size_sum, n),
        "dp/clipped_fraction": clipped / jnp.maximum(size_sum, 1.0),
        "dp/truncated": trunc.astype(jnp.float32),
        "dp/ghost": jnp.float32(bool(ghost and ghost[0])),
    }


def dp_local_train(
    model: Model,
    params: Params,
    split,
    client: jax.Array,
    key: jax.Array,
    *,
    lr,
    num_steps: int,
    batch_size: int,
    sampling: str,
    dp: DPConfig,
    unroll: int | bool = 1,
    weight_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
    active_steps: jax.Array | int | None = None,
    drop_last: bool = False,
    num_passes: int | None = None,
    correction: Callable[[Params], Params] | None = None,
) -> tuple[Params, jax.Array, dict]:
    """``num_steps`` DP-SGD steps (SGD with step ``lr``) on one client's data.

    Each step draws a batch (Poisson with rate ``dp.sampling_rate``, or a mode of
    :func:`fedjax_pfl.data.client_batch_indices`), clips each example's gradient
    to ``dp.clip``, adds ``N(0, (sigma C)^2)`` to the sum and divides by the
    normaliser. Noise keys are ``fold_in(fold_in(key, KeyTag.DP_NOISE), step)``.
    ``weight_fn(losses, mask)`` gives per-example (fairness) weights, clipped by
    ``dp.fair_clip`` (see :func:`fedjax_pfl.privacy.clip_factor`).
    ``active_steps``, ``drop_last`` and ``num_passes`` are those of
    :func:`fedjax_pfl.core.local_train` (only the first ``active_steps`` steps
    run, with that trip count).

    ``correction``, when given, is ``params -> gradient-shaped pytree``: a
    data-independent term added to the private (clipped, noised, normalised)
    gradient before each SGD step, evaluated at the current iterate: FedProx's
    proximal gradient ``mu (p - w^t)``, SCAFFOLD's ``c - c_k``, FedDyn's
    ``-grad_k + alpha (p - w^t)``. It must read nothing but the iterate and
    values that are public or post-processing of earlier DP releases (the
    round-start model, the server's and the client's state built from them):
    then each step is post-processing of the same noisy gradient and the
    accounting (:func:`fedjax_pfl.privacy.dp_sgd_event`) is unchanged. It is
    not clipped and not noised. ``None`` (default) is plain DP-SGD, the same
    program as before the hook existed.

    Returns:
      ``(params, mean minibatch loss, metrics)`` with ``dp/batch_size`` (mean
      realised batch size), ``dp/clipped_fraction`` (share of examples whose
      factor is below their weight), ``dp/truncated`` (Poisson rows dropped by
      the cap, summed over steps) and ``dp/ghost`` (1 on the ghost-norm path).
      The loss is the data loss (plus the model's regularizer), without the
      ``correction``'s objective.
    """
    rows, mask, truncated = dp_batches(split, client, key, num_steps=num_steps,
                                       batch_size=batch_size, sampling=sampling, dp=dp,
                                       drop_last=drop_last, num_passes=num_passes)
    opt = optax.sgd(lr)
    ghost = []
    grad = _private_step(model, split, client, key, dp, batch_size, weight_fn, ghost)

    def step(carry, inputs):
        p, opt_state = carry
        i, r, m, trunc = inputs
        g, (loss, n_real, clipped) = grad(p, i, r, m)
        if correction is not None:
            g = jax.tree.map(jnp.add, g, correction(p))
        upd, opt_state = opt.update(g, opt_state, p)
        return (optax.apply_updates(p, upd), opt_state), (loss, n_real, clipped,
                                                          trunc)

    (params, _), (loss_sum, size_sum, clipped, trunc), n = run_steps(
        step, (params, opt.init(params)),
        (jnp.arange(num_steps), rows, mask, truncated), unroll=unroll,
        active_steps=active_steps)
    metrics = _dp_metrics(size_sum, clipped, trunc, n, ghost)
    return params, mean_over_steps(loss_sum, n), metrics


def dp_gradient(
    model: Model,
    params: Params,
    split,
    client: jax.Array,
    key: jax.Array,
    *,
    batch_size: int,
    sampling: str,
    dp: DPConfig,
    weight_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
) -> tuple[Params, jax.Array, dict]:
    """DP-SGD's private gradient at ``params`` without the step: the gradient
    that ``dp_local_train(..., num_steps=1)`` with the same key applies (same
    batch, same noise), for methods that upload a function of the gradient
    itself (q-FedSGD). One Poisson-subsampled Gaussian, as one DP-SGD step.

    Returns:
      ``(gradient, minibatch loss, metrics)`` (metrics as
      :func:`dp_local_train`'s).
    """
    rows, mask, truncated = dp_batches(split, client, key, num_steps=1,
                                       batch_size=batch_size, sampling=sampling, dp=dp)
    ghost = []
    grad = _private_step(model, split, client, key, dp, batch_size, weight_fn, ghost)
    g, (loss, n_real, clipped) = grad(params, 0, rows[0], mask[0])
    return g, loss, _dp_metrics(n_real, clipped, truncated[0], 1, ghost)


def dp_client_loss(
    model: Model,
    params: Params,
    split,
    client: jax.Array,
    key: jax.Array,
    *,
    dp: DPConfig,
    loss_clip,
    loss_noise_multiplier,
    batch_size: int = 1,
    sampling: str = "poisson",
) -> jax.Array:
    """FedFDP's private loss release (Ling et al. 2024, eq. 15) for ONE client:
    the private counterpart of :func:`fedjax_pfl.core.client_loss`.

    Draws a fresh batch with ``key`` (Poisson with ``dp.sampling_rate``, or a
    mode of :func:`fedjax_pfl.data.client_batch_indices` with ``batch_size``),
    clips each example's loss of ``params`` to ``[0, loss_clip]``, adds
    ``N(0, (loss_noise_multiplier * loss_clip)^2)`` to the masked sum and
    divides by the normaliser :func:`dp_denominator` (noise key
    ``fold_in(key, KeyTag.FEDFDP_LOSS_NOISE)``). With Poisson batches and a
    data-independent normaliser this is one Poisson-subsampled Gaussian with
    multiplier ``loss_noise_multiplier`` (sensitivity ``loss_clip``), the loss
    term of :func:`fedjax_pfl.privacy.fedfdp_event`. The model's regularizer
    is not included.
    """
    rows, mask, _ = dp_batches(split, client, key, num_steps=1, batch_size=batch_size,
                               sampling=sampling, dp=dp)

    def release(r, m):
        b = gather_batch(split, r, m)
        per = model.loss(model.apply(params, b.x), b.y)
        return release_loss(per, b.mask, loss_clip, loss_noise_multiplier,
                            jax.random.fold_in(key, KeyTag.FEDFDP_LOSS_NOISE),
                            dp_denominator(dp, b.mask, split.counts[client],
                                           batch_size))

    return on_sampled_rows(release, rows[0], mask[0], dp)
