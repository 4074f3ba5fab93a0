"""Epsilon in a run's metrics: a host-side monitor that ``simulate`` calls at
every evaluation (never inside jit). See docs/privacy.md, "Epsilon in the run's
metrics"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import dp_accounting

from fedjax_pfl.validation import check_count, check_int, check_number

from ._accounting import _check_accountant, _check_delta, epsilon, max_rounds


class Monitor:
    """Accounts a run's privacy after each evaluation.

    ``simulate(..., privacy=Monitor(...))`` adds ``privacy/epsilon`` (the epsilon
    of ``event_fn(t)`` at ``delta``, ``t`` the row's ``round``) and
    ``privacy/delta`` to every history row. With ``target_epsilon`` it also adds
    ``privacy/stopped`` and stops the run before a chunk of rounds (the rounds
    up to the next evaluation) whose END would give an epsilon above the target:
    the row of the last evaluation allowed has ``privacy/stopped: True``, and
    ``SimulationResult.rounds_run`` says how many rounds ran.

    Args:
      event_fn: ``rounds -> dp_accounting.DpEvent``, the mechanism after
        ``rounds >= 1`` rounds, e.g. ``lambda t: privacy.dp_sgd_event(q, sigma, t,
        steps)``. Zero rounds have epsilon 0 (``event_fn`` is not called).
      delta: in (0, 1).
      target_epsilon: ``None`` (only report) or a positive budget.
      accountant: ``"rdp"`` or ``"pld"``, as in :func:`epsilon`.
      orders: RDP orders (default ``DEFAULT_ORDERS``).
      pld_discretization: PLD ``value_discretization_interval``.

    Raises:
      ValueError: an invalid argument, or ``event_fn(1)`` not a ``DpEvent``.

    Example::

      mon = privacy.Monitor(lambda t: privacy.dp_sgd_event(0.05, 1.0, t, 5), 1e-5,
                            target_epsilon=8.0)
      res = fp.simulate(alg, data, num_rounds=500, eval_every=10, key=key,
                        privacy=mon)
      res.rounds_run, res.history[-1]["privacy/epsilon"]
    """

    def __init__(self, event_fn: Callable[[int], dp_accounting.DpEvent],
                 delta: float, *, target_epsilon: float | None = None,
                 accountant: str = "rdp", orders: Sequence[float] | None = None,
                 pld_discretization: float = 1e-4):
        if not callable(event_fn):
            raise ValueError(f"event_fn: must be callable, got {event_fn!r}")
        _check_delta(delta)
        if target_epsilon is not None:
            check_number("target_epsilon", target_epsilon, lo=0.0, lo_open=True,
                         scalar=True)
        _check_accountant(accountant, orders, pld_discretization)
        self.event_fn = event_fn
        self.delta = float(delta)
        self.target_epsilon = None if target_epsilon is None else float(target_epsilon)
        self.accountant = accountant
        self.orders = None if orders is None else tuple(float(a) for a in orders)
        self.pld_discretization = float(pld_discretization)
        self._cache: dict[int, float] = {}
        self._event(1)

    def __repr__(self) -> str:
        return (f"Monitor(delta={self.delta}, target_epsilon={self.target_epsilon}, "
                f"accountant={self.accountant!r})")

    def _event(self, rounds: int) -> dp_accounting.DpEvent:
        event = self.event_fn(rounds)
        if not isinstance(event, dp_accounting.DpEvent):
            raise ValueError(f"event_fn: must return a dp_accounting.DpEvent, got "
                             f"{type(event).__name__} for rounds={rounds}")
        return event

    def _kwargs(self) -> dict[str, Any]:
        return {"accountant": self.accountant, "orders": self.orders,
                "pld_discretization": self.pld_discretization}

    def epsilon(self, rounds: int) -> float:
        """Epsilon after ``rounds`` rounds (0 for 0 rounds); cached."""
        rounds = check_count("rounds", rounds)
        if rounds not in self._cache:
            self._cache[rounds] = 0.0 if rounds == 0 else epsilon(
                self._event(rounds), self.delta, **self._kwargs())
        return self._cache[rounds]

    def allows(self, rounds: int) -> bool:
        """Whether ``rounds`` rounds stay within ``target_epsilon`` (always True
        without a target)."""
        if self.target_epsilon is None:
            check_count("rounds", rounds)
            return True
        return self.epsilon(rounds) <= self.target_epsilon

    def metrics(self, rounds: int) -> dict[str, float]:
        """The columns added to a history row at round ``rounds``."""
        return {"privacy/epsilon": self.epsilon(rounds), "privacy/delta": self.delta}

    def max_rounds(self, upper: int = 100_000) -> int:
        """:func:`max_rounds` for this monitor's target (exact, not on the
        evaluation grid)."""
        if self.target_epsilon is None:
            raise ValueError("target_epsilon: max_rounds needs a target")
        upper = check_int("upper", upper, lo=1)
        return max_rounds(self.target_epsilon, self.delta, self._event, upper=upper,
                          **self._kwargs())

    def config(self) -> dict[str, Any]:
        """JSON-able settings, part of a checkpoint's fingerprint (``event_fn``
        itself cannot be compared; its epsilon after one round stands in)."""
        return {"delta": self.delta, "target_epsilon": self.target_epsilon,
                "accountant": self.accountant,
                "orders": None if self.orders is None else list(self.orders),
                "pld_discretization": self.pld_discretization,
                "epsilon_1": self.epsilon(1)}
