"""The papers' partitions: Ditto's Fashion-MNIST and skewed FEMNIST, LINDT's
CIFAR-10 allocations, Fed+'s MNIST-robust/personal and synthetic regression.

Each takes NumPy arrays (as the loaders return them) and returns
:class:`FederatedData`; the label-only ``*_indices`` helpers are public so that
recipes can be checked without images.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedjax_pfl.validation import check_choice, check_int, check_number

from ._federated import FederatedData, brief_repr, from_client_arrays, split_clients
from ._partition import (
    Fractions,
    _labels,
    class_subset_lognormal_indices,
    client_arrays,
    iid_indices,
)

# ---------------------------------------------------------------- Ditto FMNIST


def ditto_fmnist_indices(
    train_labels,
    test_labels,
    *,
    num_clients: int = 500,
    classes_per_client: int = 5,
    total_train: float = 60000.0,
    num_classes: int | None = None,
    seed: int = 233,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Ditto's ``data/fmnist/create_dataset.py`` on labels: per-user row indices.

    Makes the script's legacy NumPy calls in its order (``RandomState(233)`` ==
    ``np.random.seed(233)``): sizes ``lognormal(3, 1, N) + 10`` rescaled to sum to
    ``total_train``; then per user ``props = lognormal(1, 1, k)`` normalized, class
    ``(u + j) mod C`` gets ``int(props_j * size_u) + 1`` train rows and
    ``int(props_j * size_u / 6) + 1`` test rows, taken sequentially from that
    class's rows in dataset order, the class cursor resetting to 0 when the draw
    would overflow. Sums use Python's left-to-right ``sum`` as the script does.
    On the real Fashion-MNIST labels: 61,251 train / 11,254 test rows, train
    sizes 31..1,378, test sizes 7..231.

    Returns:
      ``(train_indices, test_indices)``, per user, in draw order (class by class;
      the script then shuffles each user's train list, see :func:`ditto_fmnist`).
    """
    y_tr, c_tr = _labels(train_labels, num_classes)
    y_te, c_te = _labels(test_labels, num_classes)
    num_classes = max(c_tr, c_te)
    num_clients = check_int("num_clients", num_clients, lo=1)
    k = check_int("classes_per_client", classes_per_client, lo=1)
    if k > num_classes:
        raise ValueError(
            f"classes_per_client: must be <= num_classes ({num_classes}), got {k}"
        )
    pools_tr = [np.where(y_tr == c)[0] for c in range(num_classes)]
    pools_te = [np.where(y_te == c)[0] for c in range(num_classes)]
    rs = np.random.RandomState(seed)
    sizes = rs.lognormal(3, 1, num_clients) + 10
    sizes = total_train * sizes / sum(sizes)  # builtin sum: the script's rounding
    cur_tr = np.zeros(num_classes, np.int64)
    cur_te = np.zeros(num_classes, np.int64)
    out_tr, out_te = [], []
    for u in range(num_clients):
        props = rs.lognormal(1, 1, k)
        props = props / sum(props)
        rows_tr, rows_te = [], []
        for j in range(k):
            c = (u + j) % num_classes
            n_tr = int(props[j] * sizes[u]) + 1
            n_te = int(props[j] * sizes[u] / 6) + 1
            for n_c, cur, pool, rows in (
                (n_tr, cur_tr, pools_tr[c], rows_tr),
                (n_te, cur_te, pools_te[c], rows_te),
            ):
                if cur[c] + n_c > len(pool):
                    cur[c] = 0
                rows.append(pool[cur[c] : cur[c] + n_c])  # truncated if pool < n_c
                cur[c] += n_c
        out_tr.append(np.concatenate(rows_tr))
        out_te.append(np.concatenate(rows_te))
    return out_tr, out_te


def standardize_pixels(x_train, *others, eps: float = 0.001):
    """Ditto's per-pixel standardization ``(x - mu) / (sigma + eps)``, float32.

    ``mu``, ``sigma`` are the float32 mean/std over the rows of ``x_train``
    (computed as the script does); every array is flattened to ``[n, -1]``.
    """
    xt = np.asarray(x_train).reshape(len(x_train), -1).astype(np.float32)
    mu, sigma = np.mean(xt, 0), np.std(xt, 0)
    out = [(xt - mu) / (sigma + eps)]
    for o in others:
        o = np.asarray(o).reshape(len(o), -1).astype(np.float32)
        out.append((o - mu) / (sigma + eps))
    return tuple(out)


def _carve_val(pairs, val_fraction, rng: np.random.Generator | None = None):
    """Moves ``floor(val_fraction * n)`` rows of each client (>= 1 kept) to a
    validation split: the last rows, or with ``rng`` rows drawn at random
    (both splits keep the rows' original order)."""
    check_number("val_fraction", val_fraction, lo=0.0, hi=1.0, hi_open=True,
                 scalar=True)
    train, val = [], []
    for x, y in pairs:
        n_val = min(int(np.floor(val_fraction * len(y))), len(y) - 1)
        is_val = np.zeros(len(y), bool)
        if rng is None:
            is_val[len(y) - n_val:] = True
        else:
            is_val[rng.choice(len(y), n_val, replace=False)] = True
        train.append((x[~is_val], y[~is_val]))
        val.append((x[is_val], y[is_val]))
    return train, val


def ditto_fmnist(
    x_train,
    y_train,
    x_test,
    y_test,
    *,
    num_clients: int = 500,
    classes_per_client: int = 5,
    val_fraction: float = 0.0,
    paper_split: bool = False,
    seed: int = 233,
    shuffle_seed: int = 0,
) -> FederatedData:
    """Ditto's Fashion-MNIST: 500 devices, 5 classes each (Li et al., ICML 2021).

    The per-user rows are :func:`ditto_fmnist_indices`; images are standardized per
    pixel with the train split's statistics (:func:`standardize_pixels`) and
    flattened to ``[n, 784]`` float32 (the FMNIST CNN reshapes them). Each user's
    train list is shuffled (the script's unseeded ``random.shuffle``; here a
    ``default_rng(shuffle_seed)`` permutation).

    Splits: by default the code's own, which the paper's "72/8/20" does not match:
    train from the FMNIST train split (61,251 rows), test from the FMNIST test
    split (11,254 rows, ~1/6 of train). ``val_fraction > 0`` moves the last
    ``floor(val_fraction * n)`` rows of each shuffled train list to ``val`` (the
    code's dynamic-lambda hold-out uses 0.1). ``paper_split=True`` instead pools
    each user's train and test rows and splits them 72/8/20 with
    :func:`split_clients` (``seed=shuffle_seed``).

    Args:
      x_train, x_test: ``[n, 28, 28]`` or ``[n, 784]`` images (uint8 or float).
      y_train, y_test: ``[n]`` integer labels in the original file order.
    """
    tr_idx, te_idx = ditto_fmnist_indices(
        y_train, y_test, num_clients=num_clients,
        classes_per_client=classes_per_client, seed=seed,
    )
    xs_tr, xs_te = standardize_pixels(x_train, x_test)
    y_tr, y_te = np.asarray(y_train), np.asarray(y_test)
    rng = np.random.default_rng(shuffle_seed)
    tr_idx = [i[rng.permutation(len(i))] for i in tr_idx]
    train = client_arrays(xs_tr, y_tr, tr_idx)
    test = client_arrays(xs_te, y_te, te_idx)
    ids = [f"f_{u:05d}" for u in range(num_clients)]
    if paper_split:
        pooled = [
            (np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
            for a, b in zip(train, test)
        ]
        return split_clients(pooled, (0.72, 0.08, 0.20), seed=shuffle_seed,
                             client_ids=ids)
    val = None
    if val_fraction > 0:
        train, val = _carve_val(train, val_fraction)
    return from_client_arrays(train, val, test, ids)


def ditto_femnist_skewed(
    x,
    y,
    *,
    num_clients: int = 100,
    classes_per_client: int = 5,
    num_classes: int = 62,
    total_size: int | None = None,
    fractions: Fractions = (0.72, 0.08, 0.20),
    seed: int = 0,
) -> FederatedData:
    """Ditto's skewed FEMNIST: 100 devices with 5 classes each (our construction).

    The paper gives no script (Li et al., ICML 2021). We apply the Fashion-MNIST
    recipe to the pooled FEMNIST rows: each class's rows are shuffled
    (``default_rng(seed)``); device sizes are ``lognormal(3, 1) + 10`` rescaled to
    sum to ``total_size`` (default: all rows); device ``u`` gets classes
    ``(u + j) mod 62`` with ``lognormal(1, 1, 5)`` proportions and
    ``int(prop * size) + 1`` rows per class, drawn sequentially with the
    wrap-around rule (``RandomState(seed)``). A device never holds a row twice
    (a draw larger than its class is truncated); rows may be shared between
    devices when a class wraps. Each device is then split ``fractions`` (the
    paper's 72/8/20) with :func:`split_clients`.

    Args:
      x, y: pooled FEMNIST features ``[n, 784]`` (or ``[n, 28, 28, 1]``) and
        labels in ``[0, 62)``.
    """
    y, num_classes = _labels(y, num_classes)
    order = np.arange(len(y))
    rng = np.random.default_rng(seed)
    perm = np.concatenate([rng.permutation(order[y == c]) for c in range(num_classes)])
    y_sorted = y[perm]  # class-sorted, shuffled within class
    total = float(len(y) if total_size is None else total_size)
    idx, _ = ditto_fmnist_indices(
        y_sorted, y_sorted, num_clients=num_clients,
        classes_per_client=classes_per_client, total_train=total,
        num_classes=num_classes, seed=seed,
    )
    clients = client_arrays(x, y, [perm[i] for i in idx])
    return split_clients(clients, fractions, seed=seed)


# ------------------------------------------------------------------------ LINDT

LINDT_SCHEMES = ("iid", "non_iid_10", "non_iid_5", "non_iid_2", "mixed")
# Log-normal sigmas whose client-size std (median over 30 seeds, mean size 600)
# is close to LINDT's Table 8 (572 / 811 / 855 / 732; ours 574 / 808 / 856 / 726
# on CIFAR-10's class sizes); the paper does not give its parameters.
_LINDT_SIGMA = {
    "non_iid_10": 0.85, "non_iid_5": 1.125, "non_iid_2": 1.28, "mixed": 1.05
}


def lindt_classes_per_client(scheme: str, num_clients: int = 100) -> np.ndarray:
    """``[N]`` classes per client: Mixed = 50 % / 30 % / 20 % with 10 / 5 / 2."""
    check_choice("scheme", scheme, LINDT_SCHEMES)
    num_clients = check_int("num_clients", num_clients, lo=1)
    if scheme == "mixed":
        n10, n5 = round(0.5 * num_clients), round(0.3 * num_clients)
        return np.array([10] * n10 + [5] * n5 + [2] * (num_clients - n10 - n5))
    k = 10 if scheme == "iid" else int(scheme.rsplit("_", 1)[1])
    return np.full(num_clients, k)


def lindt_cifar(
    x_train,
    y_train,
    x_test,
    y_test,
    scheme: str = "mixed",
    *,
    num_clients: int = 100,
    sigma: float | None = None,
    class_sigma: float = 0.0,
    val_fraction: float = 0.0,
    seed: int = 0,
) -> FederatedData:
    """LINDT's CIFAR-10 allocations (the LINDT paper): all train and test rows.

    * ``"iid"``: a seeded shuffle of each split into equal parts (500 + 100).
    * ``"non_iid_{10,5,2}"``: every client holds 10/5/2 classes, log-normal sizes
      (:func:`class_subset_lognormal_indices`; train and test alike per client).
    * ``"mixed"`` (the paper's default): clients ``0..49`` hold 10 classes,
      ``50..79`` 5 and ``80..99`` 2 (:func:`lindt_classes_per_client`).

    ``sigma`` defaults to a per-scheme value whose size std is near Table 8.
    ``class_sigma`` unbalances each client's classes (log-normal proportions,
    :func:`class_subset_lognormal_indices`; 0, the default, spreads a client's
    rows evenly over its classes). The paper says only that each client gets "a
    different amount of data" from its classes; its private models' accuracies
    (65 / 76 / 90 % with 10 / 5 / 2 classes, against 44 % for IID) imply
    unbalanced classes (docs/lindt.md).
    ``val_fraction`` carves the last rows of each (shuffled) train client.
    Arrays pass through unchanged (CIFAR from the loader is NCHW: transpose to
    NHWC with :func:`fedjax_pfl.models.nchw_to_nhwc` for the zoo's CNNs).
    """
    ks = lindt_classes_per_client(scheme, num_clients)
    if scheme == "iid" and class_sigma:
        raise ValueError(f"class_sigma: the iid scheme has balanced clients (0 "
                         f"only), got {class_sigma!r}")
    if scheme == "iid":
        tr_idx = iid_indices(len(y_train), num_clients, seed=seed)
        te_idx = iid_indices(len(y_test), num_clients, seed=seed + 1)
    else:
        s = _LINDT_SIGMA[scheme] if sigma is None else sigma
        tr_idx, te_idx = class_subset_lognormal_indices(
            y_train, y_test, ks, sigma=s, class_sigma=class_sigma, seed=seed
        )
    train = client_arrays(x_train, y_train, tr_idx)
    test = client_arrays(x_test, y_test, te_idx)
    val = None
    if val_fraction > 0:
        train, val = _carve_val(train, val_fraction)
    return from_client_arrays(train, val, test)


# ------------------------------------------------------------------------- Fed+


class FedPlusMNIST(NamedTuple):
    """Fed+'s MNIST-robust / MNIST-personal data and how each party was changed."""

    data: FederatedData
    negated: np.ndarray  # [N] bool: parties whose images are 1 - x
    noisy_classes: np.ndarray  # [N, k] the classes given Laplacian noise

    __repr__ = brief_repr


def fedplus_mnist(
    x,
    y,
    num_clients: int = 10,
    *,
    personal: bool = True,
    negate_fraction: float | None = None,
    noisy_classes_per_client: int = 2,
    noise_scale: float = 0.5,
    negation: str = "complement",
    fractions: Fractions = (0.5, 0.0, 0.5),
    seed: int = 0,
) -> FedPlusMNIST:
    """Fed+'s MNIST-robust (``personal=False``) / MNIST-personal (Fed+ §5.1, Table 2).

    MNIST is shuffled into ``N`` equal parties; a random ``negate_fraction`` of them
    (default 10 % for ``N <= 10``, else 20 %) get negated images ``1 - x`` (pixels
    scaled to [0, 1]); with ``personal=True`` each party also picks
    ``noisy_classes_per_client`` distinct classes whose images get i.i.d.
    ``Laplace(0, noise_scale)`` pixel noise (the scale is not in the paper; 0.5 is
    our choice; no clipping). "Taking negative of images" is read as
    ``negation="complement"`` (``1 - x``, an inverted image in [0, 1]);
    ``"sign"`` gives ``-x``. Each party is then split 50/50 train/test.
    Integer images are scaled by 1/255 (float images must already be in [0, 1]);
    all are flattened to ``[n, 784]`` float32 (for logistic regression). Pass the
    60k train split (or the pooled 70k: the paper does not say which).
    """
    num_clients = check_int("num_clients", num_clients, lo=1)
    y, num_classes = _labels(y, None)
    if negate_fraction is None:
        negate_fraction = 0.1 if num_clients <= 10 else 0.2
    check_number("negate_fraction", negate_fraction, lo=0.0, hi=1.0, scalar=True)
    check_choice("negation", negation, ("complement", "sign"))
    check_number("noise_scale", noise_scale, lo=0.0, scalar=True)
    check_int("noisy_classes_per_client", noisy_classes_per_client, lo=0,
              hi=num_classes)
    x = np.asarray(x).reshape(len(y), -1)
    x = x.astype(np.float32) / (255.0 if np.issubdtype(x.dtype, np.integer) else 1.0)
    rng = np.random.default_rng(seed)
    parts = iid_indices(len(y), num_clients, seed=seed)
    n_neg = round(negate_fraction * num_clients)
    negated = np.zeros(num_clients, bool)
    negated[rng.choice(num_clients, n_neg, replace=False)] = True
    k = noisy_classes_per_client if personal else 0
    noisy = np.stack(
        [np.sort(rng.choice(num_classes, k, replace=False)) for _ in range(num_clients)]
    ).reshape(num_clients, k)
    clients = []
    for i, idx in enumerate(parts):
        xi, yi = x[idx].copy(), y[idx]
        if negated[i]:
            xi = 1.0 - xi if negation == "complement" else -xi
        hit = np.isin(yi, noisy[i])
        xi[hit] += rng.laplace(0.0, noise_scale, xi[hit].shape).astype(np.float32)
        clients.append((xi, yi))
    return FedPlusMNIST(split_clients(clients, fractions, seed=seed), negated, noisy)


class FedPlusRegression(NamedTuple):
    """Fed+'s synthetic regression and its ground truth."""

    data: FederatedData
    w_true: np.ndarray  # [N, d] each party's regression vector
    outlier: np.ndarray  # [N] bool: the last party

    __repr__ = brief_repr


def fedplus_synthetic_regression(
    num_clients: int = 10,
    *,
    dim: int = 1000,
    samples_per_client: int = 100,
    spread: str = "variance",
    party_mean: str = "vector",
    fractions: Fractions = (0.5, 0.0, 0.5),
    seed: int = 0,
) -> FedPlusRegression:
    """Fed+'s synthetic regression with an outlier party (Kundu et al., Fed+).

    ``y = w_k . x + v``; ``x ~ N(mu_k, Sigma)``, ``Sigma_jj = (((j - 1) mod 50) +
    1)^-1.1`` for ``j = 1..d`` (the paper's ``mod(j, 50)^-1.1`` is infinite at
    multiples of 50); ``mu_k ~ N(0, 0.5 I)`` per coordinate. Parties ``1..N-1``:
    ``w_k = w_bar + Laplace(0.5)`` with ``w_bar ~ N(0, 5 I)``; the last party (the
    outlier) uses its own ``w_bar' ~ N(0, 50 I)``. Noise ``v ~ N(0, 2)``. All
    ``N(0, s)`` read ``s`` as a variance (the paper does not say). Targets are
    ``[n, 1]``; split 50/50 train/test. ``spread="std"`` reads every ``N(0, s)``
    (and the ``5 I`` / ``50 I`` covariances) as a standard deviation instead.
    ``party_mean="scalar"`` draws one ``mu_k ~ N(0, 0.5)`` per party and shifts
    every coordinate by it (the paper writes ``N(0, 0.5)`` for ``mu_k`` but
    ``N(0, 5 I)`` for the vectors ``w_bar``); ``"vector"`` draws a coordinate each.
    """
    num_clients = check_int("num_clients", num_clients, lo=1)
    dim = check_int("dim", dim, lo=1)
    n = check_int("samples_per_client", samples_per_client, lo=1)
    check_choice("spread", spread, ("variance", "std"))
    check_choice("party_mean", party_mean, ("vector", "scalar"))
    sd = np.sqrt if spread == "variance" else (lambda v: v)
    rng = np.random.default_rng(seed)
    cov = (((np.arange(1, dim + 1) - 1) % 50) + 1.0) ** -1.1
    w_bar = rng.normal(0.0, sd(5.0), dim)
    w_out = rng.normal(0.0, sd(50.0), dim)
    w = np.empty((num_clients, dim))
    clients = []
    for k in range(num_clients):
        base = w_out if k == num_clients - 1 else w_bar
        w[k] = base + rng.laplace(0.0, 0.5, dim)
        mu = rng.normal(0.0, sd(0.5), dim if party_mean == "vector" else 1)
        x = mu + rng.normal(size=(n, dim)) * np.sqrt(cov)
        y = x @ w[k] + rng.normal(0.0, sd(2.0), n)
        clients.append((x.astype(np.float32), y[:, None].astype(np.float32)))
    outlier = np.arange(num_clients) == num_clients - 1
    return FedPlusRegression(split_clients(clients, fractions, seed=seed), w, outlier)
