"""Client-level DP: clip every client's update, noise the aggregate on the server.

McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent
Language Models", ICLR 2018 (DP-FedAvg): each update is clipped to L2 norm S,
the server averages and adds ``N(0, (z S / m)^2)`` per coordinate, ``m`` the
number of counted cohort members. Account with
:func:`fedjax_pfl.privacy.client_level_event`.

The ``z S / m`` calibration is the sensitivity of the UNWEIGHTED mean
(``aggregators.mean(weighted=False)``). A weighted mean has sensitivity
``S max_k w_k / sum_k w_k`` and robust rules (median, Krum) others still: with
those the noise is still added, but the algorithm's declared mechanism says it
is not accounted, and no epsilon is reported for it. A rule that reads the
clients' un-noised training losses (TERM, k-loss) is refused.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.aggregators import Aggregator
from fedjax_pfl.core import KeyTag
from fedjax_pfl.validation import check_nonnegative, is_concrete

from ._clip import clip_factor, tree_sq_norms
from ._noise import gaussian_noise, noise_std


class ClientDP(NamedTuple):
    """The settings a :func:`client_level_dp` aggregator carries
    (``Aggregator.client_dp``), from which algorithms declare their mechanism."""

    clip: Any
    noise_multiplier: Any
    unweighted_mean: bool


def _is_unweighted_mean(aggregator: Aggregator) -> bool:
    """Whether ``aggregator`` is a plain average of the counted uploads: a
    linear rule (``linear_weights``) whose coefficients are the mask itself."""
    if aggregator.linear_weights is None:
        return False
    w, mask = np.array([1.0, 2.0, 3.0], np.float32), np.array([1.0, 1.0, 0.0],
                                                              np.float32)
    return bool(np.array_equal(np.asarray(aggregator.linear_weights(w, mask)), mask))


def clip_updates(updates, clip) -> tuple[object, jax.Array]:
    """Clips each row of stacked ``updates [m, ...]`` to L2 norm ``clip`` (over
    the whole pytree); returns ``(clipped, norms [m])``."""
    norms = jnp.sqrt(tree_sq_norms(updates))
    c = clip_factor(norms, clip)
    return jax.tree.map(
        lambda u: u * c.reshape((-1,) + (1,) * (u.ndim - 1)).astype(u.dtype),
        updates), norms


def client_level_dp(aggregator: Aggregator, clip, noise_multiplier) -> Aggregator:
    """Wraps ``aggregator``: clip each client's update to ``clip`` (S), aggregate,
    add Gaussian noise with std ``noise_multiplier * S / m`` (``m`` = cohort
    members with a nonzero mask).

    The uploads are always stacked (``linear_weights=None``): the engine's
    streaming mean would average before the per-client clip.

    Args:
      aggregator: the inner rule (use ``aggregators.mean(weighted=False)`` for the
        accounted guarantee).
      clip: S > 0 (traceable; ``inf`` = no clipping).
      noise_multiplier: z >= 0 (traceable).

    Raises:
      ValueError: naming ``clip`` or ``noise_multiplier`` when out of range, or
        ``aggregator`` when it reads the clients' training losses (they are not
        noised).
    """
    if is_concrete(clip) and not np.all(np.asarray(clip, np.float64) > 0):
        raise ValueError(f"clip: must be positive (inf disables clipping), got {clip!r}")
    check_nonnegative("noise_multiplier", noise_multiplier)
    if aggregator.needs_losses:
        raise ValueError("aggregator: this rule weights or selects the uploads by "
                         "the clients' exact training losses, which are not "
                         "noised; it cannot be used with client-level DP")

    def aggregate(state, updates, weights, mask, key, losses=None):
        clipped, _ = clip_updates(updates, clip)
        agg, state = aggregator.aggregate(state, clipped, weights, mask, key,
                                          losses=losses)
        m = jnp.maximum(jnp.sum(mask > 0), 1).astype(jnp.float32)
        std = noise_std(clip, noise_multiplier) / m
        noise = gaussian_noise(jax.random.fold_in(key, KeyTag.CLIENT_DP_NOISE), agg, std)
        return jax.tree.map(jnp.add, agg, noise), state

    return Aggregator(aggregator.init, aggregate, None, False,
                      ClientDP(clip, noise_multiplier, _is_unweighted_mean(aggregator)))
