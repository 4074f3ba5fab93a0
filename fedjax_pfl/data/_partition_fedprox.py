"""FedProx's MNIST partition (Li et al., "Federated Optimization in Heterogeneous
Networks", MLSys 2020), as Fed+ uses it for its Fig. 4 (Kundu et al., arXiv
2009.06303, §5.2).

FedProx's generator gives each of 1000 users a few digits and a power-law
number of their images: 5 images of each of its 2 digits first, then the rest
of every digit shared among its holders in proportion to log-normal(0, 2)
weights (rounded down, so about one image per holder is left unused: 69,035 of
the 70,000 images, mean 69, std 106 per user). Fed+ says "each party has
samples of only one digit" and splits every party 80/20 train/test.
"""

from __future__ import annotations

import numpy as np

from fedjax_pfl.validation import check_int, check_number

from ._federated import FederatedData, split_clients
from ._partition import Fractions, _labels
from ._partition_papers import standardize_pixels


def _digit_shares(y: np.ndarray, num_classes: int, num_clients: int,
                  digits_per_client: int, size_lognormal: tuple[float, float],
                  min_size: int, seed: int) -> list[np.ndarray]:
    """Per-party row indices into ``y`` (checked arguments)."""
    rng = np.random.default_rng(seed)
    d = digits_per_client
    # party k holds digits (k + j) mod C, j < d (FedProx's consecutive digits)
    digits = (np.arange(num_clients)[:, None] + np.arange(d)[None]) % num_classes
    # its minimum split over its digits: FedProx's 10 = 5 + 5
    floor = min_size // d + (np.arange(d) < min_size % d)
    weights = rng.lognormal(*size_lognormal, (num_clients, d))
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        holder, slot = np.nonzero(digits == c)
        if holder.size == 0:
            continue
        rows = rng.permutation(np.flatnonzero(y == c))
        need = int(floor[slot].sum())
        if need > rows.size:
            raise ValueError(
                f"min_size: digit {c} has {rows.size} images, fewer than the "
                f"{need} its {holder.size} parties need at min_size={min_size}; "
                "lower min_size or num_clients")
        w = weights[holder, slot]
        extra = np.floor((rows.size - need) * w / w.sum()).astype(np.int64)
        counts = floor[slot] + extra  # floors: sum(counts) <= rows.size
        for k, piece in zip(holder, np.split(rows, np.cumsum(counts))[:-1]):
            parts[k].append(piece)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64)
            for p in parts]


def fedprox_mnist(
    x,
    y,
    num_clients: int = 1000,
    *,
    digits_per_client: int = 1,
    size_lognormal: tuple[float, float] = (0.0, 2.0),
    min_size: int = 10,
    standardize: bool = True,
    fractions: Fractions = (0.8, 0.0, 0.2),
    seed: int = 0,
) -> FederatedData:
    """FedProx's power-law MNIST parties with ``digits_per_client`` digits each.

    Party ``k`` holds the digits ``(k + j) mod C`` for ``j < digits_per_client``
    (FedProx's assignment; ``C`` classes, from ``y``). Every party first gets
    ``min_size`` images, spread evenly over its digits; the remaining images of
    each digit are then shared among its holders in proportion to i.i.d.
    ``LogNormal(*size_lognormal)`` weights, rounded down (FedProx's
    ``int(...)``), so no image is used twice and about one image per holder is
    left over. Each party's rows are then shuffled and split into ``fractions``
    (train/val/test, :func:`split_clients`).

    With the defaults on the 70,000 pooled MNIST images this is Fed+'s §5.2
    MNIST (Kundu et al., arXiv 2009.06303): 1000 parties of one digit each,
    about 69,500 images, 80/20 per party. ``digits_per_client=2`` is FedProx's
    own recipe (Li et al., MLSys 2020: 5 + 5 images, then LogNormal(0, 2)
    shares; 69,035 images, mean 69, std 106 per user, 90/10 per user in its
    code); the random draws differ from its script's.

    Args:
      x: images ``[n, ...]`` (flattened to ``[n, -1]`` float32).
      y: integer labels ``[n]``.
      num_clients: number of parties ``N >= 1``.
      digits_per_client: digits per party, in ``[1, C]``.
      size_lognormal: ``(mean, sigma)`` of the log-normal share weights
        (``sigma >= 0``; the mean only scales every weight and cancels).
      min_size: images every party gets before the power-law shares, ``>= 1``.
      standardize: FedProx's per-pixel ``(x - mean) / (std + 0.001)`` over the
        given rows (:func:`standardize_pixels`); ``False`` scales integer images
        by 1/255 and leaves float images as they are.
      fractions: the train/val/test split of each party.
      seed: seeds the weights, the shares and the splits.

    Returns:
      :class:`FederatedData` with ``num_clients`` parties.

    Raises:
      ValueError: naming the argument: ``x`` and ``y`` of different lengths,
        labels that are not non-negative integers, a count out of range, a
        ``size_lognormal`` that is not a pair with ``sigma >= 0``, a
        ``min_size`` a digit has too few images for, or bad ``fractions``.
    """
    num_clients = check_int("num_clients", num_clients, lo=1)
    y, num_classes = _labels(y, None)
    digits_per_client = check_int("digits_per_client", digits_per_client, lo=1,
                                  hi=max(1, num_classes))
    min_size = check_int("min_size", min_size, lo=1)
    size = np.asarray(size_lognormal, dtype=object)
    if size.shape != (2,):
        raise ValueError(f"size_lognormal: must be a pair (mean, sigma), got "
                         f"{size_lognormal!r}")
    check_number("size_lognormal", size_lognormal)
    if size_lognormal[1] < 0:
        raise ValueError(f"size_lognormal: sigma must be >= 0, got "
                         f"{size_lognormal!r}")
    if standardize not in (True, False):
        raise ValueError(f"standardize: must be True or False, got {standardize!r}")
    x = np.asarray(x)
    if x.ndim < 1 or len(x) != len(y):
        raise ValueError(f"x, y: need the same number of rows, got "
                         f"{x.shape[:1]} and {len(y)}")
    parts = _digit_shares(y, num_classes, num_clients, digits_per_client,
                          (float(size_lognormal[0]), float(size_lognormal[1])),
                          min_size, seed)
    if standardize:
        (x,) = standardize_pixels(x)
    else:
        x = x.reshape(len(x), -1)
        scale = 255.0 if np.issubdtype(x.dtype, np.integer) else 1.0
        x = x.astype(np.float32) / np.float32(scale)
    return split_clients([(x[p], y[p]) for p in parts], fractions, seed=seed)
