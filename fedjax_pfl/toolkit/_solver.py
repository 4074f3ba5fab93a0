"""FedAvg's two halves (the client's upload, the server's aggregation and
optimizer step), shared by every method whose global model is FedAvg's."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.aggregators import Aggregator, mean
from fedjax_pfl.core import (
    Algorithm,
    AlgorithmState,
    ClientResult,
    LocalConfig,
    client_loss,
    run_local,
)
from fedjax_pfl.models import Model
from fedjax_pfl.privacy import client_level_mechanism

from ._round import attack_delta, check_malicious, malicious_mask, round_step


class ServerState(NamedTuple):
    """A FedAvg-style server: the global ``params``, the server optimizer's
    state and the aggregator's state."""

    params: object
    opt_state: object
    agg_state: object


class GlobalSolver(NamedTuple):
    """FedAvg's two halves.

    Attributes:
      init: ``key -> ServerState``.
      client_update: ``(server, cid, key, data, cohort_size) -> ClientResult``
        with ``client_state=()``: local SGD from ``w^t``, the upload
        ``w_k - w^t`` (attacked if the client is malicious) and its weight.
      server_fn: the engine's ``server_fn`` (aggregate, server optimizer step).
      aggregator: the :class:`Aggregator` in use.
      upload: ``(w, w_k, cid, key, data, cohort_size, metrics) -> ClientResult``,
        :func:`client_upload` with this solver's model, aggregator and attack
        (for methods whose clients train ``w_k`` their own way).
    """

    init: object
    client_update: object
    server_fn: object
    aggregator: Aggregator
    upload: object


def client_upload(model, aggregator, attack, mal, w, w_k, cid, key, data,
                  cohort_size, metrics) -> ClientResult:
    """FedAvg's upload from a locally trained copy ``w_k`` of ``w``: ``w_k - w``
    (attacked if the client is malicious, :func:`attack_delta`), weight
    ``n_k``, and the round-start loss when the aggregator needs it.
    ``client_state`` is ``()``; replace it."""
    delta = jax.tree.map(jnp.subtract, w_k, w)
    delta = attack_delta(attack, mal, key, delta, cid, cohort_size)
    if aggregator.needs_losses:
        metrics = dict(metrics, round_start_loss=client_loss(model, w, data.train, cid))
    return ClientResult((), delta, data.train.counts[cid].astype(jnp.float32), metrics)


def server_update(server_optimizer: optax.GradientTransformation, params, opt_state,
                  delta):
    """FedAvg's server step: ``server_optimizer`` applied to the pseudo-gradient
    ``-delta`` (``optax.sgd(1.0)``: ``params + delta``). Returns the new
    ``(params, opt_state)``."""
    upd, opt_state = server_optimizer.update(jax.tree.map(jnp.negative, delta),
                                             opt_state, params)
    return optax.apply_updates(params, upd), opt_state


def global_solver(model: Model, cfg: LocalConfig, *,
                  aggregator: Aggregator | None = None, weighted: bool = True,
                  server_optimizer: optax.GradientTransformation | None = None,
                  attack=None, malicious=None, local_penalty=None) -> GlobalSolver:
    """Builds FedAvg's client update and server step.

    ``aggregator`` defaults to ``mean(weighted=weighted)`` and ``server_optimizer``
    to ``optax.sgd(1.0)`` (plain averaging of the deltas), FedAvg's defaults.
    ``local_penalty``, when given, is ``w^t -> (params -> scalar)``: a term added
    to every local minibatch loss, anchored at the round-start model (FedProx's
    ``mu/2 ||w - w^t||^2``); ``None`` is FedAvg."""
    aggregator = aggregator or mean(weighted=weighted)
    server_optimizer = server_optimizer or optax.sgd(1.0)
    mal = malicious_mask(attack, malicious)

    def upload(w, w_k, cid, key, data, cohort_size, metrics):
        return client_upload(model, aggregator, attack, mal, w, w_k, cid, key, data,
                             cohort_size, metrics)

    def init(key):
        params = model.init(key)
        return ServerState(params, server_optimizer.init(params),
                           aggregator.init(params))

    def client_update(server, cid, key, data, cohort_size):
        w = server.params
        penalty = None if local_penalty is None else local_penalty(w)
        w_k, loss = run_local(model, w, data, cid, key, cfg, penalty=penalty)
        return upload(w, w_k, cid, key, data, cohort_size, {"loss": loss})

    def server_fn(server, updates, weights, mask, metrics, key):
        delta, agg_state = aggregator.aggregate(
            server.agg_state, updates, weights, mask, key,
            losses=metrics.get("round_start_loss"))
        params, opt_state = server_update(server_optimizer, server.params,
                                          server.opt_state, delta)
        norm = optax.tree.norm(delta)
        return ServerState(params, opt_state, agg_state), {"server/update_norm": norm}

    return GlobalSolver(init, client_update, server_fn, aggregator, upload)


def client_dp_mechanism(aggregator: Aggregator, cohort_size, cohort):
    """``data -> privacy.Mechanism`` of a method whose server sees only
    ``aggregator``'s result, when ``aggregator`` is a
    :func:`fedjax_pfl.privacy.client_level_dp` wrapper (else ``None``).

    Raises:
      ValueError: naming ``cohort`` when it is not ``'uniform'`` or ``'full'``:
        client-level accounting needs every client to be equally likely to be
        picked (size-weighted cohorts pick large clients more often)."""
    cdp = aggregator.client_dp
    if cdp is None:
        return None
    if cohort not in ("uniform", "full"):
        raise ValueError(f"cohort: client-level DP (a client_level_dp aggregator) "
                         f"is accounted only for cohort='uniform' or 'full', got "
                         f"{cohort!r}")

    def mechanism(data):
        return client_level_mechanism(cdp, cohort=cohort, cohort_size=cohort_size,
                                      num_clients=data.num_clients)

    return mechanism


def stateless_algorithm(solver: GlobalSolver, client_update, eval_models, *,
                        cohort_size, cohort, malicious):
    """An :class:`fedjax_pfl.core.Algorithm` whose clients keep no state:
    ``client_update`` (``GlobalSolver.client_update``'s signature) lifted over
    the cohort, then ``solver.server_fn`` (FedAvg, DP-FedAvg, ...). With a
    ``client_level_dp`` aggregator it declares the client-level mechanism
    (:func:`client_dp_mechanism`)."""
    mechanism = client_dp_mechanism(solver.aggregator, cohort_size, cohort)

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        return AlgorithmState(solver.init(key), (), jnp.zeros((), jnp.int32))

    def client_fn(server, client_state, cid, key, data, *, cohort_size):
        return client_update(server, cid, key, data, cohort_size)

    step = round_step(client_fn, solver.server_fn, cohort_size=cohort_size,
                      cohort=cohort, malicious=malicious,
                      linear_weights=solver.aggregator.linear_weights,
                      pass_cohort_size=True)
    return Algorithm(init, step, eval_models, mechanism)
