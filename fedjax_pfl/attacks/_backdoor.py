"""Semantic backdoor by data poisoning: attackers relabel whole source classes.

Reference: LINDT (Lin et al., arXiv 2020) §5 and App. C.4, following Gu et al.
2017 and Bagdasaryan et al., "How To Backdoor Federated Learning", AISTATS 2020:
CIFAR attackers relabel deer -> horse and dog -> frog (classes 4 -> 7, 5 -> 6),
and every training batch of 10 mixes 3 backdoor samples with 7 correct ones;
attackers train 5 local epochs (``algorithms.lindt(malicious_multiplier=5)``).
Paper: the LINDT paper
"""

from __future__ import annotations

import numpy as np

from fedjax_pfl.data import from_client_arrays

CIFAR_BACKDOOR = ((4, 7), (5, 6))  # deer -> horse, dog -> frog


def _with_train(data, train):
    """``data`` with its training split replaced by per-client ``(x, y)``."""
    def pairs_of(split):
        if split is None:
            return None
        return [split.client(c) for c in range(data.num_clients)]

    return from_client_arrays(train, pairs_of(data.val), pairs_of(data.test),
                              data.client_ids)


def semantic_backdoor(data, malicious, *, mapping=CIFAR_BACKDOOR,
                      poison_per_batch: int = 3, batch_size: int = 10,
                      seed: int = 0):
    """Poisons the TRAINING data of the malicious clients (val/test untouched).

    Each attacker keeps its rows of the non-source classes (correct labels) and
    gets ``n_b = round(n_clean * p / (B - p))`` backdoor rows (``p =
    poison_per_batch``, ``B = batch_size``), so a uniformly drawn batch of ``B``
    holds ``p`` backdoor samples in expectation (the paper: exactly 3 of 10 per
    batch; not exact here so that the poisoned data works with every algorithm).
    Backdoor rows are source-class images relabelled by ``mapping``, drawn with
    replacement from the attacker's own source-class rows, or, if it has none
    (label skew), from the source-class training rows of all clients (the paper
    does not say where they come from).

    Args:
      data: :class:`fedjax_pfl.data.FederatedData` with integer labels.
      malicious: ``[num_clients]`` bool mask (``attacks.malicious_clients``).
      mapping: ``(source, target)`` label pairs.
      poison_per_batch, batch_size: the mixing ratio ``p / B`` (0 <= p < B).
      seed: seeds the backdoor draws.

    Returns:
      The poisoned :class:`FederatedData` (same clients, ids and keys).
    """
    malicious = np.asarray(malicious, bool)
    if malicious.shape != (data.num_clients,):
        raise ValueError(f"malicious: must be a bool mask of shape "
                         f"({data.num_clients},), got {malicious.shape}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: must be a positive integer, got {batch_size!r}")
    if not isinstance(poison_per_batch, int) or not 0 <= poison_per_batch < batch_size:
        raise ValueError(f"poison_per_batch: must be an integer in [0, batch_size), "
                         f"got {poison_per_batch!r}")
    pairs = [(int(s), int(t)) for s, t in mapping]
    if not pairs:
        raise ValueError("mapping: give at least one (source, target) pair")
    y_all = np.asarray(data.train.y)
    if not np.issubdtype(y_all.dtype, np.integer):
        raise ValueError(f"data: needs integer class labels, got {y_all.dtype}")
    src = np.array([s for s, _ in pairs])
    lut = dict(pairs)
    pool = np.where(np.isin(y_all, src))[0]
    if pool.size == 0:
        raise ValueError(f"mapping: no training rows of the source classes {src}")
    x_all = np.asarray(data.train.x)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xBD]))
    train = []
    for c in range(data.num_clients):
        x, y = data.train.client(c)
        if not malicious[c]:
            train.append((x, y))
            continue
        is_src = np.isin(y, src)
        xc, yc = x[~is_src], y[~is_src]
        own = np.where(is_src)[0]
        n_b = max(1, round(len(yc) * poison_per_batch / (batch_size - poison_per_batch)))
        if own.size:
            pick = rng.choice(own, n_b)
            xb, yb = x[pick], y[pick]
        else:
            pick = rng.choice(pool, n_b)
            xb, yb = x_all[pick], y_all[pick]
        yb = np.array([lut[int(v)] for v in yb], dtype=y.dtype)
        train.append((np.concatenate([xc, xb]), np.concatenate([yc, yb])))

    return _with_train(data, train)


def target_backdoor(data, malicious, *, target: int):
    """Every training label of a malicious client becomes ``target`` (val/test
    untouched): LINDT's Shakespeare attack, where attackers train the model to
    predict ``'\\n'`` (LEAF id 0) after any input, holding no normal samples.

    The paper's "produces '\\n' in a row" leaves the inputs open; here each
    attacker keeps its own text windows as inputs (docs/lindt.md, decision 26).

    Args:
      data: :class:`fedjax_pfl.data.FederatedData` with integer labels.
      malicious: ``[num_clients]`` bool mask (``attacks.malicious_clients``).
      target: the label every poisoned row gets, in ``[0, max label]``.
    """
    malicious = np.asarray(malicious, bool)
    if malicious.shape != (data.num_clients,):
        raise ValueError(f"malicious: must be a bool mask of shape "
                         f"({data.num_clients},), got {malicious.shape}")
    y_all = np.asarray(data.train.y)
    if not np.issubdtype(y_all.dtype, np.integer):
        raise ValueError(f"data: needs integer class labels, got {y_all.dtype}")
    top = int(max(y_all.max(), *(np.asarray(s.y).max() for s in (data.val, data.test)
                                 if s is not None)))
    if isinstance(target, bool) or not isinstance(target, (int, np.integer)) or not (
            0 <= target <= top):
        raise ValueError(f"target: must be an integer label in [0, {top}], got "
                         f"{target!r}")
    train = []
    for c in range(data.num_clients):
        x, y = data.train.client(c)
        train.append((x, np.full_like(y, target) if malicious[c] else y))

    return _with_train(data, train)


def backdoor_success(predictions, labels, mapping=CIFAR_BACKDOOR) -> float:
    """Attack success rate: the fraction of source-class rows predicted as their
    target class (host-side, from ``[n]`` predicted and true labels)."""
    pred, y = np.asarray(predictions), np.asarray(labels)
    hit = total = 0
    for s, t in mapping:
        rows = y == s
        hit += int(np.sum(pred[rows] == t))
        total += int(np.sum(rows))
    return hit / total if total else float("nan")
