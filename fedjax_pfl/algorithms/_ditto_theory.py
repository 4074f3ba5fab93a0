"""Ditto's closed forms (host NumPy): the test oracles of the paper's theory.

Reference: Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning
Through Personalization", ICML 2021, §3.3 and App. A. Federated point estimation: device
k has ``w_k = theta + zeta_k`` with
``zeta_k ~ N(0, tau^2)`` (benign) or ``N(0, tau_a^2)`` (the ``num_malicious``
adversaries), ``n`` points ``x_ki = w_k + N(0, sigma^2)``, local loss
``F_k(w) = (w - mean_i x_ki)^2 / 2`` and the global optimum ``w*`` the UNWEIGHTED
mean of the local optima (adversaries included). The expected-error formulas for
any lambda are our own derivation (checked by Monte Carlo in
``tests/algorithms/test_ditto.py``); the paper states only their minimizers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _check_config(sigma, n, tau, num_clients, num_malicious, tau_a) -> None:
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 2:
        raise ValueError(f"num_clients: must be an integer >= 2, got {num_clients!r}")
    if (not isinstance(num_malicious, (int, np.integer))
            or not 0 <= num_malicious < num_clients):
        raise ValueError(f"num_malicious: must be an integer in [0, num_clients), "
                         f"got {num_malicious!r}")
    if not np.isfinite(n) or n <= 0:
        raise ValueError(f"n: must be positive, got {n!r}")
    for name, v in (("sigma", sigma), ("tau", tau), ("tau_a", tau_a)):
        if not np.isfinite(v) or v < 0:
            raise ValueError(f"{name}: must be finite and >= 0, got {v!r}")


def _alpha(lam, num_clients, beta_n=1.0):
    """Weight of a device's own estimate in its Ditto solution (Lemma 9 / eq. 31):
    ``(beta/n + lam/K) / (beta/n + lam)``; ``1/K`` at ``lam = inf``."""
    lam = np.asarray(lam, np.float64)
    if np.any(np.isnan(lam)) or np.any(lam < 0):
        raise ValueError(f"lam: must be >= 0 (inf allowed), got {lam!r}")
    with np.errstate(invalid="ignore"):
        a = (beta_n + lam / num_clients) / (beta_n + lam)
    return np.where(np.isinf(lam), 1.0 / num_clients, a)


def _big_a(s2, tau, num_clients, num_malicious, tau_a):
    """``A = K tau^2 + s2 + K_a/(K-1) (tau_a^2 - tau^2)`` with ``s2`` the variance of
    a local estimate: ``(K-1) Var(mean of the others' estimates - w_k)`` (Lemma 11)."""
    return (num_clients * tau**2 + s2
            + num_malicious / (num_clients - 1) * (tau_a**2 - tau**2))


def lambda_star(sigma: float, n: float, tau: float, num_clients: int,
                num_malicious: int = 0, tau_a: float = 0.0) -> float:
    """The lambda minimizing a benign device's expected test error.

    Clean (Theorem 2 / Theorem 6): ``lambda* = sigma^2 / (n tau^2)``.
    With ``K_a`` adversaries of spread ``tau_a`` (Theorem 4 / Theorem 8):
    ``lambda_a* = sigma^2/n * K / (K tau^2 + K_a/(K-1) (tau_a^2 - tau^2))``.
    The same value holds for linear regression with ``X_k^T X_k = beta I`` (it does
    not depend on ``beta``). ``inf`` when the denominator is not positive (e.g.
    ``tau = 0`` without adversaries: the global model is optimal).
    """
    _check_config(sigma, n, tau, num_clients, num_malicious, tau_a)
    denom = num_clients * tau**2 + num_malicious / (num_clients - 1) * (
        tau_a**2 - tau**2)
    if denom <= 0:
        return float("inf")
    return float(sigma**2 / n * num_clients / denom)


def point_estimate_solution(w_hat, lam):
    """Every device's Ditto solution in federated point estimation (Lemma 9).

    ``v_k(lam) = lam/(1+lam) w* + 1/(1+lam) w_hat_k`` with ``w* = mean_k w_hat_k``
    (unweighted, all devices), i.e. the minimizer of
    ``(v - w_hat_k)^2 / 2 + lam/2 (v - w*)^2``.

    Args:
      w_hat: ``[K]`` (or ``[K, d]``) local optima (the devices' sample means).
      lam: a scalar or a ``[K]`` vector (one lambda per device); ``inf`` gives w*.

    Returns:
      ``[K]`` (or ``[K, d]``) float64 personalized solutions.
    """
    w_hat = np.asarray(w_hat, np.float64)
    lam = np.broadcast_to(np.asarray(lam, np.float64), w_hat.shape[:1])
    if np.any(np.isnan(lam)) or np.any(lam < 0):
        raise ValueError(f"lam: must be >= 0, got {lam!r}")
    lam = lam.reshape(lam.shape + (1,) * (w_hat.ndim - 1))
    w_star = w_hat.mean(axis=0)
    with np.errstate(invalid="ignore"):
        mixed = (lam * w_star + w_hat) / (1.0 + lam)
    return np.where(np.isinf(lam), w_star, mixed)


def linear_regression_solution(xs: Sequence[np.ndarray] | np.ndarray,
                               ys: Sequence[np.ndarray] | np.ndarray, lam):
    """Every device's Ditto solution for least squares (App. A.2, eq. 23).

    With ``F_k(w) = ||X_k w - y_k||^2 / (2 n_k)`` and ``w* = argmin_w sum_k F_k(w)``:
    ``v_k = (X_k^T X_k / n_k + lam_k I)^{-1} (X_k^T y_k / n_k + lam_k w*)``.
    Any design works (a model with a bias: append a column of ones to ``X_k``; the
    bias is then penalized like every other parameter, as in the simulator).

    Args:
      xs: per-device designs ``[n_k, d]`` (a list, or a ``[K, n, d]`` array).
      ys: per-device targets ``[n_k]`` or ``[n_k, 1]``.
      lam: a scalar or a ``[K]`` vector.

    Returns:
      ``(v, w_star)``: ``[K, d]`` personalized solutions and the ``[d]`` global
      optimum (float64).
    """
    xs = [np.asarray(x, np.float64) for x in xs]
    ys = [np.asarray(y, np.float64).reshape(-1) for y in ys]
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"xs, ys: need the same positive number of devices, got "
                         f"{len(xs)} and {len(ys)}")
    lam = np.broadcast_to(np.asarray(lam, np.float64), (len(xs),))
    if np.any(~np.isfinite(lam)) or np.any(lam < 0):
        raise ValueError(f"lam: must be finite and >= 0, got {lam!r}")
    grams = [x.T @ x / x.shape[0] for x in xs]
    moments = [x.T @ y / x.shape[0] for x, y in zip(xs, ys)]
    w_star = np.linalg.solve(sum(grams), sum(moments))
    eye = np.eye(w_star.shape[0])
    v = np.stack([np.linalg.solve(g + lam_k * eye, m + lam_k * w_star)
                  for g, m, lam_k in zip(grams, moments, lam, strict=True)])
    return v, w_star


def expected_mse(lam, sigma: float, n: float, tau: float, num_clients: int,
                 num_malicious: int = 0, tau_a: float = 0.0, *,
                 beta: float | None = None, dim: int = 1):
    """Expected squared error ``E (v_k(lam) - w_k)^2`` of a benign device.

    ``alpha^2 s2 + (1 - alpha)^2 A / (K - 1)`` with ``alpha = (K + lam)/(K (1 + lam))``
    the weight of the device's own estimate (Lemma 9), ``s2 = sigma^2/n`` and
    ``A = K tau^2 + s2 + K_a/(K-1)(tau_a^2 - tau^2)`` (Lemma 11). Its minimum is
    ``sigma_w^2`` (``sigma_{w,a}^2``), reached at :func:`lambda_star` (Lemmas 8, 12;
    Theorems 6, 8). ``lam = 0`` is local (``s2``), ``lam = inf`` global.

    With ``beta`` (linear regression with ``X_k^T X_k = beta I``, App. A.2, eq. 31):
    ``alpha = (beta/n + lam/K)/(beta/n + lam)``, ``s2 = sigma^2/beta``, times ``dim``.

    Args:
      lam: scalar or array of lambdas (``inf`` allowed).

    Returns:
      float64 array shaped like ``lam``.
    """
    _check_config(sigma, n, tau, num_clients, num_malicious, tau_a)
    if beta is None:
        s2, beta_n = sigma**2 / n, 1.0
    else:
        if not np.isfinite(beta) or beta <= 0:
            raise ValueError(f"beta: must be positive, got {beta!r}")
        s2, beta_n = sigma**2 / beta, beta / n
    if not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"dim: must be a positive integer, got {dim!r}")
    a = _alpha(lam, num_clients, beta_n)
    big_a = _big_a(s2, tau, num_clients, num_malicious, tau_a)
    return dim * (a**2 * s2 + (1 - a) ** 2 * big_a / (num_clients - 1))


def expected_variance(lam, sigma: float, n: float, tau: float, num_clients: int,
                      num_malicious: int = 0, tau_a: float = 0.0):
    """Expected across-device variance (``np.var``, ddof 0, over the ``K_b`` benign
    devices) of the squared errors ``e_k^2 = (v_k(lam) - w_k)^2``.

    ``(K_b - 1)/K_b (2 MSE^2 - 2 Cov^2)``, with ``Cov`` the covariance of two benign
    devices' errors (our derivation; the errors are jointly Gaussian). This is the
    fairness quantity of Theorems 3, 5, 7 and 9; the paper's claim that lambda*
    minimizes it holds only approximately under attack (its proofs ignore the
    correlation between devices that the shared ``w*`` induces).

    Returns:
      float64 array shaped like ``lam``.
    """
    _check_config(sigma, n, tau, num_clients, num_malicious, tau_a)
    k, ka = num_clients, num_malicious
    kb = k - ka
    s2 = sigma**2 / n
    a = _alpha(lam, k)
    c1, c2, c3 = a, -(1 - a), (1 - a) / (k - 1)
    cov = (2 * c1 * c3 * s2 + 2 * c2 * c3 * tau**2
           + c3**2 * ((kb - 2) * (tau**2 + s2) + ka * (tau_a**2 + s2)))
    m = expected_mse(lam, sigma, n, tau, k, ka, tau_a)
    return (kb - 1) / kb * (2 * m**2 - 2 * cov**2)


# The public names, re-exported by ``fedjax_pfl.algorithms``.
ditto_lambda_star = lambda_star
ditto_point_estimate_solution = point_estimate_solution
ditto_linear_regression_solution = linear_regression_solution
ditto_expected_mse = expected_mse
ditto_expected_variance = expected_variance
