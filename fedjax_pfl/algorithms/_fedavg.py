"""FedAvg, local-only training, and global-then-finetune.

References:
  McMahan et al., "Communication-Efficient Learning of Deep Networks from
  Decentralized Data", AISTATS 2017 (FedAvg).
  Reddi et al., "Adaptive Federated Optimization", ICLR 2021 (server optimizers).
  Li et al., "Ditto", ICML 2021, §4 (local and finetuning baselines).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.aggregators import Aggregator
from fedjax_pfl.core import (
    Algorithm,
    AlgorithmState,
    ClientResult,
    ModelView,
    make_local_config,
    run_local,
    tree_broadcast,
)
from fedjax_pfl.models import Model
from fedjax_pfl.toolkit import (
    check_cohort,
    finetune_views,
    global_solver,
    make_finetune_config,
    round_step,
    stateless_algorithm,
)


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
    """
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling,
                       local_epochs, drop_last=drop_last,
                       optimizer=local_optimizer)
    check_cohort(cohort_size, cohort)
    ft_cfg = make_finetune_config(cfg, finetune_steps, finetune_lr, finetune_lam)
    solver = global_solver(model, cfg, aggregator=aggregator, weighted=weighted,
                           server_optimizer=server_optimizer,
                           attack=attack, malicious=malicious)

    def eval_models(state, data, key):
        out = {"global": ModelView(model, state.server.params, False)}
        out.update(finetune_views(model, state.server.params, data, key, ft_cfg))
        return out

    return stateless_algorithm(solver, solver.client_update, eval_models,
                               cohort_size=cohort_size, cohort=cohort,
                               malicious=malicious)


def local_only(
    model: Model,
    *,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
) -> Algorithm:
    """Local training: each client trains its own model, nothing is shared.

    All clients start from the same initialization. Selected clients take
    ``num_local_steps`` steps per round, so the compute schedule matches FedAvg's
    (the Ditto paper's 'local' baseline). The evaluated model is ``personal``.
    """
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling)
    check_cohort(cohort_size, cohort)

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

    def eval_models(state, data, key):
        return {"personal": ModelView(model, state.clients, True)}

    return Algorithm(init, round_step(client_fn, server_fn, cohort_size=cohort_size,
                                      cohort=cohort), eval_models)
