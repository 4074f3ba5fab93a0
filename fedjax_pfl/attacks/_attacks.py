"""The Ditto threat model: a malicious set fixed per run, label poisoning (A1),
Gaussian random updates (A2) and model replacement (A3).

Reference: Li et al., "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021, §4 and App. D (Li et al., ICML 2021). Details the paper
leaves open follow the authors' code (github.com/litian96/ditto): A2 sends
noise with the entry std of the client's own update, A3 scales by the cohort size,
and under every attack the malicious clients' TRAINING labels are poisoned (val and
test stay clean).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any
ATTACKS = ("none", "A1", "A2", "A3")


class UpdateAttack(NamedTuple):
    """What a malicious client uploads instead of its honest update.

    Attributes:
      name: a label for logs.
      apply: ``(key, update, cohort_size) -> update`` for ONE client; lift it over a
        cohort with :func:`attack_updates` (or let the engine do it).
    """

    name: str
    apply: Callable[[jax.Array, PyTree, int], PyTree]


def _entry_std(tree: PyTree) -> jax.Array:
    """Std of all entries of a pytree, as ``np.std(flatten(tree))``."""
    leaves = jax.tree.leaves(tree)
    n = sum(a.size for a in leaves)
    mean = sum(jnp.sum(a) for a in leaves) / n
    return jnp.sqrt(sum(jnp.sum(jnp.square(a - mean)) for a in leaves) / n)


def gaussian_updates(std: float | None = None) -> UpdateAttack:
    """A2: upload ``N(0, s^2 I)`` noise.

    Args:
      std: fixed ``s`` (the StackOverflow code uses 1); default: the entry std of
        the client's own update (the Ditto code).
    """

    def apply(key, update, cohort_size):
        del cohort_size
        s = _entry_std(update) if std is None else jnp.float32(std)
        leaves, tdef = jax.tree.flatten(update)
        keys = jax.random.split(key, len(leaves))
        noise = [s.astype(a.dtype) * jax.random.normal(k, a.shape, a.dtype)
                 for k, a in zip(keys, leaves)]
        return jax.tree.unflatten(tdef, noise)

    return UpdateAttack("A2", apply)


def model_replacement(scale: float | None = None) -> UpdateAttack:
    """A3: upload ``scale * update`` (Bagdasaryan et al. 2020).

    Args:
      scale: default the cohort size (the Ditto code's ``clients_per_round``).
    """

    def apply(key, update, cohort_size):
        del key
        s = cohort_size if scale is None else scale
        return jax.tree.map(lambda u: jnp.asarray(s, u.dtype) * u, update)

    return UpdateAttack("A3", apply)


def attack_update(attack: UpdateAttack | None, key, update, is_malicious,
                  cohort_size: int) -> PyTree:
    """One client's upload: the attacked update if ``is_malicious`` else ``update``."""
    if attack is None:
        return update
    bad = attack.apply(key, update, cohort_size)
    return jax.tree.map(lambda b, u: jnp.where(is_malicious, b, u), bad, update)


def attack_updates(attack: UpdateAttack | None, key, updates, malicious,
                   cohort_size: int | None = None) -> PyTree:
    """Stacked form ``(key, updates[m, ...], malicious[m]) -> updates``; client
    ``i`` uses ``fold_in(key, i)``."""
    m = malicious.shape[0]
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(m))
    return jax.vmap(lambda k, u, b: attack_update(attack, k, u, b, cohort_size or m))(
        keys, updates, malicious)


def malicious_clients(num_clients: int, ratio: float, seed: int = 0) -> np.ndarray:
    """The fixed malicious set: ``int(ratio * num_clients)`` clients drawn
    uniformly without replacement. Returns a ``[num_clients]`` bool mask."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"ratio: must be in [0, 1) (some clients must stay benign), "
                         f"got {ratio!r}")
    count = int(ratio * num_clients)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xD1770]))
    mask = np.zeros(num_clients, bool)
    mask[rng.choice(num_clients, count, replace=False)] = True
    return mask


def poison_labels(data, malicious, *, num_classes: int | None = None,
                  mode: str = "auto", seed: int = 0):
    """A1: replaces the TRAINING labels of malicious clients (val/test untouched).

    Args:
      data: :class:`fedjax_pfl.data.FederatedData` with integer or +-1 labels.
      malicious: ``[num_clients]`` bool mask.
      num_classes: for ``random``; default ``max(label) + 1``.
      mode: ``random`` (uniform over the classes; may keep the true label, as in
        the Ditto code), ``flip`` (binary: ``1 - y`` for {0, 1}, ``-y`` for
        {-1, +1}), or ``auto`` (``flip`` for binary labels, else ``random``).
      seed: the relabelling seed.
    """
    malicious = np.asarray(malicious, bool)
    if malicious.shape != (data.num_clients,):
        raise ValueError(f"malicious: must be a bool mask of shape "
                         f"({data.num_clients},), got {malicious.shape}")
    if mode not in ("auto", "random", "flip"):
        raise ValueError(f"mode: must be 'auto', 'random' or 'flip', got {mode!r}")
    y = np.asarray(data.train.y)
    values = np.unique(y)
    signed = set(values.tolist()) <= {-1, 1}
    binary = signed or set(values.tolist()) <= {0, 1}
    if mode == "auto":
        mode = "flip" if binary and (num_classes in (None, 2)) else "random"
    if mode == "flip" and not binary:
        raise ValueError(f"mode: 'flip' needs binary labels, got values {values[:5]}")
    if mode == "random" and not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"mode: 'random' needs integer class labels, got {y.dtype}")
    owner = np.asarray(data.train.client_of_row)
    rows = malicious[owner]
    new = y.copy()
    if mode == "flip":
        new[rows] = -y[rows] if signed else 1 - y[rows]
    else:
        c = int(values.max()) + 1 if num_classes is None else num_classes
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0xA1]))
        new[rows] = rng.integers(0, c, size=int(rows.sum())).astype(y.dtype)
    train = dataclasses.replace(data.train, y=jnp.asarray(new))
    return dataclasses.replace(data, train=train)


class ThreatModel(NamedTuple):
    """A run's adversary: who is malicious and what they upload.

    Attributes:
      kind: ``none``, ``A1``, ``A2`` or ``A3``.
      malicious: ``[num_clients]`` bool mask, fixed for the run.
      update_attack: the upload attack (``None`` for A1 and clean runs).
    """

    kind: str
    malicious: np.ndarray
    update_attack: UpdateAttack | None

    @property
    def benign(self) -> np.ndarray:
        """``[num_clients]`` float mask of benign clients (for ``eval_mask``)."""
        return (~self.malicious).astype(np.float32)


def setup_attack(data, kind: str, ratio: float, *, seed: int = 0,
                 num_classes: int | None = None, poison: bool = True,
                 scale: float | None = None):
    """Draws the malicious set and applies the data side of an attack.

    Args:
      data: the clean federated data.
      kind: ``none``, ``A1`` (label poisoning), ``A2`` (Gaussian updates) or
        ``A3`` (model replacement).
      ratio: fraction of malicious clients.
      seed: seeds the malicious set and the relabelling.
      num_classes: for random relabelling.
      poison: also poison the malicious clients' training labels under A2/A3 (the
        Ditto code does; A1 always poisons).
      scale: A3's factor (default: the cohort size).

    Returns:
      ``(data, ThreatModel)``: data with poisoned labels where the attack calls
      for it; pass ``threat.update_attack`` and ``threat.malicious`` to the
      algorithm and ``eval_mask=threat.benign`` to ``simulate``.
    """
    if kind not in ATTACKS:
        raise ValueError(f"kind: must be one of {ATTACKS}, got {kind!r}")
    malicious = malicious_clients(data.num_clients, ratio if kind != "none" else 0.0,
                                  seed)
    update_attack = {"A2": gaussian_updates(), "A3": model_replacement(scale)}.get(kind)
    if kind == "A1" or (kind in ("A2", "A3") and poison):
        data = poison_labels(data, malicious, num_classes=num_classes, seed=seed)
    return data, ThreatModel(kind, malicious, update_attack)
