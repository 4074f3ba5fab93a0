"""Epsilon in a run's metrics: a host-side monitor that ``simulate`` calls at
every evaluation (never inside jit). See docs/privacy.md, "Epsilon in the run's
metrics"."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import dp_accounting

from fedjax_pfl.validation import check_count, check_int, check_number

from ._accounting import _check_accountant, _check_delta, epsilon, max_rounds
from ._mechanism import Mechanism


class Monitor:
    """Accounts a run's privacy after each evaluation.

    ``simulate(..., privacy=Monitor(...))`` adds ``privacy/epsilon`` (the epsilon
    of the mechanism after ``t`` rounds at ``delta``, ``t`` the row's ``round``)
    and ``privacy/delta`` to every history row. With ``target_epsilon`` it also
    adds ``privacy/stopped`` and stops the run before a chunk of rounds (the
    rounds up to the next evaluation) whose END would give an epsilon above the
    target: the row of the last evaluation allowed has ``privacy/stopped:
    True``, and ``SimulationResult.rounds_run`` says how many rounds ran.

    ``simulate`` reports an epsilon only for an algorithm that declares its
    mechanism (``Algorithm.privacy``), only when that mechanism is accounted,
    and only when this monitor's event gives the declared mechanism's epsilon
    (checked after 1 and 7 rounds); otherwise it refuses the run before any
    work. Build the monitor from the algorithm itself with :meth:`of`.

    ``privacy/delta`` is ``delta`` plus ``(1 + e^eps) * t *
    Mechanism.truncation_per_round``: the chance that a static Poisson cap
    truncated a batch (at most ``1e-12`` per draw with the default cap).

    Args:
      event_fn: ``rounds -> dp_accounting.DpEvent``, the mechanism after
        ``rounds >= 1`` rounds, e.g. ``lambda t: privacy.dp_sgd_event(q, sigma, t,
        steps)``; or a :class:`Mechanism`. Zero rounds have epsilon 0
        (``event_fn`` is not called).
      delta: in (0, 1).
      target_epsilon: ``None`` (only report) or a positive budget.
      accountant: ``"rdp"`` or ``"pld"``, as in :func:`epsilon`.
      orders: RDP orders (default ``DEFAULT_ORDERS``).
      pld_discretization: PLD ``value_discretization_interval``.

    Raises:
      ValueError: an invalid argument, ``event_fn(1)`` not a ``DpEvent``, or a
        mechanism that is not accounted (the message says why).

    Example::

      mon = privacy.Monitor.of(alg, data, 1e-5, target_epsilon=8.0)
      res = fp.simulate(alg, data, num_rounds=500, eval_every=10, key=key,
                        privacy=mon)
      res.rounds_run, res.history[-1]["privacy/epsilon"]
    """

    def __init__(self, event_fn: Callable[[int], dp_accounting.DpEvent] | Mechanism,
                 delta: float, *, target_epsilon: float | None = None,
                 accountant: str = "rdp", orders: Sequence[float] | None = None,
                 pld_discretization: float = 1e-4):
        self.mechanism = None
        self.truncation_per_round = 0.0
        if isinstance(event_fn, Mechanism):
            self.mechanism = event_fn
            self.truncation_per_round = event_fn.truncation_per_round
            event_fn = event_fn.event  # _event(1) below refuses one not accounted
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

    @classmethod
    def of(cls, algorithm, data, delta: float, **kwargs) -> Monitor:
        """The monitor of the mechanism that ``algorithm`` declares on ``data``
        (``Algorithm.privacy``); ``kwargs`` as in the constructor.

        Raises:
          ValueError: the algorithm declares no mechanism, or its mechanism is
            not accounted (the message says why)."""
        return cls(declared_mechanism(algorithm, data), delta, **kwargs)

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

    def bind(self, algorithm, data) -> None:
        """Checks, before a run, that this monitor accounts the mechanism
        ``algorithm`` declares on ``data`` (``simulate`` calls it); adopts the
        mechanism's truncation term.

        Raises:
          ValueError: naming ``privacy``, when the algorithm declares no
            mechanism, the mechanism is not accounted, or this monitor's epsilon
            differs from the mechanism's after 1 or 7 rounds."""
        mech = declared_mechanism(algorithm, data)
        for t in (1, 7):  # mech.event refuses a mechanism that is not accounted
            theirs = epsilon(mech.event(t), self.delta, **self._kwargs())
            mine = self.epsilon(t)
            if not math.isclose(mine, theirs, rel_tol=1e-9, abs_tol=1e-12):
                raise ValueError(
                    f"privacy: the monitor's event gives epsilon {mine:.6g} after "
                    f"{t} rounds, but the algorithm runs {mech.description}, whose "
                    f"epsilon is {theirs:.6g}; build the monitor with "
                    "privacy.Monitor.of(algorithm, data, delta)")
        self.mechanism = mech
        self.truncation_per_round = max(self.truncation_per_round,
                                        mech.truncation_per_round)

    def epsilon(self, rounds: int) -> float:
        """Epsilon after ``rounds`` rounds (0 for 0 rounds); cached."""
        rounds = check_count("rounds", rounds)
        if rounds not in self._cache:
            self._cache[rounds] = 0.0 if rounds == 0 else epsilon(
                self._event(rounds), self.delta, **self._kwargs())
        return self._cache[rounds]

    def total_delta(self, rounds: int) -> float:
        """``delta`` plus the truncation term after ``rounds`` rounds."""
        eps = self.epsilon(rounds)
        if self.truncation_per_round == 0 or rounds == 0:
            return self.delta
        return self.delta + (1.0 + math.exp(min(eps, 700.0))) * rounds * \
            self.truncation_per_round

    def allows(self, rounds: int) -> bool:
        """Whether ``rounds`` rounds stay within ``target_epsilon`` (always True
        without a target)."""
        if self.target_epsilon is None:
            check_count("rounds", rounds)
            return True
        return self.epsilon(rounds) <= self.target_epsilon

    def metrics(self, rounds: int) -> dict[str, float]:
        """The columns added to a history row at round ``rounds``."""
        return {"privacy/epsilon": self.epsilon(rounds),
                "privacy/delta": self.total_delta(rounds)}

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

    def ledger(self, rounds: Sequence[int]) -> dict[str, Any]:
        """The privacy ledger of a run evaluated at ``rounds``: the mechanism
        (when known), the accountant's settings and, per round, epsilon and the
        total delta (JSON-able)."""
        return {"mechanism": None if self.mechanism is None
                else self.mechanism.record(),
                "delta": self.delta, "target_epsilon": self.target_epsilon,
                "accountant": self.accountant,
                "orders": None if self.orders is None else list(self.orders),
                "truncation_per_round": self.truncation_per_round,
                "event": repr(self._event(max(1, max(rounds, default=1)))),
                "evaluations": [{"round": int(t), "epsilon": self.epsilon(int(t)),
                                 "delta": self.total_delta(int(t))}
                                for t in rounds]}


def declared_mechanism(algorithm, data) -> Mechanism:
    """``algorithm.privacy(data)``, or a ``ValueError`` naming ``privacy`` when
    the algorithm declares no DP mechanism."""
    fn = getattr(algorithm, "privacy", None)
    if fn is None:
        raise ValueError(
            "privacy: this algorithm declares no differentially private mechanism "
            "(Algorithm.privacy), so no epsilon can be checked against what it "
            "runs; the DP algorithms (dp_fedavg, fedfdp, ditto(dp=...), and FedAvg-"
            "style methods with a client_level_dp aggregator) declare theirs")
    mech = fn(data)
    if not isinstance(mech, Mechanism):
        raise ValueError(f"privacy: Algorithm.privacy must return a "
                         f"privacy.Mechanism, got {type(mech).__name__}")
    return mech
