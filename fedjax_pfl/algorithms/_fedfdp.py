"""FedFair and FedFDP: fairness-weighted FedAvg, and its DP version.

Reference: Ling, Fu, Chen et al., "FedFDP: Federated Learning with Fairness and
Differential Privacy", arXiv 2402.16028 (2024), the
decisions taken are listed in docs/privacy.md.

Client k minimizes ``F_k(w) + lam/2 (F_k(w) - F_hat)^2`` with the server's
global-loss estimate ``F_hat`` held fixed: its gradient is the loss gradient
scaled by ``1 + lam (F_k - F_hat)`` (eq. 8-9). FedFair uses the batch-mean loss
(one weight per client step); FedFDP weights every example
(``1 + lam (loss_j - F_hat)``, eq. 11) and clips with the fair clip factor
(eq. 13), adds ``N(0, (sigma C)^2)`` and releases a clipped, noised training
loss of the updated model on a fresh Poisson batch, with a per-client adaptive
bound (eq. 14-15). The server takes the weighted mean of the models and of the
released losses (``F_hat``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_pfl.core import (
    Algorithm,
    AlgorithmState,
    ClientResult,
    KeyTag,
    ModelView,
    resolve_unroll,
)
from fedjax_pfl.models import Model
from fedjax_pfl.privacy import (
    dp_client_loss,
    dp_local_train,
    dp_sgd_mechanism,
    make_dp_config,
)
from fedjax_pfl.toolkit import (
    check_cohort,
    check_malicious,
    round_step,
    server_update,
)
from fedjax_pfl.validation import (
    check_choice,
    check_clip,
    check_int,
    check_nonnegative,
    check_positive,
    is_concrete,
)

WEIGHTINGS = ("per_sample", "batch")


class FedFDPServerState(NamedTuple):
    """FedFDP's server: the global ``params`` and ``fhat``, its estimate of the
    global loss that the clients' fairness weights compare with, and the
    server optimizer's state (no leaves for the paper's plain step)."""

    params: object
    fhat: jax.Array  # the global-loss estimate F_hat (0 before round 0)
    opt_state: object = ()


class FedFDPClientState(NamedTuple):
    """One FedFDP client's state: its adaptive loss clipping bound."""

    loss_clip: jax.Array  # the client's adaptive loss bound C_loss,t


class FedFDPConfig(NamedTuple):
    """A FedFDP run's client-side settings (see :func:`fedfdp`)."""

    model: Model
    lr: float | jax.Array
    num_steps: int
    dp: object  # privacy.DPConfig
    lam: float | jax.Array
    weighting: str
    loss_noise_multiplier: float | jax.Array
    loss_clip_floor: float | jax.Array
    adaptive_loss_clip: bool


def fairness_weights(weighting: str, lam, fhat) -> Callable:
    """FedFair's per-example loss weights ``(losses, mask) -> weights``:
    ``1 + lam (loss_i - fhat)`` per sample, or with the batch's mean loss
    (``weighting='per_client'``); ``fhat`` is the server's released mean loss."""

    def fn(losses, mask):
        if weighting == "per_sample":
            return 1.0 + lam * (losses - fhat)
        mean = jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)
        return jnp.full_like(losses, 1.0 + lam * (mean - fhat))

    return fn


def fedfdp_client(fc: FedFDPConfig, server: FedFDPServerState,
                  client_state: FedFDPClientState, cid, key, data) -> ClientResult:
    """FedFDP's kernel for ONE client: DP-SGD on the fairness-weighted loss
    (:func:`fairness_weights`), then the loss of the updated model on a fresh
    Poisson batch, clipped at the client's loss clip and privatized
    (:func:`fedjax_pfl.privacy.dp_client_loss`); with ``adaptive_loss_clip``
    that released loss is the next round's clip. Uploads ``w_k - w``."""
    model, dp, w = fc.model, fc.dp, server.params
    w_k, loss, dpm = dp_local_train(
        model, w, data.train, cid, key, lr=fc.lr, num_steps=fc.num_steps,
        batch_size=1, sampling="poisson", dp=dp,
        unroll=resolve_unroll(None, fc.num_steps),
        weight_fn=fairness_weights(fc.weighting, fc.lam, server.fhat))
    released = dp_client_loss(
        model, w_k, data.train, cid, jax.random.fold_in(key, KeyTag.FEDFDP_LOSS),
        dp=dp, loss_clip=client_state.loss_clip,
        loss_noise_multiplier=fc.loss_noise_multiplier)
    new_clip = (jnp.maximum(released, fc.loss_clip_floor) if fc.adaptive_loss_clip
                else client_state.loss_clip)
    n = data.train.counts[cid].astype(jnp.float32)
    delta = jax.tree.map(jnp.subtract, w_k, w)
    # the client's fairness weight 1 + lam (L_k - F_hat), L_k its mean batch loss:
    # the mean of the per-example weights (before clipping) over its steps
    metrics = {"loss": loss, "released_loss": released, "num_examples": n,
               "fair_weight": 1.0 + fc.lam * (loss - server.fhat), **dpm}
    return ClientResult(FedFDPClientState(new_clip), delta, n, metrics)


def fedfdp(
    model: Model,
    *,
    lam: float | jax.Array = 0.1,
    clip: float | jax.Array = 0.1,
    noise_multiplier: float | jax.Array = 2.0,
    loss_clip: float | jax.Array = 2.5,
    loss_noise_multiplier: float | jax.Array = 5.0,
    sampling_rate: float | jax.Array = 0.05,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    weighting: str = "per_sample",
    fair_clip: str = "sign_preserving",
    normalize: str | float = "expected",
    loss_clip_floor: float | jax.Array = 0.0,
    adaptive_loss_clip: bool = True,
    max_batch_size: int | None = None,
    clip_method: str = "auto",
    chunk_size: int | None = None,
    cohort_size: int = 10,
    cohort: str = "uniform",
    server_optimizer: optax.GradientTransformation | None = None,
    attack=None,
    malicious=None,
) -> Algorithm:
    """FedFDP (Algorithm 2 of the paper, as reconstructed in docs/privacy.md).

    The paper leaves the values blank; the authors' code
    (github.com/one1Mouth/FedFDP) uses q = 0.05, C = 0.1, sigma = 2,
    C_loss = 2.5, sigma_loss = 5, lam = 0.1 (this factory's defaults) and
    lr = 1, one local step, every client every round (set by the FedFDP
    presets: ``client_lr``, ``num_local_steps`` and ``cohort`` keep the
    package's shared defaults here). Privacy (per client, sample level): the
    declared mechanism (``Algorithm.privacy``; ``privacy.Monitor.of``) is
    ``privacy.fedfdp_event(q, sigma, rounds, sigma_loss, num_local_steps)``.
    Each round reports ``server/fhat`` and the clients' fairness weights
    ``1 + lam (L_k - F_hat)`` (``L_k`` the client's mean batch loss; the mean
    of its per-example weights before clipping): their mean over clients
    ``train/fair_weight``, and ``server/fair_weight_min`` and ``_max``.

    Args:
      model: the model.
      lam: fairness weight lambda >= 0 (traceable; 0 is DP-FedSGD).
      clip, noise_multiplier: C and sigma of the gradient (traceable).
      loss_clip, loss_noise_multiplier: initial loss bound C_loss and sigma_loss.
        ``loss_noise_multiplier = 0`` and ``loss_clip = inf`` release the exact
        mean loss (FedFair).
      sampling_rate: Poisson rate q of both the gradient and the loss batches.
      client_lr, num_local_steps: local step size and DP-SGD steps per round.
      weighting: ``'per_sample'`` (FedFDP, eq. 11) or ``'batch'`` (FedFair's
        ``1 + lam (mean batch loss - F_hat)``; refused with noise and a nonzero
        ``lam``: one record would change every example's factor, so the
        sensitivity is no longer C).
      fair_clip: ``'sign_preserving'`` (DP-safe), ``'paper'`` or ``'code'``
        (see ``privacy.clip_factor``; with ``lam > 0`` these two are not
        accounted: a negative weight leaves the clipped gradient unbounded).
      normalize: ``'expected'`` (q n_k), a number (the authors' code: 64) or
        ``'realized'`` (|B|, the paper's eq. 12 and 15; NOT accounted: the
        realised size depends on the data); used for the loss release too.
      loss_clip_floor: lower bound of the adaptive loss bound (0 = the paper; a
        bound that reaches 0 then stays there).
      adaptive_loss_clip: the next round's loss bound is the client's released
        loss (eq. 14); ``False`` keeps ``loss_clip`` (FedFair).
      max_batch_size, clip_method, chunk_size: see ``dp_fedavg``.
      cohort_size, cohort: default every client every round (the paper).
      server_optimizer: optax transformation applied to the pseudo-gradient
        ``-delta`` (``None``, the paper: ``w <- w + delta``; e.g.
        ``optax.sgd(1.0, momentum=0.9)``, post-processing of the release).
      attack, malicious: an :class:`fedjax_pfl.attacks.UpdateAttack` that the
        engine applies to the uploads of the clients flagged in the
        ``[num_clients]`` bool mask (after their DP noise: the attacker controls
        what it sends).
    """
    check_choice("weighting", weighting, WEIGHTINGS)
    check_nonnegative("lam", lam)
    check_clip("clip", clip)
    check_clip("loss_clip", loss_clip)
    check_nonnegative("loss_noise_multiplier", loss_noise_multiplier)
    check_nonnegative("loss_clip_floor", loss_clip_floor)
    check_positive("client_lr", client_lr)
    check_int("num_local_steps", num_local_steps, lo=1)
    check_int("max_batch_size", max_batch_size, lo=1, allow_none=True)
    check_int("chunk_size", chunk_size, lo=1, allow_none=True)
    check_choice("adaptive_loss_clip", adaptive_loss_clip, (True, False))
    dp = make_dp_config(clip, noise_multiplier, "poisson", sampling_rate,
                        max_batch_size, normalize, clip_method, chunk_size, fair_clip)
    if weighting == "batch" and _maybe_nonzero(noise_multiplier) \
            and _maybe_nonzero(lam):
        raise ValueError("weighting: 'batch' weights every example by the batch's "
                         "mean loss, so one record changes every example's clip "
                         "factor and the sensitivity is no longer the clip; with "
                         "noise_multiplier > 0 and lam > 0 use "
                         "weighting='per_sample'")
    if cohort != "full":
        check_cohort(cohort_size, cohort)

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        params = model.init(key)
        c0 = jnp.full((data.num_clients,), loss_clip, jnp.float32)
        return AlgorithmState(
            FedFDPServerState(params, jnp.zeros((), jnp.float32),
                              server_opt.init(params)),
            FedFDPClientState(c0), jnp.zeros((), jnp.int32))

    server_opt = server_optimizer or optax.sgd(1.0)  # the paper: w + delta
    fc = FedFDPConfig(model, client_lr, num_local_steps, dp, lam, weighting,
                      loss_noise_multiplier, loss_clip_floor, adaptive_loss_clip)

    def server_fn(server, updates, weights, mask, metrics, key):
        del key
        delta = jax.tree.map(lambda u: u[0], updates)  # the engine's streamed mean
        n = metrics["num_examples"]
        fhat = jnp.sum(n * metrics["released_loss"]) / jnp.sum(n)
        params, opt_state = server_update(server_opt, server.params,
                                          server.opt_state, delta)
        fw = metrics["fair_weight"]  # the spread of the weights (NaN: no step)
        return FedFDPServerState(params, fhat, opt_state), {
            "server/fhat": fhat, "server/fair_weight_min": jnp.nanmin(fw),
            "server/fair_weight_max": jnp.nanmax(fw)}

    step = round_step(functools.partial(fedfdp_client, fc), server_fn,
                      cohort_size=cohort_size, cohort=cohort,
                      linear_weights=lambda w, mask: mask * w,
                      attack=attack, malicious=malicious)

    def eval_models(state, data, key):
        return {"global": ModelView(model, state.server.params, False)}

    unbounded = () if fair_clip == "sign_preserving" or not _maybe_nonzero(lam) \
        else (f"fair_clip={fair_clip!r}: a negative fairness weight leaves the "
              "clipped gradient unbounded (use 'sign_preserving')",)

    def mechanism(data):
        return dp_sgd_mechanism(dp, sampling="poisson",
                                steps_per_round=num_local_steps,
                                max_count=data.train.max_count, what="FedFDP",
                                loss_release=(loss_clip, loss_noise_multiplier),
                                extra_reasons=unbounded)

    return Algorithm(init, step, eval_models, mechanism)


def _maybe_nonzero(x) -> bool:
    """False only for a concrete value that is exactly 0 everywhere."""
    return not (is_concrete(x) and np.all(np.asarray(x) == 0))


def fedfair(
    model: Model,
    *,
    lam: float | jax.Array = 0.1,
    sampling_rate: float | jax.Array = 0.05,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    weighting: str = "batch",
    **kwargs,
) -> Algorithm:
    """FedFair (Ling et al. 2024, Alg. 1): non-private FedFDP. Each client takes
    ``w - lr (1 + lam (L_k - F_hat)) grad L_k`` on a Poisson batch (``L_k`` the
    batch-mean loss; ``weighting='per_sample'`` weights every example instead)
    and uploads the exact mean loss of the updated model on a fresh Poisson
    batch. This is the paper's intended semantics (the released code's
    non-private branch is effectively FedAvg).

    ``kwargs`` go to :func:`fedfdp` (e.g. ``normalize``)."""
    for k in ("clip", "noise_multiplier", "loss_clip", "loss_noise_multiplier"):
        if k in kwargs:
            raise ValueError(f"{k}: FedFair is non-private; use fedfdp")
    return fedfdp(model, lam=lam, clip=np.inf, noise_multiplier=0.0,
                  loss_clip=np.inf, loss_noise_multiplier=0.0,
                  sampling_rate=sampling_rate, client_lr=client_lr,
                  num_local_steps=num_local_steps, weighting=weighting,
                  adaptive_loss_clip=False, **kwargs)
