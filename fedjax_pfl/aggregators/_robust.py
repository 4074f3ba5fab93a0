"""Robust aggregation rules: coordinate-wise median and trimmed mean, Krum and
multi-Krum, the geometric median (RFA), norm clipping, k-norm, k-loss and FedMGDA+.

Every rule is an :class:`Aggregator` over stacked updates (leaves ``[m, ...]``),
ignores rows with ``mask == 0`` entirely (they may hold NaN), does not depend on
the order of the cohort (up to exact ties in a selection), and treats the
flattened concatenation of all leaves as a client's vector wherever a norm or a
distance is involved. Contractions over the client axis are dots (``tensordot``,
Gram matrices): XLA:CPU's leading-axis reductions are slow (docs/engine.md).
Design notes and costs: docs/aggregators.md. Papers: Li et al., ICML 2021
(Ditto's aggregators); Kundu et al., Fed+.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fedjax_pfl.validation import check_choice, check_int, check_number

from ._mean import Aggregator, weighted_mean
from ._moreau import (
    IterationState,
    _contract,
    _iteration_state,
    _num_rows,
    _row_sq_norms,
    _rows,
    _zero_rows,
    weiszfeld_solve,
)

PyTree = Any


def _stateless(params) -> tuple:
    del params
    return ()


def _coefficients(weighted: bool):
    check_choice("weighted", weighted, (True, False))
    def coefficients(weights, mask):
        return (mask > 0) * weights if weighted else (mask > 0).astype(jnp.float32)

    return coefficients


def _ranks(key: jax.Array) -> jax.Array:
    """``[m]`` int ranks of ``key`` ascending (stable: ties by lowest index)."""
    order = jnp.argsort(key, stable=True)
    return jnp.zeros(key.shape, jnp.int32).at[order].set(
        jnp.arange(key.shape[0], dtype=jnp.int32))


def _valid_key(values: jax.Array, valid: jax.Array) -> jax.Array:
    """Sort key putting masked rows last and non-finite values of valid rows just
    before them (a NaN/inf score, norm or loss ranks as the largest valid one)."""
    big = jnp.finfo(values.dtype).max
    return jnp.where(valid, jnp.where(jnp.isfinite(values), values, big), jnp.inf)


def _check_cohort(name: str, m: int, need: int, what: str) -> None:
    if m < need:
        raise ValueError(f"{name}: needs a cohort of at least {need} clients ({what}), "
                         f"got {m}")


# ------------------------------------------------------- coordinate-wise rules


def _sort_select(updates: PyTree, valid: jax.Array, select, *, top: int | None = None,
                 weights: jax.Array | None = None) -> PyTree:
    """Per coordinate, sorts the valid rows' values ascending (masked rows last)
    and returns ``sum_i s_i x_(i)`` (or ``sum_i s_i w_(i) x_(i) / sum_i s_i w_(i)``
    with ``weights``), ``s = select(m_or_top)`` a ``[k]`` vector over sorted
    positions. ``top``: only the ``top`` smallest values are needed (``top_k``)."""

    def leaf(u):
        m = u.shape[0]
        x = u.reshape(m, -1)
        # Masked rows sort last; a finite sentinel keeps 0 * sentinel == 0.
        x = jnp.where(valid[:, None], x, jnp.finfo(x.dtype).max).T  # [d, m]
        if weights is None:
            if top is None:
                xs = jnp.sort(x, axis=1)
            else:
                xs = -jax.lax.top_k(-x, top)[0]
            s = select(xs.shape[1]).astype(x.dtype)
            out = xs @ s
        else:
            w = jnp.where(valid, weights, 0).astype(x.dtype)  # 0 * sentinel == 0
            w = jnp.broadcast_to(w[None], x.shape)
            xs, ws = jax.lax.sort((x, w), dimension=1, num_keys=1)
            s = select(m).astype(x.dtype)
            out = ((xs * ws) @ s) / jnp.maximum(ws @ s, 1e-30)
        return out.reshape(u.shape[1:]).astype(u.dtype)

    return jax.tree.map(leaf, updates)


def coordinate_median() -> Aggregator:
    """Coordinate-wise median (Yin et al., "Byzantine-Robust Distributed Learning:
    Towards Optimal Statistical Rates", ICML 2018).

    Per coordinate, the median of the unmasked updates; for an even count, the
    average of the two middle values (NumPy's convention, as in the Ditto code).
    Unweighted, as in the paper. An empty cohort gives zeros.
    """

    def aggregate(state, updates, weights, mask, key, losses=None):
        del weights, key, losses
        valid = mask > 0
        n = jnp.sum(valid).astype(jnp.int32)
        m = _num_rows(updates)

        def select(k):
            pos = jnp.arange(k)
            s = 0.5 * ((pos == (n - 1) // 2).astype(jnp.float32)
                   + (pos == n // 2).astype(jnp.float32))
            return jnp.where(n > 0, s, 0.0)

        return _sort_select(updates, valid, select, top=m // 2 + 1), state

    return Aggregator(_stateless, aggregate)


def trimmed_mean(beta=0.1, *, weighted: bool = False) -> Aggregator:
    """Coordinate-wise trimmed mean (Yin et al., ICML 2018).

    Per coordinate, drops the ``floor(beta * n)`` largest and smallest of the
    ``n`` unmasked values and averages the rest (weighted by the clients' weights
    with ``weighted``: the weights travel with the values through the sort).
    ``beta = 0`` is the mean.

    Args:
      beta: trimmed fraction per side, in ``[0, 0.5)`` (may be traced).
      weighted: weight the kept values by the clients' weights.
    """
    check_number("beta", beta, lo=0.0, hi=0.5, hi_open=True, scalar=True)
    check_choice("weighted", weighted, (True, False))

    def aggregate(state, updates, weights, mask, key, losses=None):
        del key, losses
        valid = mask > 0
        n = jnp.sum(valid).astype(jnp.int32)
        t = jnp.floor(beta * n).astype(jnp.int32)
        count = jnp.maximum(n - 2 * t, 1)

        def select(k):
            pos = jnp.arange(k)
            keep = (pos >= t) & (pos < n - t)
            return keep / (count if not weighted else 1)

        w = weights if weighted else None
        return _sort_select(updates, valid, select, weights=w), state

    return Aggregator(_stateless, aggregate)


# ---------------------------------------------------------- distance-based rules


def _pairwise_sq_dists(updates: PyTree, valid: jax.Array) -> jax.Array:
    """``[m, m]`` squared distances ``||a||^2 + ||b||^2 - 2 a.b`` from ONE Gram
    matrix accumulated leaf by leaf, after centering on the valid rows' mean (it
    reduces float cancellation and does not change distances)."""
    n = jnp.maximum(jnp.sum(valid), 1)
    center = _contract(valid / n, updates)
    xs = [(u - c[None]).reshape(u.shape[0], -1)
          for u, c in zip(jax.tree.leaves(updates), jax.tree.leaves(center),
                          strict=True)]
    sq = sum(jnp.sum(jnp.square(x), 1) for x in xs)
    gram = sum(x @ x.T for x in xs)
    return jnp.maximum(sq[:, None] + sq[None, :] - 2 * gram, 0.0)


def _krum_scores(updates: PyTree, valid: jax.Array, f: int) -> jax.Array:
    """Krum scores: the sum of squared distances to the ``n - f - 2`` nearest other
    valid updates (masked rows: +inf)."""
    m = _num_rows(updates)
    k_static = m - f - 2
    d = _pairwise_sq_dists(updates, valid)
    others = valid[None, :] & ~jnp.eye(m, dtype=bool)
    d = jnp.where(others, d, jnp.inf)
    nearest = -jax.lax.top_k(-d, k_static)[0]  # [m, k_static] ascending
    n = jnp.sum(valid).astype(jnp.int32)
    # With masks n may be below m: fewer neighbours (at least one).
    k = jnp.clip(n - f - 2, 1, k_static)
    scores = jnp.sum(jnp.where(jnp.arange(k_static) < k, nearest, 0.0), axis=1)
    return _valid_key(scores, valid)


def multi_krum(f: int, m_select: int | None = None, *,
               weighted: bool = False) -> Aggregator:
    """Multi-Krum (Blanchard et al., "Machine Learning with Adversaries: Byzantine
    Tolerant Gradient Descent", NeurIPS 2017; El Mhamdi et al., ICML 2018).

    Each unmasked update's score is the sum of its squared distances to its
    ``n - f - 2`` nearest other updates (``n`` = unmasked count); the output is the
    mean of the ``m_select`` lowest-score updates (ties: lowest cohort index).

    Args:
      f: assumed number of Byzantine clients in the cohort (static int ``>= 0``);
        the cohort size ``m`` must satisfy ``m - f - 2 >= 1`` (checked when the
        rule is traced, since shapes are static). If masks leave fewer rows, at
        least one neighbour is used.
      m_select: how many updates to average (static int ``>= 1``); ``None``:
        ``n - f`` (the Ditto code's choice). ``m_select = 1`` is Krum.
      weighted: weight the selected updates by their clients' weights.
    """
    check_int("f", f, lo=0)
    check_int("m_select", m_select, lo=1, allow_none=True)
    check_choice("weighted", weighted, (True, False))

    def aggregate(state, updates, weights, mask, key, losses=None):
        del key, losses
        m = _num_rows(updates)
        _check_cohort("multi_krum" if m_select != 1 else "krum", m, f + 3,
                      f"n - f - 2 >= 1 with f={f}")
        if m_select is not None and m_select > m:
            raise ValueError(f"m_select: must be <= the cohort size {m}, "
                             f"got {m_select}")
        valid = mask > 0
        updates = _zero_rows(updates, valid)
        n = jnp.sum(valid).astype(jnp.int32)
        count = n - f if m_select is None else jnp.minimum(m_select, n)
        sel = valid & (_ranks(_krum_scores(updates, valid, f)) < count)
        c = sel * weights if weighted else sel.astype(jnp.float32)
        return weighted_mean(updates, c), state

    return Aggregator(_stateless, aggregate)


def krum(f: int) -> Aggregator:
    """Krum (Blanchard et al., NeurIPS 2017): the single unmasked update with the
    lowest score (see :func:`multi_krum`, of which this is ``m_select=1``).

    Args:
      f: assumed number of Byzantine clients in the cohort (static int ``>= 0``;
        the cohort size must be at least ``f + 3``).
    """
    return multi_krum(f, 1)


def geometric_median(nu=1e-6, *, num_iters: int = 100, tol=1e-6,
                     weighted: bool = True) -> Aggregator:
    """Geometric median by smoothed Weiszfeld: RFA (Pillutla et al., "Robust
    Aggregation for Federated Learning", IEEE TSP 2022 / arXiv 2019).

    ``argmin_z sum_k a_k ||u_k - z||`` over the unmasked updates with RFA's weights
    ``a_k = n_k`` (``weighted=False``: ``a_k = 1``), by :func:`weiszfeld` with
    smoothing ``nu``. RFA's own runs use a few (3-5) iterations; the default here
    iterates to ``tol``. The state is :class:`IterationState`.

    Args:
      nu: smoothing, ``> 0`` (may be traced).
      num_iters: maximum Weiszfeld iterations (static int ``>= 1``).
      tol: stop once ``||z_new - z|| <= tol (1 + ||z||)`` (may be traced).
      weighted: weight by the clients' weights (RFA's ``alpha_k``).
    """
    check_number("nu", nu, lo=0.0, lo_open=True)
    check_int("num_iters", num_iters, lo=1)
    check_number("tol", tol, lo=0.0)
    coefficients = _coefficients(weighted)

    def aggregate(state, updates, weights, mask, key, losses=None):
        del state, key, losses
        z, iters = weiszfeld_solve(updates, coefficients(weights, mask), nu,
                                   num_iters=num_iters, tol=tol)
        return z, IterationState(iters)

    return Aggregator(_iteration_state, aggregate)


# -------------------------------------------------------------- norm-based rules


def _median(values: jax.Array, valid: jax.Array) -> jax.Array:
    """Median of the valid entries of a ``[m]`` vector (even: mean of the two
    middle values)."""
    xs = jnp.sort(jnp.where(valid, values, jnp.inf))
    n = jnp.sum(valid).astype(jnp.int32)
    lo, hi = xs[jnp.maximum((n - 1) // 2, 0)], xs[jnp.maximum(n // 2, 0)]
    return jnp.where(n > 0, 0.5 * (lo + hi), 0.0)


def norm_clipping(then: Aggregator | None = None, *,
                  weighted: bool = False) -> Aggregator:
    """Clip every update to the round's median update norm, then aggregate (the
    Ditto paper's "clipping" baseline: Li et al., ICML 2021, §4.3 and its code's
    ``l2_clip``; Li et al., ICML 2021).

    ``c = median_k ||u_k||`` over the unmasked updates (even count: the mean of
    the two middle norms, ``np.median``); ``u_k <- u_k c / (||u_k|| + 1e-10)``
    where ``||u_k|| > c``; then the mean (the code's plain mean; ``weighted``: by
    the clients' weights), or ``then``'s rule on the clipped updates.

    Args:
      then: aggregator applied to the clipped updates (default: the mean, computed
        without materializing the clipped updates). Its state and
        ``needs_losses`` are carried over.
      weighted: for the default mean, weight by the clients' weights.
    """
    if then is not None and not isinstance(then, Aggregator):
        raise ValueError(f"then: must be an Aggregator or None, got "
                         f"{type(then).__name__}")
    coefficients = _coefficients(weighted)

    def aggregate(state, updates, weights, mask, key, losses=None):
        valid = mask > 0
        updates = _zero_rows(updates, valid)
        norms = jnp.sqrt(_row_sq_norms(updates))
        c = _median(norms, valid)
        scale = jnp.where(norms > c, c / (norms + 1e-10), 1.0)
        if then is None:
            return _mean_scaled(updates, coefficients(weights, mask), scale), state
        clipped = jax.tree.map(lambda u: u * _rows(u, scale), updates)
        return then.aggregate(state, clipped, weights, mask, key, losses=losses)

    init = _stateless if then is None else then.init
    return Aggregator(init, aggregate, None,
                      needs_losses=then is not None and then.needs_losses)


def _mean_scaled(updates: PyTree, coeffs: jax.Array,
                         scale: jax.Array) -> PyTree:
    """``sum_k c_k s_k u_k / sum_k c_k`` (the mean of rescaled rows, one dot)."""
    total = jnp.maximum(jnp.sum(coeffs), 1e-12)
    return jax.tree.map(lambda s: s / total.astype(s.dtype),
                        _contract(coeffs * scale, updates))


def k_norm(k: int, *, weighted: bool = False) -> Aggregator:
    """Drop the ``k`` largest-norm updates and average the rest: the Ditto paper's
    "k-norm" baseline (Li et al., ICML 2021, §4.3), the norm-based anomaly
    detector of Bagdasaryan et al. ("How To Backdoor Federated Learning",
    AISTATS 2020). ``k = 0`` is the mean.

    Args:
      k: number of updates dropped (static int ``>= 0``, below the cohort size;
        if masks leave ``n <= k`` rows the update is zero). A NaN norm counts as
        the largest.
      weighted: weight the kept updates by the clients' weights.
    """
    check_int("k", k, lo=0)
    coefficients = _coefficients(weighted)

    def aggregate(state, updates, weights, mask, key, losses=None):
        del key, losses
        _check_cohort("k_norm", _num_rows(updates), k + 1, f"k={k} are dropped")
        valid = mask > 0
        updates = _zero_rows(updates, valid)
        norms = jnp.sqrt(_row_sq_norms(updates))
        # Rank by descending norm among the valid rows (masked rows last; a NaN
        # norm first).
        big = jnp.finfo(norms.dtype).max
        rank = _ranks(jnp.where(valid, -jnp.where(jnp.isfinite(norms), norms, big),
                                jnp.inf))
        keep = valid & (rank >= k)
        return weighted_mean(updates, keep * coefficients(weights, mask)), state

    return Aggregator(_stateless, aggregate)


def k_loss(k: int) -> Aggregator:
    """The Ditto paper's "k-loss" defense (Li et al., ICML 2021, §4.3 and App. D.4;
    Li et al., ICML 2021): return the single update whose client has the
    ``(k+1)``-th largest training loss.

    Follows the reference code: the losses ``F_k(w^t)`` of the unmasked clients on
    their full training sets at the round-start global model (the engine provides
    them: ``needs_losses=True``) are sorted ascending and the update at position
    ``n - k - 1`` is returned (ties: lowest cohort index). With ``k`` the expected
    number of malicious clients, the ``k`` largest losses (poisoned data) are
    skipped. The paper's §4.3 text ("the k-th largest loss") is off by one from
    its App. D.4 and code. If masks leave ``n <= k`` rows the update is zero.

    Args:
      k: number of largest losses skipped (static int ``>= 0``, below the cohort
        size).
    """
    check_int("k", k, lo=0)

    def aggregate(state, updates, weights, mask, key, losses=None):
        del weights, key
        if losses is None:
            raise ValueError("k_loss: needs the clients' round-start losses "
                             "(losses=...)")
        _check_cohort("k_loss", _num_rows(updates), k + 1, f"k={k} are skipped")
        valid = mask > 0
        updates = _zero_rows(updates, valid)
        n = jnp.sum(valid).astype(jnp.int32)
        rank = _ranks(_valid_key(jnp.asarray(losses, jnp.float32), valid))
        sel = valid & (rank == n - k - 1)
        return weighted_mean(updates, sel.astype(jnp.float32)), state

    return Aggregator(_stateless, aggregate, None, needs_losses=True)


# ------------------------------------------------------------------- FedMGDA+


def _project_box_simplex(v: jax.Array, valid: jax.Array, lo, hi,
                         iters: int = 60) -> jax.Array:
    """Euclidean projection of ``v`` onto ``{x: sum_valid x = 1, lo <= x <= hi}``
    (``x = 0`` on invalid entries): ``clip(v - tau, lo, hi)`` with ``tau`` found
    by bisection (the sum is non-increasing in ``tau``). Needs
    ``n lo <= 1 <= n hi``."""
    big = jnp.finfo(v.dtype).max
    a = jnp.min(jnp.where(valid, v, big)) - hi   # sum(clip) = n hi >= 1
    b = jnp.max(jnp.where(valid, v, -big)) - lo  # sum(clip) = n lo <= 1

    def total(tau):
        return jnp.sum(jnp.where(valid, jnp.clip(v - tau, lo, hi), 0.0))

    def body(_, ab):
        a, b = ab
        mid = 0.5 * (a + b)
        big_sum = total(mid) > 1
        return jnp.where(big_sum, mid, a), jnp.where(big_sum, b, mid)

    a, b = jax.lax.fori_loop(0, iters, body, (a, b))
    return jnp.where(valid, jnp.clip(v - 0.5 * (a + b), lo, hi), 0.0)


def mgda_weights(gram: jax.Array, valid: jax.Array, epsilon, num_iters: int):
    """FedMGDA+'s ``lambda``: ``argmin lambda^T G lambda`` over the simplex of the
    valid rows intersected with ``|lambda_k - 1/n| <= epsilon``, by accelerated
    projected gradient (FISTA) from the uniform weights, with step
    ``1 / (2 ||G||_F)`` (``||G||_F >= lambda_max``)."""
    n = jnp.maximum(jnp.sum(valid), 1).astype(gram.dtype)
    lo = jnp.maximum(1 / n - epsilon, 0.0)
    hi = jnp.minimum(1 / n + epsilon, 1.0)
    lam0 = jnp.where(valid, 1 / n, 0.0).astype(gram.dtype)
    step = 1 / (2 * jnp.maximum(jnp.sqrt(jnp.sum(jnp.square(gram))), 1e-30))

    def body(_, carry):
        lam, y, t = carry
        lam_new = _project_box_simplex(y - step * 2 * (gram @ y), valid, lo, hi)
        t_new = 0.5 * (1 + jnp.sqrt(1 + 4 * t * t))
        y = lam_new + ((t - 1) / t_new) * (lam_new - lam)
        return lam_new, y, t_new

    lam, _, _ = jax.lax.fori_loop(0, num_iters, body,
                                  (lam0, lam0, jnp.ones((), gram.dtype)))
    return lam


def fedmgda_plus(epsilon=0.1, *, num_iters: int = 200) -> Aggregator:
    """FedMGDA+ (Hu et al., "Federated Learning Meets Multi-objective Optimization",
    IEEE TNSE 2022 / arXiv 2020), as the Ditto code's ``fedmgda_average``
    (Li et al., ICML 2021).

    Normalizes every unmasked update to unit norm, ``g_k = u_k / ||u_k||``, finds
    ``lambda`` minimizing ``||sum_k lambda_k g_k||^2`` over the simplex with
    ``|lambda_k - 1/n| <= epsilon``, and returns ``sum_k lambda_k g_k`` (norm
    ``<= 1``; the server learning rate scales it). ``epsilon = 0`` is the mean of
    the normalized updates; ``epsilon >= 1`` is MGDA's min-norm element of their
    convex hull (not the mean). Unweighted (the box is centered at ``1/n``); a
    zero update stays zero.

    Args:
      epsilon: the box half-width, ``>= 0`` (the paper tunes {0, 0.1, 0.5, 1};
        may be traced).
      num_iters: projected-gradient iterations (static int ``>= 1``).
    """
    check_number("epsilon", epsilon, lo=0.0)
    check_int("num_iters", num_iters, lo=1)

    def aggregate(state, updates, weights, mask, key, losses=None):
        del weights, key, losses
        valid = mask > 0
        updates = _zero_rows(updates, valid)
        xs = [u.reshape(u.shape[0], -1) for u in jax.tree.leaves(updates)]
        gram = sum(x @ x.T for x in xs)
        norms = jnp.sqrt(jnp.maximum(jnp.diagonal(gram), 0.0))
        inv = jnp.where(valid & (norms > 0), 1 / jnp.where(norms > 0, norms, 1.0), 0.0)
        lam = mgda_weights(gram * inv[:, None] * inv[None, :], valid, epsilon,
                           num_iters)
        return _contract(lam * inv, updates), state

    return Aggregator(_stateless, aggregate)

