"""The DP baselines of the FedFDP paper: DP-FedProx, DP-SCAFFOLD, DP-FedDyn and
DP-q-FFL, each with sample-level DP-SGD (per-example clipping plus Gaussian
noise) in its local step.

References:
  Ling et al., "FedFDP: Federated Learning with Fairness and Differential
  Privacy", arXiv 2402.16028 (Table 2: each baseline with DP-SGD in its local
  step, sharing (epsilon, delta), q, sigma, C and T).
  Abadi et al., "Deep Learning with Differential Privacy", CCS 2016 (DP-SGD).
  Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020
  (FedProx); Karimireddy et al., "SCAFFOLD", ICML 2020; Acar et al., "Federated
  Learning Based on Dynamic Regularization", ICLR 2021 (FedDyn); Li et al.,
  "Fair Resource Allocation in Federated Learning", ICLR 2020 (q-FFL).

Each method's data-independent term (FedProx's proximal gradient, SCAFFOLD's
control variates, FedDyn's linear and proximal terms) is added to the private
gradient after clipping and noise (``privacy.dp_local_train``'s
``correction``): it depends only on the iterate and on state that is itself
post-processing of earlier DP releases, so each algorithm releases exactly
what DP-FedAvg's accountant counts. Decisions: docs/privacy.md, "DP baselines
of the FedFDP paper".
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.aggregators import Aggregator, mean
from fedjax_pfl.core import Algorithm, KeyTag
from fedjax_pfl.models import Model
from fedjax_pfl.privacy import DPConfig, dp_client_loss, dp_gradient
from fedjax_pfl.toolkit import check_cohort, malicious_mask
from fedjax_pfl.validation import (
    check_clip,
    check_nonnegative,
    check_positive,
)

from . import _feddyn, _qffl, _scaffold
from ._dp import dp_global_algorithm, dp_mechanism, dp_trainer, make_dp_configs
from ._fedprox import check_mu, fedprox_penalty


def dp_fedprox(
    model: Model,
    *,
    mu: float | jax.Array = 0.01,
    clip: float | jax.Array,
    noise_multiplier: float | jax.Array,
    sampling_rate: float | jax.Array | None = None,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    local_epochs: float | None = None,
    batch_size: int = 32,
    sampling: str = "poisson",
    max_batch_size: int | None = None,
    normalize: str | float = "expected",
    clip_method: str = "auto",
    chunk_size: int | None = None,
    cohort_size: int = 10,
    cohort: str = "uniform",
    server_optimizer: optax.GradientTransformation | None = None,
    aggregator: Aggregator | None = None,
    weighted: bool = True,
    attack=None,
    malicious=None,
) -> Algorithm:
    """DP-FedProx: FedProx whose clients run DP-SGD on
    ``F_k(w) + mu/2 ||w - w^t||^2``.

    Each local step is DP-FedAvg's (clip each example's gradient of ``F_k``,
    add ``N(0, (sigma C)^2)``, normalise) plus the proximal gradient
    ``mu (w - w^t)``, added outside the clip: it does not touch the data. The
    FedFDP authors' code instead computes each example's clip factor from the
    norm of ``g_i + mu (w - w^t)``; that reading is not built. The server is
    FedAvg's (:func:`fedprox`); ``mu = 0`` is :func:`dp_fedavg` (the same
    updates up to the added zero).

    Privacy: exactly DP-FedAvg's mechanism (declared as ``Algorithm.privacy``,
    event ``privacy.dp_sgd_event(q, sigma, rounds, steps)``), the same epsilon
    for the same settings: the uploads are post-processing of the same noisy
    gradients.

    Args:
      model: the model.
      mu: proximal coefficient ``mu >= 0``; may be traced.
      clip, noise_multiplier, sampling_rate, client_lr, num_local_steps,
        local_epochs, batch_size, sampling, max_batch_size, normalize,
        clip_method, chunk_size, cohort_size, cohort, server_optimizer,
        aggregator, weighted, attack, malicious: as in :func:`dp_fedavg`.

    Raises:
      ValueError: naming the argument: ``mu`` negative or not finite, a
        ``dp_fedavg`` argument out of range, or ``aggregator`` for a rule that
        reads the clients' training losses.
    """
    check_mu(mu)
    cfg, dp = make_dp_configs(
        clip=clip, noise_multiplier=noise_multiplier, sampling_rate=sampling_rate,
        client_lr=client_lr, num_local_steps=num_local_steps, batch_size=batch_size,
        sampling=sampling, max_batch_size=max_batch_size, normalize=normalize,
        clip_method=clip_method, chunk_size=chunk_size, aggregator=aggregator,
        local_epochs=local_epochs)
    return dp_global_algorithm(
        model, cfg, dp, sampling, what="DP-FedProx", cohort_size=cohort_size,
        cohort=cohort, server_optimizer=server_optimizer, aggregator=aggregator,
        weighted=weighted, attack=attack, malicious=malicious,
        local_penalty=fedprox_penalty(mu))


def dp_scaffold(
    model: Model,
    *,
    clip: float | jax.Array,
    noise_multiplier: float | jax.Array,
    sampling_rate: float | jax.Array | None = None,
    client_lr: float | jax.Array = 0.1,
    global_lr: float | jax.Array = 1.0,
    num_local_steps: int = 10,
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
    """DP-SCAFFOLD: SCAFFOLD (option II) whose clients run DP-SGD.

    Each of the ``K = num_local_steps`` local steps is
    ``y <- y - eta (g~_k(y) - c_k + c)`` with ``g~_k`` DP-FedAvg's private
    gradient (clipped, noised, normalised) and the control variates added after
    clipping and noise, as the FedFDP authors' code does. The client variate is
    then ``c_k+ = c_k - c + (x - y) / (K eta)`` (option II: from the model
    difference, no extra gradient) and the upload ``(y - x, c_k+ - c_k)``; the
    server is :func:`scaffold`'s.

    Privacy: ``c``, every ``c_k`` and both uploads are functions of the noisy
    models ``y`` and of the round-start state, so the mechanism is exactly
    DP-FedAvg's (``privacy.dp_sgd_event(q, sigma, rounds, K)``, declared as
    ``Algorithm.privacy``).

    Args:
      model: the model.
      client_lr, global_lr, num_local_steps, aggregator, weighted: as in
        :func:`scaffold` (``aggregator`` applies to ``y - x``).
      clip, noise_multiplier, sampling_rate, batch_size, sampling,
        max_batch_size, normalize, clip_method, chunk_size, cohort_size, cohort,
        attack, malicious: as in :func:`dp_fedavg`.

    Raises:
      ValueError: naming the argument: a non-positive ``global_lr``, an
        invalid ``dp_fedavg`` argument, or a loss-reading ``aggregator``.
    """
    cfg, dp = make_dp_configs(
        clip=clip, noise_multiplier=noise_multiplier, sampling_rate=sampling_rate,
        client_lr=client_lr, num_local_steps=num_local_steps, batch_size=batch_size,
        sampling=sampling, max_batch_size=max_batch_size, normalize=normalize,
        clip_method=clip_method, chunk_size=chunk_size, aggregator=aggregator)
    check_positive("global_lr", global_lr)
    check_cohort(cohort_size, cohort)
    return _scaffold.scaffold_algorithm(
        model, cfg, global_lr=global_lr,
        aggregator=aggregator or mean(weighted=weighted), cohort_size=cohort_size,
        cohort=cohort, attack=attack, malicious=malicious,
        train=dp_trainer(model, cfg, dp, sampling),
        privacy=dp_mechanism(cfg, dp, sampling, "DP-SCAFFOLD"))


def dp_feddyn(
    model: Model,
    *,
    alpha: float | jax.Array = 0.01,
    clip: float | jax.Array,
    noise_multiplier: float | jax.Array,
    sampling_rate: float | jax.Array | None = None,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
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
    """DP-FedDyn: FedDyn whose clients run DP-SGD on
    ``F_k(w) - <grad_k, w> + alpha/2 ||w - w^t||^2``.

    Each local step adds the gradient of the data-independent terms,
    ``-grad_k + alpha (w - w^t)``, to DP-FedAvg's private gradient after
    clipping and noise; then ``grad_k <- grad_k - alpha (w_k - w^t)`` and the
    upload ``w_k - w^t``, with :func:`feddyn`'s server.

    Privacy: ``grad_k`` and the server's ``h`` are sums of the noisy updates,
    so the mechanism is exactly DP-FedAvg's (``privacy.dp_sgd_event(q, sigma,
    rounds, steps)``, declared as ``Algorithm.privacy``).

    Args:
      model: the model.
      alpha: the dynamic regularization coefficient, ``> 0`` (may be traced).
      client_lr, num_local_steps, aggregator, weighted: as in :func:`feddyn`.
      clip, noise_multiplier, sampling_rate, batch_size, sampling,
        max_batch_size, normalize, clip_method, chunk_size, cohort_size, cohort,
        attack, malicious: as in :func:`dp_fedavg`.

    Raises:
      ValueError: naming the argument: ``alpha`` not positive and finite, an
        invalid ``dp_fedavg`` argument, or a loss-reading ``aggregator``.
    """
    _feddyn.check_alpha(alpha)
    cfg, dp = make_dp_configs(
        clip=clip, noise_multiplier=noise_multiplier, sampling_rate=sampling_rate,
        client_lr=client_lr, num_local_steps=num_local_steps, batch_size=batch_size,
        sampling=sampling, max_batch_size=max_batch_size, normalize=normalize,
        clip_method=clip_method, chunk_size=chunk_size, aggregator=aggregator)
    check_cohort(cohort_size, cohort)
    return _feddyn.feddyn_algorithm(
        model, cfg, alpha=alpha,
        aggregator=aggregator or mean(weighted=weighted), cohort_size=cohort_size,
        cohort=cohort, attack=attack, malicious=malicious,
        train=dp_trainer(model, cfg, dp, sampling),
        privacy=dp_mechanism(cfg, dp, sampling, "DP-FedDyn"))


def dp_qffl_client(model: Model, dp: DPConfig, sampling: str, batch_size: int, lr,
                   q, loss_clip, loss_noise_multiplier, loss_floor, attack, mal, w,
                   client_state, cid, key, data, *, cohort_size: int):
    """DP-q-FedSGD for ONE client: the private gradient ``g~_k`` at ``w^t``
    (``privacy.dp_gradient``, stream ``key``), the released loss
    ``F~_k = max(loss_floor, dp_client_loss(w^t) + regularizer(w^t))`` (stream
    ``fold_in(key, KeyTag.FEDFDP_LOSS)``, FedFDP's), and q-FFL's upload
    (``_qffl.upload``) from them with ``L = 1 / lr``."""
    g, loss, dpm = dp_gradient(model, w, data.train, cid, key, batch_size=batch_size,
                               sampling=sampling, dp=dp)
    released = dp_client_loss(
        model, w, data.train, cid, jax.random.fold_in(key, KeyTag.FEDFDP_LOSS),
        dp=dp, loss_clip=loss_clip, loss_noise_multiplier=loss_noise_multiplier,
        batch_size=batch_size, sampling=sampling)
    if model.regularizer is not None:  # data-independent, as in q-FFL's F_k
        released = released + model.regularizer(w)
    f_k = jnp.maximum(released, loss_floor)
    lipschitz_L = 1.0 / lr
    update = jax.tree.map(lambda d: -d / lipschitz_L, g)
    metrics = {"loss": loss, "released_loss": released, **dpm}
    return _qffl.upload(f_k, update, q, lipschitz_L, attack, mal, key, cid,
                        cohort_size, metrics)


def dp_qffl(
    model: Model,
    *,
    q: float | jax.Array = 1.0,
    clip: float | jax.Array,
    noise_multiplier: float | jax.Array,
    sampling_rate: float | jax.Array | None = None,
    loss_clip: float | jax.Array = 2.5,
    loss_noise_multiplier: float | jax.Array = 5.0,
    loss_floor: float | jax.Array = 1e-3,
    client_lr: float | jax.Array = 0.1,
    batch_size: int = 32,
    sampling: str = "poisson",
    max_batch_size: int | None = None,
    normalize: str | float = "expected",
    clip_method: str = "auto",
    chunk_size: int | None = None,
    cohort_size: int = 10,
    cohort: str = "uniform",
    attack=None,
    malicious=None,
) -> Algorithm:
    """DP-q-FFL: q-FedSGD (the q-FFL paper's Algorithm 1) on a private
    gradient and a privately released loss.

    Each selected client k computes DP-FedAvg's private gradient ``g~_k`` at
    ``w^t`` (one DP-SGD step's gradient, ``privacy.dp_gradient``) and releases
    its loss ``F_k(w^t)`` as FedFDP releases its own
    (``privacy.dp_client_loss``: a fresh batch, each example's loss clipped to
    ``[0, loss_clip]``, ``N(0, (loss_noise_multiplier * loss_clip)^2)`` on the
    sum, the same normaliser; the model's regularizer, data-independent, is
    added). The released ``F~_k`` is floored at ``loss_floor > 0`` (a noisy
    loss may be negative or 0, where ``F^q`` and ``F^{q-1}`` are undefined or
    unbounded). With ``L = 1 / client_lr`` it uploads ``F~_k^q g~_k`` and
    ``h_k = q F~_k^{q-1} ||g~_k||^2 + L F~_k^q``, and the server sets
    ``w <- w^t - sum_k F~_k^q g~_k / sum_k h_k`` (:func:`qffl`'s server).
    ``q = 0`` is DP-FedSGD with the unweighted mean.

    Privacy: everything the server sees is a function of ``g~_k`` and
    ``F~_k``. The declared mechanism (``Algorithm.privacy``) composes the
    gradient step with one loss release per round, as FedFDP's does:
    ``privacy.fedfdp_event(q, sigma, rounds, loss_noise_multiplier, 1)`` with
    this method's Poisson rate ``sampling_rate``. The FedFDP authors' code
    instead weights each example's gradient by a factor computed from the
    exact (un-noised) loss, which is not accounted and not built.

    Args:
      model: the model.
      q: fairness parameter ``q >= 0``; may be traced.
      clip, noise_multiplier, sampling_rate, batch_size, sampling,
        max_batch_size, normalize, clip_method, chunk_size, cohort_size, cohort:
        as in :func:`dp_fedavg` (one local step); the loss batch is drawn the
        same way.
      loss_clip, loss_noise_multiplier: the loss release's bound and noise
        multiplier (FedFDP's defaults; ``inf`` / ``0`` release the exact loss,
        not accounted).
      loss_floor: the positive floor of the released loss.
      client_lr: the q-FedSGD step ``1/L``.
      attack, malicious: an update attack and the ``[num_clients]`` malicious
        mask, applied to the model update ``-client_lr g~_k`` before ``Delta_k``
        and ``h_k`` are formed (as in :func:`qffl`).

    Raises:
      ValueError: naming the argument: ``q < 0``, ``loss_clip`` not positive,
        ``loss_noise_multiplier < 0``, ``loss_floor`` not positive and finite,
        or an invalid ``dp_fedavg`` argument.
    """
    _qffl.check_q(q)
    check_clip("loss_clip", loss_clip)
    check_nonnegative("loss_noise_multiplier", loss_noise_multiplier)
    check_positive("loss_floor", loss_floor)
    cfg, dp = make_dp_configs(
        clip=clip, noise_multiplier=noise_multiplier, sampling_rate=sampling_rate,
        client_lr=client_lr, num_local_steps=1, batch_size=batch_size,
        sampling=sampling, max_batch_size=max_batch_size, normalize=normalize,
        clip_method=clip_method, chunk_size=chunk_size)
    check_cohort(cohort_size, cohort)
    mal = malicious_mask(attack, malicious)
    kernel = functools.partial(dp_qffl_client, model, dp, sampling, batch_size,
                               client_lr, q, loss_clip, loss_noise_multiplier,
                               loss_floor, attack, mal)
    return _qffl.qffl_algorithm(
        model, kernel, cohort_size=cohort_size, cohort=cohort, malicious=malicious,
        privacy=dp_mechanism(cfg, dp, sampling, "DP-q-FFL",
                             loss_release=(loss_clip, loss_noise_multiplier)))
