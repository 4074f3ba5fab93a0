"""Aggregators as ``(init, aggregate)`` pairs over stacked client updates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

PyTree = Any


class Aggregator(NamedTuple):
    """A server aggregation rule.

    Attributes:
      init: ``params -> aggregator state``.
      aggregate: ``(state, updates[m, ...], weights[m], mask[m], key) ->
        (aggregated update, state)``. ``mask`` is 1 for cohort members whose update
        counts; rules must be invariant to the order of the cohort.
    """

    init: Callable[[PyTree], PyTree]
    aggregate: Callable[..., tuple[PyTree, PyTree]]
    linear_weights: Callable[[jax.Array, jax.Array], jax.Array] | None = None
    """For rules that are a weighted mean ``sum c_k u_k / sum c_k``:
    ``(weights, mask) -> c``. The engine may then accumulate the mean inside its
    client loop instead of stacking every update (``None``: always stacked)."""


def weighted_mean(updates: PyTree, weights: jax.Array) -> PyTree:
    """``sum_k w_k u_k / sum_k w_k`` over the leading axis."""
    total = jnp.maximum(jnp.sum(weights), 1e-12)

    def avg(u):
        # A contraction, not jnp.sum(w * u, 0): XLA:CPU reduces over the leading
        # axis 100-400x slower than it runs the same dot (docs/sharp-edges.md).
        return jnp.tensordot(weights.astype(u.dtype), u, axes=1) / total

    return jax.tree.map(avg, updates)


def mean(weighted: bool = True) -> Aggregator:
    """(Weighted) mean of the updates: FedAvg's rule (McMahan et al., 2017).

    Args:
      weighted: weight each update by its client's weight (its number of training
        examples); ``False`` gives the plain average of the Ditto paper's Alg. 2.
    """

    def coefficients(weights, mask):
        return mask * weights if weighted else mask

    def aggregate(state, updates, weights, mask, key):
        del key
        return weighted_mean(updates, coefficients(weights, mask)), state

    return Aggregator(lambda params: (), aggregate, coefficients)
