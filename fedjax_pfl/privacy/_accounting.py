"""Privacy accounting on the host with ``dp_accounting`` (never inside jit).

The mechanisms are described as ``dp_accounting`` events and handed to its RDP
accountant (Mironov et al. 2019 for the Poisson-subsampled Gaussian; the
RDP -> (eps, delta) conversion of Balle et al. 2020 / Canonne et al. 2020,
FedFDP's Lemma 2) or to its PLD accountant. Nothing here re-implements an
accountant.

Sample-level DP-SGD: one Poisson(q)-subsampled Gaussian with multiplier sigma per
local step. FedFDP (Theorem 2) adds one Poisson(q)-subsampled Gaussian with
``sigma_loss`` per round for the released loss. Client-level DP-FedAvg: one
Gaussian per round on the cohort mean, subsampled with rate ``cohort/clients``
(the Poisson approximation of a fixed-size cohort, as in McMahan et al. 2018), or
exactly as a fixed-size cohort without replacement (replace-one adjacency).

Every function checks its arguments first (``fedjax_pfl.validation``) and raises a
``ValueError`` naming the argument: rates in (0, 1], positive noise
multipliers, delta in (0, 1), non-negative integer counts of rounds and steps
(a negative count, a float or a bool is refused, never rounded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import dp_accounting
import numpy as np
from dp_accounting import pld, rdp

from fedjax_pfl.validation import (
    check_choice,
    check_count,
    check_int,
    check_number,
    check_probability,
)

ACCOUNTANTS = ("rdp", "pld")
# A rich set of RDP orders: 1.1..10.9 by 0.1, 11..63, 128/256/512.
DEFAULT_ORDERS = tuple(float(np.round(a, 1)) for a in np.arange(1.1, 10.95, 0.1)) + \
    tuple(float(a) for a in range(11, 64)) + (128.0, 256.0, 512.0)
# The RDP orders of the FedFDP authors' code (github.com/one1Mouth/FedFDP).
INTEGER_ORDERS = tuple(float(a) for a in range(2, 64)) + (128.0, 256.0, 512.0)


def _check_delta(delta) -> None:
    check_number("delta", delta, lo=0.0, hi=1.0, lo_open=True, hi_open=True,
                 scalar=True)


def _check_multiplier(name: str, value) -> None:
    check_number(name, value, lo=0.0, lo_open=True, scalar=True)


def _check_accountant(accountant, orders, pld_discretization) -> None:
    """The options of :func:`epsilon` (shared with ``Monitor``)."""
    check_choice("accountant", accountant, ACCOUNTANTS)
    if orders is not None:
        if isinstance(orders, (str, bytes)) or not hasattr(orders, "__len__") \
                or len(orders) == 0:
            raise ValueError(f"orders: must be a non-empty sequence of RDP orders "
                             f"> 1, got {orders!r}")
        check_number("orders", list(orders), lo=1.0, lo_open=True)
    check_number("pld_discretization", pld_discretization, lo=0.0, lo_open=True,
                 scalar=True)


def sampled_gaussian_event(sampling_rate: float, noise_multiplier: float,
                           count: int) -> dp_accounting.DpEvent:
    """``count`` compositions of the Poisson(``sampling_rate``)-subsampled
    Gaussian mechanism with noise multiplier ``noise_multiplier`` (sensitivity 1,
    noise std ``noise_multiplier``). ``count = 0`` is ``NoOpDpEvent`` (epsilon 0;
    ``dp_accounting`` refuses a zero-fold composition)."""
    check_probability("sampling_rate", sampling_rate)
    _check_multiplier("noise_multiplier", noise_multiplier)
    count = check_count("count", count)
    if count == 0:
        return dp_accounting.NoOpDpEvent()
    one = dp_accounting.GaussianDpEvent(float(noise_multiplier))
    if sampling_rate < 1.0:
        one = dp_accounting.PoissonSampledDpEvent(float(sampling_rate), one)
    return dp_accounting.SelfComposedDpEvent(one, count)


def dp_sgd_event(sampling_rate: float, noise_multiplier: float, num_rounds: int,
                 num_local_steps: int = 1) -> dp_accounting.DpEvent:
    """A client's sample-level DP-SGD over ``num_rounds`` rounds of
    ``num_local_steps`` Poisson-sampled steps (every round counted: no
    amplification by cohort sampling is claimed)."""
    num_rounds = check_count("num_rounds", num_rounds)
    num_local_steps = check_count("num_local_steps", num_local_steps)
    return sampled_gaussian_event(sampling_rate, noise_multiplier,
                                  num_rounds * num_local_steps)


def fedfdp_event(sampling_rate: float, noise_multiplier: float, num_rounds: int,
                 loss_noise_multiplier: float,
                 num_local_steps: int = 1) -> dp_accounting.DpEvent:
    """FedFDP's Theorem 2: the gradient steps composed with one loss release per
    round (Poisson(q) batch, multiplier ``loss_noise_multiplier``). The FedFDP
    authors' code leaves the loss release out; that count is
    :func:`dp_sgd_event`'s, which is NOT a bound for FedFDP (it releases the
    loss too), so ``None`` is refused."""
    if loss_noise_multiplier is None:
        raise ValueError("loss_noise_multiplier: FedFDP releases a noisy loss every "
                         "round and its epsilon must count it; the gradient steps "
                         "alone are dp_sgd_event")
    _check_multiplier("loss_noise_multiplier", loss_noise_multiplier)
    grad = dp_sgd_event(sampling_rate, noise_multiplier, num_rounds, num_local_steps)
    loss = sampled_gaussian_event(sampling_rate, loss_noise_multiplier, num_rounds)
    return dp_accounting.ComposedDpEvent([grad, loss])


COHORT_SAMPLINGS = ("poisson", "fixed_size")


def client_level_event(cohort_size: int, num_clients: int, noise_multiplier: float,
                       num_rounds: int, *, sampling: str = "poisson"
                       ) -> dp_accounting.DpEvent:
    """Client-level DP-FedAvg (clip S, noise ``z S`` on the sum), one release per
    round.

    ``sampling``:
      * ``"poisson"`` (default): a Poisson(``cohort_size / num_clients``)-subsampled
        Gaussian, add/remove-one-client adjacency (McMahan et al. 2018's
        approximation of the fixed-size cohort).
      * ``"fixed_size"``: exactly the engine's ``cohort="uniform"`` sampler, a
        uniform ``cohort_size``-subset without replacement
        (``SampledWithoutReplacementDpEvent``, Wang, Balle and Kasiviswanathan
        2019). Its adjacency is replace-one-client, under which the clipped sum's
        sensitivity is ``2 S``, so the event's multiplier is ``z / 2``;
        :func:`epsilon` then uses the replace-one RDP accountant (no PLD).
    """
    num_clients = check_int("num_clients", num_clients, lo=1)
    cohort_size = check_int("cohort_size", cohort_size, lo=1, hi=num_clients)
    num_rounds = check_count("num_rounds", num_rounds)
    check_choice("sampling", sampling, COHORT_SAMPLINGS)
    if sampling == "poisson":
        return sampled_gaussian_event(cohort_size / num_clients, noise_multiplier,
                                      num_rounds)
    _check_multiplier("noise_multiplier", noise_multiplier)
    if num_rounds == 0:
        return dp_accounting.NoOpDpEvent()
    one = dp_accounting.SampledWithoutReplacementDpEvent(
        num_clients, cohort_size,
        dp_accounting.GaussianDpEvent(float(noise_multiplier) / 2.0))
    return dp_accounting.SelfComposedDpEvent(one, num_rounds)


def _replace_one(event: dp_accounting.DpEvent) -> bool:
    """Whether ``event`` contains a sampled-without-replacement event."""
    if isinstance(event, dp_accounting.SampledWithoutReplacementDpEvent):
        return True
    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return _replace_one(event.event)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        return any(_replace_one(e) for e in event.events)
    return False


def epsilon(event: dp_accounting.DpEvent, delta: float, *, accountant: str = "rdp",
            orders: Sequence[float] | None = None,
            pld_discretization: float = 1e-4) -> float:
    """``epsilon`` of ``event`` at ``delta``.

    Args:
      event: a ``dp_accounting.DpEvent`` (e.g. from :func:`dp_sgd_event`).
      delta: target delta in (0, 1).
      accountant: ``"rdp"`` (default; orders ``DEFAULT_ORDERS``) or ``"pld"``.
      orders: RDP orders (``INTEGER_ORDERS``: those of the FedFDP authors' code).
      pld_discretization: PLD ``value_discretization_interval``.
    """
    if not isinstance(event, dp_accounting.DpEvent):
        raise ValueError(f"event: must be a dp_accounting.DpEvent, got "
                         f"{type(event).__name__}")
    _check_delta(delta)
    _check_accountant(accountant, orders, pld_discretization)
    if accountant == "rdp":
        rel = dp_accounting.NeighboringRelation
        rel = rel.REPLACE_ONE if _replace_one(event) else rel.ADD_OR_REMOVE_ONE
        acc = rdp.RdpAccountant(list(orders or DEFAULT_ORDERS), rel)
    else:
        if _replace_one(event):
            raise ValueError("accountant: 'pld' does not account sampling without "
                             "replacement (client_level_event(sampling="
                             "'fixed_size')); use 'rdp'")
        acc = pld.PLDAccountant(value_discretization_interval=pld_discretization)
    return float(acc.compose(event).get_epsilon(float(delta)))


def max_rounds(target_epsilon: float, delta: float,
               event_fn: Callable[[int], dp_accounting.DpEvent], *,
               upper: int = 100_000, **epsilon_kwargs) -> int:
    """The largest ``T <= upper`` with ``epsilon(event_fn(T), delta) <=
    target_epsilon`` (0 if even one round exceeds it). Epsilon grows with T, so
    this is an exponential then binary search (exact, integer T).

    Example: ``max_rounds(3.52, 1e-5, lambda t: fedfdp_event(0.05, 2.0, t, 5.0))``.
    """
    check_number("target_epsilon", target_epsilon, lo=0.0, lo_open=True,
                 scalar=True)
    _check_delta(delta)
    if not callable(event_fn):
        raise ValueError(f"event_fn: must be callable, got {event_fn!r}")
    upper = check_int("upper", upper, lo=1)

    def ok(t):
        return epsilon(event_fn(t), delta, **epsilon_kwargs) <= target_epsilon

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= upper and ok(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, upper + 1)
    if hi == upper + 1 and ok(upper):
        return upper
    while hi - lo > 1:  # invariant: ok(lo), not ok(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
