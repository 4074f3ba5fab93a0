"""Empirical privacy auditing: a statistical lower bound on epsilon.

Run a mechanism many times on two neighbouring datasets: ``D`` without a
canary record (or client) and ``D'`` with it. Score every run's output (e.g.
the final parameter along the direction the canary pushes) and let an attack
say "the canary was in" when the score exceeds a threshold ``t``. Its true
positive rate ``TPR = P[score(M(D')) > t]`` and false positive rate
``FPR = P[score(M(D)) > t]`` are then bounded by (eps, delta)-DP:

    TPR <= e^eps FPR + delta,        1 - FPR <= e^eps (1 - TPR) + delta,

so any observed pair of rates gives a lower bound on the epsilon of the
mechanism. With finitely many runs the rates are estimated: the bound uses a
Clopper-Pearson lower confidence limit for TPR and an upper one for FPR, so it
holds with confidence ``1 - alpha`` (each limit fails with probability at most
``alpha / 2``; Bonferroni).

References:
  Jagielski, Ullman and Oprea, "Auditing Differentially Private Machine
  Learning: How Private is Private SGD?", NeurIPS 2020 (canaries, the
  Clopper-Pearson bound on epsilon).
  Nasr, Song, Thakurta, Papernot and Carlini, "Adversary Instantiation: Lower
  Bounds for Differentially Private Machine Learning", IEEE S&P 2021
  (white-box gradient canaries, choosing the threshold on separate runs).

The functions here are host-side NumPy/SciPy; the runs themselves are the
caller's (tests/privacy/test_audit.py and benchmarks/privacy_audit.py audit
``dp_local_train`` and client-level DP-FedAvg). A bound below the accountant's
epsilon does not prove a mechanism private; a bound above it proves a bug (or
an accountant that does not describe the mechanism), up to the chance
``alpha``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import stats

from fedjax_pfl.validation import check_int, check_number


class AuditResult(NamedTuple):
    """The outcome of :func:`epsilon_lower_bound`.

    Attributes:
      epsilon: the lower bound on epsilon (0 when the runs show nothing).
      threshold: the attack says "in" when ``score > threshold``.
      tpr, fpr: the observed rates on the runs the bound is computed from.
      tpr_lo, fpr_hi: their Clopper-Pearson limits (lower for TPR, upper for
        FPR; two-sided intervals at confidence ``1 - alpha`` each).
      trials_out, trials_in: how many runs without / with the canary the bound
        is computed from (the second halves when the threshold was chosen).
    """

    epsilon: float
    threshold: float
    tpr: float
    fpr: float
    tpr_lo: float
    fpr_hi: float
    trials_out: int
    trials_in: int


def _check_alpha(alpha) -> None:
    check_number("alpha", alpha, lo=0.0, hi=1.0, lo_open=True, hi_open=True,
                 scalar=True)


def _interval(k, n, alpha) -> tuple[np.ndarray, np.ndarray]:
    """Clopper-Pearson limits of ``k`` successes in ``n`` trials (arrays)."""
    k = np.asarray(k, np.float64)
    n = np.asarray(n, np.float64)
    lo = stats.beta.ppf(alpha / 2, np.maximum(k, 1), n - k + 1)
    hi = stats.beta.ppf(1 - alpha / 2, k + 1, np.maximum(n - k, 1))
    return np.where(k == 0, 0.0, lo), np.where(k == n, 1.0, hi)


def clopper_pearson(successes: int, trials: int,
                    alpha: float = 0.05) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided binomial interval.

    ``lo`` is the ``alpha / 2`` quantile of ``Beta(k, n - k + 1)`` (0 when
    ``k = 0``) and ``hi`` the ``1 - alpha / 2`` quantile of ``Beta(k + 1, n -
    k)`` (1 when ``k = n``): the rate lies in ``[lo, hi]`` with probability at
    least ``1 - alpha``, and below ``lo`` (above ``hi``) with probability at
    most ``alpha / 2``.

    Args:
      successes: k, an integer in ``[0, trials]``.
      trials: n >= 1.
      alpha: in (0, 1); the confidence is ``1 - alpha``.

    Returns:
      ``(lo, hi)`` as floats.

    Raises:
      ValueError: naming ``successes``, ``trials`` or ``alpha``.
    """
    trials = check_int("trials", trials, lo=1)
    successes = check_int("successes", successes, lo=0, hi=trials)
    _check_alpha(alpha)
    lo, hi = _interval(successes, trials, float(alpha))
    return float(lo), float(hi)


def _bound(tpr_lo, fpr_hi, delta) -> np.ndarray:
    """``max(0, log((tpr_lo - delta) / fpr_hi), log((1 - fpr_hi - delta) /
    (1 - tpr_lo)))`` elementwise (a non-positive argument counts as 0)."""
    tpr_lo = np.asarray(tpr_lo, np.float64)
    fpr_hi = np.asarray(fpr_hi, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = (tpr_lo - delta) / fpr_hi
        b = (1.0 - fpr_hi - delta) / (1.0 - tpr_lo)
        la = np.where(a > 0, np.log(np.where(a > 0, a, 1.0)), 0.0)
        lb = np.where(b > 0, np.log(np.where(b > 0, b, 1.0)), 0.0)
    return np.maximum(0.0, np.maximum(la, lb))


def _above(sorted_scores: np.ndarray, thresholds) -> np.ndarray:
    """How many of ``sorted_scores`` are ``> t``, for each ``t``."""
    return sorted_scores.size - np.searchsorted(sorted_scores, thresholds,
                                                side="right")


def _check_scores(name: str, scores) -> np.ndarray:
    try:
        arr = np.asarray(scores)
    except Exception as e:  # ragged lists and other non-arrays
        raise ValueError(f"{name}: must be a 1-D array of scores, got "
                         f"{type(scores).__name__}") from e
    check_number(name, arr)
    if arr.ndim != 1 or arr.shape[0] < 2:
        raise ValueError(f"{name}: must be a 1-D array of at least 2 scores, got "
                         f"shape {arr.shape}")
    return arr.astype(np.float64)


def _select_threshold(out: np.ndarray, in_: np.ndarray, delta: float,
                      alpha: float) -> float:
    """The threshold that maximises the bound on these runs: over the observed
    scores ``c``, the best one, moved to the middle of the gap up to the next
    observed score (the same counts on these runs, a margin on others)."""
    cands = np.unique(np.concatenate([out, in_]))
    s_out, s_in = np.sort(out), np.sort(in_)
    tpr_lo, _ = _interval(_above(s_in, cands), s_in.size, alpha)
    _, fpr_hi = _interval(_above(s_out, cands), s_out.size, alpha)
    i = int(np.argmax(_bound(tpr_lo, fpr_hi, delta)))
    if i + 1 < cands.size:
        return float(cands[i] + (cands[i + 1] - cands[i]) / 2)
    return float(cands[i])


def epsilon_lower_bound(scores_out, scores_in, delta: float, *,
                        alpha: float = 0.05,
                        threshold: float | None = None) -> AuditResult:
    """A lower bound on epsilon, with confidence ``1 - alpha``, from the scores
    of independent runs without (``scores_out``) and with (``scores_in``) the
    canary (Jagielski et al. 2020; Nasr et al. 2021).

    The attack says "in" when ``score > threshold``. With its Clopper-Pearson
    limits ``TPR_lo`` and ``FPR_hi`` (:func:`clopper_pearson` at ``alpha``,
    so both hold together with probability ``>= 1 - alpha``), the bound is::

        max(0, log((TPR_lo - delta) / FPR_hi),
               log((1 - FPR_hi - delta) / (1 - TPR_lo)))

    (a term whose argument is not positive counts as 0).

    With ``threshold=None`` each array is split into halves (the first
    ``len // 2`` runs and the rest). The threshold maximises this bound
    computed on the first halves (the bound itself rather than the raw rates,
    whose ratio is infinite for every threshold no "out" score passes); the
    candidates are the observed first-half scores, each moved to the middle of
    the gap up to the next one (which classifies the first halves the same
    way). The returned bound then uses the second halves only, so choosing the
    threshold does not bias it. The runs' order must not depend on their
    scores.

    Args:
      scores_out: 1-D finite scores of runs on the dataset without the canary
        (at least 2).
      scores_in: the same for runs on the neighbouring dataset with it.
      delta: the delta of the guarantee being audited, in [0, 1).
      alpha: in (0, 1); the bound holds with probability ``>= 1 - alpha``.
      threshold: a fixed threshold (all runs are then used), or ``None``.

    Returns:
      An :class:`AuditResult`.

    Raises:
      ValueError: naming ``scores_out``, ``scores_in``, ``delta``, ``alpha``
        or ``threshold``.
    """
    out = _check_scores("scores_out", scores_out)
    in_ = _check_scores("scores_in", scores_in)
    check_number("delta", delta, lo=0.0, hi=1.0, hi_open=True, scalar=True)
    _check_alpha(alpha)
    if threshold is not None:
        check_number("threshold", threshold, scalar=True)
    delta, alpha = float(delta), float(alpha)
    if threshold is None:
        h_out, h_in = out.size // 2, in_.size // 2
        threshold = _select_threshold(out[:h_out], in_[:h_in], delta, alpha)
        out, in_ = out[h_out:], in_[h_in:]
    threshold = float(threshold)
    k_in, k_out = int(np.sum(in_ > threshold)), int(np.sum(out > threshold))
    tpr_lo, _ = _interval(k_in, in_.size, alpha)
    _, fpr_hi = _interval(k_out, out.size, alpha)
    eps = float(_bound(tpr_lo, fpr_hi, delta))
    return AuditResult(eps, threshold, k_in / in_.size, k_out / out.size,
                       float(tpr_lo), float(fpr_hi), int(out.size), int(in_.size))
