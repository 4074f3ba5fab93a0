"""Negative federated learning (NFL): the gain over private models and the
server-side divergence detector.

Reference: Hong Lin, Lidan Shou, Ke Chen, Gang Chen, Sai Wu, "LINDT: Tackling
Negative Federated Learning with Local Adaptation" (arXiv 2020), §3 (Eq. 2-3 the
gain, Eq. 5 and 7 the divergence, Alg. 2 s10-s15 the detector). Paper: the LINDT paper;
decisions: docs/lindt.md.

Measurement (needs on-client tests): ``beta_i = V_i^G - V_i^P`` where ``V^G`` is
the accuracy of the model a client deploys and ``V^P`` that of its private model
(trained on its own data only), ``beta = sum_i alpha_i beta_i``.

Detection (server only, no client tests): ``w_div = (1/K) sum_k ||w_k - w||``
with the raw uploaded local models ``w_k`` and the post-noise global ``w``,
``Delta = w_div - ||noise||``; a counter of rounds with ``Delta > eps`` that
never resets; NFL is flagged in the round where the counter first exceeds
``r_prime`` (strict ``>``, as in Alg. 2: with ``Delta > eps`` every round that is
round ``r_prime + 1``, one round after the paper's prose "when r reaches 250").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_pfl.validation import (
    check_choice,
    check_count,
    check_int,
    check_positive,
)

EPS, R_PRIME, STOP_STREAK = 0.1, 250, 10  # the paper's defaults (Fig. 3b, App. C.7)


# ------------------------------------------------------------------ measurement


def client_gain(global_acc, private_acc) -> jax.Array:
    """``beta_i = V_i^G - V_i^P`` per client (Eq. 2), same units as the inputs
    (the paper: accuracy in percent)."""
    return jnp.asarray(global_acc) - jnp.asarray(private_acc)


def system_gain(gains, *, alpha=None, mask=None) -> jax.Array:
    """``beta = sum_i alpha_i beta_i`` (Eq. 3) over the clients with a finite gain.

    Args:
      gains: ``[N]`` per-client gains (NaN for clients without test data).
      alpha: ``[N]`` non-negative weights; default ``1/N`` (the paper's choice;
        ``n_i/n`` is the other weighting it lists). Renormalized over the counted
        clients.
      mask: ``[N]`` clients to count (e.g. benign only, ``threat.benign``: the
        paper's tables are consistent with benign-only averages: in LINDT's
        tables, local accuracy minus beta, the mean private accuracy, moves with
        the share of attackers).
    """
    g = jnp.asarray(gains, jnp.float32)
    ok = jnp.isfinite(g)
    if mask is not None:
        ok = ok & (jnp.asarray(mask) > 0)
    a = jnp.ones_like(g) if alpha is None else jnp.asarray(alpha, jnp.float32)
    a = jnp.where(ok, a, 0.0)
    return jnp.sum(a * jnp.where(ok, g, 0.0)) / jnp.maximum(jnp.sum(a), 1e-12)


def nfl_verdict(betas, window: int = 10) -> dict:
    """The paper's definition (§3.2: NFL iff no round ``R`` exists after which
    ``beta >= 0`` for every model) on a finite history: the run is in NFL when
    some ``beta`` of the last ``window`` evaluations is negative. Host-side.

    Returns ``{'in_nfl': bool, 'beta_tail_mean': float, 'settled_from': int |
    None}`` (``settled_from``: the first index from which every ``beta`` is
    ``>= 0``, None if the last one is negative).
    """
    b = np.asarray(betas, np.float64)
    if b.ndim != 1 or b.size == 0:
        raise ValueError("betas: must be a non-empty 1-D sequence, got shape "
                         f"{b.shape}")
    window = check_int("window", window, lo=1)
    tail = b[-window:]
    neg = np.where(b < 0)[0]
    settled = None if b[-1] < 0 else (int(neg[-1]) + 1 if neg.size else 0)
    return {"in_nfl": bool(np.any(tail < 0)), "beta_tail_mean": float(np.mean(tail)),
            "settled_from": settled}


def gain_metrics(deployed_acc, private_acc, *, alpha=None, mask=None,
                 scale: float = 100.0, prefix: str = "nfl") -> dict:
    """``{prefix/beta, prefix/local_acc, prefix/private_acc}`` from per-client
    accuracies (fractions), in percent with the default ``scale``; jittable."""
    d = jnp.asarray(deployed_acc, jnp.float32) * scale
    p = jnp.asarray(private_acc, jnp.float32) * scale
    return {f"{prefix}/beta": system_gain(client_gain(d, p), alpha=alpha, mask=mask),
            f"{prefix}/local_acc": system_gain(d, alpha=alpha, mask=mask),
            f"{prefix}/private_acc": system_gain(p, alpha=alpha, mask=mask)}


def add_gain(row: dict, deployed_acc, private_acc, *, alpha=None,
             mask=None) -> dict:
    """Adds ``nfl/beta``, ``nfl/local_acc`` and ``nfl/private_acc`` (percent)
    from per-client accuracies (fractions) to a metrics history ``row`` (in
    place; returned)."""
    for k, v in gain_metrics(deployed_acc, private_acc, alpha=alpha,
                             mask=mask).items():
        row[k] = float(v)
    return row


def deployed_accuracy_fn(algorithm, *, view: str | None = None,
                         split: str = "test") -> Callable:
    """A jitted ``(state, data) -> [N]`` per-client accuracy of the model each
    client deploys: ``view`` (default ``personal`` if the algorithm has one, else
    ``global``).

    Raises:
      ValueError: an unknown ``split`` (now), a ``view`` the algorithm does not
        evaluate or a split the data lacks (when first called).
    """
    from fedjax_pfl.core import evaluate_split

    check_choice("split", split, ("train", "val", "test"))
    if view is not None and not isinstance(view, str):
        raise ValueError(f"view: must be a view name or None, got {view!r}")

    def acc(state, data):
        views = algorithm.eval_models(state, data, jax.random.key(0))
        name = view or ("personal" if "personal" in views else "global")
        if name not in views:
            raise ValueError(f"view: unknown {name!r}; this algorithm evaluates "
                             f"{tuple(views)}")
        if getattr(data, split) is None:
            raise ValueError(f"split: the data has no {split!r} split")
        return evaluate_split(views[name], getattr(data, split))["accuracy"]

    return jax.jit(acc)


def gain_callback(algorithm, data, private_acc, *, view: str | None = None,
                  split: str = "test", alpha=None, mask=None) -> Callable:
    """A ``simulate(callback=...)`` that adds the gain of the deployed model (see
    :func:`deployed_accuracy_fn`) against ``private_acc`` (``[N]`` fractions, e.g.
    from :func:`private_accuracy`) to every history row (``simulate`` writes its
    ``jsonl_path`` line before calling the callback, so only the returned history
    has these keys)."""
    acc = deployed_accuracy_fn(algorithm, view=view, split=split)

    def callback(state, row):
        add_gain(row, acc(state, data), private_acc, alpha=alpha, mask=mask)

    return callback


# -------------------------------------------------------------------- detection


def weight_divergence(local_models, new_global, mask=None) -> jax.Array:
    """Eq. 5: ``(1/K) sum_k ||w_k - w||`` over stacked ``local_models [K, ...]``
    (L2 over the whole flattened model); ``mask [K]`` drops rows."""
    diffs = jax.tree.map(lambda a, b: a - b[None], local_models, new_global)
    return _masked_mean_norm(diffs, mask)


def divergence_from_updates(updates, server_delta, mask=None) -> jax.Array:
    """Eq. 5 from the uploads: ``w_k - w^r = u_k - (w^r - w^{r-1})`` with
    ``u_k = w_k - w^{r-1}`` the raw (unclipped) update and ``server_delta`` the
    global model's change including the noise."""
    diffs = jax.tree.map(lambda u, d: u - d[None], updates, server_delta)
    return _masked_mean_norm(diffs, mask)


def mean_update_norm(updates, mask=None) -> jax.Array:
    """``(1/K) sum_k ||u_k||`` over the stacked uploads ``updates [K, ...]``: how
    far a client moves in a round, the scale that Eq. 5's divergence grows
    with whether or not the clients disagree."""
    return _masked_mean_norm(updates, mask)


def _masked_mean_norm(diffs, mask) -> jax.Array:
    sq = sum(jnp.sum(jnp.square(a.reshape(a.shape[0], -1)), axis=1)
             for a in jax.tree.leaves(diffs))
    norms = jnp.sqrt(sq)
    m = jnp.ones_like(norms) if mask is None else jnp.asarray(mask, norms.dtype)
    return jnp.sum(norms * m) / jnp.maximum(jnp.sum(m), 1.0)


def nfl_delta(w_div, noise=None) -> jax.Array:
    """Eq. 7: ``Delta = w_div - ||noise||`` with the realized noise (a pytree, or
    its norm as a scalar; ``None`` = no DP)."""
    if noise is None:
        return jnp.asarray(w_div)
    leaves = jax.tree.leaves(noise)
    norm = leaves[0] if len(leaves) == 1 and jnp.ndim(leaves[0]) == 0 else (
        optax.tree.norm(noise))
    return jnp.asarray(w_div) - norm


class DetectorState(NamedTuple):
    """The server's NFL detector (Alg. 2 s12-s15), all int32/bool scalars.

    Attributes:
      count: rounds so far with ``Delta > eps`` (never reset).
      detected: NFL has been flagged.
      detect_round: the 1-based round in which it was flagged (-1 before).
      below: consecutive rounds with ``Delta < eps`` so far (for the stopping
        strategy ``delta_below``; reset by a round with ``Delta >= eps``).
    """

    count: jax.Array
    detected: jax.Array
    detect_round: jax.Array
    below: jax.Array


def detector_init() -> DetectorState:
    """The detector before round 1: nothing counted, nothing flagged."""
    return DetectorState(jnp.zeros((), jnp.int32), jnp.zeros((), bool),
                         jnp.full((), -1, jnp.int32), jnp.zeros((), jnp.int32))


def detector_update(state: DetectorState, delta, round_: jax.Array, *, eps=EPS,
                    r_prime=R_PRIME) -> DetectorState:
    """One round: ``count += Delta > eps``; flag when ``count > r_prime`` for the
    first time, recording ``round_`` (1-based). ``eps``/``r_prime`` may be
    traced."""
    count = state.count + (delta > eps).astype(jnp.int32)
    fire = (count > r_prime) & ~state.detected
    below = jnp.where(delta < eps, state.below + 1, 0).astype(jnp.int32)
    return DetectorState(count, state.detected | fire,
                         jnp.where(fire, round_, state.detect_round).astype(jnp.int32),
                         below)


def detection_round(deltas, *, eps=EPS, r_prime=R_PRIME) -> int | None:
    """Host-side reference: the 1-based round at which a stream of ``Delta``
    values raises the flag (``None`` if it never does)."""
    check_positive("eps", eps)
    r_prime = check_count("r_prime", r_prime)
    count = 0
    for r, d in enumerate(np.asarray(deltas, np.float64), start=1):
        count += int(d > eps)
        if count > r_prime:
            return r
    return None
