"""What a private algorithm releases, and the event that accounts it.

Every DP algorithm of the package declares its mechanism: ``Algorithm.privacy``
is ``data -> Mechanism``. A :class:`Mechanism` says who is protected (one record
of a client, or one client), the settings that the guarantee depends on, and
either the ``dp_accounting`` event of ``t`` rounds or the reason why no epsilon
of it would be a proven bound (e.g. ``normalize='realized'``). ``Monitor`` and
``simulate`` refuse to report an epsilon for a mechanism that is not accounted,
or for an event that is not the declared one (docs/privacy.md, "What an epsilon
covers").

Public facts (not protected): the number of clients, each client's number of
training examples ``n_k`` (FedAvg sends it as the aggregation weight; the
expected-size normaliser ``q n_k`` and the static Poisson cap are computed from
it) and every hyperparameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import dp_accounting
import numpy as np

from fedjax_pfl.validation import is_concrete

from ._accounting import client_level_event, dp_sgd_event, fedfdp_event
from ._sampling import default_max_batch_size, truncation_probability

LEVELS = ("sample", "client")


class Mechanism(NamedTuple):
    """A DP algorithm's release, as the accountant must see it.

    Attributes:
      level: ``"sample"`` (add/remove one training record of any one client) or
        ``"client"`` (replace one client's whole data).
      description: one sentence: what is released each round, with which noise.
      settings: the JSON-able values the guarantee depends on.
      event_fn: ``rounds -> dp_accounting.DpEvent`` (``None`` when not
        accounted).
      reason: why an epsilon of this run would NOT be a proven bound (``None``
        when it is).
      truncation_per_round: an upper bound on the probability, per round, that a
        static Poisson cap drops a sampled row in the worst client, for the
        larger neighbour. ``Monitor`` adds ``(1 + e^eps) * rounds *
        truncation_per_round`` to delta (a truncated Poisson batch is within that
        total-variation distance of an exact one).
    """

    level: str
    description: str
    settings: dict[str, Any]
    event_fn: Callable[[int], dp_accounting.DpEvent] | None
    reason: str | None = None
    truncation_per_round: float = 0.0

    @property
    def accounted(self) -> bool:
        """Whether the event's epsilon is a proven bound for this mechanism."""
        return self.reason is None

    def event(self, rounds: int) -> dp_accounting.DpEvent:
        """The event of ``rounds`` rounds (``ValueError`` if not accounted)."""
        if not self.accounted:
            raise ValueError(f"privacy: no epsilon of this run is a proven bound: "
                             f"{self.reason}")
        return self.event_fn(rounds)

    def record(self) -> dict[str, Any]:
        """JSON-able summary (the run directory's privacy ledger)."""
        return {"level": self.level, "description": self.description,
                "accounted": self.accounted, "reason": self.reason,
                "settings": self.settings,
                "truncation_per_round": self.truncation_per_round}


def _value(x) -> float | None:
    """``float(x)`` for a concrete scalar, else ``None`` (absent or traced)."""
    if x is None or not is_concrete(x) or np.ndim(x) != 0:
        return None
    return float(np.asarray(x))


def _why_not(reasons: list[str]) -> str | None:
    return "; ".join(reasons) if reasons else None


def dp_sgd_mechanism(dp, *, sampling: str, steps_per_round: int, max_count: int,
                     what: str = "local DP-SGD", loss_release=None,
                     extra_reasons=()) -> Mechanism:
    """The sample-level mechanism of local DP-SGD with ``dp`` (a
    :class:`DPConfig`): ``steps_per_round`` Poisson-subsampled Gaussian steps
    per round for every client (cohort sampling is not used for amplification),
    plus FedFDP's loss release when ``loss_release = (loss_clip,
    loss_noise_multiplier)``. ``max_count`` is the largest client's size (the
    static Poisson cap and its truncation probability)."""
    q, sigma, clip = (_value(dp.sampling_rate), _value(dp.noise_multiplier),
                      _value(dp.clip))
    reasons = list(extra_reasons)
    if sampling != "poisson":
        reasons.append(f"sampling={sampling!r}: only Poisson batches "
                       "(sampling='poisson' with a sampling_rate) are accounted")
    elif q is None:
        reasons.append("sampling_rate is traced (a sweep): account each value "
                       "with privacy.dp_sgd_event")
    if clip is None or sigma is None:
        reasons.append("clip or noise_multiplier is traced (a sweep): account "
                       "each value with privacy.dp_sgd_event")
    else:
        if math.isinf(clip):
            reasons.append("clip=inf: an unclipped gradient has no sensitivity "
                           "bound")
        if sigma == 0:
            reasons.append("noise_multiplier=0: no noise")
    if isinstance(dp.normalize, str) and dp.normalize == "realized":
        reasons.append("normalize='realized': the noisy sum is divided by the "
                       "realised batch size, which depends on the private data "
                       "and is not accounted (use 'expected' or a number)")
    settings = {"sampling": sampling, "sampling_rate": q, "noise_multiplier": sigma,
                "clip": clip, "normalize": dp.normalize,
                "steps_per_round": steps_per_round, "max_batch_size": None,
                "fair_clip": dp.fair_clip}
    draws = steps_per_round
    if loss_release is not None:
        lclip, lsigma = (_value(v) for v in loss_release)
        settings.update(loss_clip=lclip, loss_noise_multiplier=lsigma)
        if lclip is None or lsigma is None:
            reasons.append("loss_clip or loss_noise_multiplier is traced")
        elif lsigma == 0 or math.isinf(lclip):
            reasons.append("the loss is released without noise or without a "
                           "bound (loss_noise_multiplier=0 or loss_clip=inf)")
        draws += 1
    trunc = 0.0
    if sampling == "poisson" and q is not None:
        cap = dp.max_batch_size or default_max_batch_size(q, max_count)
        settings["max_batch_size"] = cap
        trunc = draws * truncation_probability(q, max_count + 1, cap)
    reason = _why_not(reasons)
    if reason is not None:
        event_fn = None
    elif loss_release is not None:
        lsigma = settings["loss_noise_multiplier"]
        event_fn = lambda t: fedfdp_event(q, sigma, t, lsigma,  # noqa: E731
                                          steps_per_round)
    else:
        event_fn = lambda t: dp_sgd_event(q, sigma, t, steps_per_round)  # noqa: E731
    desc = (f"{what}: per client and round, {steps_per_round} Poisson(q={q}) "
            f"batches, each example's gradient clipped to {clip}, Gaussian noise "
            f"with multiplier {sigma}, normaliser {dp.normalize!r}")
    if loss_release is not None:
        desc += (f"; one loss release per round (bound {settings['loss_clip']}, "
                 f"multiplier {settings['loss_noise_multiplier']})")
    return Mechanism("sample", desc, settings, event_fn, reason, trunc)


def client_level_mechanism(client_dp, *, cohort: str, cohort_size: int,
                           num_clients: int) -> Mechanism:
    """The client-level mechanism of an aggregator wrapped by
    :func:`client_level_dp` (``client_dp = aggregator.client_dp``) in an
    algorithm whose server sees nothing but that aggregate: one release per
    round, accounted exactly for the engine's ``cohort='uniform'`` (a uniform
    subset without replacement) or ``'full'`` sampler under replace-one-client
    adjacency (:func:`client_level_event` with ``sampling='fixed_size'``)."""
    clip, z = _value(client_dp.clip), _value(client_dp.noise_multiplier)
    m = num_clients if cohort == "full" else min(int(cohort_size), num_clients)
    reasons = []
    if cohort not in ("uniform", "full"):
        reasons.append(f"cohort={cohort!r}: client-level DP is accounted for "
                       "cohort='uniform' or 'full' only")
    if not client_dp.unweighted_mean:
        reasons.append("the noise is calibrated to the unweighted mean's "
                       "sensitivity; the wrapped aggregator is another rule "
                       "(use aggregators.mean(weighted=False))")
    if clip is None or z is None:
        reasons.append("clip or noise_multiplier is traced (a sweep)")
    else:
        if math.isinf(clip):
            reasons.append("clip=inf: an unclipped update has no sensitivity bound")
        if z == 0:
            reasons.append("noise_multiplier=0: no noise")
    reason = _why_not(reasons)
    event_fn = None if reason else (
        lambda t: client_level_event(m, num_clients, z, t, sampling="fixed_size"))
    desc = (f"client-level DP: per round one aggregate of {m} of {num_clients} "
            f"clients' updates (cohort {cohort!r}), each clipped to {clip}, "
            f"Gaussian noise with multiplier {z} on the sum")
    settings = {"cohort": cohort, "cohort_size": m, "num_clients": num_clients,
                "clip": clip, "noise_multiplier": z,
                "unweighted_mean": bool(client_dp.unweighted_mean)}
    return Mechanism("client", desc, settings, event_fn, reason)
