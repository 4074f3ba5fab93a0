"""L2SGD: federated learning of a mixture of global and local models.

Reference: Filip Hanzely, Peter Richtarik, "Federated Learning of a Mixture of
Global and Local Models", arXiv:2002.05516, 2020; as a baseline in Li et al.,
"Ditto", ICML 2021, Table 2 and App. C.2 (code ``flearn/trainers_MTL/l2sgd.py``).
Paper: Li et al., ICML 2021; decisions: docs/baselines-personalization.md.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

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
    attack_delta,
    check_cohort,
    check_malicious,
    deferred,
    malicious_mask,
    resolve_cohort_size,
)
from fedjax_pfl.validation import check_choice, check_nonnegative

MEAN_MODES = ("exact", "code")


class L2SGDServerState(NamedTuple):
    """``mean``: the server's ``wbar``; ``agg_state``: the aggregator's state."""

    mean: object
    agg_state: object


def client_update(model: Model, cfg: LocalConfig, lam, mean_update: str, attack, mal,
                  server: L2SGDServerState, w_k, cid, key, data, *,
                  cohort_size) -> ClientResult:
    """L2SGD for ONE client: local SGD (stream ``key``) on ``F_k(w) + lam/2 ||w -
    wbar||^2`` from its ``w_k``, ``wbar = server.mean`` fixed; the new ``w_k``
    is the client's state. Uploads ``w_k^new - w_k`` (``mean_update='exact'``)
    or ``w_k^new - wbar`` (``'code'``), attacked (stream ``fold_in(key,
    KeyTag.ATTACK)``) if the client is flagged in ``mal``; the weight is ``n_k``. The
    server's step, ``wbar + (m / N) aggregate(uploads)``, couples the cohort."""
    wbar = server.mean
    new, loss = run_local(model, w_k, data, cid, key, cfg,
                          penalty=prox_penalty(lam, wbar))
    ref = w_k if mean_update == "exact" else wbar
    delta = jax.tree.map(jnp.subtract, new, ref)
    if attack is not None:
        delta = attack_delta(attack, mal, key, delta, cid, cohort_size)
    return ClientResult(new, delta, data.train.counts[cid].astype(jnp.float32),
                        {"loss": loss})


def l2sgd(
    model: Model,
    *,
    lam: float | jax.Array = 0.1,
    mean_update: str = "exact",
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    local_epochs: float | None = None,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
    aggregator: Aggregator | None = None,
    attack=None,
    malicious=None,
) -> Algorithm:
    """L2SGD as the Ditto paper runs it (App. C.2): persistent personal models.

    Objective ``min sum_k F_k(w_k) + lam/2 ||w_k - wbar||^2`` with ``wbar`` the
    mean of ALL N personalized models. Every selected client runs local SGD on
    ``F_k(w) + lam/2 ||w - wbar||^2`` from its persistent ``w_k`` (``wbar``
    fixed at its round-start value) and uploads a change of ``wbar``:

    * ``mean_update='exact'`` (the paper's ``wbar``): the upload is
      ``w_k^new - w_k^old`` and the server adds ``(m/N) x`` their mean (an
      unweighted mean over the cohort), so ``wbar`` stays exactly the mean of
      all ``w_k`` (they all start at ``w^0``);
    * ``mean_update='code'``: the upload is ``w_k^new - wbar`` and the server
      does ``wbar <- wbar + (m/N) mean(w_k^new - wbar)``, the authors' running
      approximation.

    Evaluated: ``personal`` (``w_k``) and ``global`` (``wbar``).

    Args:
      model: the model.
      lam: the coupling ``lambda >= 0`` (may be traced); 0 is local training.
      mean_update: ``exact`` or ``code`` (see above).
      client_lr, num_local_steps, local_epochs, batch_size, sampling: local SGD.
      cohort_size, cohort: clients per round.
      aggregator: combines the uploads (default: unweighted mean); a robust rule
        makes ``wbar`` a robust estimate instead of the exact mean.
      attack, malicious: update attack on the uploads, ``[num_clients]`` mask.

    Raises:
      ValueError: for invalid arguments (the message names the argument).
    """
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling,
                       local_epochs)
    check_cohort(cohort_size, cohort)
    check_nonnegative("lam", lam)
    if jnp.ndim(lam) != 0:
        raise ValueError(f"lam: must be a scalar, got shape {jnp.shape(lam)}")
    check_choice("mean_update", mean_update, MEAN_MODES)
    mal = malicious_mask(attack, malicious)
    aggregator = aggregator or mean(weighted=False)
    if aggregator.needs_losses:
        raise ValueError("aggregator: L2SGD has no global model to compute the "
                         "round-start losses of a loss-based rule at")

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        params = model.init(key)
        return AlgorithmState(L2SGDServerState(params, aggregator.init(params)),
                              tree_broadcast(params, data.num_clients),
                              jnp.zeros((), jnp.int32))

    def build(num_clients):
        check_malicious(malicious, num_clients)
        m = resolve_cohort_size(cohort_size, cohort, num_clients)

        client_fn = functools.partial(client_update, model, cfg, lam, mean_update,
                                      attack, mal, cohort_size=m)

        def server_fn(server, updates, weights, mask, metrics, key):
            delta, agg_state = aggregator.aggregate(server.agg_state, updates, weights,
                                                    mask, key)
            frac = m / num_clients
            wbar = jax.tree.map(lambda a, d: a + frac * d, server.mean, delta)
            return L2SGDServerState(wbar, agg_state), {}

        return federated_round(client_fn, server_fn, cohort_size=m, cohort=cohort,
                               linear_weights=aggregator.linear_weights)

    def eval_models(state, data, key):
        return {"global": ModelView(model, state.server.mean, False),
                "personal": ModelView(model, state.clients, True)}

    return Algorithm(init, deferred(build), eval_models)
