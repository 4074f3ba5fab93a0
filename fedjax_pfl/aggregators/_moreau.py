"""Fed+'s Moreau-envelope aggregation and the smoothed Weiszfeld kernel it shares
with RFA's geometric median.

Fed+ (Yu et al., "Robustness and Personalization in Federated Learning: A Unified
Approach via Regularization", IEEE EDGE 2022; Kundu et al., Fed+)
aggregates the clients' models ``u_k`` as

    A(U) = argmin_w  sum_k c_k  Psi_hat_{1/sigma}(u_k - w),

the Moreau envelope of the personalization penalty ``Psi``. With the paper's
scaling (``Psi`` proportional to ``sigma``) the aggregate depends only on ``delta``:

* ``"ind0"``: Psi = indicator of {0}; prox(u) = 0; A = the mean (FedProx's).
* ``"sq"``: Psi = sigma delta/2 ||.||^2; prox(u) = u / (1 + delta); A = the mean
  (FedAvg+).
* ``"l2"``: Psi = sigma delta ||.||_2; prox(u) = max(0, 1 - delta/||u||) u; A = a
  Huber-smoothed geometric median (FedGeoMed+).
* ``"l1"``: Psi = sigma delta ||.||_1; prox(u) = sign(u) max(|u| - delta, 0); A = a
  Huber-smoothed coordinatewise median (FedCoMed+).
* ``"zero"``: Psi = 0; prox(u) = u; A = any w (the paper's iteration stays at the
  mean, which is returned).

The ``l1`` prox is the correct soft threshold, not the paper's printed eq. (19)
(``max(0, u - delta sign(u))``, wrong for negative entries). The ``l2`` norm is
over the whole model (all leaves).

Two solvers give the same aggregate where it is unique:

* ``"paper"``: the paper's fixed point (25), ``w <- mean(u) - mean_k prox(u_k - w)``
  from the mean: gradient descent with step ``1/sigma`` on the envelope objective,
  monotone, but it moves ``w`` by at most ``delta`` per iteration (it needs at
  least ``||mean - A|| / delta`` iterations, often thousands);
* ``"irls"``: smoothed Weiszfeld / IRLS with ``nu = delta``, ``w <- sum_k b_k u_k /
  sum_k b_k``, ``b_k = c_k / max(delta, ||u_k - w||)`` (coordinatewise for ``l1``):
  the same fixed point in tens of iterations.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_pfl.validation import check_choice, check_int, check_number

from ._mean import Aggregator, weighted_mean

PyTree = Any

PSI = ("sq", "l2", "l1", "ind0", "zero")
"""The personalization penalties ``Psi`` of Fed+ (Kundu et al., arXiv 2009.06303)."""
LINEAR_PSI = ("sq", "ind0", "zero")
"""Penalties whose aggregate is exactly the (weighted) mean."""
METHODS = ("irls", "paper")


# ------------------------------------------------------------------ tree helpers


def _num_rows(tree: PyTree) -> int:
    return jax.tree.leaves(tree)[0].shape[0]


def _rows(x: jax.Array, v: jax.Array) -> jax.Array:
    """``v[m]`` broadcast against a ``[m, ...]`` leaf."""
    return v.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)


def _zero_rows(updates: PyTree, keep: jax.Array) -> PyTree:
    """Rows with ``keep == 0`` set to exact zeros (NaN/inf included)."""
    return jax.tree.map(
        lambda u: jnp.where(_rows(u, keep) > 0, u, jnp.zeros((), u.dtype)), updates)


def _row_sq_norms(updates: PyTree) -> jax.Array:
    """``[m]`` squared norms of each row's flattened concatenation of leaves (a
    reduction over the trailing axis: fast on XLA:CPU)."""
    return sum(jnp.sum(jnp.square(u.reshape(u.shape[0], -1)), 1)
               for u in jax.tree.leaves(updates))


def _colsum(x: jax.Array) -> jax.Array:
    """``sum_k x[k]`` as a contraction with ones (XLA:CPU's leading-axis
    reductions are slow: docs/engine.md)."""
    return jnp.tensordot(jnp.ones((x.shape[0],), x.dtype), x, axes=1)


def _contract(c: jax.Array, updates: PyTree) -> PyTree:
    """``sum_k c_k u_k`` per leaf (``c`` must be 0 on rows that may hold NaN)."""
    return jax.tree.map(lambda u: jnp.tensordot(c.astype(u.dtype), u, axes=1), updates)


def _tree_norm(tree: PyTree) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree)))


def _coeffs(c) -> jax.Array:
    """Non-negative float coefficients (negative/NaN entries become 0)."""
    c = jnp.asarray(c)
    if not jnp.issubdtype(c.dtype, jnp.floating):
        c = c.astype(jnp.result_type(float))
    return jnp.where(c > 0, c, jnp.zeros((), c.dtype))


def _safe_norm(sq: jax.Array) -> jax.Array:
    """``sqrt(sq)`` with a finite gradient at 0."""
    pos = sq > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1.0)), 0.0)


# -------------------------------------------------------------------------- prox


def prox(psi: str, u: PyTree, delta) -> PyTree:
    """``prox^{1/sigma}_Psi(u)`` for ONE client vector ``u`` (a pytree).

    Args:
      psi: one of :data:`PSI` (see the module docstring).
      u: the client's offset ``w_k - w`` (any pytree of arrays).
      delta: Fed+'s threshold/smoothing constant (may be traced).

    Returns:
      A pytree like ``u``. ``l2`` thresholds the norm of the whole pytree and is 0
      (with a finite gradient) at ``u = 0``.
    """
    check_choice("psi", psi, PSI)
    if psi == "sq":
        return jax.tree.map(lambda x: x / (1 + delta), u)
    if psi == "l2":
        norm = _safe_norm(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(u)))
        scale = jnp.where(norm > delta, 1 - delta / jnp.where(norm > 0, norm, 1.0), 0.0)
        return jax.tree.map(lambda x: (scale * x).astype(x.dtype), u)
    if psi == "l1":
        return jax.tree.map(lambda x: (jnp.sign(x) * jnp.maximum(jnp.abs(x) - delta, 0)
                                       ).astype(x.dtype), u)
    if psi == "ind0":
        return jax.tree.map(jnp.zeros_like, u)
    return u  # "zero"


def prox_stacked(psi: str, U: PyTree, delta) -> PyTree:
    """:func:`prox` of every row of ``U`` (leaves ``[m, ...]``; norms per row)."""
    check_choice("psi", psi, PSI)
    return jax.vmap(lambda u: prox(psi, u, delta))(U)


# --------------------------------------------------------------------- Weiszfeld


def weiszfeld_solve(updates: PyTree, coeffs: jax.Array, nu, *, num_iters: int,
                    tol=0.0, coordinatewise: bool = False,
                    init: PyTree | None = None) -> tuple[PyTree, jax.Array]:
    """:func:`weiszfeld` that also returns the number of iterations run."""
    check_int("num_iters", num_iters, lo=0)
    check_number("nu", nu, lo=0.0, lo_open=True)
    check_number("tol", tol, lo=0.0)
    c = _coeffs(coeffs)
    U = _zero_rows(updates, c)
    z0 = weighted_mean(U, c) if init is None else init

    if coordinatewise:

        def step(z):
            def leaf(u, zl):
                b = _rows(u, c) / jnp.maximum(nu, jnp.abs(u - zl[None]))
                return _colsum(b * u) / jnp.maximum(_colsum(b), 1e-30)

            return jax.tree.map(leaf, U, z)
    else:

        def step(z):
            diff = jax.tree.map(lambda u, zl: u - zl[None], U, z)
            b = c / jnp.maximum(nu, jnp.sqrt(_row_sq_norms(diff)))
            return jax.tree.map(lambda s: s / jnp.maximum(jnp.sum(b), 1e-30).astype(
                s.dtype), _contract(b, U))

    return _fixed_point(step, z0, num_iters, tol)


def weiszfeld(updates: PyTree, coeffs: jax.Array, nu, *, num_iters: int,
              tol=0.0, coordinatewise: bool = False,
              init: PyTree | None = None) -> PyTree:
    """Smoothed Weiszfeld / IRLS over the rows of ``updates``.

    ``z <- sum_k b_k u_k / sum_k b_k`` with ``b_k = c_k / max(nu, ||u_k - z||)``
    (``||.||`` over the flattened concatenation of all leaves), or, with
    ``coordinatewise``, ``b_kj = c_k / max(nu, |u_kj - z_j|)`` per coordinate. It
    minimizes ``sum_k c_k h_nu(||u_k - z||) / nu`` (``h`` the Huber function): the
    geometric median as ``nu -> 0`` (RFA, Pillutla et al. 2019, with ``nu = 1e-6``)
    and exactly Fed+'s FedGeoMed+/FedCoMed+ aggregate with ``nu = delta`` (the
    fixed point of the paper's eqs. (16) and (22)). Each iteration does not
    increase that objective (majorize-minimize).

    Args:
      updates: pytree with leaves ``[m, ...]``.
      coeffs: ``[m]`` non-negative coefficients; rows with 0 are ignored entirely
        (they may hold NaN).
      nu: smoothing (may be traced), ``> 0``.
      num_iters: maximum number of iterations (static).
      tol: stop early once ``||z_new - z|| <= tol * (1 + ||z||)`` (may be traced;
        0 runs all iterations unless a step is exactly 0).
      coordinatewise: per-coordinate weights (the coordinatewise analogue).
      init: starting point (default: the ``coeffs``-weighted mean).

    Returns:
      The aggregate, a pytree like one row of ``updates``.
    """
    return weiszfeld_solve(updates, coeffs, nu, num_iters=num_iters, tol=tol,
                           coordinatewise=coordinatewise, init=init)[0]


def _fixed_point(step, z0: PyTree, num_iters: int, tol) -> tuple[PyTree, jax.Array]:
    """Iterates ``z <- step(z)`` at most ``num_iters`` times under ``while_loop``,
    stopping once ``||z_new - z|| <= tol (1 + ||z||)``; returns ``(z, iters)``."""

    def cond(carry):
        i, _, done = carry
        return (i < num_iters) & ~done

    def body(carry):
        i, z, _ = carry
        z_new = step(z)
        moved = _tree_norm(jax.tree.map(jnp.subtract, z_new, z))
        return i + 1, z_new, moved <= tol * (1 + _tree_norm(z))

    i, z, _ = jax.lax.while_loop(
        cond, body, (jnp.zeros((), jnp.int32), z0, jnp.zeros((), bool)))
    return z, i


# ------------------------------------------------------------------------ Moreau


class IterationState(NamedTuple):
    """Aggregator state of the iterative rules: the number of solver iterations
    the last aggregation ran (0 before the first round)."""

    iterations: jax.Array


def _iteration_state(params) -> IterationState:
    del params
    return IterationState(jnp.zeros((), jnp.int32))


def moreau_solve(updates: PyTree, coeffs: jax.Array, psi: str = "l2", delta=0.1, *,
                 method: str = "irls", num_iters: int | None = None,
                 tol=1e-6) -> tuple[PyTree, jax.Array]:
    """Fed+'s aggregate ``argmin_w sum_k c_k Psi_hat(u_k - w)``; returns
    ``(aggregate, iterations)`` (see :func:`moreau`; ``iterations`` is 0 for the
    penalties whose aggregate is the mean)."""
    check_choice("psi", psi, PSI)
    check_choice("method", method, METHODS)
    check_number("delta", delta, lo=0.0, lo_open=psi in ("l2", "l1"))
    c = _coeffs(coeffs)
    if psi in LINEAR_PSI:
        return weighted_mean(updates, c), jnp.zeros((), jnp.int32)
    if num_iters is None:
        num_iters = 200 if method == "irls" else 10_000
    if method == "irls":
        return weiszfeld_solve(updates, c, delta, num_iters=num_iters, tol=tol,
                               coordinatewise=psi == "l1")
    check_int("num_iters", num_iters, lo=0)
    check_number("tol", tol, lo=0.0)
    U = _zero_rows(updates, c)
    p = c / jnp.maximum(jnp.sum(c), 1e-30)
    w_mean = _contract(p, U)

    def step(w):
        theta = prox_stacked(psi, jax.tree.map(lambda u, wl: u - wl[None], U, w), delta)
        return jax.tree.map(jnp.subtract, w_mean, _contract(p, theta))

    return _fixed_point(step, w_mean, num_iters, tol)


def moreau_objective(updates: PyTree, coeffs: jax.Array, w: PyTree, psi: str = "l2",
                     delta=0.1) -> jax.Array:
    """``G(w) = sum_k c_k Psi_hat(u_k - w) / (sigma sum_k c_k)``: the objective
    (in units of ``sigma``) the Moreau aggregate minimizes (Fed+'s eq. (7))."""
    check_choice("psi", psi, PSI)
    c = _coeffs(coeffs)
    diff = _zero_rows(jax.tree.map(lambda u, wl: u - wl[None], updates, w), c)
    sq = _row_sq_norms(diff)
    if psi in ("sq", "ind0"):
        env = sq * (delta / (2 * (1 + delta)) if psi == "sq" else 0.5)
    elif psi == "zero":
        env = jnp.zeros_like(sq)
    elif psi == "l2":
        env = _huber(jnp.sqrt(sq), delta)
    else:
        env = sum(jnp.sum(_huber(d, delta).reshape(d.shape[0], -1), 1)
                  for d in jax.tree.leaves(diff))
    return jnp.dot(c, env) / jnp.maximum(jnp.sum(c), 1e-30)


def _huber(r, delta):
    a = jnp.abs(r)
    return jnp.where(a <= delta, 0.5 * a * a, delta * a - 0.5 * delta * delta)


def moreau(psi: str = "l2", delta=0.1, *, method: str = "irls",
           num_iters: int | None = None, tol=1e-6,
           weighted: bool = False) -> Aggregator:
    """Fed+'s Moreau-envelope aggregation (Yu et al., 2022; eqs. (7), (16), (22)
    and (25)).

    ``argmin_w sum_k c_k Psi_hat_{1/sigma}(u_k - w)`` over the cohort's unmasked
    updates, ``c_k = n_k`` if ``weighted`` else 1 (the paper's means are
    unweighted). ``psi="l2"`` is FedGeoMed+, ``"l1"`` FedCoMed+, ``"sq"``
    FedAvg+ (the mean), ``"ind0"`` FedProx's (the mean), ``"zero"`` pure local (the
    mean). For the three mean cases ``linear_weights`` is set, so the engine
    streams the mean instead of stacking the updates.

    The aggregator's state is :class:`IterationState`: the iterations the last
    aggregation took.

    Args:
      psi: one of :data:`PSI`.
      delta: Fed+'s delta (default 0.1, the paper's); may be traced; ``> 0`` for
        ``l2``/``l1``.
      method: ``"irls"`` (smoothed Weiszfeld with ``nu = delta``, coordinatewise
        for ``l1``; default at most 200 iterations) or ``"paper"`` (the paper's
        iteration (25) from the mean; default at most 10,000 iterations).
      num_iters: maximum iterations (static; ``None``: the method's default).
      tol: stop once ``||w_new - w|| <= tol (1 + ||w||)`` (may be traced).
      weighted: weight clients by their weights (training-set sizes).

    Raises:
      ValueError: for an unknown ``psi``/``method``, a bad ``num_iters``, or a
        concrete ``delta``/``tol`` out of range.
    """
    check_choice("psi", psi, PSI)
    check_choice("method", method, METHODS)
    check_number("delta", delta, lo=0.0, lo_open=psi in ("l2", "l1"))
    check_number("tol", tol, lo=0.0)
    check_int("num_iters", num_iters, lo=1, allow_none=True)
    check_choice("weighted", weighted, (True, False))

    def coefficients(weights, mask):
        return mask * weights if weighted else mask

    def aggregate(state, updates, weights, mask, key, losses=None):
        del state, key, losses
        z, iters = moreau_solve(updates, coefficients(weights, mask), psi, delta,
                                method=method, num_iters=num_iters, tol=tol)
        return z, IterationState(iters)

    linear = coefficients if psi in LINEAR_PSI else None
    return Aggregator(_iteration_state, aggregate, linear)
