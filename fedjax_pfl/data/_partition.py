"""Partitioners: split a centralized ``(x, y)`` dataset into clients.

Each partitioner comes in two layers:

* ``*_indices`` functions look at the labels only and return one array of row
  indices per client (cheap, pure NumPy; what the tests check);
* the wrappers gather those rows and return :class:`FederatedData`, split per
  client into train/val/test with :func:`split_clients`.

All are deterministic for a given ``seed``. Where a recipe copies a reference
implementation (PFLlib / FedFDP), it uses a legacy ``np.random.RandomState(seed)``
that makes the same calls in the same order as the reference, so the partition is
identical to the one the reference produces after ``np.random.seed(seed)``; the
global NumPy random state is never touched.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedjax_pfl.validation import (
    check_choice,
    check_count,
    check_int,
    check_nonnegative,
    check_positive,
)

from ._federated import FederatedData, split_clients

Fractions = tuple[float, float, float]


def _labels(y, num_classes: int | None) -> tuple[np.ndarray, int]:
    y = np.asarray(y)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(
            f"y: need a 1-D integer label array, got shape {y.shape}, dtype {y.dtype}"
        )
    if y.size and y.min() < 0:
        raise ValueError("y: labels must be non-negative")
    inferred = int(y.max()) + 1 if y.size else 0
    check_int("num_classes", num_classes, lo=1, allow_none=True)
    if num_classes is None:
        num_classes = inferred
    elif num_classes < inferred:
        raise ValueError(
            f"num_classes: {num_classes} is smaller than max(y) + 1 = {inferred}"
        )
    return y, int(num_classes)


def client_arrays(
    x, y, indices: Sequence[np.ndarray]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Gathers ``(x[idx], y[idx])`` for each client's index array."""
    x, y = np.asarray(x), np.asarray(y)
    return [(x[np.asarray(i, np.int64)], y[np.asarray(i, np.int64)]) for i in indices]


def _federate(x, y, indices, fractions, seed, client_ids=None) -> FederatedData:
    if len(np.asarray(x)) != len(np.asarray(y)):
        raise ValueError(
            f"x, y: need the same number of rows, got {len(x)} and {len(y)}"
        )
    return split_clients(
        client_arrays(x, y, indices), fractions, seed=seed, client_ids=client_ids
    )


# ----------------------------------------------------------------------- natural


def natural(
    x,
    y,
    client_keys,
    *,
    fractions: Fractions = (0.72, 0.08, 0.20),
    min_size: int = 1,
    seed: int = 0,
) -> FederatedData:
    """Natural partition: one client per distinct value of ``client_keys``.

    Args:
      x, y: ``[n, ...]`` features and labels.
      client_keys: ``[n]`` the owner of each row (writer, vehicle, speaker, ...).
        Clients are ordered by sorted key; the keys become the ``client_ids``.
      fractions: per-client train/val/test fractions (Ditto's 72/8/20 default).
      min_size: drop clients with fewer rows than this.
      seed: seed of the per-client shuffle before splitting.
    """
    min_size = check_count("min_size", min_size)
    keys = np.asarray(client_keys)
    if keys.shape[:1] != np.asarray(y).shape[:1]:
        raise ValueError(
            f"client_keys: need one key per row ({len(y)}), got shape {keys.shape}"
        )
    uniq, inverse = np.unique(keys, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    groups = np.split(order, np.cumsum(np.bincount(inverse, minlength=len(uniq)))[:-1])
    keep = [g for g in range(len(uniq)) if len(groups[g]) >= min_size]
    if not keep:
        raise ValueError(f"min_size: no client has at least {min_size} rows")
    return _federate(
        x, y, [groups[g] for g in keep], fractions, seed, [str(uniq[g]) for g in keep]
    )


# --------------------------------------------------------------------------- iid


def iid_indices(num_examples: int, num_clients: int, *, seed: int = 0) -> list:
    """A seeded shuffle cut into ``num_clients`` near-equal parts."""
    num_examples = check_count("num_examples", num_examples)
    num_clients = check_int("num_clients", num_clients, lo=1)
    if num_examples < num_clients:
        raise ValueError(
            f"num_clients: {num_clients} clients need at least as many examples, "
            f"got {num_examples}"
        )
    perm = np.random.default_rng(seed).permutation(num_examples)
    return np.array_split(perm, num_clients)


def iid(
    x, y, num_clients: int, *, fractions: Fractions = (0.72, 0.08, 0.20), seed: int = 0
) -> FederatedData:
    """IID partition into equal-sized clients (sizes differ by at most one)."""
    return _federate(x, y, iid_indices(len(y), num_clients, seed=seed), fractions, seed)


# ------------------------------------------------- k classes per client (PFLlib)


def k_classes_indices(
    y,
    num_clients: int,
    classes_per_client: int,
    *,
    num_classes: int | None = None,
    balance: bool = False,
    least_samples: float = 40.0,
    seed: int = 1,
) -> list[np.ndarray]:
    """PFLlib's pathological ``'pat'`` partition (``separate_data``), exactly.

    For each class ``c`` in order, the first ``ceil(N / C * k)`` clients that still
    need classes share that class's rows (in dataset order): equally with
    ``balance=True``; otherwise ``N_sel - 1`` clients draw
    ``randint(max(n_per / 10, least_samples / C), n_per)`` rows and the last takes
    the rest. With ``N = C = 10`` and ``k = 2``, clients ``2m`` and ``2m + 1`` both
    hold classes ``2m`` and ``2m + 1``.

    Args:
      least_samples: FedFDP's ``batch_size / (1 - train_size) = 40`` (PFLlib HEAD
        uses 1); only its ratio to ``num_classes`` matters.
      seed: legacy ``RandomState`` seed (FedFDP/PFLlib scripts use 1).

    Raises:
      ValueError: when a client would end up with no data.
    """
    y, num_classes = _labels(y, num_classes)
    num_clients = check_int("num_clients", num_clients, lo=1)
    k = check_int("classes_per_client", classes_per_client, lo=1)
    check_choice("balance", balance, (True, False))
    check_nonnegative("least_samples", least_samples)
    if k > num_classes:
        raise ValueError(
            f"classes_per_client: must be <= num_classes ({num_classes}), got {k}"
        )
    rs = np.random.RandomState(seed)
    idxs = np.arange(len(y))
    per_class = [idxs[y == c] for c in range(num_classes)]
    budget = [k] * num_clients
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    take = int(np.ceil(num_clients / num_classes * k))
    for c in range(num_classes):
        selected = [i for i in range(num_clients) if budget[i] > 0][:take]
        if not selected:
            break
        n_all = len(per_class[c])
        num_per = n_all / len(selected)
        if balance:
            counts = [int(num_per)] * (len(selected) - 1)
        else:
            low = max(num_per / 10, least_samples / num_classes)
            counts = rs.randint(low, num_per, len(selected) - 1).tolist()
        counts.append(n_all - sum(counts))
        start = 0
        for client, cnt in zip(selected, counts):
            parts[client].append(per_class[c][start : start + cnt])
            start += cnt
            budget[client] -= 1
    out = [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]
    empty = [i for i, p in enumerate(out) if len(p) == 0]
    if empty:
        raise ValueError(
            f"classes_per_client: with {num_clients} clients, {num_classes} classes "
            f"and {k} classes per client, clients {empty[:5]} get no data"
        )
    return out


def k_classes_per_client(
    x,
    y,
    num_clients: int,
    classes_per_client: int,
    *,
    num_classes: int | None = None,
    balance: bool = False,
    least_samples: float = 40.0,
    fractions: Fractions = (0.75, 0.0, 0.25),
    seed: int = 1,
) -> FederatedData:
    """Pathological non-IID partition (:func:`k_classes_indices`) then a per-client
    split (PFLlib's 75/25 train/test by default)."""
    idx = k_classes_indices(
        y, num_clients, classes_per_client, num_classes=num_classes,
        balance=balance, least_samples=least_samples, seed=seed,
    )
    return _federate(x, y, idx, fractions, seed)


# ------------------------------------------------------------ Dirichlet (PFLlib)


def dirichlet_indices(
    y,
    num_clients: int,
    alpha: float,
    *,
    num_classes: int | None = None,
    min_size: int = 10,
    max_tries: int = 10_000,
    seed: int = 1,
) -> list[np.ndarray]:
    """PFLlib/FedFDP Dirichlet label-skew partition, exactly (``separate_data``).

    For each class ``c`` in order: shuffle its row indices; draw
    ``p ~ Dir(alpha 1_N)``; zero ``p_j`` for clients already holding
    ``>= n / N`` rows, renormalize; cut at ``int(cumsum(p) * n_c)``. The whole
    draw is repeated until every client holds ``>= min_size`` rows (FedFDP:
    ``min_size = num_classes = 10``; PFLlib HEAD: 1). With ``seed=1`` and MNIST's
    pooled labels (train then test) this reproduces FedFDP's committed
    ``dataset/mnist/config.json`` exactly.

    Raises:
      ValueError: on bad arguments, or if ``max_tries`` draws all fail.
    """
    y, num_classes = _labels(y, num_classes)
    num_clients = check_int("num_clients", num_clients, lo=1)
    check_positive("alpha", alpha)
    min_size = check_count("min_size", min_size)
    max_tries = check_int("max_tries", max_tries, lo=1)
    if min_size * num_clients > len(y):
        raise ValueError(
            f"min_size: {num_clients} clients x {min_size} rows exceeds the "
            f"{len(y)} examples"
        )
    rs = np.random.RandomState(seed)
    n = len(y)
    for _ in range(max_tries):
        batch: list[list[int]] = [[] for _ in range(num_clients)]
        for c in range(num_classes):
            idx_c = np.where(y == c)[0]
            rs.shuffle(idx_c)
            p = rs.dirichlet(np.repeat(alpha, num_clients))
            p = np.array([q * (len(b) < n / num_clients) for q, b in zip(p, batch)])
            p = p / p.sum()
            cuts = (np.cumsum(p) * len(idx_c)).astype(int)[:-1]
            batch = [b + s.tolist() for b, s in zip(batch, np.split(idx_c, cuts))]
        if min(len(b) for b in batch) >= min_size:
            return [np.asarray(b, np.int64) for b in batch]
    raise ValueError(
        f"min_size: no draw in {max_tries} tries gave every client >= {min_size} "
        f"rows (alpha={alpha}, num_clients={num_clients})"
    )


def dirichlet(
    x,
    y,
    num_clients: int = 10,
    alpha: float = 0.1,
    *,
    num_classes: int | None = None,
    min_size: int = 10,
    fractions: Fractions = (0.75, 0.0, 0.25),
    seed: int = 1,
) -> FederatedData:
    """Dirichlet(``alpha``) label skew (:func:`dirichlet_indices`) + per-client split.

    Defaults are FedFDP's (Ling et al., arXiv 2402.16028): 10 clients,
    ``alpha = 0.1``,
    ``>= 10`` rows per client, seed 1, 75/25 train/test per client. FedFDP pools the
    official train and test sets first: pass ``concatenate([train, test])``.
    The per-client split uses :func:`split_clients` (test = ``floor(0.25 n)``;
    sklearn's ``train_test_split`` would take ``ceil``), with our own seeded shuffle
    (PFLlib's split is unseeded).
    """
    idx = dirichlet_indices(
        y, num_clients, alpha, num_classes=num_classes, min_size=min_size, seed=seed
    )
    return _federate(x, y, idx, fractions, seed)


# --------------------------------------- class subsets with log-normal sizes


def class_subset_lognormal_indices(
    y_train,
    y_test,
    classes_per_client: Sequence[int],
    *,
    num_classes: int | None = None,
    sigma: float = 1.0,
    class_sigma: float = 0.0,
    seed: int = 0,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Label skew with log-normal client sizes; train and test alike per client.

    Client ``i`` holds ``k_i = classes_per_client[i]`` consecutive classes
    ``(s_i + j) mod C``, with starts ``s_i = perm(N)_i mod C`` (so every class is
    held about equally often), and a target size ``t_i ~ LogNormal(0, sigma)``
    spread over its classes evenly (``class_sigma=0``, the default) or in
    proportions ``LogNormal(0, class_sigma)`` drawn per (client, class) and
    normalised, so that a client's classes are unbalanced (larger
    ``class_sigma``: a larger majority class). Each class's train rows
    (shuffled) are then shared among its holders in proportion to their
    weights for it (``t_i / k_i`` when even; largest-remainder
    rounding; a holder rounded to 0 takes one row from the largest, so client
    ``i`` holds exactly ``k_i`` classes), so all rows are used exactly once. The
    test rows are shared with the same weights (no one-row minimum: a small client
    may miss a class, or have no test rows), so each client's train and test label
    distributions match
    (the LINDT paper).

    Returns:
      ``(train_indices, test_indices)``: per-client index arrays into each split.
    """
    ks = np.asarray(classes_per_client)
    if ks.ndim != 1 or ks.size == 0 or ks.dtype.kind not in "iu":
        raise ValueError("classes_per_client: need one integer class count per "
                         f"client, got {classes_per_client!r}")
    ks = ks.astype(np.int64)
    y_train, c_tr = _labels(y_train, num_classes)
    y_test, c_te = _labels(y_test, num_classes)
    num_classes = max(c_tr, c_te)
    if ks.min() < 1 or ks.max() > num_classes:
        raise ValueError(
            f"classes_per_client: each must be in [1, {num_classes}], got "
            f"{ks.min()}..{ks.max()}"
        )
    check_nonnegative("sigma", sigma)
    check_nonnegative("class_sigma", class_sigma)
    rng = np.random.default_rng(seed)
    n_clients = len(ks)
    starts = rng.permutation(n_clients) % num_classes
    target = rng.lognormal(0.0, sigma, n_clients)
    holds = np.zeros((n_clients, num_classes), bool)
    for i in range(n_clients):
        holds[i, (starts[i] + np.arange(ks[i])) % num_classes] = True
    if class_sigma > 0:  # drawn only then: class_sigma=0 keeps the old splits
        prop = np.where(holds, rng.lognormal(0.0, class_sigma, holds.shape), 0.0)
        weight = target[:, None] * prop / prop.sum(1, keepdims=True)
    else:
        weight = np.where(holds, (target / ks)[:, None], 0.0)

    def share(labels, at_least_one):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        for c in range(num_classes):
            rows = rng.permutation(np.where(labels == c)[0])
            holders = np.where(holds[:, c])[0]
            if len(holders) == 0 or len(rows) == 0:
                continue
            counts = _apportion(len(rows), weight[holders, c], at_least_one)
            for h, piece in zip(holders, np.split(rows, np.cumsum(counts)[:-1])):
                parts[h].append(piece)
        return [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]

    return share(y_train, True), share(y_test, False)


def _apportion(total: int, weights: np.ndarray, at_least_one: bool) -> np.ndarray:
    """Integer counts summing to ``total`` in proportion to ``weights`` (largest
    remainder); with ``at_least_one`` (and ``total >= len(weights)``) each zero
    count takes one row from the currently largest count."""
    quota = weights / weights.sum() * total
    counts = np.floor(quota).astype(np.int64)
    short = total - int(counts.sum())
    if short:
        counts[np.argsort(-(quota - counts), kind="stable")[:short]] += 1
    if at_least_one and total >= len(weights):
        for j in np.where(counts == 0)[0]:
            counts[np.argmax(counts)] -= 1
            counts[j] = 1
    return counts
