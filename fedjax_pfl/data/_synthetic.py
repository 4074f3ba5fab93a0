"""Synthetic federated problems: FedProx Synthetic(alpha, beta) and the Ditto
point-estimation / linear-regression problems (with closed-form oracles)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedjax_pfl.validation import (
    check_choice,
    check_count,
    check_int,
    check_nonnegative,
    check_number,
)

from ._federated import FederatedData, brief_repr, from_client_arrays, split_clients


def fedprox_synthetic(
    alpha: float = 1.0,
    beta: float = 1.0,
    *,
    num_clients: int = 30,
    dim: int = 60,
    num_classes: int = 10,
    iid: bool = False,
    size_lognormal: tuple[float, float] = (4.0, 2.0),
    min_size: int = 50,
    max_size: int | None = None,
    fractions: tuple[float, float, float] = (0.8, 0.0, 0.2),
    seed: int = 0,
) -> FederatedData:
    """FedProx's Synthetic(alpha, beta) (Li et al., MLSys 2020; Kundu et al., Fed+).

    Client k: ``u_k ~ N(0, alpha)``, ``W_k ~ N(u_k, 1)`` ``[dim, classes]``,
    ``b_k ~ N(u_k, 1)``; ``B_k ~ N(0, beta)``, ``v_k ~ N(B_k, 1)`` per feature,
    ``x ~ N(v_k, diag(j^-1.2))``; ``y = argmax softmax(x W_k + b_k)``. Sizes are
    ``int(lognormal(*size_lognormal)) + min_size`` (a power law), optionally capped
    at ``max_size``. As in the FedProx generator, the second argument of each
    normal is a standard deviation. ``iid=True`` shares one ``W, b`` and one
    feature mean across clients.

    Returns:
      :class:`FederatedData` split per client into ``fractions`` (train/val/test).
    """
    for name, v in (("num_clients", num_clients), ("dim", dim),
                    ("num_classes", num_classes)):
        check_int(name, v, lo=1)
    check_nonnegative("alpha", alpha)
    check_nonnegative("beta", beta)
    check_choice("iid", iid, (True, False))
    min_size = check_count("min_size", min_size)
    check_int("max_size", max_size, lo=1, allow_none=True)
    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(*size_lognormal, num_clients).astype(int) + min_size
    if max_size is not None:
        sizes = np.minimum(sizes, max_size)
    cov_diag = np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2)
    mean_w = rng.normal(0, alpha, num_clients)
    big_b = rng.normal(0, beta, num_clients)
    w_global = rng.normal(0, 1, (dim, num_classes))
    b_global = rng.normal(0, 1, num_classes)
    clients = []
    for k in range(num_clients):
        if iid:
            w, b, mean_x = w_global, b_global, np.zeros(dim)
        else:
            w = rng.normal(mean_w[k], 1, (dim, num_classes))
            b = rng.normal(mean_w[k], 1, num_classes)
            mean_x = rng.normal(big_b[k], 1, dim)
        x = mean_x + rng.normal(size=(sizes[k], dim)) * np.sqrt(cov_diag)
        y = np.argmax(x @ w + b, axis=1).astype(np.int32)
        clients.append((x.astype(np.float32), y))
    return split_clients(clients, fractions, seed=seed)


class PointEstimation(NamedTuple):
    """The Ditto point-estimation problem and its ground truth."""

    data: FederatedData
    w_true: np.ndarray  # [K] each device's true mean
    w_hat: np.ndarray  # [K] each device's sample mean (its local optimum)
    malicious: np.ndarray  # [K] bool

    __repr__ = brief_repr


def point_estimation_problem(
    *,
    num_clients: int = 8,
    num_malicious: int = 0,
    n: int = 30,
    sigma: float = 0.8,
    tau: float = 0.1,
    tau_a: float = 0.0,
    theta: float = 0.0,
    seed: int = 0,
) -> PointEstimation:
    """Federated point estimation (Ditto §3.3, Li et al., ICML 2021).

    Device k has ``w_k = theta + zeta_k``, ``zeta_k ~ N(0, tau^2)`` (benign) or
    ``N(0, tau_a^2)`` (malicious: the first ``num_malicious`` devices, as in the
    authors' notebook), and ``n`` points ``x_ki = w_k + N(0, sigma^2)``. With the
    :func:`fedjax_pfl.models.mean_model` loss ``0.5 (w - x)^2`` the local optimum is
    the sample mean. Features are a dummy zero column; targets are ``[n, 1]``.
    """
    num_clients = check_int("num_clients", num_clients, lo=1)
    check_int("num_malicious", num_malicious, lo=0, hi=num_clients - 1)
    n = check_int("n", n, lo=1)
    for name, v in (("sigma", sigma), ("tau", tau), ("tau_a", tau_a)):
        check_nonnegative(name, v)
    check_number("theta", theta)
    rng = np.random.default_rng(seed)
    stds = np.where(np.arange(num_clients) < num_malicious, tau_a, tau)
    w = theta + rng.normal(size=num_clients) * stds
    pts = w[:, None] + rng.normal(size=(num_clients, n)) * sigma
    clients = [
        (np.zeros((n, 1), np.float32), pts[k][:, None].astype(np.float32))
        for k in range(num_clients)
    ]
    data = from_client_arrays(clients)
    return PointEstimation(data, w, pts.astype(np.float32).mean(1),
                           np.arange(num_clients) < num_malicious)


class LinearRegression(NamedTuple):
    """The Ditto federated linear-regression problem and its ground truth."""

    data: FederatedData
    w_true: np.ndarray  # [K, d]
    w_ols: np.ndarray  # [K, d] local least-squares solutions
    malicious: np.ndarray  # [K] bool

    __repr__ = brief_repr


def linear_regression_problem(
    *,
    num_clients: int = 10,
    num_malicious: int = 0,
    n: int = 40,
    dim: int = 5,
    beta: float = 7.0,
    sigma: float = 1.0,
    tau: float = 0.3,
    tau_a: float = 0.0,
    seed: int = 0,
) -> LinearRegression:
    """Federated linear regression with ``X_k^T X_k = beta I`` (Li et al., ICML 2021).

    ``w_k = zeta_k`` (``N(0, tau^2 I)`` benign, ``N(0, tau_a^2 I)`` for the first
    ``num_malicious``), ``X_k = sqrt(beta) Q`` with ``Q`` the orthonormal factor of
    a Gaussian ``n x d``, ``y_k = X_k w_k + N(0, sigma^2)``. With the squared loss
    ``0.5 (x.w - y)^2`` averaged over n, Ditto's solution has the closed form of
    eq. (31) of the paper.
    """
    num_clients = check_int("num_clients", num_clients, lo=1)
    check_int("num_malicious", num_malicious, lo=0, hi=num_clients)
    dim = check_int("dim", dim, lo=1)
    n = check_int("n", n, lo=1)
    if n < dim:
        raise ValueError(f"n: need n >= dim ({dim}) for X^T X = beta I, got {n}")
    check_number("beta", beta, lo=0.0, lo_open=True)
    for name, v in (("sigma", sigma), ("tau", tau), ("tau_a", tau_a)):
        check_nonnegative(name, v)
    rng = np.random.default_rng(seed)
    stds = np.where(np.arange(num_clients) < num_malicious, tau_a, tau)
    w = rng.normal(size=(num_clients, dim)) * stds[:, None]
    clients, ols = [], []
    for k in range(num_clients):
        q, _ = np.linalg.qr(rng.normal(size=(n, dim)))
        x = np.sqrt(beta) * q
        y = x @ w[k] + rng.normal(size=n) * sigma
        clients.append((x.astype(np.float32), y[:, None].astype(np.float32)))
        ols.append(np.linalg.solve(x.T @ x, x.T @ y))
    return LinearRegression(from_client_arrays(clients), w, np.asarray(ols),
                            np.arange(num_clients) < num_malicious)
