"""Cohorts, malicious masks, attacks on uploads and the plain ``round_step``."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from fedjax_pfl.attacks import attack_update
from fedjax_pfl.core import (
    COHORT_MODES,
    ClientResult,
    KeyTag,
    current_engine,
    federated_round,
    lift,
)
from fedjax_pfl.validation import check_choice, check_int, check_mask

RoundStep = Callable  # (state, data, key) -> (state, metrics)


def check_cohort(cohort_size, cohort) -> None:
    """Validates a factory's ``cohort_size`` and ``cohort`` mode."""
    check_choice("cohort", cohort, COHORT_MODES)
    if cohort != "full":
        check_int("cohort_size", cohort_size, lo=1)


def resolve_cohort_size(cohort_size, cohort, num_clients) -> int:
    """The static cohort size for ``num_clients`` clients; raises if it exceeds
    them."""
    if cohort == "full":
        return num_clients
    if cohort_size > num_clients:
        raise ValueError(
            f"cohort_size: {cohort_size} is larger than the number of clients "
            f"({num_clients})"
        )
    return cohort_size


def malicious_mask(attack, malicious) -> jax.Array | None:
    """The ``[num_clients]`` malicious mask as a bool device array (``None``
    without one); an attack without a mask is refused."""
    if attack is not None and malicious is None:
        raise ValueError("malicious: an attack needs the [num_clients] bool mask of "
                         "malicious clients")
    return None if malicious is None else jnp.asarray(malicious, bool)


def check_malicious(malicious, num_clients) -> None:
    """``malicious`` is ``None`` or a ``[num_clients]`` bool mask."""
    if malicious is not None:
        check_mask("malicious", malicious, num_clients)


def attack_delta(attack, mal, key, delta, cid, cohort_size):
    """Client ``cid``'s upload ``delta`` as the engine sends it: attacked with
    its own stream ``fold_in(key, KeyTag.ATTACK)`` if the client is flagged in
    ``mal`` (unchanged without an attack)."""
    if attack is None:
        return delta
    return attack_update(attack, jax.random.fold_in(key, KeyTag.ATTACK), delta,
                         mal[cid], cohort_size)


def deferred(build: Callable[[int], RoundStep]) -> RoundStep:
    """A plain ``round_step(state, data, key)`` that builds the round for
    ``data.num_clients`` (static) on every call (once per trace under jit):
    for methods whose round depends on the number of clients."""

    def round_step(state, data, key):
        return build(data.num_clients)(state, data, key)

    return round_step


def lift_clients(fn: Callable) -> Callable:
    """``fn`` lifted over a leading axis (clients, or a client's candidates)
    by the strategy of the engine in force (:func:`fedjax_pfl.core.
    current_engine`): call it while the round is traced, not when the
    factory runs."""
    engine = current_engine()
    return lift(fn, engine.strategy, engine.map_batch_size)


def round_step(client_fn, server_fn, *, cohort_size, cohort: str = "uniform",
               linear_weights=None, attack=None, malicious=None,
               pass_cohort_size: bool = False) -> RoundStep:
    """``Algorithm.round_step`` from a one-client kernel and a server step.

    ``client_fn(server, client_state, cid, key, data) -> ClientResult`` runs for
    ONE client; the engine lifts it over the cohort (:func:`fedjax_pfl.core.
    federated_round`). With ``attack``, the engine replaces the ``update`` of
    every client flagged in ``malicious`` by the attacked update (keyed by
    ``fold_in(client key, KeyTag.ATTACK)``): any method whose upload is a model
    delta gets the threat model without wiring it. The cohort size is resolved
    from ``data.num_clients`` when the round runs (``cohort='full'``: all);
    with ``pass_cohort_size`` the kernel also gets it as ``cohort_size=``.
    The engine (strategy, mesh, ...) is the one in force when the round is
    traced: ``simulate(..., engine=...)`` sets it.
    """
    check_cohort(cohort_size, cohort)
    mal = malicious_mask(attack, malicious)

    def build(num_clients):
        check_malicious(malicious, num_clients)
        m = resolve_cohort_size(cohort_size, cohort, num_clients)
        one = (functools.partial(client_fn, cohort_size=m) if pass_cohort_size
               else client_fn)
        fn = one
        if attack is not None:
            def fn(server, client_state, cid, key, data):
                r: ClientResult = one(server, client_state, cid, key, data)
                return r._replace(update=attack_delta(attack, mal, key, r.update,
                                                      cid, m))

        return federated_round(fn, server_fn, cohort_size=m, cohort=cohort,
                               linear_weights=linear_weights)

    return deferred(build)
