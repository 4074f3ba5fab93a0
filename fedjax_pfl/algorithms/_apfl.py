"""APFL: adaptive personalized federated learning (a Ditto-paper baseline).

Reference: Yuyang Deng, Mohammad Mahdi Kamani, Mehrdad Mahdavi, "Adaptive
Personalized Federated Learning", arXiv:2003.13461, 2020 (Algorithm 1 and the
adaptive mixing weight, §3-4). As a baseline: Li et al., "Ditto", ICML 2021,
Table 2 (code ``flearn/trainers_MTL/apfl.py``). Paper: Li et al., ICML 2021;
decisions: docs/baselines-personalization.md.
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
    LocalConfig,
    ModelView,
    make_local_config,
    resolve_unroll,
    tree_broadcast,
)
from fedjax_pfl.data import client_batch_indices, gather_batch
from fedjax_pfl.models import Model, batch_loss
from fedjax_pfl.toolkit import (
    check_cohort,
    check_malicious,
    global_solver,
    round_step,
)
from fedjax_pfl.validation import check_choice, check_nonnegative, check_number


class APFLClientState(NamedTuple):
    """One client's APFL state: its local model ``v_k`` and mixing weight
    ``alpha_k`` (fixed, or adapted by gradient steps)."""

    local: object
    alpha: jax.Array


def mix(alpha, v, w):
    """``alpha v + (1 - alpha) w``."""
    return jax.tree.map(lambda a, b: alpha * a + (1.0 - alpha) * b, v, w)


def client_update(model: Model, cfg: LocalConfig, adaptive_alpha: bool, alpha_lr,
                  upload, server, state: APFLClientState, cid, key, data, *,
                  cohort_size) -> ClientResult:
    """APFL for ONE client (Deng et al., Algorithm 1): ``cfg.num_steps`` steps
    from ``w_k = server.params`` and the client's ``(v_k, alpha_k)``, each on one
    minibatch of the stream ``key`` (see :func:`apfl`); then FedAvg's
    ``upload`` (``GlobalSolver.upload``: ``w_k - w^t``, attacked if malicious,
    weight ``n_k``). The new ``(v_k, alpha_k)`` is the client's state."""
    w = server.params
    rows, mask = client_batch_indices(data.train, cid, key, num_steps=cfg.num_steps,
                                      batch_size=cfg.batch_size, sampling=cfg.sampling)

    def step(carry, inputs):
        w_k, v, a = carry
        b = gather_batch(data.train, *inputs)
        loss_fn = lambda p: batch_loss(model, p, b.x, b.y, b.mask)
        loss, gw = jax.value_and_grad(loss_fn)(w_k)
        vbar = mix(a, v, w_k)
        ploss, gbar = jax.value_and_grad(loss_fn)(vbar)
        new_w = jax.tree.map(lambda p, g: p - cfg.lr * g, w_k, gw)
        new_v = jax.tree.map(lambda p, g: p - cfg.lr * a * g, v, gbar)
        if adaptive_alpha:
            dot = optax.tree.vdot(optax.tree.sub(v, w_k), gbar)
            a = jnp.clip(a - alpha_lr * dot, 0.0, 1.0)
        return (new_w, new_v, a), (loss, ploss)

    (w_k, v, a), (losses, plosses) = jax.lax.scan(
        step, (w, state.local, state.alpha), (rows, mask),
        unroll=resolve_unroll(cfg.unroll, cfg.num_steps))
    new_state = APFLClientState(v, a)
    res = upload(w, w_k, cid, key, data, cohort_size, {
        "loss": jnp.mean(losses), "personal_loss": jnp.mean(plosses),
        "alpha": new_state.alpha})
    return res._replace(client_state=new_state)


def apfl(
    model: Model,
    *,
    alpha: float | jax.Array = 0.01,
    adaptive_alpha: bool = True,
    alpha_lr: float | jax.Array | None = None,
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
) -> Algorithm:
    """APFL (Deng et al. 2020, Algorithm 1) with FedAvg as the global solver.

    Every selected client k runs ``num_local_steps`` steps; at each, on ONE
    minibatch ``b`` and with ``vbar = alpha_k v_k + (1 - alpha_k) w_k`` formed
    from the step's starting ``v_k`` and ``w_k``:

    * ``w_k <- w_k - lr grad f(w_k; b)`` (FedAvg's local step; ``w_k`` starts
      at ``w^t`` every round and ``w_k - w^t`` is uploaded);
    * ``v_k <- v_k - lr alpha_k grad f(vbar; b)`` (the gradient of
      ``f(vbar)`` with respect to ``v_k``);
    * adaptive only: ``alpha_k <- clip(alpha_k - alpha_lr <v_k - w_k,
      grad f(vbar; b)>, 0, 1)`` (Deng et al. §4).

    ``v_k`` and ``alpha_k`` persist on the device (``v_k`` starts at ``w^0``).
    Evaluated: ``global`` (``w``) and ``personal`` (``alpha_k v_k + (1 -
    alpha_k) w``, as the Ditto code evaluates it).

    Args:
      model: the model.
      alpha: the initial (or, with ``adaptive_alpha=False``, fixed) mixing
        weight in [0, 1]; 0.01 adaptive as in LINDT's setup, 0.5 fixed as in
        the Ditto code's default (``--alpha``). May be traced.
      adaptive_alpha: adapt ``alpha_k`` per client (the paper) or keep it fixed
        (the Ditto code).
      alpha_lr: step size of the ``alpha`` update (default ``client_lr``).
      client_lr, num_local_steps, batch_size, sampling: local SGD.
      cohort_size, cohort, aggregator, weighted, server_optimizer: the FedAvg
        global solver (the Ditto code draws clients by size and takes the
        unweighted mean: ``cohort='size_weighted', weighted=False``).
      attack, malicious: update attack on the global upload and the
        ``[num_clients]`` malicious mask.

    Raises:
      ValueError: for invalid arguments (the message names the argument).
    """
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling)
    check_cohort(cohort_size, cohort)
    check_number("alpha", alpha, lo=0.0, hi=1.0)
    check_choice("adaptive_alpha", adaptive_alpha, (True, False))
    if jnp.ndim(alpha) != 0:
        raise ValueError(f"alpha: must be a scalar, got shape {jnp.shape(alpha)}")
    alpha_lr = client_lr if alpha_lr is None else alpha_lr
    check_nonnegative("alpha_lr", alpha_lr)
    solver = global_solver(model, cfg, aggregator=aggregator, weighted=weighted,
                           server_optimizer=server_optimizer,
                           attack=attack, malicious=malicious)

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        server = solver.init(key)
        n = data.num_clients
        clients = APFLClientState(tree_broadcast(server.params, n),
                                  jnp.full((n,), alpha, jnp.float32))
        return AlgorithmState(server, clients, jnp.zeros((), jnp.int32))

    step = round_step(
        functools.partial(client_update, model, cfg, adaptive_alpha, alpha_lr,
                          solver.upload),
        solver.server_fn, cohort_size=cohort_size, cohort=cohort, malicious=malicious,
        linear_weights=solver.aggregator.linear_weights, pass_cohort_size=True)

    def eval_models(state, data, key):
        w = state.server.params
        personal = jax.vmap(lambda v, a: mix(a, v, w))(state.clients.local,
                                                       state.clients.alpha)
        return {"global": ModelView(model, w, False),
                "personal": ModelView(model, personal, True)}

    return Algorithm(init, step, eval_models)
