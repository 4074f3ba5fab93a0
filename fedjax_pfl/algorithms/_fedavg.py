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
import optax

from fedjax_pfl.aggregators import Aggregator, mean
from fedjax_pfl.core._clients import (
    COHORT_MODES,
    check_positive,
    client_keys,
    lift,
    tree_broadcast,
)
from fedjax_pfl.core._local import local_train
from fedjax_pfl.core._round import EngineConfig, federated_round
from fedjax_pfl.core._types import Algorithm, AlgorithmState, ClientResult, ModelView
from fedjax_pfl.data._federated import SAMPLING_MODES
from fedjax_pfl.models._model import Model


class LocalConfig(NamedTuple):
    """Local training settings shared by every algorithm."""

    lr: float | jax.Array
    num_steps: int
    batch_size: int
    sampling: str
    unroll: int | bool


class ServerState(NamedTuple):
    params: object
    opt_state: object
    agg_state: object


def make_local_config(
    client_lr, num_local_steps, batch_size, sampling, unroll
) -> LocalConfig:
    """Validates and bundles the local-training arguments."""
    check_positive("client_lr", client_lr)
    if not isinstance(num_local_steps, int) or num_local_steps < 1:
        raise ValueError(
            f"num_local_steps: must be a positive integer, got {num_local_steps!r}"
        )
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: must be a positive integer, got {batch_size!r}")
    if sampling not in SAMPLING_MODES:
        raise ValueError(f"sampling: must be one of {SAMPLING_MODES}, got {sampling!r}")
    if unroll is None:
        # XLA:CPU runs matmuls/convs much faster outside while loops (measured in
        # benchmarks/throughput.py); full unrolling costs compile time, so cap it.
        unroll = jax.default_backend() == "cpu" and num_local_steps <= 32
    return LocalConfig(client_lr, num_local_steps, batch_size, sampling, unroll)


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


def run_local(model, params, data, cid, key, cfg: LocalConfig, penalty=None):
    """Local SGD on one client's training split with ``cfg``."""
    return local_train(
        model, params, data.train, cid, key,
        optimizer=optax.sgd(cfg.lr), num_steps=cfg.num_steps,
        batch_size=cfg.batch_size, sampling=cfg.sampling, penalty=penalty,
        unroll=cfg.unroll,
    )


class _Deferred:
    """Builds the round lazily: the static cohort size depends on the data."""

    def __init__(self, build):
        self._build, self._cache = build, {}

    def __call__(self, state, data, key):
        n = data.num_clients
        if n not in self._cache:
            self._cache[n] = self._build(n)
        return self._cache[n](state, data, key)


def fedavg(
    model: Model,
    *,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
    server_optimizer: optax.GradientTransformation | None = None,
    aggregator: Aggregator | None = None,
    weighted: bool = True,
    finetune_steps: int = 0,
    finetune_lr: float | jax.Array | None = None,
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
    client finetunes the current global model on its own training data for that
    many steps (global-then-finetune; the ``lam = 0`` case of Ditto's finetuning
    solver).

    Args:
      model: the model.
      client_lr: local SGD step size (may be a traced array, e.g. in ``sweep``).
      num_local_steps, batch_size, sampling: local training (see ``local_train``).
      cohort_size, cohort: clients per round and how they are drawn.
      server_optimizer: optax transformation applied to ``-delta``.
      aggregator: overrides ``weighted`` with any :class:`Aggregator`.
      finetune_steps, finetune_lr: global-then-finetune evaluation.
      engine: execution strategy (vmap / lax.map / sharding).
      unroll: unroll local steps (default: on CPU).
    """
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling, unroll)
    check_cohort(cohort_size, cohort)
    if not isinstance(finetune_steps, int) or finetune_steps < 0:
        raise ValueError(
            f"finetune_steps: must be a non-negative integer, got {finetune_steps!r}"
        )
    ft_cfg = cfg._replace(
        lr=client_lr if finetune_lr is None else finetune_lr, num_steps=finetune_steps
    )
    if finetune_lr is not None:
        check_positive("finetune_lr", finetune_lr)
    server_opt = server_optimizer or optax.sgd(1.0)
    agg = aggregator or mean(weighted=weighted)
    engine = engine or EngineConfig()

    def init(key, data):
        params = model.init(key)
        return AlgorithmState(
            ServerState(params, server_opt.init(params), agg.init(params)),
            (),
            jnp.zeros((), jnp.int32),
        )

    def client_fn(server, client_state, cid, key, data):
        w = server.params
        w_k, loss = run_local(model, w, data, cid, key, cfg)
        delta = jax.tree.map(jnp.subtract, w_k, w)
        n = data.train.counts[cid].astype(jnp.float32)
        return ClientResult(client_state, delta, n, {"loss": loss})

    def server_fn(server, updates, weights, mask, metrics, key):
        delta, agg_state = agg.aggregate(server.agg_state, updates, weights, mask, key)
        pseudo_grad = jax.tree.map(jnp.negative, delta)
        upd, opt_state = server_opt.update(pseudo_grad, server.opt_state, server.params)
        params = optax.apply_updates(server.params, upd)
        norm = optax.tree.norm(delta)
        return ServerState(params, opt_state, agg_state), {"server/update_norm": norm}

    def build(num_clients):
        m = resolve_cohort_size(cohort_size, cohort, num_clients)
        return federated_round(client_fn, server_fn, cohort_size=m, cohort=cohort,
                               engine=engine, linear_weights=agg.linear_weights)

    def eval_models(state, data, key):
        out = {"global": ModelView(model, state.server.params, False)}
        if finetune_steps > 0:
            out["finetuned"] = ModelView(
                model,
                finetune_all(model, state.server.params, data, key, ft_cfg, engine),
                True,
            )
        return out

    return Algorithm(init, _Deferred(build), eval_models)


def finetune_all(model, params, data, key, cfg: LocalConfig, engine: EngineConfig):
    """Every client finetunes ``params`` on its training data: stacked results."""
    ids = jnp.arange(data.num_clients, dtype=jnp.int32)
    keys = client_keys(key, data.key_ids)

    def one(cid, k):
        return run_local(model, params, data, cid, k, cfg)[0]

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
