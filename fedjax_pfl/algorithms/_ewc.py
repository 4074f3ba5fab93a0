"""EWC finetuning: FedAvg, then finetuning with a diagonal-Fisher penalty.

References: James Kirkpatrick et al., "Overcoming catastrophic forgetting in
neural networks", PNAS 2017 (elastic weight consolidation); as a personalization
baseline in Li et al., "Ditto", ICML 2021, §4 and Table 2 (code
``flearn/trainers_MTL/ewc.py``). Paper: Li et al., ICML 2021; decisions:
docs/baselines-personalization.md.

Also holds the finetuning helpers shared by the finetuning baselines (EWC, SKL,
Per-FedAvg, mapper).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.aggregators import Aggregator
from fedjax_pfl.core import (
    Algorithm,
    KeyTag,
    LocalConfig,
    ModelView,
    client_keys,
    make_local_config,
    run_local,
)
from fedjax_pfl.data import client_batch_indices, gather_batch
from fedjax_pfl.models import Model, batch_loss
from fedjax_pfl.toolkit import (
    check_cohort,
    global_solver,
    lift_clients,
    make_finetune_config,
    stateless_algorithm,
)
from fedjax_pfl.validation import check_int, check_nonnegative, check_positive


def finetune_local_config(cfg: LocalConfig, steps, epochs, lr) -> LocalConfig:
    """The finetuning :class:`LocalConfig`: ``steps`` SGD steps, or ``epochs``
    epochs (client k: ``ceil(epochs n_k / batch_size)`` steps), at ``lr``
    (default: the local lr)."""
    check_int("finetune_steps", steps, lo=1)
    ft = make_finetune_config(cfg, steps, lr, 0.0).local
    if epochs is not None:
        check_positive("finetune_epochs", epochs)
        ft = ft._replace(epochs=epochs, unroll=None)
    return ft


def finetune_clients(model: Model, start, data, key, cfg: LocalConfig,
                     penalty_for: Callable | None = None,
                     per_client_start: bool = False):
    """Every client finetunes from ``start`` (shared, or stacked with
    ``per_client_start``) on its training data with ``cfg``; ``penalty_for(cid,
    ckey, start_k)`` gives the client's penalty (``params -> scalar``).
    Client keys are ``fold_in(key, key_ids[c])``, as in :func:`finetune_all`,
    so with no penalty this IS ``finetune_all`` (same minibatches)."""
    ids = jnp.arange(data.num_clients, dtype=jnp.int32)
    keys = client_keys(key, data.key_ids)

    def one(cid, k, p0):
        pen = None if penalty_for is None else penalty_for(cid, k, p0)
        return run_local(model, p0, data, cid, k, cfg, penalty=pen)[0]

    lifted = lift_clients(one if per_client_start
                          else (lambda c, k: one(c, k, start)))
    return lifted(ids, keys, start) if per_client_start else lifted(ids, keys)


def penalized_finetuning(model: Model, solver, ft: LocalConfig,
                         penalty_for: Callable, *, cohort_size, cohort,
                         malicious) -> Algorithm:
    """FedAvg training (``solver``) whose evaluation finetunes the global model
    ``w`` on every client with ``ft`` and the penalty ``penalty_for(w, data)``
    (see :func:`finetune_clients`); views ``global`` and ``personal``. EWC's and
    the symmetrized-KL baseline's shared shape."""

    def eval_models(state, data, key):
        w = state.server.params
        personal = finetune_clients(model, w, data, key, ft, penalty_for(w, data))
        return {"global": ModelView(model, w, False),
                "personal": ModelView(model, personal, True)}

    return stateless_algorithm(solver, solver.client_update, eval_models,
                               cohort_size=cohort_size, cohort=cohort,
                               malicious=malicious)


def diag_fisher(model: Model, params, data, cid, key, *, num_batches: int,
                batch_size: int, sampling: str = "with_replacement"):
    """The Ditto code's diagonal empirical Fisher of one client at ``params``:
    the mean over ``num_batches`` minibatches of the squared minibatch-mean
    gradient (``grad`` of the training loss, regularizer included)."""
    rows, mask = client_batch_indices(data.train, cid, key, num_steps=num_batches,
                                      batch_size=batch_size, sampling=sampling)

    def sq_grad(r, m):
        b = gather_batch(data.train, r, m)
        g = jax.grad(lambda p: batch_loss(model, p, b.x, b.y, b.mask))(params)
        return jax.tree.map(jnp.square, g)

    sq = jax.lax.map(lambda rm: sq_grad(*rm), (rows, mask))
    return jax.tree.map(lambda a: jnp.mean(a, axis=0), sq)


def ewc_penalty(lam, fisher, anchor) -> Callable:
    """``p -> lam/2 sum_i F_i (p_i - anchor_i)^2`` (gradient ``lam F (p - a)``)."""

    def penalty(p):
        return 0.5 * lam * sum(jnp.sum(f * jnp.square(a - b)) for f, a, b in zip(
            jax.tree.leaves(fisher), jax.tree.leaves(p), jax.tree.leaves(anchor)))

    return penalty


def ewc(
    model: Model,
    *,
    lam: float | jax.Array = 1.0,
    fisher_batches: int = 4,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    local_epochs: float | None = None,
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
    """FedAvg, then every client finetunes ``w*`` with an EWC penalty.

    Training is exactly FedAvg's (see ``fedavg``). At evaluation every client k
    estimates the diagonal empirical Fisher ``F`` at ``w*`` (the current global
    model) from ``fisher_batches`` minibatches (the mean of squared
    minibatch-mean gradients, as in the Ditto code) and runs SGD from ``w*`` on
    ``F_k(w) + lam/2 sum_i F_ii (w_i - w*_i)^2``. Evaluated: ``global`` and
    ``personal`` (the finetuned models). ``lam = 0`` is plain finetuning
    (``fedavg(finetune_steps=...)``'s ``finetuned`` view, same minibatches).

    Args:
      model: the model.
      lam: EWC strength ``>= 0`` (may be traced).
      fisher_batches: minibatches (of ``batch_size``) in the Fisher estimate.
      client_lr, num_local_steps, local_epochs, batch_size, sampling: FedAvg's
        local training (finetuning uses the same batch size and sampling).
      cohort_size, cohort, aggregator, weighted, server_optimizer: FedAvg.
      attack, malicious: update attack and ``[num_clients]`` malicious mask.
      finetune_steps, finetune_epochs, finetune_lr: finetuning length (epochs,
        when given, override steps; the paper uses 50 epochs) and step size
        (default ``client_lr``).

    Raises:
      ValueError: for invalid arguments (the message names the argument).
    """
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling,
                       local_epochs)
    check_cohort(cohort_size, cohort)
    check_nonnegative("lam", lam)
    check_int("fisher_batches", fisher_batches, lo=1)
    ft = finetune_local_config(cfg, finetune_steps, finetune_epochs, finetune_lr)
    solver = global_solver(model, cfg, aggregator=aggregator, weighted=weighted,
                           server_optimizer=server_optimizer,
                           attack=attack, malicious=malicious)

    def penalty_for(w_star, data):
        def pen(cid, k, p0):
            fisher = diag_fisher(model, w_star, data, cid,
                                 jax.random.fold_in(k, KeyTag.EWC_FISHER),
                                 num_batches=fisher_batches, batch_size=batch_size,
                                 sampling=sampling)
            return ewc_penalty(lam, fisher, w_star)

        return pen

    return penalized_finetuning(model, solver, ft, penalty_for,
                                cohort_size=cohort_size, cohort=cohort,
                                malicious=malicious)
