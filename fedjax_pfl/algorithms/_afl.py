"""AFL: agnostic federated learning (minimax over client mixtures).

Reference: Mehryar Mohri, Gary Sivek, Ananda Theertha Suresh, "Agnostic
Federated Learning", ICML 2019 (§4, the stochastic mirror/gradient descent-ascent
algorithm with Euclidean projections). Decisions: docs/baselines-global.md.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

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
)
from fedjax_pfl.models import Model
from fedjax_pfl.toolkit import (
    attack_delta,
    check_cohort,
    check_malicious,
    deferred,
    malicious_mask,
    resolve_cohort_size,
)
from fedjax_pfl.validation import check_nonnegative


class AFLServerState(NamedTuple):
    """Attributes: ``params`` (w) and ``lam``, the ``[num_clients]`` mixture
    weights on the simplex (uniform at the start)."""

    params: object
    lam: jax.Array


def project_simplex(v: jax.Array) -> jax.Array:
    """Euclidean projection of a vector onto the probability simplex.

    ``argmin_{p >= 0, sum p = 1} ||p - v||`` is ``max(v - tau, 0)`` with the
    ``tau`` that makes it sum to 1, found exactly by sorting (Duchi, Shalev-Shwartz,
    Singer, Chandra, ICML 2008, Fig. 1)."""
    v = jnp.asarray(v)
    n = v.shape[-1]
    u = jnp.sort(v)[::-1]
    css = jnp.cumsum(u)
    k = jnp.arange(1, n + 1, dtype=v.dtype)
    rho = jnp.sum(u - (css - 1.0) / k > 0)  # the support size (>= 1)
    tau = (css[rho - 1] - 1.0) / rho.astype(v.dtype)
    return jnp.maximum(v - tau, 0.0)


def client_update(model: Model, cfg: LocalConfig, attack, mal,
                  server: AFLServerState, client_state, cid, key, data, *,
                  cohort_size: int) -> ClientResult:
    """AFL for ONE client: ``F_k(w)`` on all its training data and ``delta_k =
    w_k - w`` from ``cfg``'s local SGD (stream ``key``), attacked if flagged in
    ``mal``. Uploads ``(lam_k delta_k, F_k e_k)`` (``e_k`` the one-hot of ``cid``
    over ``data.num_clients``), weight 1; no client state (``client_state`` is
    ``()``, unused)."""
    w = server.params
    f_k = client_loss(model, w, data.train, cid)
    w_k, loss = run_local(model, w, data, cid, key, cfg)
    delta = jax.tree.map(jnp.subtract, w_k, w)
    if attack is not None:
        delta = attack_delta(attack, mal, key, delta, cid, cohort_size)
    lam_k = server.lam[cid]
    upload = (jax.tree.map(lambda d: lam_k * d, delta),
              f_k * jax.nn.one_hot(cid, data.num_clients, dtype=jnp.float32))
    return ClientResult((), upload, jnp.float32(1.0),
                        {"loss": loss, "round_start_loss": f_k})


def afl(
    model: Model,
    *,
    lambda_lr: float | jax.Array = 0.01,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
    attack=None,
    malicious=None,
) -> Algorithm:
    """Agnostic FL: ``min_w max_{lam in simplex} sum_k lam_k F_k(w)``.

    The server keeps ``w`` and the mixture ``lam`` over the ``N`` clients
    (uniform at the start). Each round every selected client k computes
    ``F_k(w)`` (its loss on all its training data) and ``delta_k = w_k - w``
    from ``num_local_steps`` SGD steps at ``client_lr``. With cohort ``S`` of
    size ``m``:

    * ``w <- w + (N/m) sum_S lam_k delta_k`` (descent on the lam-weighted loss);
    * ``lam <- Proj_simplex(lam + lambda_lr (N/m) sum_S F_k e_k)`` (ascent).

    With ``cohort='full', num_local_steps=1, sampling='full_batch'`` this is
    the paper's projected gradient descent-ascent with step ``client_lr`` for ``w`` and
    ``lambda_lr`` for ``lam``; AFL assumes every client (domain) answers every
    round. With partial participation the ``N/m`` factors make both steps
    unbiased estimates of the full ones. More local steps give a local-SGD
    approximation of the ``w`` step (not in the paper).

    ``lambda_lr = 0``: ``lam`` stays uniform and the round is FedAvg with the
    unweighted mean (under full participation). The server step weights by the
    learned ``lam``, so no ``aggregator`` applies. An ``attack`` replaces a
    malicious client's ``delta_k`` (its reported loss is honest).

    Args:
      model: the model.
      lambda_lr: step size of the ascent on ``lam``, ``>= 0`` (may be traced).
      client_lr, num_local_steps, batch_size, sampling: the clients' local SGD.
      cohort_size, cohort: clients per round and how they are drawn (the
        paper: ``cohort='full'``, see above).
      attack, malicious: update attack and ``[num_clients]`` malicious mask.

    Raises:
      ValueError: ``lambda_lr`` negative, or an invalid ``fedavg`` argument.
    """
    check_nonnegative("lambda_lr", lambda_lr)
    if jnp.ndim(lambda_lr) != 0:
        raise ValueError(f"lambda_lr: must be a scalar, got shape "
                         f"{jnp.shape(lambda_lr)}")
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling)
    check_cohort(cohort_size, cohort)
    mal = malicious_mask(attack, malicious)
    kernel = functools.partial(client_update, model, cfg, attack, mal)

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        n = data.num_clients
        server = AFLServerState(model.init(key), jnp.full((n,), 1.0 / n, jnp.float32))
        return AlgorithmState(server, (), jnp.zeros((), jnp.int32))

    def build(num_clients):
        check_malicious(malicious, num_clients)
        m = resolve_cohort_size(cohort_size, cohort, num_clients)

        def server_fn(server, updates, weights, mask, metrics, key):
            # Uploads arrive averaged over the cohort: N * mean = (N/m) * sum.
            step, losses = jax.tree.map(lambda a: num_clients * a[0], updates)
            params = jax.tree.map(jnp.add, server.params, step)
            lam = project_simplex(server.lam + lambda_lr * losses)
            return AFLServerState(params, lam), {
                "server/update_norm": optax.tree.norm(step),
                "server/lambda_max": jnp.max(lam)}

        return federated_round(functools.partial(kernel, cohort_size=m), server_fn,
                               cohort_size=m, cohort=cohort,
                               linear_weights=lambda weights, mask: mask)

    def eval_models(state, data, key):
        return {"global": ModelView(model, state.server.params, False)}

    return Algorithm(init, deferred(build), eval_models)
