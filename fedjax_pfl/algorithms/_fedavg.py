"""FedAvg, local-only training, and global-then-finetune.

References:
  McMahan et al., "Communication-Efficient Learning of Deep Networks from
  Decentralized Data", AISTATS 2017 (FedAvg).
  Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (server optimizers).
  Li et al., "Ditto", ICML 2021, §4 (local and finetuning baselines).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_pfl.aggregators import Aggregator, mean
from fedjax_pfl.attacks import attack_update
from fedjax_pfl.core import (
    LocalConfig,
    make_local_config,
    run_local,
)
from fedjax_pfl.core._clients import (
    COHORT_MODES,
    check_nonnegative,
    check_positive,
    client_keys,
    is_concrete,
    lift,
    tree_broadcast,
)
from fedjax_pfl.core._local import client_loss, prox_penalty
from fedjax_pfl.core._round import EngineConfig, federated_round
from fedjax_pfl.core._types import Algorithm, AlgorithmState, ClientResult, ModelView
from fedjax_pfl.models._model import Model


class ServerState(NamedTuple):
    params: object
    opt_state: object
    agg_state: object


def check_cohort(cohort_size, cohort) -> None:
    if cohort not in COHORT_MODES:
        raise ValueError(f"cohort: must be one of {COHORT_MODES}, got {cohort!r}")
    if cohort != "full" and (not isinstance(cohort_size, int) or cohort_size < 1):
        raise ValueError(f"cohort_size: must be a positive integer, got {cohort_size!r}")


def resolve_cohort_size(cohort_size, cohort, num_clients) -> int:
    """The static cohort size for ``data``; raises if it exceeds the clients."""
    if cohort == "full":
        return num_clients
    if cohort_size > num_clients:
        raise ValueError(
            f"cohort_size: {cohort_size} is larger than the number of clients "
            f"({num_clients})"
        )
    return cohort_size


class _Deferred:
    """Builds the round lazily: the static cohort size depends on the data."""

    def __init__(self, build):
        self._build, self._cache = build, {}

    def __call__(self, state, data, key):
        n = data.num_clients
        if n not in self._cache:
            self._cache[n] = self._build(n)
        return self._cache[n](state, data, key)


ATTACK_TAG = 11  # fold_in tag of a client's attack randomness


class GlobalSolver(NamedTuple):
    """FedAvg's two halves, shared by every algorithm whose global model is
    FedAvg's (Ditto, finetuning, ...).

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


def malicious_mask(attack, malicious) -> jax.Array | None:
    """The ``[num_clients]`` malicious mask as a bool device array (``None``
    without one); an attack without a mask is refused."""
    if attack is not None and malicious is None:
        raise ValueError("malicious: an attack needs the [num_clients] bool mask of "
                         "malicious clients")
    return None if malicious is None else jnp.asarray(malicious, bool)


def client_upload(model, aggregator, attack, mal, w, w_k, cid, key, data,
                  cohort_size, metrics):
    """FedAvg's upload from a locally trained copy ``w_k`` of ``w``: ``w_k - w``
    (attacked if the client is malicious), weight ``n_k``, and the round-start
    loss when the aggregator needs it. ``client_state`` is ``()``; replace it."""
    delta = jax.tree.map(jnp.subtract, w_k, w)
    if attack is not None:
        delta = attack_update(attack, jax.random.fold_in(key, ATTACK_TAG), delta,
                              mal[cid], cohort_size)
    if aggregator.needs_losses:
        metrics = dict(metrics, round_start_loss=client_loss(model, w, data.train, cid))
    return ClientResult((), delta, data.train.counts[cid].astype(jnp.float32), metrics)


def global_solver(model: Model, cfg: LocalConfig, *,
                  aggregator: Aggregator | None = None, weighted: bool = False,
                  server_optimizer: optax.GradientTransformation | None = None,
                  attack=None, malicious=None, local_penalty=None) -> GlobalSolver:
    """Builds FedAvg's client update and server step (see :func:`fedavg`).

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
        pseudo_grad = jax.tree.map(jnp.negative, delta)
        upd, opt_state = server_optimizer.update(pseudo_grad, server.opt_state,
                                                 server.params)
        params = optax.apply_updates(server.params, upd)
        norm = optax.tree.norm(delta)
        return ServerState(params, opt_state, agg_state), {"server/update_norm": norm}

    return GlobalSolver(init, client_update, server_fn, aggregator, upload)


def check_malicious(malicious, num_clients) -> None:
    if malicious is not None and np.shape(malicious) != (num_clients,):
        raise ValueError(f"malicious: must have shape ({num_clients},) (one flag per "
                         f"client), got {np.shape(malicious)}")


def fedavg(
    model: Model,
    *,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    local_epochs: float | None = None,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
    drop_last: bool = False,
    local_optimizer=None,
    server_optimizer: optax.GradientTransformation | None = None,
    aggregator: Aggregator | None = None,
    weighted: bool = True,
    attack=None,
    malicious=None,
    finetune_steps: int | tuple[int, ...] = 0,
    finetune_lr: float | jax.Array | None = None,
    finetune_lam: float | jax.Array = 0.0,
    engine: EngineConfig | None = None,
    unroll: int | bool | None = None,
) -> Algorithm:
    """Federated averaging with an optax server optimizer.

    Each selected client runs ``num_local_steps`` SGD steps from the global model
    and uploads ``delta_k = w_k - w``. The server aggregates (default: mean weighted
    by training-set size, or unweighted with ``weighted=False``) and applies
    ``server_optimizer`` to the pseudo-gradient ``-delta`` (default ``sgd(1.0)``:
    ``w <- w + mean delta``, plain FedAvg).

    ``finetune_steps > 0`` adds a ``finetuned`` model to the evaluation: every
    client finetunes the current global model ``w`` on its own training data for
    that many steps, minimizing ``F_k(v) + finetune_lam/2 ||v - w||^2``
    (``finetune_lam = 0``: plain finetuning; ``> 0``: Ditto's finetuning solver,
    Li et al. 2021 §3.2).

    Args:
      model: the model.
      client_lr: local SGD step size (may be a traced array, e.g. in ``sweep``).
      num_local_steps, batch_size, sampling: local training (see ``local_train``).
      local_epochs: count local training in epochs instead of steps (client k
        takes ``ceil(local_epochs * n_k / batch_size)`` steps, its own count:
        no client pays for the largest one's steps).
      drop_last: PyTorch-style epochs (``floor(n_k / batch_size)`` whole batches
        per pass, see :class:`fedjax_pfl.core.LocalConfig`).
      local_optimizer: ``lr -> optax.GradientTransformation`` for the local
        steps (default ``optax.sgd``; e.g. ``optax.adam``).
      cohort_size, cohort: clients per round and how they are drawn.
      server_optimizer: optax transformation applied to ``-delta``.
      aggregator: overrides ``weighted`` with any :class:`Aggregator`.
      attack, malicious: an :class:`fedjax_pfl.attacks.UpdateAttack` applied to
        the uploads of the clients flagged in the ``[num_clients]`` bool mask.
      finetune_steps, finetune_lr, finetune_lam: finetuning evaluation;
        ``finetune_steps`` may be a tuple of step counts (one view each).
      engine: execution strategy (vmap / lax.map / sharding).
      unroll: unroll local steps (default: on CPU).
    """
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling, unroll,
                            local_epochs, drop_last=drop_last,
                            optimizer=local_optimizer)
    check_cohort(cohort_size, cohort)
    ft_cfg = make_finetune_config(cfg, finetune_steps, finetune_lr, finetune_lam)
    engine = engine or EngineConfig()
    solver = global_solver(model, cfg, aggregator=aggregator, weighted=weighted,
                           server_optimizer=server_optimizer,
                           attack=attack, malicious=malicious)

    def eval_models(state, data, key):
        out = {"global": ModelView(model, state.server.params, False)}
        out.update(finetune_views(model, state.server.params, data, key, ft_cfg, engine))
        return out

    return stateless_algorithm(solver, solver.client_update, eval_models,
                               cohort_size=cohort_size, cohort=cohort, engine=engine,
                               malicious=malicious)


def stateless_algorithm(solver: GlobalSolver, client_update, eval_models, *,
                        cohort_size, cohort, engine, malicious) -> Algorithm:
    """An :class:`Algorithm` whose clients keep no state: ``client_update``
    (``GlobalSolver.client_update``'s signature) lifted over the cohort, then
    ``solver.server_fn`` (FedAvg, DP-FedAvg, ...)."""

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        return AlgorithmState(solver.init(key), (), jnp.zeros((), jnp.int32))

    def build(num_clients):
        check_malicious(malicious, num_clients)
        m = resolve_cohort_size(cohort_size, cohort, num_clients)

        def client_fn(server, client_state, cid, key, data):
            return client_update(server, cid, key, data, m)

        return federated_round(client_fn, solver.server_fn, cohort_size=m,
                               cohort=cohort, engine=engine,
                               linear_weights=solver.aggregator.linear_weights)

    return Algorithm(init, _Deferred(build), eval_models)


class FinetuneConfig(NamedTuple):
    local: LocalConfig
    lam: float | jax.Array
    counts: tuple[int, ...] | None  # several step counts: one view each


def make_finetune_config(cfg: LocalConfig, steps, lr, lam) -> FinetuneConfig | None:
    """Validates the finetuning arguments; ``None`` when ``steps == 0``.

    ``steps`` is an int, or a tuple of step counts: every client then finetunes
    along ONE minibatch stream and each count is reported as its own view
    ``finetuned_<count>`` (the Ditto paper's Fig. 6 picks the best count)."""
    counts = tuple(steps) if isinstance(steps, (tuple, list)) else None
    ok = all(isinstance(c, int) and c > 0 for c in counts) if counts else (
        isinstance(steps, int) and steps >= 0)
    if not ok:
        raise ValueError(f"finetune_steps: must be a non-negative integer or a tuple "
                         f"of positive integers, got {steps!r}")
    if lr is not None:
        check_positive("finetune_lr", lr)
    check_nonnegative("finetune_lam", lam)
    if steps == 0:
        return None
    return FinetuneConfig(cfg._replace(lr=cfg.lr if lr is None else lr,
                                       num_steps=max(counts) if counts else steps,
                                       epochs=None), lam, counts)


def finetune_views(model, params, data, key, ft: FinetuneConfig | None, engine):
    """``{'finetuned': per-client view}`` (or one ``finetuned_<count>`` view per
    count); empty without finetuning."""
    if ft is None:
        return {}
    if ft.counts is None:
        return {"finetuned": ModelView(model, finetune_all(
            model, params, data, key, ft.local, engine, lam=ft.lam), True)}
    return {f"finetuned_{c}": ModelView(model, finetune_all(
        model, params, data, key, ft.local, engine, lam=ft.lam, active_steps=c), True)
        for c in ft.counts}


def finetune_all(model, params, data, key, cfg: LocalConfig, engine: EngineConfig,
                 lam: float | jax.Array = 0.0, active_steps: int | None = None):
    """Every client finetunes ``params`` on its training data, minimizing
    ``F_k(v) + lam/2 ||v - params||^2`` from ``v = params``: stacked results.
    ``active_steps`` stops after that many of ``cfg.num_steps`` steps (same
    minibatch stream for every count)."""
    ids = jnp.arange(data.num_clients, dtype=jnp.int32)
    keys = client_keys(key, data.key_ids)
    penalty = None if is_concrete(lam) and np.all(np.asarray(lam) == 0) else (
        prox_penalty(lam, params))

    def one(cid, k):
        return run_local(model, params, data, cid, k, cfg, penalty=penalty,
                         active_steps=active_steps)[0]

    return lift(one, engine.strategy, engine.map_batch_size)(ids, keys)


def local_only(
    model: Model,
    *,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
    engine: EngineConfig | None = None,
    unroll: int | bool | None = None,
) -> Algorithm:
    """Local training: each client trains its own model, nothing is shared.

    All clients start from the same initialization. Selected clients take
    ``num_local_steps`` steps per round, so the compute schedule matches FedAvg's
    (the Ditto paper's 'local' baseline). The evaluated model is ``personal``.
    """
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling, unroll)
    check_cohort(cohort_size, cohort)
    engine = engine or EngineConfig()

    def init(key, data):
        params = model.init(key)
        return AlgorithmState((), tree_broadcast(params, data.num_clients),
                              jnp.zeros((), jnp.int32))

    def client_fn(server, v, cid, key, data):
        v_new, loss = run_local(model, v, data, cid, key, cfg)
        return ClientResult(v_new, (), data.train.counts[cid].astype(jnp.float32),
                            {"loss": loss})

    def server_fn(server, updates, weights, mask, metrics, key):
        return server, {}

    def build(num_clients):
        m = resolve_cohort_size(cohort_size, cohort, num_clients)
        return federated_round(client_fn, server_fn, cohort_size=m, cohort=cohort,
                               engine=engine)

    def eval_models(state, data, key):
        return {"personal": ModelView(model, state.clients, True)}

    return Algorithm(init, _Deferred(build), eval_models)
