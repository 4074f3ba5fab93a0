"""Mapper: per-device model interpolation (a Ditto-paper baseline).

References: Yishay Mansour, Mehryar Mohri, Jae Ro, Ananda Theertha Suresh,
"Three Approaches for Personalization with Applications to Federated
Learning", arXiv:2002.10619, 2020 (§3, model interpolation / MAPPER); as run by
Li et al., "Ditto", ICML 2021, Table 2 (code ``flearn/trainers_MTL/mapper.py``).
Paper: Li et al., ICML 2021; decisions: docs/baselines-personalization.md.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.aggregators import Aggregator
from fedjax_pfl.core import (
    Algorithm,
    AlgorithmState,
    ClientResult,
    KeyTag,
    LocalConfig,
    ModelView,
    client_loss,
    make_local_config,
    run_local,
    tree_broadcast,
)
from fedjax_pfl.models import Model
from fedjax_pfl.toolkit import (
    check_cohort,
    check_malicious,
    global_solver,
    lift_clients,
    round_step,
)

from ._apfl import mix
from ._checks import check_grid
from ._ewc import finetune_clients, finetune_local_config


class MapperClientState(NamedTuple):
    """``local``: the client's ``h_k`` (starts at ``w^0``); ``lam``: its
    interpolation weight ``lambda_k`` (0 until first selected)."""

    local: object
    lam: jax.Array


def reparam(model: Model, fn) -> Model:
    """``model`` seen as a function of ``p`` through ``params = fn(p)``."""
    reg = model.regularizer
    return model._replace(apply=lambda p, x: model.apply(fn(p), x),
                          regularizer=None if reg is None else (lambda p: reg(fn(p))))


def personal_update(model: Model, cfg: LocalConfig, grid, h, w, cid, key, data):
    """Steps 1-2 of :func:`mapper` for ONE client: for every ``lam`` of ``grid``
    (lifted by the engine's strategy, same stream ``key`` for every candidate),
    ``cfg.num_steps + 1`` SGD steps on ``h`` of ``lam h + (1 - lam) w``, from
    the client's ``h``; returns the candidate whose interpolation has the lowest
    full training loss: ``(h_k, lam_k, its mean local loss)``."""
    hcfg = cfg._replace(num_steps=cfg.num_steps + 1)

    def candidate(lam):
        interp = lambda p: mix(lam, p, w)
        h_c, loss = run_local(reparam(model, interp), h, data, cid, key, hcfg)
        return h_c, loss, client_loss(model, interp(h_c), data.train, cid)

    cands = jnp.asarray(grid, jnp.float32)
    hs, losses, scores = lift_clients(candidate)(cands)
    i = jnp.argmin(jnp.where(jnp.isnan(scores), jnp.inf, scores))
    return jax.tree.map(lambda a: a[i], hs), cands[i], losses[i]


def client_update(model: Model, cfg: LocalConfig, grid, upload, server,
                  state: MapperClientState, cid, key, data, *,
                  cohort_size) -> ClientResult:
    """Mapper for ONE client: :func:`personal_update` (stream ``key``), then one
    SGD step on ``w`` of ``lam_k h_k + (1 - lam_k) w`` from ``w^t =
    server.params`` (stream ``fold_in(key, KeyTag.MAPPER_GLOBAL)``) and FedAvg's
    ``upload`` (``GlobalSolver.upload``: ``w_k - w^t``, attacked if malicious,
    weight ``n_k``). The new ``(h_k, lam_k)`` is the client's state."""
    w = server.params
    h, lam, ploss = personal_update(model, cfg, grid, state.local, w, cid, key, data)
    gkey = jax.random.fold_in(key, KeyTag.MAPPER_GLOBAL)
    gcfg = cfg._replace(num_steps=1, unroll=1)
    w_k, loss = run_local(reparam(model, lambda p: mix(lam, h, p)), w, data, cid,
                          gkey, gcfg)
    res = upload(w, w_k, cid, key, data, cohort_size, {
        "loss": loss, "personal_loss": ploss, "lam": lam})
    return res._replace(client_state=MapperClientState(h, lam))


def mapper(
    model: Model,
    *,
    lam_grid: tuple[float, ...] = (0.25, 0.5, 0.75),
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
    aggregator: Aggregator | None = None,
    weighted: bool = True,
    server_optimizer: optax.GradientTransformation | None = None,
    attack=None,
    malicious=None,
    finetune_steps: int = 50,
    finetune_epochs: float | None = None,
    finetune_lr: float | jax.Array | None = None,
) -> Algorithm:
    """Model interpolation ``lam_k h_k + (1 - lam_k) w`` as in the Ditto code.

    Every selected client k, given ``w^t``:

    1. for each ``lam`` of ``lam_grid`` (same minibatches for every candidate),
       runs ``num_local_steps + 1`` SGD steps on ``h``, from its ``h_k``:
       ``h <- h - lr lam grad f(lam h + (1 - lam) w^t; b)``;
    2. keeps the candidate whose interpolation has the lowest loss on the
       client's full training set (``lam_k``, ``h_k`` persist);
    3. takes one SGD step on ``w``: ``w_k = w^t - lr (1 - lam_k) grad f(lam_k h_k
       + (1 - lam_k) w^t; b')`` and uploads ``w_k - w^t`` (attacked if
       malicious); the server aggregates over the WHOLE cohort (the code's
       ``csolns.append`` outside the client loop, which averages only the last
       client, is not reproduced).

    Evaluated: ``global``; ``interpolated`` (``lam_k h_k + (1 - lam_k) w``);
    ``personal``: that interpolation finetuned with plain SGD (the code's last
    step). Unselected-so-far clients have ``lam_k = 0`` (the global model).

    Args:
      model: the model.
      lam_grid: candidate interpolation weights in [0, 1].
      client_lr, num_local_steps, batch_size, sampling: local SGD.
      cohort_size, cohort, aggregator, weighted, server_optimizer: FedAvg.
      attack, malicious: update attack and ``[num_clients]`` malicious mask.
      finetune_steps, finetune_epochs, finetune_lr: the finetuned evaluation.

    Raises:
      ValueError: for invalid arguments (the message names the argument).
    """
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling)
    check_cohort(cohort_size, cohort)
    grid = check_grid("lam_grid", lam_grid, hi=1.0)
    ft = finetune_local_config(cfg, finetune_steps, finetune_epochs, finetune_lr)
    solver = global_solver(model, cfg, aggregator=aggregator, weighted=weighted,
                           server_optimizer=server_optimizer,
                           attack=attack, malicious=malicious)

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        server = solver.init(key)
        n = data.num_clients
        clients = MapperClientState(tree_broadcast(server.params, n),
                                    jnp.zeros((n,), jnp.float32))
        return AlgorithmState(server, clients, jnp.zeros((), jnp.int32))

    step = round_step(
        functools.partial(client_update, model, cfg, grid, solver.upload),
        solver.server_fn, cohort_size=cohort_size, cohort=cohort, malicious=malicious,
        linear_weights=solver.aggregator.linear_weights, pass_cohort_size=True)

    def eval_models(state, data, key):
        w = state.server.params
        interp = jax.vmap(lambda h, lam: mix(lam, h, w))(state.clients.local,
                                                         state.clients.lam)
        tuned = finetune_clients(model, interp, data, key, ft,
                                 per_client_start=True)
        return {"global": ModelView(model, w, False),
                "interpolated": ModelView(model, interp, True),
                "personal": ModelView(model, tuned, True)}

    return Algorithm(init, step, eval_models)
