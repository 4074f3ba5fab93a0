"""Aggregators as ``(init, aggregate)`` pairs over stacked client updates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_pfl.validation import check_choice, check_number

PyTree = Any


class Aggregator(NamedTuple):
    """A server aggregation rule.

    Attributes:
      init: ``params -> aggregator state``.
      aggregate: ``(state, updates[m, ...], weights[m], mask[m], key, losses=None)
        -> (aggregated update, state)``. ``mask`` is 1 for cohort members whose
        update counts; rules must be invariant to the order of the cohort.
        ``losses[m]`` are the clients' full-training-set losses at the round-start
        global model, passed when ``needs_losses`` is set (TERM, k-loss).
    """

    init: Callable[[PyTree], PyTree]
    aggregate: Callable[..., tuple[PyTree, PyTree]]
    linear_weights: Callable[[jax.Array, jax.Array], jax.Array] | None = None
    """For rules that are a weighted mean ``sum c_k u_k / sum c_k``:
    ``(weights, mask) -> c``. The engine may then accumulate the mean inside its
    client loop instead of stacking every update (``None``: always stacked)."""
    needs_losses: bool = False
    """Whether clients must also report their training loss at the round-start
    global model (costs one full pass over each selected client's data)."""
    client_dp: Any = None
    """Set by :func:`fedjax_pfl.privacy.client_level_dp` (its clip, noise
    multiplier and whether the wrapped rule is the unweighted mean): algorithms
    read it to declare their client-level DP mechanism."""


def weighted_mean(updates: PyTree, weights: jax.Array) -> PyTree:
    """``sum_k w_k u_k / sum_k w_k`` over the leading axis."""
    total = jnp.maximum(jnp.sum(weights), 1e-12)

    def avg(u):
        # Rows of weight 0 must not leak NaN/inf through 0 * inf.
        keep = (weights != 0).reshape((-1,) + (1,) * (u.ndim - 1))
        u = jnp.where(keep, u, jnp.zeros((), u.dtype))
        # A contraction, not jnp.sum(w * u, 0): XLA:CPU reduces over the leading
        # axis 100-400x slower than it runs the same dot (docs/engine.md).
        return jnp.tensordot(weights.astype(u.dtype), u, axes=1) / total

    return jax.tree.map(avg, updates)


def mean(weighted: bool = True) -> Aggregator:
    """(Weighted) mean of the updates: FedAvg's rule (McMahan et al., 2017).

    Args:
      weighted: weight each update by its client's weight (its number of training
        examples); ``False`` gives the plain average of the Ditto paper's Alg. 2.
    """
    check_choice("weighted", weighted, (True, False))

    def coefficients(weights, mask):
        return mask * weights if weighted else mask

    def aggregate(state, updates, weights, mask, key, losses=None):
        del key, losses
        return weighted_mean(updates, coefficients(weights, mask)), state

    return Aggregator(lambda params: (), aggregate, coefficients)


def tilted_mean(t: float | jax.Array = 1.0, weighted: bool = False) -> Aggregator:
    """TERM's device-level tilted average (Li et al., "Tilted Empirical Risk
    Minimization", ICLR 2021; the 'fair' baseline of the Ditto paper, §4.2).

    ``sum_k c_k u_k / sum_k c_k`` with ``c_k = exp(t * F_k(w^t))`` (times ``n_k`` when
    ``weighted``), ``F_k(w^t)`` being client k's full-training-set loss at the
    round-start global model: the gradient of ``(1/t) log sum_k p_k exp(t F_k)``.
    With the Ditto code's size-weighted cohort sampling and ``weighted=False`` this
    is exactly the code's ``q != 0`` branch. ``t = 0`` is the plain mean; larger
    ``t`` up-weights worse-off clients (fairer; t -> inf approaches AFL).

    Args:
      t: the tilt, a finite number (may be traced).
      weighted: also weight by the clients' weights (training-set sizes).
    """
    check_number("t", t)
    check_choice("weighted", weighted, (True, False))

    def aggregate(state, updates, weights, mask, key, losses=None):
        del key
        if losses is None:
            raise ValueError("tilted_mean: needs the clients' round-start losses")
        size = jnp.log(jnp.maximum(weights, 1e-30)) if weighted else 0.0
        logits = t * losses + size
        logits = jnp.where(mask > 0, logits, -jnp.inf)
        c = jnp.exp(logits - jnp.max(logits))
        return weighted_mean(updates, c), state

    return Aggregator(lambda params: (), aggregate, None, needs_losses=True)
