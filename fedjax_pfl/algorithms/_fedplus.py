"""Fed+: personal models pulled toward a robust (Moreau-envelope) aggregate.

Reference: Achintya Kundu, Pengqian Yu, Laura Wynter, Shiau Hong Lim,
"Robustness and Personalization in Federated Learning: A Unified Approach via
Regularization" (arXiv 2009.06303, "Fed+"), Algorithm 1, eqs. (7), (11), (14),
(25), Table 1. Paper: Kundu et al., Fed+; the decisions where the paper is silent or
contradicts itself: docs/fedplus.md.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_pfl.aggregators import Aggregator, moreau, prox, prox_stacked
from fedjax_pfl.core import (
    Algorithm,
    AlgorithmState,
    ClientResult,
    KeyTag,
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
    malicious_mask,
    resolve_cohort_size,
)
from fedjax_pfl.validation import (
    check_choice,
    check_int,
    check_nonnegative,
    check_number,
    check_positive,
)

PSIS = ("sq", "l2", "l1", "ind0", "zero")
AGG_SETS = ("all", "sampled")
AGG_METHODS = ("irls", "paper")


class FedPlusClientState(NamedTuple):
    """One party's persistent Fed+ state.

    Attributes:
      params: the personal model ``w_k`` (starts at ``w~^0``).
      trained: whether the party has run Local-Solve at least once (a party
        never sampled is evaluated with the global model; docs/fedplus.md, decision 7).
      sent: the model the server holds for this party, ``w~^t + upload`` (the
        attacked one for a malicious party); only kept when an attack is set
        and ``agg_set='all'`` (else ``()``: the server's copy IS ``params``).
    """

    params: object
    trained: jax.Array
    sent: object = ()


class FedPlusServerState(NamedTuple):
    """Fed+'s server: the global model ``params`` (``w~``) and the aggregator's
    state."""

    params: object  # the global model w~
    agg_state: object


def fedplus_sgd(lr, sigma, anchor) -> optax.GradientTransformation:
    """Fed+'s fused local step (eq. 14) as an optax transformation.

    ``w <- kappa (w - lr g) + (1 - kappa) z`` with ``kappa = 1 / (1 + lr sigma)``
    and the anchor ``z``, computed in Prop. 1's equal form
    ``w - lr kappa (g + sigma (w - z))`` (a gradient step of size ``lr kappa`` on
    ``f(w) + sigma/2 ||w - z||^2``; the two agree to rounding, tested in float64).
    This form makes ``sigma = 0`` bit-for-bit ``optax.sgd(lr)`` (the FedAvg and
    local-training reductions). ``lr`` and ``sigma`` may be traced.
    """
    kappa = 1.0 / (1.0 + lr * sigma)

    def update(grads, state, params):
        upd = jax.tree.map(lambda g, p, z: -(lr * kappa) * (g + sigma * (p - z)),
                           grads, params, anchor)
        return upd, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _check_steps_per_client(steps, num_local_steps, num_clients=None):
    arr = np.asarray(steps)
    if arr.ndim != 1 or arr.dtype.kind not in "iu" or np.any(arr < 1) or np.any(
            arr > num_local_steps):
        raise ValueError(
            f"local_steps_per_client: must be a 1-D integer array with entries in "
            f"[1, num_local_steps={num_local_steps}], got {steps!r}")
    if num_clients is not None and arr.shape != (num_clients,):
        raise ValueError(f"local_steps_per_client: needs one entry per client "
                         f"({num_clients}), got shape {arr.shape}")


class FedPlusConfig(NamedTuple):
    """A Fed+ run's client-side settings (see :func:`fedplus`): the model, the
    :class:`LocalConfig`, ``psi``, ``delta``, ``sigma``, ``init_mix``, the
    stragglers' ``[N]`` step counts (or None), the attack and malicious mask,
    whether the attacked uploads are kept (``agg_set='all'`` under attack)
    and whether the aggregator reads the round-start losses."""

    model: Model
    cfg: LocalConfig
    psi: str
    delta: float | jax.Array
    sigma: float | jax.Array
    init_mix: float | jax.Array
    steps_per_client: jax.Array | None
    attack: object
    malicious: jax.Array | None
    keep_sent: bool
    needs_losses: bool


def fedplus_client(fc: FedPlusConfig, server: FedPlusServerState,
                   state: FedPlusClientState, cid, key, data, *,
                   cohort_size) -> ClientResult:
    """Fed+'s Local-Solve for ONE party (Algorithm 1): the offset
    ``theta = prox_Psi(w_k - w~)``, the anchor ``z = w~ + theta``, local SGD
    from ``(1 - init_mix) w_k + init_mix w~`` on ``f_k(w) + sigma/2 ||w - z||^2``
    (:func:`fedplus_sgd`); uploads ``w_k - w~`` (attacked if malicious)."""
    model, cfg = fc.model, fc.cfg
    w_t, w_k = server.params, state.params
    theta = prox(fc.psi, jax.tree.map(jnp.subtract, w_k, w_t), fc.delta)
    z = jax.tree.map(jnp.add, w_t, theta)
    w0 = jax.tree.map(lambda a, b: (1.0 - fc.init_mix) * a + fc.init_mix * b, w_k,
                      w_t)
    active = None if fc.steps_per_client is None else fc.steps_per_client[cid]
    w_new, loss = run_local(model, w0, data, cid, key, cfg, active_steps=active,
                            optimizer=fedplus_sgd(cfg.lr, fc.sigma, z))
    upload = jax.tree.map(jnp.subtract, w_new, w_t)
    if fc.attack is not None:
        upload = attack_delta(fc.attack, fc.malicious, key, upload, cid, cohort_size)
    sent = jax.tree.map(jnp.add, w_t, upload) if fc.keep_sent else ()
    metrics = {"loss": loss, "offset_norm": optax.tree.norm(theta)}
    if fc.needs_losses:
        metrics["round_start_loss"] = client_loss(model, w_t, data.train, cid)
    n = data.train.counts[cid].astype(jnp.float32)
    return ClientResult(FedPlusClientState(w_new, jnp.ones((), bool), sent),
                        upload, n, metrics)


def fedplus(
    model: Model,
    *,
    psi: str = "l2",
    delta: float | jax.Array = 0.1,
    sigma: float | jax.Array,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int | None = None,
    local_steps_per_client=None,
    local_epochs: float | None = None,
    init_mix: float | jax.Array = 0.0,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
    drop_last: bool = False,
    agg_set: str = "all",
    agg_method: str = "irls",
    agg_iters: int | None = None,
    agg_tol: float = 1e-6,
    weighted: bool = True,
    aggregator: Aggregator | None = None,
    attack=None,
    malicious=None,
) -> Algorithm:
    """Fed+ (Algorithm 1): persistent personal models, a Moreau-envelope aggregate.

    Every party ``k`` keeps a personal model ``w_k`` (initially ``w~^0``). A
    sampled party computes its offset ``theta_k = prox(w_k - w~^t)`` and the
    anchor ``z_k = w~^t + theta_k``, starts from
    ``w = (1 - init_mix) w_k + init_mix w~^t`` and runs ``E_k`` steps of
    ``w <- kappa (w - eta g) + (1 - kappa) z_k``, ``kappa = 1 / (1 + eta sigma)``,
    ``g`` a minibatch gradient of its loss. The server then sets
    ``w~^{t+1} = argmin_w sum_k Psi^(w_k - w)`` (:func:`aggregators.moreau`) over
    every party's current model (``agg_set='all'``, Algorithm 1: parties not
    sampled count with their stale models) or over this round's cohort only
    (``'sampled'``, eqs. 16/22). Uploads are ``w_k - w~^t`` (attacked for
    malicious parties); the aggregate is added back to ``w~^t``.

    Table 1 of the paper as settings: FedAvg+ / FedGeoMed+ / FedCoMed+ are
    ``psi='sq' / 'l2' / 'l1'`` with ``init_mix=0``, ``sigma > 0``; FedProx is
    ``psi='ind0', init_mix=1`` (its lr is ``client_lr * kappa``); FedAvg is
    ``sigma=0, init_mix=1`` and a mean (``psi='ind0'``, or ``aggregator=mean()``
    with ``agg_set='sampled'``); local training is ``sigma=0, init_mix=0``.

    Args:
      model: the model.
      psi: the personalization penalty ``Psi``: ``'sq'`` (FedAvg+, ``sigma delta/2
        ||.||^2``), ``'l2'`` (FedGeoMed+, ``sigma delta ||.||_2`` over the whole
        model), ``'l1'`` (FedCoMed+, ``sigma delta ||.||_1``), ``'ind0'`` (no
        personalization: ``theta = 0``, mean aggregate), ``'zero'`` (``Psi = 0``:
        ``theta = w_k - w~``).
      delta: the threshold inside ``Psi`` (> 0; may be traced).
      sigma: the coupling ``sigma >= 0`` (may be traced; ``0`` gives ``kappa = 1``).
      client_lr: the local step size ``eta`` (may be traced).
      num_local_steps: ``E``, local iterations per round; with
        ``local_steps_per_client`` the static bound (default: their max, else 10;
        the paper's §5.1 takes 20, as the ``fedplus-table2`` preset does).
      local_steps_per_client: optional ``[num_clients]`` ints ``E_k`` in
        ``[1, num_local_steps]`` (stragglers): steps past ``E_k`` are no-ops.
      local_epochs: count local work in epochs instead (``ceil(epochs n_k / B)``
        steps for party k; §5.2 defers to FedProx's epochs).
      init_mix: the paper's ``lambda`` in ``[0, 1]`` (may be traced): 0 continues
        from ``w_k`` (Fed+), 1 restarts from ``w~^t`` (FedAvg/FedProx).
      batch_size, sampling: minibatches (see ``local_train``).
      drop_last: PyTorch-style epochs (see :class:`fedjax_pfl.core.LocalConfig`).
      cohort_size, cohort: parties per round (``K``) and how they are drawn.
      agg_set: ``'all'`` or ``'sampled'`` (see above).
      agg_method, agg_iters, agg_tol, weighted: the Moreau aggregator's
        iteration (``'irls'``: smoothed Weiszfeld, ~20 iterations; ``'paper'``:
        eq. 25, needs about distance/delta iterations), its cap and tolerance,
        and whether parties weigh by their number of training examples (default
        True; the paper's means are unweighted, as the preset sets).
      aggregator: any :class:`Aggregator` of the uploads, replacing the Moreau
        one (e.g. ``aggregators.mean()`` or a robust rule); the local prox still
        uses ``psi``.
      attack, malicious: an update attack on the uploads of the parties flagged
        in the ``[num_clients]`` bool mask (as in ``fedavg``).

    Returns:
      An :class:`Algorithm` with ``FedPlusServerState``/``FedPlusClientState``
      and the views ``personal`` (``w_k``; ``w~`` for a party never sampled),
      ``anchor`` (``z_k = w~ + prox_Psi(w_k - w~)``: the paper's decomposition
      ``w~ + theta_k`` of a personal model, which the penalty only couples
      softly to ``w_k``) and ``global`` (``w~``). Metrics: ``train/loss``,
      ``train/offset_norm`` (``||theta_k||``), ``server/update_norm``
      (``||w~^{t+1} - w~^t||``) and the Moreau aggregator's ``server/agg_iters``
      when it reports them.

    Raises:
      ValueError: naming the argument, for values out of range.
    """
    check_choice("psi", psi, PSIS)
    check_choice("agg_set", agg_set, AGG_SETS)
    check_choice("agg_method", agg_method, AGG_METHODS)
    check_positive("delta", delta)
    check_nonnegative("sigma", sigma)
    check_number("init_mix", init_mix, lo=0.0, hi=1.0)
    check_int("agg_iters", agg_iters, lo=1, allow_none=True)
    check_nonnegative("agg_tol", agg_tol)
    check_int("num_local_steps", num_local_steps, lo=1, allow_none=True)
    if local_steps_per_client is not None:
        if local_epochs is not None:
            raise ValueError("local_steps_per_client: cannot be combined with "
                             "local_epochs")
        if num_local_steps is None:
            num_local_steps = int(np.max(np.asarray(local_steps_per_client)))
        _check_steps_per_client(local_steps_per_client, num_local_steps)
    num_local_steps = 10 if num_local_steps is None else num_local_steps
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling,
                       local_epochs, drop_last=drop_last)
    check_cohort(cohort_size, cohort)
    mal = malicious_mask(attack, malicious)
    agg = aggregator or moreau(psi, delta, method=agg_method, num_iters=agg_iters,
                               tol=agg_tol, weighted=weighted)
    if agg.needs_losses and agg_set == "all":
        raise ValueError("aggregator: rules that need the clients' losses "
                         "(needs_losses) only work with agg_set='sampled'")
    keep_sent = attack is not None and agg_set == "all"
    e_k = None if local_steps_per_client is None else jnp.asarray(
        local_steps_per_client, jnp.int32)

    def check_data(num_clients):
        check_malicious(malicious, num_clients)
        if local_steps_per_client is not None:
            _check_steps_per_client(local_steps_per_client, num_local_steps,
                                    num_clients)

    def init(key, data):
        check_data(data.num_clients)
        params = model.init(key)
        n = data.num_clients
        stacked = tree_broadcast(params, n)
        clients = FedPlusClientState(stacked, jnp.zeros((n,), bool),
                                     stacked if keep_sent else ())
        return AlgorithmState(FedPlusServerState(params, agg.init(params)), clients,
                              jnp.zeros((), jnp.int32))

    fc = FedPlusConfig(model, cfg, psi, delta, sigma, init_mix, e_k, attack, mal,
                       keep_sent, agg.needs_losses)

    def server_step(server, updates, weights, mask, key, losses=None):
        step, agg_state = agg.aggregate(server.agg_state, updates, weights, mask, key,
                                        losses=losses)
        params = jax.tree.map(jnp.add, server.params, step)
        out = {"server/update_norm": optax.tree.norm(step)}
        out.update(_agg_metrics(agg_state))
        return FedPlusServerState(params, agg_state), out

    def build(num_clients):
        check_data(num_clients)
        m = resolve_cohort_size(cohort_size, cohort, num_clients)

        one = functools.partial(fedplus_client, fc, cohort_size=m)

        if agg_set == "sampled":
            def server_fn(server, updates, weights, mask, metrics, key):
                return server_step(server, updates, weights, mask, key,
                                   metrics.get("round_start_loss"))

            return federated_round(one, server_fn, cohort_size=m, cohort=cohort,
                                   linear_weights=agg.linear_weights)

        # 'all': the engine only sees the cohort, so the round runs Local-Solve on
        # the cohort (server untouched) and then aggregates the stack of all N
        # parties' current models. The cohort's uploads are streamed (never
        # stacked) only so that the engine's non-finite check still runs.
        inner = federated_round(one, lambda server, *_: (server, {}), cohort_size=m,
                                cohort=cohort,
                                linear_weights=lambda weights, mask: mask)

        def round_step(state, data, key):
            new, metrics = inner(state, data, key)
            w_t = state.server.params
            held = new.clients.sent if keep_sent else new.clients.params
            updates = jax.tree.map(lambda a, b: a - b[None], held, w_t)
            weights = data.train.counts.astype(jnp.float32)
            skey = jax.random.fold_in(jax.random.fold_in(key, state.round),
                                      KeyTag.SERVER)
            server, server_metrics = server_step(state.server, updates, weights,
                                                 jnp.ones_like(weights), skey)
            metrics.update(server_metrics)
            return new._replace(server=server), metrics

        return round_step

    def eval_models(state, data, key):
        w_t, c = state.server.params, state.clients

        def pick(a, g):
            on = c.trained.reshape((-1,) + (1,) * (a.ndim - 1))
            return jnp.where(on, a, g[None])

        personal = jax.tree.map(pick, c.params, w_t)
        offsets = jax.tree.map(lambda a, g: a - g[None], personal, w_t)
        anchor = jax.tree.map(lambda g, th: g[None] + th, w_t,
                              prox_stacked(psi, offsets, delta))
        return {"personal": ModelView(model, personal, True),
                "anchor": ModelView(model, anchor, True),
                "global": ModelView(model, w_t, False)}

    return Algorithm(init, deferred(build), eval_models)


def _agg_metrics(agg_state) -> dict:
    """The aggregator's iteration count, when its state reports one."""
    for name in ("iterations", "num_iters", "iters"):
        value = getattr(agg_state, name, None)
        if value is not None:
            return {"server/agg_iters": jnp.asarray(value, jnp.float32)}
    return {}


def fedavg_plus(model: Model, **kwargs) -> Algorithm:
    """FedAvg+: :func:`fedplus` with ``psi='sq'`` (mean aggregate, ``theta =
    (w_k - w~)/(1 + delta)``); same keyword arguments."""
    return fedplus(model, psi="sq", **kwargs)


def fedgeomed_plus(model: Model, **kwargs) -> Algorithm:
    """FedGeoMed+: :func:`fedplus` with ``psi='l2'`` (Huber-smoothed geometric
    median, block soft-thresholded offsets); same keyword arguments."""
    return fedplus(model, psi="l2", **kwargs)


def fedcomed_plus(model: Model, **kwargs) -> Algorithm:
    """FedCoMed+: :func:`fedplus` with ``psi='l1'`` (Huber-smoothed coordinatewise
    median, elementwise soft-thresholded offsets); same keyword arguments."""
    return fedplus(model, psi="l1", **kwargs)
