"""q-FFL: fair resource allocation (q-FedAvg and q-FedSGD).

Reference: Tian Li, Maziar Sanjabi, Ahmad Beirami, Virginia Smith, "Fair Resource
Allocation in Federated Learning", ICLR 2020 (Algorithms 1-2, q-FedSGD and
q-FedAvg). Decisions: docs/baselines-global.md.
"""

from __future__ import annotations

import functools

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
from fedjax_pfl.validation import check_choice, check_nonnegative, check_positive

VARIANTS = ("qfedavg", "qfedsgd")


def client_update(model: Model, cfg: LocalConfig, variant: str, q, lipschitz_L,
                  attack, mal, w, client_state, cid, key, data, *,
                  cohort_size: int) -> ClientResult:
    """q-FFL for ONE client (q-FedAvg: Algorithm 2; q-FedSGD: Algorithm 1):
    ``F_k = F_k(w^t)`` on all its training data and the model update ``u``
    (``qfedavg``: ``w_k - w^t`` from ``cfg``'s local SGD, stream ``key``;
    ``qfedsgd``: ``-grad F_k(w^t) / L``), attacked if flagged in ``mal``;
    ``Delta_k = -L u``. Uploads ``(F_k^q Delta_k, h_k)`` with
    ``h_k = q F_k^{q-1} ||Delta_k||^2 + L F_k^q``, weight 1; no client state
    (``client_state`` is ``()``, unused)."""
    if variant == "qfedavg":
        f_k = client_loss(model, w, data.train, cid)
        w_k, loss = run_local(model, w, data, cid, key, cfg)
        update = jax.tree.map(jnp.subtract, w_k, w)
    else:
        f_k, grad = jax.value_and_grad(
            lambda p: client_loss(model, p, data.train, cid,
                                  differentiable=True))(w)
        loss = f_k
        update = jax.tree.map(lambda g: -g / lipschitz_L, grad)
    return upload(f_k, update, q, lipschitz_L, attack, mal, key, cid, cohort_size,
                  {"loss": loss, "round_start_loss": f_k})


def upload(f_k, update, q, lipschitz_L, attack, mal, key, cid, cohort_size,
           metrics) -> ClientResult:
    """q-FFL's upload from the loss ``f_k`` and the model update ``u``
    (attacked if the client is flagged in ``mal``): ``Delta_k = -L u``,
    ``(F_k^q Delta_k, h_k)`` with ``h_k = q F_k^{q-1} ||Delta_k||^2 + L F_k^q``,
    weight 1, no client state."""
    if attack is not None:
        update = attack_delta(attack, mal, key, update, cid, cohort_size)
    direction = jax.tree.map(lambda u: -lipschitz_L * u, update)  # Delta_k
    fq = jnp.power(f_k, q)
    sq = sum(jnp.sum(jnp.square(d)) for d in jax.tree.leaves(direction))
    # q F^{q-1} written as 0 when q = 0 (no 0 * inf at F = 0).
    slope = jnp.where(q == 0, 0.0, q * jnp.power(f_k, q - 1.0))
    h_k = slope * sq + lipschitz_L * fq
    scaled = jax.tree.map(lambda d: fq * d, direction)
    return ClientResult((), (scaled, h_k), jnp.float32(1.0), metrics)


def server_fn(w, updates, weights, mask, metrics, key):
    """q-FFL's server step ``w <- w - sum_k F_k^q Delta_k / sum_k h_k`` (the
    uploads arrive averaged over the cohort: mean/mean = sum/sum)."""
    scaled, h = jax.tree.map(lambda a: a[0], updates)
    step = jax.tree.map(lambda s: s / h, scaled)
    new = jax.tree.map(jnp.subtract, w, step)
    return new, {"server/update_norm": optax.tree.norm(step), "server/h": h}


def check_q(q) -> None:
    """q-FFL's ``q``: non-negative, finite, a scalar (``ValueError``)."""
    check_nonnegative("q", q)
    if jnp.ndim(q) != 0:
        raise ValueError(f"q: must be a scalar, got shape {jnp.shape(q)}")


def qffl_algorithm(model: Model, kernel, *, cohort_size: int, cohort: str,
                   malicious, privacy=None) -> Algorithm:
    """q-FFL's algorithm around a one-client ``kernel(w, client_state, cid,
    key, data, *, cohort_size) -> ClientResult`` whose upload is
    :func:`upload`'s: the model as the server state, :func:`server_fn`, the
    ``global`` view, and ``privacy`` as ``Algorithm.privacy``."""

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        return AlgorithmState(model.init(key), (), jnp.zeros((), jnp.int32))

    def build(num_clients):
        check_malicious(malicious, num_clients)
        m = resolve_cohort_size(cohort_size, cohort, num_clients)
        return federated_round(functools.partial(kernel, cohort_size=m), server_fn,
                               cohort_size=m, cohort=cohort,
                               linear_weights=lambda weights, mask: mask)

    def eval_models(state, data, key):
        return {"global": ModelView(model, state.server, False)}

    return Algorithm(init, deferred(build), eval_models, privacy)


def qffl(
    model: Model,
    *,
    q: float | jax.Array = 1.0,
    lipschitz_L: float | jax.Array = 10.0,
    variant: str = "qfedavg",
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
    attack=None,
    malicious=None,
) -> Algorithm:
    """q-FedAvg / q-FedSGD: minimizes ``sum_k p_k F_k^{q+1} / (q+1)``.

    Each selected client k computes ``F_k = F_k(w^t)`` (its loss on all its
    training data) and a direction ``Delta_k``:

    * ``qfedavg``: ``Delta_k = L (w^t - w_k)``, ``w_k`` from ``num_local_steps``
      SGD steps at ``client_lr`` from ``w^t`` (Algorithm 2);
    * ``qfedsgd``: ``Delta_k = grad F_k(w^t)`` on all its training data
      (Algorithm 1; the local-SGD arguments are then unused);

    and uploads ``F_k^q Delta_k`` and ``h_k = q F_k^{q-1} ||Delta_k||^2 +
    L F_k^q``. The server sets ``w <- w^t - sum_k F_k^q Delta_k / sum_k h_k``.

    ``q = 0``: ``h_k = L``, so q-FedAvg is ``w <- mean_k w_k`` (FedAvg with the
    unweighted mean) and q-FedSGD is gradient descent at step ``1/L`` on the
    unweighted mean loss. The server step is a ratio of sums, not an aggregate
    of updates, so no ``aggregator`` applies. An ``attack`` replaces a malicious
    client's model update ``w_k - w^t`` (q-FedSGD: ``-grad F_k / L``) before
    ``Delta_k`` and ``h_k`` are formed; its reported loss ``F_k`` is honest.

    Args:
      model: the model.
      q: fairness parameter ``q >= 0`` (``0``: FedAvg); may be traced.
      lipschitz_L: the Lipschitz constant estimate ``L > 0`` (the paper's step
        ``1/L``); may be traced.
      variant: ``qfedavg`` or ``qfedsgd``.
      client_lr, num_local_steps, batch_size, sampling: q-FedAvg's local SGD.
      cohort_size, cohort: clients per round and how they are drawn (the paper
        samples clients with probability ``p_k``, i.e. ``size_weighted``, then
        averages without weights).
      attack, malicious: update attack and ``[num_clients]`` malicious mask.

    Raises:
      ValueError: ``q < 0``, ``lipschitz_L <= 0``, an unknown ``variant``, or an
        invalid ``fedavg`` argument.
    """
    check_q(q)
    check_positive("lipschitz_L", lipschitz_L)
    if jnp.ndim(lipschitz_L) != 0:
        raise ValueError(f"lipschitz_L: must be a scalar, got shape "
                         f"{jnp.shape(lipschitz_L)}")
    check_choice("variant", variant, VARIANTS)
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling)
    check_cohort(cohort_size, cohort)
    mal = malicious_mask(attack, malicious)
    kernel = functools.partial(client_update, model, cfg, variant, q, lipschitz_L,
                               attack, mal)
    return qffl_algorithm(model, kernel, cohort_size=cohort_size, cohort=cohort,
                          malicious=malicious)
