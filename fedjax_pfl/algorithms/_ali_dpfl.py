"""ALI-DPFL: DP federated learning with adaptive local iterations.

Reference: Xinpeng Ling, Jie Fu, Kuncan Wang, Haitao Liu, Zhili Chen,
"ALI-DPFL: Differentially Private Federated Learning with Adaptive Local
Iterations", arXiv 2308.10457 (a DP baseline of the FedFDP paper's Table 2).

The setting is a federation with two budgets: ``num_rounds`` communication
rounds (R_s) and ``max_steps`` local DP-SGD steps per client (R_c, what the
privacy budget allows). Every round all selected clients run ``tau`` DP-SGD
steps from the global model; after aggregating, the server re-estimates a
strong-convexity constant ``mu`` and a heterogeneity constant ``Gamma`` and
sets the next ``tau`` to the minimiser of the paper's convergence bound
(:func:`ali_tau`). Training stops when the R_c steps are spent. Decisions
(the estimators, what is private): docs/privacy.md, "ALI-DPFL".
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import dp_accounting
import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.aggregators import Aggregator, mean
from fedjax_pfl.core import (
    Algorithm,
    AlgorithmState,
    ClientResult,
    KeyTag,
    ModelView,
    federated_round,
)
from fedjax_pfl.data import gather_batch
from fedjax_pfl.models import Model, num_params
from fedjax_pfl.privacy import (
    DPConfig,
    dp_batches,
    dp_denominator,
    dp_local_train,
    dp_sgd_mechanism,
    max_rounds,
    on_sampled_rows,
    release_loss,
    sampled_gaussian_event,
)
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
    check_clip,
    check_int,
    check_nonnegative,
)

from ._dp import make_dp_configs

ESTIMATES = ("private", "exact")


class AliServerState(NamedTuple):
    """Attributes: ``params`` (the global model), ``agg_state``, ``tau`` (the
    local DP-SGD steps of the next round, int32), ``steps`` (steps every client
    has spent so far, int32), ``mu`` and ``gamma`` (the last estimates) and
    ``batch_hat`` (``max(1, floor(q min_k n_k))``, :func:`ali_tau`'s B)."""

    params: object
    agg_state: object
    tau: jax.Array
    steps: jax.Array
    mu: jax.Array
    gamma: jax.Array
    batch_hat: jax.Array


def ali_tau(mu, gamma, *, clip, noise_multiplier, dim, batch_hat, num_rounds,
            max_steps, tau, tau_max):
    """ALI-DPFL's local-iteration count: the ``tau`` that minimises the
    convergence bound, rounded half up and clamped to ``[1, tau_max]``::

        T     = min(R_s tau, R_c)
        N     = sigma^2 C^2 d / B^2              (the DP noise term)
        tau*  = sqrt(1 + (4 / mu^2 + 3 C^2 + 2 Gamma T mu + N)
                         / ((2 + 2 / T) (C^2 + N)))

    with ``B = batch_hat`` (the authors use ``floor(q min_k n_k)``) and ``d``
    the number of parameters. ``mu = 0`` gives ``tau_max``; a NaN estimate
    keeps ``tau``. Traceable in every argument but ``tau_max``."""
    f = jnp.float32
    big_t = jnp.minimum(num_rounds * tau, max_steps).astype(f)
    c2 = jnp.asarray(clip, f) ** 2
    noise = (jnp.asarray(noise_multiplier, f) ** 2) * c2 * dim / (
        jnp.asarray(batch_hat, f) ** 2)
    numer = 4.0 / jnp.asarray(mu, f) ** 2 + 3.0 * c2 + 2.0 * gamma * big_t * mu + noise
    denom = (2.0 + 2.0 / big_t) * (c2 + noise)
    raw = jnp.sqrt(1.0 + numer / (denom + 1e-6))
    raw = jnp.where(jnp.isnan(raw), jnp.asarray(tau, f), raw)
    return jnp.clip(jnp.floor(raw + 0.5), 1, tau_max).astype(jnp.int32)


def ali_dpfl_event(sampling_rate: float, noise_multiplier: float, steps: int,
                   loss_noise_multiplier: float | None = None,
                   loss_releases: int = 0) -> dp_accounting.DpEvent:
    """A client's sample-level release in ALI-DPFL: ``steps`` DP-SGD steps
    (Poisson(q)-subsampled Gaussians, multiplier ``noise_multiplier``) composed
    with ``loss_releases`` private loss-change releases (one per round, a fresh
    Poisson(q) batch, multiplier ``loss_noise_multiplier``; ``None``: none)."""
    grad = sampled_gaussian_event(sampling_rate, noise_multiplier, steps)
    if loss_noise_multiplier is None or loss_releases == 0:
        return grad
    loss = sampled_gaussian_event(sampling_rate, loss_noise_multiplier, loss_releases)
    return dp_accounting.ComposedDpEvent([grad, loss])


def ali_dpfl_max_steps(target_epsilon: float, delta: float, *, sampling_rate: float,
                       noise_multiplier: float, num_rounds: int,
                       loss_noise_multiplier: float | None = None, **kwargs) -> int:
    """R_c: the most DP-SGD steps a client may take so that, with
    ``num_rounds`` loss releases (none when ``loss_noise_multiplier`` is
    ``None``), epsilon stays within ``target_epsilon`` at ``delta``
    (``privacy.max_rounds`` over the step count; ``kwargs`` go to it)."""
    check_int("num_rounds", num_rounds, lo=1)
    return max_rounds(target_epsilon, delta, lambda s: ali_dpfl_event(
        sampling_rate, noise_multiplier, s, loss_noise_multiplier, num_rounds),
        **kwargs)


def _loss_change(model: Model, dp: DPConfig, sampling: str, batch_size: int,
                 estimates: str, loss_clip, loss_noise_multiplier, before, after,
                 split, cid, key):
    """One client's release of the loss change ``F_k(after) - F_k(before)`` on
    a fresh batch (stream ``key``). ``'private'``: each example's change is
    clipped to ``[-loss_clip, loss_clip]``, ``N(0, (loss_noise_multiplier *
    loss_clip)^2)`` is added to the masked sum (noise key ``fold_in(key,
    KeyTag.ALI_LOSS_NOISE)``) and the sum divided by DP-SGD's normaliser: one
    Poisson-subsampled Gaussian of sensitivity ``loss_clip``. ``'exact'``: the
    batch's mean change, un-noised (the authors' code)."""
    rows, mask, _ = dp_batches(split, cid, key, num_steps=1, batch_size=batch_size,
                               sampling=sampling, dp=dp)

    def release(r, m):
        b = gather_batch(split, r, m)
        change = (model.loss(model.apply(after, b.x), b.y)
                  - model.loss(model.apply(before, b.x), b.y))
        if estimates == "exact":
            return jnp.sum(change * b.mask) / jnp.maximum(jnp.sum(b.mask), 1.0)
        return release_loss(change, b.mask, loss_clip, loss_noise_multiplier,
                            jax.random.fold_in(key, KeyTag.ALI_LOSS_NOISE),
                            dp_denominator(dp, b.mask, split.counts[cid], batch_size),
                            lower=-loss_clip)

    return on_sampled_rows(release, rows[0], mask[0], dp)


def _steps_now(server: AliServerState, max_steps: int, tau_max: int) -> jax.Array:
    """This round's steps: ``tau``, cut to what is left of the budget R_c."""
    return jnp.clip(jnp.minimum(server.tau, max_steps - server.steps), 0, tau_max)


def client_update(model: Model, cfg, dp: DPConfig, sampling: str, tau_max: int,
                  max_steps: int, release, attack, mal, server: AliServerState,
                  client_state, cid, key, data, *, cohort_size: int) -> ClientResult:
    """ALI-DPFL for ONE client: ``a = min(tau, max_steps - steps)`` DP-SGD steps
    from ``w = server.params`` (the first ``a - 1`` with stream ``fold_in(key,
    KeyTag.ALI_STEPS)``, the last with ``key``, so one step is DP-FedAvg's
    exactly), then ``release(before, after, cid, fold_in(key,
    KeyTag.ALI_LOSS))``, the loss change of the last step. Upload:
    ``(w_k - w, last step, loss change)``, weight ``n_k``."""
    w = server.params
    active = _steps_now(server, max_steps, tau_max)
    kw = dict(lr=cfg.lr, batch_size=cfg.batch_size, sampling=sampling, dp=dp)
    before, loss_sum = w, jnp.float32(0.0)
    if tau_max > 1:
        before, first_loss, _ = dp_local_train(
            model, w, data.train, cid, jax.random.fold_in(key, KeyTag.ALI_STEPS),
            num_steps=tau_max - 1, active_steps=jnp.maximum(active - 1, 0), **kw)
        loss_sum = jnp.where(active > 1, first_loss * (active - 1), 0.0)
    after, last_loss, dpm = dp_local_train(model, before, data.train, cid, key,
                                           num_steps=1, active_steps=(active > 0)
                                           .astype(jnp.int32), **kw)
    loss_sum = loss_sum + jnp.where(active > 0, last_loss, 0.0)
    change = release(before, after, data.train, cid,
                     jax.random.fold_in(key, KeyTag.ALI_LOSS))
    delta = jax.tree.map(jnp.subtract, after, w)
    last = jax.tree.map(jnp.subtract, after, before)
    if attack is not None:
        delta = attack_delta(attack, mal, key, delta, cid, cohort_size)
    metrics = {"loss": loss_sum / jnp.maximum(active, 1), "ali/loss_change": change,
               **dpm}
    n = data.train.counts[cid].astype(jnp.float32)
    return ClientResult(client_state, (delta, last, change), n, metrics)


def ali_estimates(delta, last, change, agg_delta, weights, mask):
    """``(mu, Gamma)`` from the cohort's stacked uploads, with ``p_k`` the
    masked weights normalised to 1: ``mu = sum_k p_k ||last_k|| / (||w_k -
    w^{t+1}|| + 1e-6)`` (``w_k - w^{t+1} = delta_k - agg_delta``: the client's
    distance to the new global model; ``last_k`` its last local step) and
    ``Gamma = |sum_k p_k change_k|``, as the authors' code computes them."""
    p = weights * mask
    p = p / jnp.maximum(jnp.sum(p), 1e-30)
    norm = jax.vmap(optax.tree.norm)
    dist = norm(jax.tree.map(lambda d, a: d - a[None], delta, agg_delta))
    mu = jnp.sum(p * norm(last) / (dist + 1e-6))
    return mu, jnp.abs(jnp.sum(p * change))


def ali_dpfl(
    model: Model,
    *,
    clip: float | jax.Array,
    noise_multiplier: float | jax.Array,
    sampling_rate: float | jax.Array | None = None,
    num_rounds: int,
    max_steps: int,
    client_lr: float | jax.Array = 0.1,
    tau_init: int = 1,
    tau_max: int = 100,
    adaptive: bool = True,
    estimates: str = "private",
    loss_clip: float | jax.Array = 2.5,
    loss_noise_multiplier: float | jax.Array = 5.0,
    batch_size: int = 32,
    sampling: str = "poisson",
    max_batch_size: int | None = None,
    normalize: str | float = "expected",
    clip_method: str = "auto",
    chunk_size: int | None = None,
    cohort_size: int = 10,
    cohort: str = "uniform",
    aggregator: Aggregator | None = None,
    weighted: bool = True,
    attack=None,
    malicious=None,
) -> Algorithm:
    """ALI-DPFL: FedAvg over local DP-SGD whose number of local steps per round
    ``tau`` adapts to the budgets of ``num_rounds`` rounds (R_s) and
    ``max_steps`` DP-SGD steps (R_c).

    Round t: every selected client runs ``min(tau_t, R_c - steps)`` DP-SGD
    steps (DP-FedAvg's: Poisson batches, per-example clip, Gaussian noise) from
    ``w^t``; the server averages the models. It then estimates
    ``mu = sum_k p_k ||w_k^tau - w_k^{tau-1}|| / ||w_k - w^{t+1}||`` (the
    authors' code: the size of the last local step over the distance to the
    new global model) and ``Gamma = |sum_k p_k (F_k(w_k^tau) -
    F_k(w_k^{tau-1}))|`` (the loss change of the last step) and sets
    ``tau_{t+1}`` by :func:`ali_tau`. Once ``R_c`` steps are spent the rounds
    change nothing. As in the authors' code, ``tau`` stays 1 when
    ``R_s >= R_c`` (then ALI-DPFL is DP-FedAvg with one step, the same
    updates); ``adaptive=False`` keeps ``tau_init`` (fixed-tau DP-FedAvg under
    the same step budget).

    ``estimates`` says how ``Gamma``'s loss change is measured, on a fresh
    batch of the client's data (``mu`` reads only the uploaded, noisy models):
      * ``'private'`` (default): released like FedFDP's loss (each example's
        change clipped to ``[-loss_clip, loss_clip]``, Gaussian noise with
        multiplier ``loss_noise_multiplier`` on the sum). ``tau`` is then a
        function of DP releases only, and the declared mechanism
        (``Algorithm.privacy``) is ``min(t tau_max, R_c)`` DP-SGD steps
        composed with ``t`` loss releases after ``t`` rounds
        (:func:`ali_dpfl_event`): a bound for every round, and after R_s
        rounds the budget :func:`ali_dpfl_max_steps` was solved for.
      * ``'exact'``: the exact mean change (the authors' code). The step
        count then depends on un-noised data, so no epsilon is declared.

    Args:
      model: the model.
      clip, noise_multiplier, sampling_rate, client_lr, batch_size, sampling,
        max_batch_size, normalize, clip_method, chunk_size, cohort_size,
        cohort, aggregator, weighted, attack, malicious: as in
        :func:`dp_fedavg` (``client_lr`` the local DP-SGD step; the loss batch
        is drawn as the gradient batches).
      num_rounds: R_s, the rounds the run is planned for (int >= 1).
      max_steps: R_c, the DP-SGD steps each client may spend (int >= 1; e.g.
        :func:`ali_dpfl_max_steps`).
      tau_init: the first round's steps (the authors' default 1).
      tau_max: the clamp of ``tau`` (the authors' 100); each round's step
        loop is bounded by it (the steps not run cost nothing, their batch
        draws do).
      adaptive: adapt ``tau`` (``False``: keep ``tau_init``).
      estimates: ``'private'`` or ``'exact'``.
      loss_clip, loss_noise_multiplier: the loss-change release's bound and
        noise multiplier (``'private'``).

    Raises:
      ValueError: naming the argument: a count below 1, ``tau_init >
        tau_max``, an unknown ``estimates``, ``loss_clip`` not positive,
        ``loss_noise_multiplier < 0``, or an invalid ``dp_fedavg`` argument.
    """
    check_int("num_rounds", num_rounds, lo=1)
    check_int("max_steps", max_steps, lo=1)
    check_int("tau_max", tau_max, lo=1)
    check_int("tau_init", tau_init, lo=1, hi=tau_max)
    if not isinstance(adaptive, bool):
        raise ValueError(f"adaptive: must be True or False, got {adaptive!r}")
    check_choice("estimates", estimates, ESTIMATES)
    check_clip("loss_clip", loss_clip)
    check_nonnegative("loss_noise_multiplier", loss_noise_multiplier)
    cfg, dp = make_dp_configs(
        clip=clip, noise_multiplier=noise_multiplier, sampling_rate=sampling_rate,
        client_lr=client_lr, num_local_steps=1, batch_size=batch_size,
        sampling=sampling, max_batch_size=max_batch_size, normalize=normalize,
        clip_method=clip_method, chunk_size=chunk_size, aggregator=aggregator)
    check_cohort(cohort_size, cohort)
    mal = malicious_mask(attack, malicious)
    agg = aggregator or mean(weighted=weighted)
    adapt = adaptive and num_rounds < max_steps  # R_s >= R_c: tau = 1 (the code)
    tau0 = 1 if adaptive and not adapt else tau_init
    dim = num_params(model)
    release = functools.partial(_loss_change, model, dp, sampling, batch_size,
                                estimates, loss_clip, loss_noise_multiplier)
    kernel = functools.partial(client_update, model, cfg, dp, sampling, tau_max,
                               max_steps, release, attack, mal)

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        params = model.init(key)
        zero = jnp.zeros((), jnp.float32)
        q = dp.sampling_rate if dp.sampling_rate is not None else 1.0
        batch_hat = jnp.maximum(jnp.floor(
            q * jnp.min(data.train.counts).astype(jnp.float32)), 1.0)
        server = AliServerState(params, agg.init(params), jnp.int32(tau0),
                                jnp.zeros((), jnp.int32), zero, zero, batch_hat)
        return AlgorithmState(server, (), jnp.zeros((), jnp.int32))

    def build(num_clients):
        check_malicious(malicious, num_clients)
        m = resolve_cohort_size(cohort_size, cohort, num_clients)

        def server_fn(server, updates, weights, mask, metrics, key):
            delta, last, change = updates
            agg_delta, agg_state = agg.aggregate(server.agg_state, delta, weights,
                                                 mask, key)
            params = jax.tree.map(jnp.add, server.params, agg_delta)
            spent = _steps_now(server, max_steps, tau_max)
            steps = server.steps + spent
            mu, gamma = ali_estimates(delta, last, change, agg_delta, weights, mask)
            tau = server.tau
            if adapt:
                tau = ali_tau(mu, gamma, clip=dp.clip,
                              noise_multiplier=dp.noise_multiplier, dim=dim,
                              batch_hat=server.batch_hat, num_rounds=num_rounds,
                              max_steps=max_steps, tau=server.tau, tau_max=tau_max)
            return AliServerState(params, agg_state, tau, steps, mu, gamma,
                                  server.batch_hat), {
                "ali/tau": spent, "ali/steps": steps, "ali/next_tau": tau,
                "ali/mu": mu, "ali/gamma": gamma,
                "server/update_norm": optax.tree.norm(agg_delta)}

        return federated_round(functools.partial(kernel, cohort_size=m),
                               server_fn, cohort_size=m, cohort=cohort)

    def eval_models(state, data, key):
        return {"global": ModelView(model, state.server.params, False)}

    def privacy(data):
        private = estimates == "private"
        mech = dp_sgd_mechanism(
            dp, sampling=sampling, steps_per_round=tau_max,
            max_count=data.train.max_count, what="ALI-DPFL",
            loss_release=(loss_clip, loss_noise_multiplier) if private else None,
            extra_reasons=() if private else (
                ("estimates='exact': the number of local steps is chosen from "
                 "un-noised training losses, which no accountant covers"),))
        s = dict(mech.settings, num_rounds=num_rounds, max_steps=max_steps,
                 tau_init=tau0, tau_max=tau_max, adaptive=adapt, estimates=estimates)
        q, sigma, lsigma = (s["sampling_rate"], s["noise_multiplier"],
                            s.get("loss_noise_multiplier"))
        event_fn = None if not mech.accounted else (lambda t: ali_dpfl_event(
            q, sigma, min(t * tau_max, max_steps), lsigma, t))
        desc = (f"ALI-DPFL: per client at most {max_steps} DP-SGD steps in all, "
                f"{tau_max} a round (Poisson(q={q}) batches, each example's "
                f"gradient clipped to {s['clip']}, noise multiplier {sigma})"
                + (f", and per round one loss-change release (bound "
                   f"{s['loss_clip']}, multiplier {lsigma})" if private else
                   ", the step count chosen from exact losses"))
        return mech._replace(description=desc, settings=s, event_fn=event_fn)

    return Algorithm(init, deferred(build), eval_models, privacy)
