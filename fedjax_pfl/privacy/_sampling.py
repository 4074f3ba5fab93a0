"""Poisson sampling of one client's minibatches inside jit (static cap + mask)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fedjax_pfl.validation import check_count, check_int, check_probability

TRUNCATION_TARGET = 1e-12
LADDER_MIN_ROWS = 32  # no rung of a batch ladder is smaller
LADDER_MAX_RUNGS = 8  # one gradient program each


def default_max_batch_size(q: float, n: int) -> int:
    """The static cap of a Poisson(q) batch from a client of at most ``n``
    examples: the smallest ``c`` with ``P(Binomial(n + 1, q) > c) <= 1e-12``,
    at most ``n + 1`` (the ``+ 1`` covers the neighbouring dataset with one more
    record, which then is never truncated when ``c = n + 1``). Computed on the
    host with scipy; see :func:`truncation_probability`."""
    check_probability("q", q)
    n = check_count("n", n)
    from scipy.stats import binom

    c = int(binom.isf(TRUNCATION_TARGET, n + 1, q))
    while c > 0 and binom.sf(c - 1, n + 1, q) <= TRUNCATION_TARGET:
        c -= 1
    while binom.sf(c, n + 1, q) > TRUNCATION_TARGET and c <= n:
        c += 1
    return max(1, min(n + 1, c))


def batch_ladder(max_batch_size: int) -> tuple[int, ...]:
    """The static batch sizes ("rungs") a Poisson batch of cap
    ``max_batch_size`` can be computed at, ascending: ``ceil(cap / sqrt(2)^j)``
    for ``j = 0, 1, ...``, at most :data:`LADDER_MAX_RUNGS` of them, none below
    :data:`LADDER_MIN_ROWS` (``(cap,)``, no ladder, for a cap below twice
    that). See ``EngineConfig(batch_ladder=...)``."""
    cap = check_int("max_batch_size", max_batch_size, lo=1)
    if cap < 2 * LADDER_MIN_ROWS:
        return (cap,)
    rungs = [cap]
    while len(rungs) < LADDER_MAX_RUNGS:
        c = math.ceil(cap / 2 ** (len(rungs) / 2))
        if c < LADDER_MIN_ROWS:
            break
        rungs.append(c)
    return tuple(reversed(rungs))


def truncation_probability(q: float, n: int, max_batch_size: int) -> float:
    """``P(Binomial(n, q) > max_batch_size)``: the chance that one step's Poisson
    batch is truncated (on the host, with scipy)."""
    check_probability("q", q)
    n = check_count("n", n)
    max_batch_size = check_count("max_batch_size", max_batch_size)
    from scipy.stats import binom

    return float(binom.sf(max_batch_size, n, q))


def poisson_batch_indices(split, client, key, *, q, num_steps: int,
                          max_batch_size: int):
    """Poisson-sampled batches of one client: each of its rows is in a step's
    batch independently with probability ``q``.

    Returns ``(rows [num_steps, cap], mask [num_steps, cap], truncated
    [num_steps])``: rows index the flat ``split``; ``mask`` marks the sampled rows;
    batches larger than the static ``cap = max_batch_size`` keep their first
    ``cap`` sampled rows (in data order) and ``truncated`` counts the dropped ones
    (should be 0; a truncation changes the sampling distribution, so report it).
    An empty batch is allowed (all-zero mask).
    """
    check_probability("q", q)
    num_steps = check_count("num_steps", num_steps)
    max_batch_size = check_count("max_batch_size", max_batch_size)
    m = split.max_count
    count = split.counts[client]
    u = jax.random.uniform(key, (num_steps, m))
    take = (u < q) & (jnp.arange(m)[None, :] < count)
    n_taken = jnp.sum(take, axis=1, dtype=jnp.int32)
    idx = jax.vmap(lambda t: jnp.nonzero(t, size=max_batch_size, fill_value=0)[0])(take)
    mask = (jnp.arange(max_batch_size)[None, :] < n_taken[:, None]).astype(jnp.float32)
    truncated = jnp.maximum(n_taken - max_batch_size, 0)
    rows = split.offsets[client] + jnp.where(mask > 0, idx, 0).astype(jnp.int32)
    return rows, mask, truncated


