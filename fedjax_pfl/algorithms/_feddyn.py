"""FedDyn: federated learning with dynamic regularization.

Reference: Durmus Alp Emre Acar, Yue Zhao, Ramon Matas Navarro, Matthew Mattina,
Paul N. Whatmough, Venkatesh Saligrama, "Federated Learning Based on Dynamic
Regularization", ICLR 2021 (Algorithm 1). Decisions: docs/baselines-global.md.
"""

from __future__ import annotations

import functools
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
    ModelView,
    federated_round,
    make_local_config,
    prox_penalty,
    run_local,
    tree_broadcast,
)
from fedjax_pfl.models import Model
from fedjax_pfl.toolkit import (
    check_cohort,
    check_malicious,
    client_upload,
    deferred,
    linear_penalty,
    malicious_mask,
    resolve_cohort_size,
)
from fedjax_pfl.validation import check_positive


class FedDynServerState(NamedTuple):
    """Attributes: ``params`` (the server model ``w``), ``h`` (the server's
    running correction), ``agg_state`` (the aggregator's state)."""

    params: object
    h: object
    agg_state: object


def client_update(model: Model, cfg: LocalConfig, alpha, aggregator: Aggregator,
                  attack, mal, server: FedDynServerState, grad_k, cid, key, data,
                  *, cohort_size: int, train=None) -> ClientResult:
    """FedDyn for ONE client (Algorithm 1): ``cfg.num_steps`` SGD steps from
    ``w^t = server.params`` (stream ``key``) on ``F_k(w) - <grad_k, w> +
    alpha/2 ||w - w^t||^2``, then ``grad_k <- grad_k - alpha (w_k - w^t)``
    (the client state). The upload is FedAvg's (:func:`fedjax_pfl.toolkit.
    client_upload`: ``w_k - w^t``, attacked if flagged in ``mal``, weight
    ``n_k``, the round-start loss if ``aggregator`` needs it).

    ``train(w, penalty, cid, key, data) -> (w_k, loss, metrics)``, when given,
    replaces the SGD steps (``dp_feddyn``: DP-SGD with the penalty's gradient
    outside the clip)."""
    w = server.params
    linear = linear_penalty(jax.tree.map(jnp.negative, grad_k))
    prox = prox_penalty(alpha, w)

    def penalty(p):
        return linear(p) + prox(p)

    if train is None:
        w_k, loss = run_local(model, w, data, cid, key, cfg, penalty=penalty)
        extra = {}
    else:
        w_k, loss, extra = train(w, penalty, cid, key, data)
    grad_new = jax.tree.map(lambda g, a, b: g - alpha * (a - b), grad_k, w_k, w)
    return client_upload(model, aggregator, attack, mal, w, w_k, cid, key, data,
                         cohort_size, {"loss": loss, **extra}
                         )._replace(client_state=grad_new)


def check_alpha(alpha) -> None:
    """FedDyn's ``alpha``: positive, finite, a scalar (``ValueError``)."""
    check_positive("alpha", alpha)
    if jnp.ndim(alpha) != 0:
        raise ValueError(f"alpha: must be a scalar, got shape {jnp.shape(alpha)}")


def feddyn_algorithm(model: Model, cfg: LocalConfig, *, alpha,
                     aggregator: Aggregator, cohort_size: int, cohort: str, attack,
                     malicious, train=None, privacy=None) -> Algorithm:
    """FedDyn's algorithm (the kernel :func:`client_update`, SGD or
    ``train``): zero ``grad_k`` and ``h`` at the start, the server step
    ``h <- h - alpha/N sum_S (w_k - w^t)``, ``w <- mean_S w_k - h / alpha``,
    the ``global`` view, and ``privacy`` as ``Algorithm.privacy``."""
    mal = malicious_mask(attack, malicious)
    agg = aggregator
    kernel = functools.partial(client_update, model, cfg, alpha, agg, attack, mal,
                               train=train)

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        params = model.init(key)
        zeros = jax.tree.map(jnp.zeros_like, params)
        server = FedDynServerState(params, zeros, agg.init(params))
        return AlgorithmState(server, tree_broadcast(zeros, data.num_clients),
                              jnp.zeros((), jnp.int32))

    def build(num_clients):
        check_malicious(malicious, num_clients)
        m = resolve_cohort_size(cohort_size, cohort, num_clients)

        def server_fn(server, updates, weights, mask, metrics, key):
            delta, agg_state = agg.aggregate(
                server.agg_state, updates, weights, mask, key,
                losses=metrics.get("round_start_loss"))
            h = jax.tree.map(lambda a, d: a - (alpha * m / num_clients) * d,
                             server.h, delta)
            params = jax.tree.map(lambda p, d, a: (p + d) - a / alpha,
                                  server.params, delta, h)
            return FedDynServerState(params, h, agg_state), {
                "server/update_norm": optax.tree.norm(delta)}

        return federated_round(functools.partial(kernel, cohort_size=m), server_fn,
                               cohort_size=m, cohort=cohort,
                               linear_weights=agg.linear_weights)

    def eval_models(state, data, key):
        return {"global": ModelView(model, state.server.params, False)}

    return Algorithm(init, deferred(build), eval_models, privacy)


def feddyn(
    model: Model,
    *,
    alpha: float | jax.Array = 0.01,
    client_lr: float | jax.Array = 0.1,
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
    """FedDyn (Algorithm 1).

    Client state: ``grad_k``, the linear term (zeros at the start). Each
    selected client k approximately minimizes, with ``num_local_steps`` SGD
    steps from ``w^t``,
    ``F_k(w) - <grad_k, w> + alpha/2 ||w - w^t||^2``,
    sets ``grad_k <- grad_k - alpha (w_k - w^t)`` and uploads ``w_k - w^t``.
    The server (``N`` clients, cohort ``S``):
    ``h <- h - alpha/N sum_S (w_k - w^t)``,
    ``w <- mean_S w_k - h / alpha``.

    ``mean_S w_k`` is ``w^t + agg(w_k - w^t)`` with ``aggregator`` (default: the
    size-weighted mean; the paper's is unweighted, ``weighted=False``), and
    ``sum_S`` is ``|S| agg(...)``, so a robust aggregator replaces both. The
    ``w`` evaluated as ``global`` is this server model (the paper's
    ``theta^t``). An ``attack`` replaces a malicious client's upload (its own
    ``grad_k`` update is honest).

    Args:
      model: the model.
      alpha: the dynamic regularization coefficient, ``> 0`` (may be traced).
      client_lr, num_local_steps, batch_size, sampling: local SGD.
      cohort_size, cohort: clients per round and how they are drawn.
      aggregator, weighted: the rule applied to the uploads (default: weighted
        by training-set size; the paper: ``weighted=False``).
      attack, malicious: update attack and ``[num_clients]`` malicious mask.

    Raises:
      ValueError: ``alpha`` not positive and finite, or an invalid ``fedavg``
        argument.
    """
    check_alpha(alpha)
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling)
    check_cohort(cohort_size, cohort)
    return feddyn_algorithm(model, cfg, alpha=alpha,
                            aggregator=aggregator or mean(weighted=weighted),
                            cohort_size=cohort_size, cohort=cohort, attack=attack,
                            malicious=malicious)
