"""MOCHA-style federated multi-task learning with a learned task relationship.

Reference: Virginia Smith, Chao-Kai Chiang, Maziar Sanjabi, Ameet Talwalkar,
"Federated Multi-Task Learning", NeurIPS 2017 (the objective (2) with the
task-relationship regularizer, Ω update of Zhang & Yeung, "A Convex Formulation
for Learning Task Relationships in Multi-Task Learning", UAI 2010). As a
baseline: Li et al., "Ditto", ICML 2021, Table 7 (Vehicle, linear SVM).

What is implemented is NOT MOCHA's primal-dual (SDCA) solver: the W step is
local proximal-gradient SGD on each selected client's block of the primal
objective, with the other clients' round-start models held fixed (block
coordinate descent over clients), followed by the closed-form Ω step. Paper: Li et al.,
ICML 2021; decisions: docs/baselines-personalization.md.
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
    malicious_mask,
    resolve_cohort_size,
)
from fedjax_pfl.validation import (
    check_choice,
    check_int,
    check_nonnegative,
    check_positive,
)

REGULARIZERS = ("inverse", "direct")


class MochaServerState(NamedTuple):
    """``W``: every client's model (stacked, ``[N, ...]`` leaves); ``sigma``:
    the ``[N, N]`` task covariance from the closed form; ``omega``: the matrix
    in the regularizer ``tr(W omega W^T)``; ``rounds``: rounds done (the Omega
    schedule)."""

    W: object
    sigma: jax.Array
    omega: jax.Array
    rounds: jax.Array


def flat_tasks(W) -> jax.Array:
    """``[P, N]``: client k's flattened parameters as column k."""
    leaves = jax.tree.leaves(W)
    return jnp.concatenate([a.reshape(a.shape[0], -1) for a in leaves], axis=1).T


def psd_power(a: jax.Array, power: float, floor: float = 0.0) -> jax.Array:
    """``a^power`` of a symmetric PSD matrix via ``eigh`` (eigenvalues floored
    at ``floor``)."""
    e, v = jnp.linalg.eigh(a)
    return (v * jnp.maximum(e, floor) ** power) @ v.T


def task_covariance(w_flat: jax.Array, eps=0.0) -> jax.Array:
    """The closed-form Ω step ``(W^T W + eps I)^{1/2} / tr((W^T W + eps
    I)^{1/2})`` for ``W`` of shape ``[P, N]`` (Zhang & Yeung 2010, eq. (8);
    MOCHA's Ω update)."""
    n = w_flat.shape[1]
    root = psd_power(w_flat.T @ w_flat + eps * jnp.eye(n), 0.5)
    return root / jnp.trace(root)


def omega_of(sigma, regularizer, eps):
    return psd_power(sigma, -1.0, eps) if regularizer == "inverse" else sigma


def client_update(model: Model, cfg: LocalConfig, lam1, lam2, attack, mal,
                  server: MochaServerState, client_state, cid, key, data, *,
                  cohort_size) -> ClientResult:
    """MOCHA's W step for ONE client: local SGD (stream ``key``) from its
    column ``w_k = server.W[cid]`` on its block ``F_k(w) + lam1 (Omega_kk
    ||w||^2 + 2 <w, sum_{l != k} Omega_kl w_l>) + lam2 ||w||^2``, the other
    columns at their round-start values (the kernel reads the whole server
    state). The new ``w_k`` (its change attacked if the client is flagged in
    ``mal``) is uploaded as ``(one_hot(cid), one_hot(cid) x w_k)``, leaves of
    shape ``[N, ...]`` that the server sums and writes into ``W``; the weight
    is 1; clients keep no state."""
    num_clients = data.num_clients
    w_k = jax.tree.map(lambda a: a[cid], server.W)
    row = server.omega[cid]
    others = row * (jnp.arange(num_clients) != cid)
    coupling = jax.tree.map(lambda a: jnp.tensordot(others, a, axes=1), server.W)

    def penalty(p):
        sq = sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(p))
        cross = optax.tree.vdot(p, coupling)
        return lam1 * (row[cid] * sq + 2.0 * cross) + lam2 * sq

    new, loss = run_local(model, w_k, data, cid, key, cfg, penalty=penalty)
    if attack is not None:
        delta = jax.tree.map(jnp.subtract, new, w_k)
        delta = attack_delta(attack, mal, key, delta, cid, cohort_size)
        new = jax.tree.map(jnp.add, w_k, delta)
    onehot = jax.nn.one_hot(cid, num_clients, dtype=jnp.float32)
    upload = (onehot, jax.tree.map(
        lambda a: onehot.reshape(-1, *([1] * a.ndim)).astype(a.dtype) * a[None], new))
    return ClientResult((), upload, jnp.float32(1.0), {"loss": loss})


def mocha(
    model: Model,
    *,
    lam1: float | jax.Array = 1e-3,
    lam2: float | jax.Array = 1e-3,
    regularizer: str = "inverse",
    omega_every: int = 1,
    eps: float = 1e-6,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
    attack=None,
    malicious=None,
) -> Algorithm:
    """Federated multi-task learning of ``W`` and a task relationship ``Omega``.

    Objective: ``sum_k F_k(w_k) + lam1 tr(W Omega W^T) + lam2 ||W||_F^2`` with
    ``W = [w_1 .. w_N]`` (``F_k`` the client's mean loss). Each round:

    * every selected client k runs ``num_local_steps`` SGD steps on its block
      ``F_k(w) + lam1 (Omega_kk ||w||^2 + 2 <w, sum_{l != k} Omega_kl w_l>) +
      lam2 ||w||^2``, the other ``w_l`` at their round-start values, and
      uploads its new ``w_k`` (a change attacked if malicious);
    * the server writes the new columns into ``W``; every ``omega_every``
      rounds it sets ``Sigma = (W^T W + eps I)^{1/2} / tr(...)``, the closed form,
      and ``Omega = Sigma^{-1}`` (``regularizer='inverse'``: the formulation
      whose minimizer that closed form is, Zhang & Yeung 2010) or ``Omega =
      Sigma`` (``'direct'``: ``tr(W Sigma W^T)`` literally).

    ``Sigma`` starts at ``I / N``. Evaluated: ``personal`` (``w_k``). Convex
    (linear) models are the intended use; uploads are ``[N, ...]`` per client, so
    keep N x params small.

    Args:
      model: the model (linear SVM / logistic regression).
      lam1, lam2: regularization strengths ``>= 0`` (may be traced).
      regularizer: ``inverse`` or ``direct`` (see above).
      omega_every: rounds between Omega updates.
      eps: ridge added to ``W^T W`` and the floor of eigenvalues inverted.
      client_lr, num_local_steps, batch_size, sampling: local SGD.
      cohort_size, cohort: clients per round.
      attack, malicious: update attack and ``[num_clients]`` malicious mask.

    Raises:
      ValueError: for invalid arguments (the message names the argument).
    """
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling)
    check_cohort(cohort_size, cohort)
    check_nonnegative("lam1", lam1)
    check_nonnegative("lam2", lam2)
    check_positive("eps", eps)
    check_choice("regularizer", regularizer, REGULARIZERS)
    check_int("omega_every", omega_every, lo=1)
    mal = malicious_mask(attack, malicious)

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        n = data.num_clients
        sigma = jnp.eye(n, dtype=jnp.float32) / n
        server = MochaServerState(tree_broadcast(model.init(key), n), sigma,
                                  omega_of(sigma, regularizer, eps),
                                  jnp.zeros((), jnp.int32))
        return AlgorithmState(server, (), jnp.zeros((), jnp.int32))

    def build(num_clients):
        check_malicious(malicious, num_clients)
        m = resolve_cohort_size(cohort_size, cohort, num_clients)

        client_fn = functools.partial(client_update, model, cfg, lam1, lam2, attack,
                                      mal, cohort_size=m)

        def server_fn(server, updates, weights, mask, metrics, key):
            sel, cols = jax.tree.map(lambda a: jnp.sum(a, axis=0), updates)
            W = jax.tree.map(lambda old, new: jnp.where(
                (sel > 0).reshape(-1, *([1] * (old.ndim - 1))), new, old),
                server.W, cols)
            rounds = server.rounds + 1
            due = rounds % omega_every == 0
            sigma = jnp.where(due, task_covariance(flat_tasks(W), eps), server.sigma)
            omega = jnp.where(due, omega_of(sigma, regularizer, eps), server.omega)
            return MochaServerState(W, sigma, omega, rounds), {}

        return federated_round(client_fn, server_fn, cohort_size=m, cohort=cohort)

    def eval_models(state, data, key):
        return {"personal": ModelView(model, state.server.W, True)}

    return Algorithm(init, deferred(build), eval_models)
