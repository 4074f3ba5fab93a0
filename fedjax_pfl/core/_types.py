"""Core types: algorithm state, the Algorithm pair, per-client results."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

PyTree = Any


class AlgorithmState(NamedTuple):
    """Everything an algorithm carries across rounds.

    Attributes:
      server: server state (global params, optimizer state, aggregator state...).
      clients: per-client persistent state, every leaf with a leading
        ``num_clients`` axis (``()`` for stateless clients).
      round: int32 scalar, the number of rounds done.
    """

    server: PyTree
    clients: PyTree
    round: jax.Array


class ModelView(NamedTuple):
    """A model to evaluate: one shared set of parameters or one per client.

    Attributes:
      model: the :class:`fedjax_pfl.models.Model` whose ``apply`` evaluates it.
      params: parameters; with ``per_client`` every leaf has a leading
        ``num_clients`` axis.
      per_client: whether ``params`` is stacked over clients.
    """

    model: Any
    params: PyTree
    per_client: bool


class Algorithm(NamedTuple):
    """A federated algorithm as pure functions (optax style).

    Attributes:
      init: ``(key, data) -> AlgorithmState``.
      round_step: ``(state, data, key) -> (state, metrics)``: one jittable round.
        ``key`` is the run's key; the round derives its own keys with
        ``fold_in(key, state.round)``.
      eval_models: ``(state, data, key) -> {name: ModelView}``, the models whose
        per-client metrics are reported (e.g. ``global``, ``personal``).
      privacy: ``data -> fedjax_pfl.privacy.Mechanism``, the differentially
        private mechanism the algorithm runs on ``data`` (``None``: it declares
        none, and ``simulate`` reports no epsilon for it). See docs/privacy.md.
    """

    init: Callable[[jax.Array, Any], AlgorithmState]
    round_step: Callable[[AlgorithmState, Any, jax.Array], tuple[AlgorithmState, dict]]
    eval_models: Callable[[AlgorithmState, Any, jax.Array], dict[str, ModelView]]
    privacy: Callable[[Any], Any] | None = None


class ClientResult(NamedTuple):
    """What the one-client kernel returns.

    Attributes:
      client_state: the client's new persistent state (same structure as input).
      update: what the client uploads (e.g. ``w_k - w``).
      weight: scalar aggregation weight (e.g. the number of training examples).
      metrics: dict of per-client scalars (e.g. mean training loss).
    """

    client_state: PyTree
    update: PyTree
    weight: jax.Array
    metrics: dict
