"""SCAFFOLD: local SGD corrected by control variates.

Reference: Sai Praneeth Karimireddy, Satyen Kale, Mehryar Mohri, Sashank J. Reddi,
Sebastian U. Stich, Ananda Theertha Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020 (Algorithm 1, option II).
Decisions: docs/baselines-global.md.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.aggregators import Aggregator, mean, weighted_mean
from fedjax_pfl.core import (
    Algorithm,
    AlgorithmState,
    ClientResult,
    LocalConfig,
    ModelView,
    client_loss,
    federated_round,
    make_local_config,
    run_local,
    tree_broadcast,
)
from fedjax_pfl.models import Model
from fedjax_pfl.toolkit import (
    attack_delta,
    check_cohort,
    check_malicious,
    deferred,
    linear_penalty,
    malicious_mask,
    resolve_cohort_size,
)
from fedjax_pfl.validation import check_positive


class ScaffoldServerState(NamedTuple):
    """Attributes: ``params`` (x), ``control`` (the server control variate c),
    ``agg_state`` (the aggregator's state)."""

    params: object
    control: object
    agg_state: object


def client_update(model: Model, cfg: LocalConfig, needs_losses: bool, attack, mal,
                  server: ScaffoldServerState, c_k, cid, key, data, *,
                  cohort_size: int, train=None) -> ClientResult:
    """SCAFFOLD for ONE client (Algorithm 1, option II): ``K = cfg.num_steps``
    local steps from ``x = server.params`` with the gradient shift ``c - c_k``
    (stream ``key``), then ``c_k+ = c_k - c + (x - y) / (K eta)``. The client
    state is ``c_k+``; the upload is ``(dy, dc) = (y - x, c_k+ - c_k)`` with
    ``dy`` attacked if the client is flagged in ``mal``; the weight is ``n_k``.
    ``needs_losses``: also report the round-start loss of ``x``.

    The local steps are SGD (``run_local`` with the penalty ``<c - c_k, y>``),
    or ``train(x, penalty, cid, key, data) -> (y, loss, metrics)`` when given
    (``dp_scaffold``: DP-SGD with the penalty's gradient outside the clip)."""
    x, c = server.params, server.control
    correction = jax.tree.map(jnp.subtract, c, c_k)  # the gradient shift
    penalty = linear_penalty(correction)
    if train is None:
        y, loss = run_local(model, x, data, cid, key, cfg, penalty=penalty)
        extra = {}
    else:
        y, loss, extra = train(x, penalty, cid, key, data)
    dy = jax.tree.map(jnp.subtract, y, x)
    scale = 1.0 / (cfg.num_steps * cfg.lr)
    c_new = jax.tree.map(lambda ck, cc, d: (ck - cc) - scale * d, c_k, c, dy)
    dc = jax.tree.map(jnp.subtract, c_new, c_k)
    if attack is not None:
        dy = attack_delta(attack, mal, key, dy, cid, cohort_size)
    metrics = {"loss": loss, **extra}
    if needs_losses:
        metrics["round_start_loss"] = client_loss(model, x, data.train, cid)
    n = data.train.counts[cid].astype(jnp.float32)
    return ClientResult(c_new, (dy, dc), n, metrics)


def scaffold_algorithm(model: Model, cfg: LocalConfig, *, global_lr,
                       aggregator: Aggregator, cohort_size: int, cohort: str, attack,
                       malicious, train=None, privacy=None) -> Algorithm:
    """SCAFFOLD's algorithm (the kernel :func:`client_update`, SGD or
    ``train``): zero control variates at the start, the server step
    ``x <- x + eta_g agg(dy)``, ``c <- c + |S|/N mean(dc)``, the ``global``
    view, and ``privacy`` as ``Algorithm.privacy``."""
    mal = malicious_mask(attack, malicious)
    agg = aggregator
    kernel = functools.partial(client_update, model, cfg, agg.needs_losses, attack,
                               mal, train=train)

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        params = model.init(key)
        zeros = jax.tree.map(jnp.zeros_like, params)
        server = ScaffoldServerState(params, zeros, agg.init(params))
        return AlgorithmState(server, tree_broadcast(zeros, data.num_clients),
                              jnp.zeros((), jnp.int32))

    def build(num_clients):
        check_malicious(malicious, num_clients)
        m = resolve_cohort_size(cohort_size, cohort, num_clients)
        frac = m / num_clients

        def server_fn(server, updates, weights, mask, metrics, key):
            dy, dc = updates
            delta, agg_state = agg.aggregate(server.agg_state, dy, weights, mask, key,
                                             losses=metrics.get("round_start_loss"))
            params = jax.tree.map(lambda p, d: p + global_lr * d, server.params, delta)
            control = jax.tree.map(lambda cc, d: cc + frac * d, server.control,
                                   weighted_mean(dc, mask))
            return ScaffoldServerState(params, control, agg_state), {
                "server/update_norm": optax.tree.norm(delta),
                "server/control_norm": optax.tree.norm(control)}

        return federated_round(functools.partial(kernel, cohort_size=m), server_fn,
                               cohort_size=m, cohort=cohort)

    def eval_models(state, data, key):
        return {"global": ModelView(model, state.server.params, False)}

    return Algorithm(init, deferred(build), eval_models, privacy)


def scaffold(
    model: Model,
    *,
    client_lr: float | jax.Array = 0.1,
    global_lr: float | jax.Array = 1.0,
    num_local_steps: int = 10,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
    aggregator: Aggregator | None = None,
    weighted: bool = True,
    attack=None,
    malicious=None,
) -> Algorithm:
    """SCAFFOLD (Algorithm 1, option II).

    Client state: the control variate ``c_k`` (zeros at the start). Server
    state: ``x`` and the server control variate ``c`` (zeros). Each selected
    client k runs ``K = num_local_steps`` corrected SGD steps from ``y = x``:
    ``y <- y - eta (g_k(y) - c_k + c)`` (``eta = client_lr``), then
    ``c_k+ = c_k - c + (x - y) / (K eta)`` and uploads ``(dy, dc) =
    (y - x, c_k+ - c_k)``. The server sets ``x <- x + eta_g agg(dy)`` and
    ``c <- c + |S|/N mean(dc)`` (``eta_g = global_lr``, ``N`` clients).

    ``agg`` is ``aggregator`` (default: the size-weighted mean; the paper's
    is unweighted, ``weighted=False``); ``dc``
    is always averaged with equal weights, so ``c`` stays the mean of all
    ``c_k`` (an exact invariant under uniform sampling). Uploads are stacked
    (no in-loop averaging), so the round holds ``cohort x 2 x params`` floats.
    An ``attack`` replaces a malicious client's ``dy`` (its ``dc`` is honest).

    Args:
      model: the model.
      client_lr, global_lr: local and server step sizes (may be traced).
      num_local_steps, batch_size, sampling: local SGD (``K`` steps).
      cohort_size, cohort: clients per round and how they are drawn.
      aggregator, weighted: the rule applied to ``dy`` (default: weighted by
        training-set size; ``weighted=False``: the paper's plain mean).
      attack, malicious: update attack and ``[num_clients]`` malicious mask.

    Raises:
      ValueError: non-positive ``global_lr``, or an invalid ``fedavg`` argument.
    """
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling)
    check_positive("global_lr", global_lr)
    check_cohort(cohort_size, cohort)
    return scaffold_algorithm(model, cfg, global_lr=global_lr,
                              aggregator=aggregator or mean(weighted=weighted),
                              cohort_size=cohort_size, cohort=cohort, attack=attack,
                              malicious=malicious)
