"""Per-FedAvg: personalized FedAvg through model-agnostic meta-learning.

Reference: Alireza Fallah, Aryan Mokhtari, Asuman Ozdaglar, "Personalized
Federated Learning with Theoretical Guarantees: A Model-Agnostic Meta-Learning
Approach", NeurIPS 2020 (Algorithm 1; the Hessian-free variant, eq. (10)); as a
baseline in Li et al., "Ditto", ICML 2021, Table 2 (code
``flearn/trainers_MTL/meta.py``). Paper: Li et al., ICML 2021; decisions:
docs/baselines-personalization.md.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.aggregators import Aggregator
from fedjax_pfl.core import (
    Algorithm,
    AlgorithmState,
    ClientResult,
    LocalConfig,
    ModelView,
    make_local_config,
    resolve_unroll,
)
from fedjax_pfl.data import client_batch_indices, gather_batch
from fedjax_pfl.models import Model, batch_loss
from fedjax_pfl.toolkit import (
    check_cohort,
    check_malicious,
    global_solver,
    round_step,
)
from fedjax_pfl.validation import check_choice, check_nonnegative, check_positive

from ._ewc import finetune_clients, finetune_local_config

HESSIANS = ("hf", "exact", "fo")


def hvp(grad_fn, w, v, *, hessian: str, delta):
    """``H(w) v`` for ``grad_fn = grad f``: central difference ``(grad f(w + d v)
    - grad f(w - d v)) / (2 d)`` (``hf``), reverse-over-reverse ``grad <grad f,
    v>`` (``exact``; not ``jax.jvp``, which the CPU convolutions' ``custom_vjp``
    does not support, :mod:`fedjax_pfl.models._conv`), or zero (``fo``,
    first-order MAML)."""
    if hessian == "fo":
        return jax.tree.map(jnp.zeros_like, v)
    if hessian == "exact":
        v = jax.lax.stop_gradient(v)
        return jax.grad(lambda p: optax.tree.vdot(grad_fn(p), v))(w)
    plus = grad_fn(jax.tree.map(lambda a, b: a + delta * b, w, v))
    minus = grad_fn(jax.tree.map(lambda a, b: a - delta * b, w, v))
    return jax.tree.map(lambda p, m: (p - m) / (2.0 * delta), plus, minus)


def per_fedavg_step(model, w, batches, *, alpha, beta, delta, hessian):
    """One Per-FedAvg local step on three minibatches ``(D, D', D'')``:
    ``w - beta (I - alpha H(w; D'')) grad f(w - alpha grad f(w; D); D')``.
    Returns ``(new w, loss on D at w)``."""
    (d, d1, d2) = batches

    def grad_on(b):
        return jax.value_and_grad(lambda p: batch_loss(model, p, b.x, b.y, b.mask))

    loss, g0 = grad_on(d)(w)
    w_tmp = jax.tree.map(lambda p, g: p - alpha * g, w, g0)
    _, g = grad_on(d1)(w_tmp)
    hv = hvp(lambda p: grad_on(d2)(p)[1], w, g, hessian=hessian, delta=delta)
    new = jax.tree.map(lambda p, a, h: p - beta * (a - alpha * h), w, g, hv)
    return new, loss


def client_update(model: Model, cfg: LocalConfig, alpha, delta, hessian: str, upload,
                  server, client_state, cid, key, data, *,
                  cohort_size) -> ClientResult:
    """Per-FedAvg for ONE client: ``cfg.num_steps`` :func:`per_fedavg_step` steps
    (``beta = cfg.lr``) from ``w^t = server.params``, the three minibatch
    streams ``D, D', D''`` drawn from ``fold_in(key, 0 | 1 | 2)``; then FedAvg's
    ``upload`` (``GlobalSolver.upload``: ``w_k - w^t``, attacked if malicious,
    weight ``n_k``). Clients keep no state (``client_state`` is ``()``)."""
    w = server.params
    streams = [client_batch_indices(
        data.train, cid, jax.random.fold_in(key, i), num_steps=cfg.num_steps,
        batch_size=cfg.batch_size, sampling=cfg.sampling) for i in range(3)]
    rows = jnp.stack([r for r, _ in streams], 1)  # [steps, 3, B]
    masks = jnp.stack([m for _, m in streams], 1)

    def step(p, inputs):
        r, m = inputs
        batches = [gather_batch(data.train, r[i], m[i]) for i in range(3)]
        return per_fedavg_step(model, p, batches, alpha=alpha, beta=cfg.lr,
                               delta=delta, hessian=hessian)

    w_k, losses = jax.lax.scan(step, w, (rows, masks),
                               unroll=resolve_unroll(cfg.unroll, cfg.num_steps))
    return upload(w, w_k, cid, key, data, cohort_size, {"loss": jnp.mean(losses)})


def per_fedavg(
    model: Model,
    *,
    alpha: float | jax.Array = 0.1,
    beta: float | jax.Array = 0.01,
    delta: float | jax.Array = 1e-3,
    hessian: str = "hf",
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
    """Per-FedAvg (HF): FedAvg whose local steps are MAML steps.

    Objective ``min_w 1/K sum_k F_k(w - alpha grad F_k(w))``. Each selected client
    runs ``num_local_steps`` steps :func:`per_fedavg_step` from ``w^t`` on three
    independent minibatch streams (``D``, ``D'``, ``D''``) and uploads ``w_k -
    w^t``; the server aggregates as FedAvg. Evaluated: ``global`` (``w``),
    ``personal``: every client finetunes ``w`` with plain SGD
    (``finetune_steps`` steps or ``finetune_epochs`` epochs at ``finetune_lr``,
    default ``alpha``), as the Ditto code evaluates Per-FedAvg, and
    ``one_step``: the paper's adaptation, one full-batch gradient step of size
    ``alpha`` from ``w``.

    Args:
      model: the model.
      alpha: inner (adaptation) step size (the Ditto code: the learning rate).
      beta: outer step size (the Ditto code: 0.01).
      delta: central-difference step of the HF Hessian-vector product.
      hessian: ``hf`` (central difference, the paper's HF variant), ``exact``
        (reverse-over-reverse Hessian-vector product) or ``fo`` (first order:
        no Hessian term).
      num_local_steps, batch_size, sampling: local steps and minibatches.
      cohort_size, cohort, aggregator, weighted, server_optimizer: FedAvg.
      attack, malicious: update attack and ``[num_clients]`` malicious mask.
      finetune_steps, finetune_epochs, finetune_lr: the finetuned evaluation.

    Raises:
      ValueError: for invalid arguments (the message names the argument).
    """
    check_nonnegative("alpha", alpha)
    check_positive("beta", beta)
    check_positive("delta", delta)
    cfg = make_local_config(beta, num_local_steps, batch_size, sampling)
    check_cohort(cohort_size, cohort)
    check_choice("hessian", hessian, HESSIANS)
    ft = finetune_local_config(cfg._replace(lr=alpha), finetune_steps,
                               finetune_epochs, finetune_lr)
    solver = global_solver(model, cfg, aggregator=aggregator, weighted=weighted,
                           server_optimizer=server_optimizer,
                           attack=attack, malicious=malicious)

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        return AlgorithmState(solver.init(key), (), jnp.zeros((), jnp.int32))

    step = round_step(
        functools.partial(client_update, model, cfg, alpha, delta, hessian,
                          solver.upload),
        solver.server_fn, cohort_size=cohort_size, cohort=cohort, malicious=malicious,
        linear_weights=solver.aggregator.linear_weights, pass_cohort_size=True)

    def eval_models(state, data, key):
        w = state.server.params
        one = finetune_clients(model, w, data, key, ft._replace(
            lr=alpha, num_steps=1, epochs=None, sampling="full_batch", unroll=1))
        return {"global": ModelView(model, w, False),
                "personal": ModelView(model, finetune_clients(
                    model, w, data, key, ft), True),
                "one_step": ModelView(model, one, True)}

    return Algorithm(init, step, eval_models)
