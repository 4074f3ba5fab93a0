"""FedProx: FedAvg with a proximal term in the local objective.

Reference: Tian Li, Anit Kumar Sahu, Manzil Zaheer, Maziar Sanjabi, Ameet
Talwalkar, Virginia Smith, "Federated Optimization in Heterogeneous Networks",
MLSys 2020 (Algorithm 2). Decisions: docs/baselines-global.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.aggregators import Aggregator
from fedjax_pfl.core import (
    Algorithm,
    ModelView,
    make_local_config,
    prox_penalty,
)
from fedjax_pfl.models import Model
from fedjax_pfl.toolkit import (
    check_cohort,
    finetune_views,
    global_solver,
    make_finetune_config,
    stateless_algorithm,
)
from fedjax_pfl.validation import check_nonnegative


def check_mu(mu) -> None:
    """FedProx's ``mu``: non-negative, finite, a scalar (``ValueError``)."""
    check_nonnegative("mu", mu)
    if jnp.ndim(mu) != 0:
        raise ValueError(f"mu: must be a scalar, got shape {jnp.shape(mu)}")


def fedprox_penalty(mu):
    """``w^t -> (params -> mu/2 ||params - w^t||^2)``: FedProx's proximal term,
    anchored at the round-start model (``global_solver``'s ``local_penalty``;
    ``dp_fedprox`` adds its gradient outside the clip)."""
    return lambda w: prox_penalty(mu, w)


def fedprox(
    model: Model,
    *,
    mu: float | jax.Array = 0.01,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    local_epochs: float | None = None,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
    server_optimizer: optax.GradientTransformation | None = None,
    aggregator: Aggregator | None = None,
    weighted: bool = True,
    attack=None,
    malicious=None,
    finetune_steps: int | tuple[int, ...] = 0,
    finetune_lr: float | jax.Array | None = None,
    finetune_lam: float | jax.Array = 0.0,
) -> Algorithm:
    """FedProx: every selected client k approximately minimizes
    ``h_k(w) = F_k(w) + mu/2 ||w - w^t||^2`` with ``num_local_steps`` SGD steps
    from the round-start global model ``w^t`` and uploads ``w_k - w^t``; the
    server step is FedAvg's (see :func:`fedjax_pfl.algorithms.fedavg`).

    ``mu = 0`` is FedAvg exactly (the same program but for a zero penalty
    gradient). The paper's inexactness (a variable number of local epochs per
    device, "stragglers") is not modelled: every client takes the same number
    of steps (or ``local_epochs`` epochs of its own data).

    Args:
      model: the model.
      mu: proximal coefficient ``mu >= 0``; may be a traced array (``sweep``).
      client_lr, num_local_steps, local_epochs, batch_size, sampling: local SGD.
      cohort_size, cohort: clients per round and how they are drawn.
      server_optimizer, aggregator, weighted: the server step (default: the
        size-weighted mean of the uploads, ``w <- w + mean``).
      attack, malicious: an update attack and the ``[num_clients]`` mask of
        malicious clients, applied to the uploads.
      finetune_steps, finetune_lr, finetune_lam: finetuning evaluation views.

    Raises:
      ValueError: ``mu`` negative or not finite, or any ``fedavg`` argument
        invalid.
    """
    check_mu(mu)
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling,
                       local_epochs)
    check_cohort(cohort_size, cohort)
    ft_cfg = make_finetune_config(cfg, finetune_steps, finetune_lr, finetune_lam)
    solver = global_solver(model, cfg, aggregator=aggregator, weighted=weighted,
                           server_optimizer=server_optimizer,
                           attack=attack, malicious=malicious,
                           local_penalty=fedprox_penalty(mu))

    def eval_models(state, data, key):
        out = {"global": ModelView(model, state.server.params, False)}
        out.update(finetune_views(model, state.server.params, data, key, ft_cfg))
        return out

    return stateless_algorithm(solver, solver.client_update, eval_models,
                               cohort_size=cohort_size, cohort=cohort,
                               malicious=malicious)
