"""pFedMe: personalized FL with Moreau envelopes.

Reference: Canh T. Dinh, Nguyen H. Tran, Tuan Dung Nguyen, "Personalized Federated
Learning with Moreau Envelopes", NeurIPS 2020 (Algorithm 1; the authors' code
github.com/CharlieDinh/pFedMe for the details the paper leaves open).
Decisions: docs/baselines-global.md.
"""

from __future__ import annotations

import functools

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
    resolve_unroll,
    tree_broadcast,
)
from fedjax_pfl.data import client_batch_indices, gather_batch
from fedjax_pfl.models import Model, batch_loss
from fedjax_pfl.toolkit import (
    ServerState,
    check_cohort,
    check_malicious,
    client_upload,
    deferred,
    malicious_mask,
    resolve_cohort_size,
)
from fedjax_pfl.validation import check_int, check_positive


def prox_solve(model: Model, anchor, start, x, y, mask, *, lam, lr, steps: int,
               unroll: int | bool = 1):
    """``steps`` gradient steps at ``lr`` from ``start`` on
    ``f(theta; batch) + lam/2 ||theta - anchor||^2``: pFedMe's approximate
    inner solution ``theta(anchor)`` (the prox of ``f`` at ``anchor``)."""
    pen = prox_penalty(lam, anchor)

    def step(theta, _):
        g = jax.grad(lambda p: batch_loss(model, p, x, y, mask) + pen(p))(theta)
        return jax.tree.map(lambda t, gt: t - lr * gt, theta, g), None

    theta, _ = jax.lax.scan(step, start, None, length=steps, unroll=unroll)
    return theta


def local_update(model: Model, cfg: LocalConfig, lam, inner_lr, inner_steps: int,
                 w, cid, key, data):
    """pFedMe's ``R = cfg.num_steps`` local rounds for ONE client from ``w``
    (minibatches from stream ``key``): each draws a minibatch, solves for
    ``theta_k`` (:func:`prox_solve`, warm-started at the previous one) and
    moves ``w_k <- w_k - eta lam (w_k - theta_k)``. Returns ``(w_k, theta_k,
    mean personal loss)``."""
    rows, mask = client_batch_indices(
        data.train, cid, key, num_steps=cfg.num_steps, batch_size=cfg.batch_size,
        sampling=cfg.sampling)

    def local_round(carry, inputs):
        w_k, theta = carry
        b = gather_batch(data.train, *inputs)
        theta = prox_solve(model, w_k, theta, b.x, b.y, b.mask, lam=lam,
                           lr=inner_lr, steps=inner_steps)
        w_k = jax.tree.map(lambda a, t: a - cfg.lr * lam * (a - t), w_k, theta)
        return (w_k, theta), batch_loss(model, theta, b.x, b.y, b.mask)

    (w_k, theta), losses = jax.lax.scan(local_round, (w, w), (rows, mask),
                                        unroll=resolve_unroll(cfg.unroll,
                                                              cfg.num_steps))
    return w_k, theta, jnp.mean(losses)


def client_update(model: Model, cfg: LocalConfig, lam, inner_lr, inner_steps: int,
                  aggregator: Aggregator, attack, mal, server: ServerState,
                  theta_old, cid, key, data, *, cohort_size: int) -> ClientResult:
    """pFedMe for ONE client (Algorithm 1): :func:`local_update` from ``w^t =
    server.params``; the new ``theta_k`` replaces the client's state
    ``theta_old``; the upload is FedAvg's (:func:`fedjax_pfl.toolkit.
    client_upload`: ``w_k - w^t``, attacked if flagged in ``mal``, weight
    ``n_k``, the round-start loss if ``aggregator`` needs it)."""
    w = server.params
    w_k, theta, loss = local_update(model, cfg, lam, inner_lr, inner_steps, w, cid,
                                    key, data)
    r = client_upload(model, aggregator, attack, mal, w, w_k, cid, key, data,
                      cohort_size, {"personal_loss": loss})
    return r._replace(client_state=theta)


def pfedme(
    model: Model,
    *,
    lam: float | jax.Array = 15.0,
    inner_steps: int = 5,
    inner_lr: float | jax.Array = 0.01,
    beta: float | jax.Array = 1.0,
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
    """pFedMe (Algorithm 1).

    Each selected client k starts from ``w_k = theta_k = w^t`` and, for each of
    ``R = num_local_steps`` local rounds, draws a minibatch ``D``, runs
    ``inner_steps`` gradient steps at ``inner_lr`` on
    ``f_k(theta; D) + lam/2 ||theta - w_k||^2`` (warm-started at the previous
    ``theta_k``), then ``w_k <- w_k - eta lam (w_k - theta_k)``
    (``eta = client_lr``). It uploads ``w_k - w^t`` and keeps ``theta_k`` as its
    personal model. The server sets ``w <- w + beta agg(w_k - w^t)``, i.e.
    ``(1 - beta) w + beta mean_S w_k`` for a mean (size-weighted by default).

    Evaluated models: ``global`` (``w``) and ``personal`` (``theta_k``; a client
    never selected keeps ``theta_k = w^0``; the authors' code trains every
    client each round and aggregates only the selected ones, which costs
    ``N / cohort_size`` times more and is not done here). An ``attack`` replaces
    a malicious client's upload.

    Args:
      model: the model.
      lam: regularization ``lambda > 0`` (may be traced).
      inner_steps, inner_lr: the inner solver (``K`` and the personal lr).
      beta: server mixing ``beta > 0`` (``1``: plain average; the paper also
        uses ``beta > 1``); may be traced.
      client_lr, num_local_steps, batch_size, sampling: ``eta``, ``R``, ``|D|``.
      cohort_size, cohort: clients per round and how they are drawn.
      aggregator, weighted: the rule applied to the uploads (default: weighted
        by size, as the authors' code; the paper's mean is unweighted,
        ``weighted=False``).
      attack, malicious: update attack and ``[num_clients]`` malicious mask.

    Raises:
      ValueError: ``lam``, ``inner_lr`` or ``beta`` not positive,
        ``inner_steps`` not a positive integer, or an invalid ``fedavg``
        argument.
    """
    for name, v in (("lam", lam), ("inner_lr", inner_lr), ("beta", beta)):
        check_positive(name, v)
        if jnp.ndim(v) != 0:
            raise ValueError(f"{name}: must be a scalar, got shape {jnp.shape(v)}")
    check_int("inner_steps", inner_steps, lo=1)
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling)
    check_cohort(cohort_size, cohort)
    mal = malicious_mask(attack, malicious)
    agg = aggregator or mean(weighted=weighted)
    kernel = functools.partial(client_update, model, cfg, lam, inner_lr, inner_steps,
                               agg, attack, mal)

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        params = model.init(key)
        server = ServerState(params, (), agg.init(params))
        return AlgorithmState(server, tree_broadcast(params, data.num_clients),
                              jnp.zeros((), jnp.int32))

    def build(num_clients):
        check_malicious(malicious, num_clients)
        m = resolve_cohort_size(cohort_size, cohort, num_clients)

        def server_fn(server, updates, weights, mask, metrics, key):
            delta, agg_state = agg.aggregate(
                server.agg_state, updates, weights, mask, key,
                losses=metrics.get("round_start_loss"))
            params = jax.tree.map(lambda p, d: p + beta * d, server.params, delta)
            return ServerState(params, (), agg_state), {
                "server/update_norm": optax.tree.norm(delta)}

        return federated_round(functools.partial(kernel, cohort_size=m), server_fn,
                               cohort_size=m, cohort=cohort,
                               linear_weights=agg.linear_weights)

    def eval_models(state, data, key):
        return {"global": ModelView(model, state.server.params, False),
                "personal": ModelView(model, state.clients, True)}

    return Algorithm(init, deferred(build), eval_models)
