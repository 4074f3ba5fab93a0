"""DP-FedAvg / DP-FedSGD with sample-level DP: local DP-SGD on every client.

References:
  Abadi et al., "Deep Learning with Differential Privacy", CCS 2016 (DP-SGD).
  Ling et al., "FedFDP: Federated Learning with Fairness and Differential
  Privacy", arXiv 2402.16028 (its DP baselines: FedAvg with one local DP-SGD
  step per round, i.e. DP-FedSGD; Ling et al., FedFDP, arXiv 2402.16028).
  McMahan et al., AISTATS 2017 (FedAvg).

Client-level DP (clip the update, noise at the server) is an aggregator wrapper
instead: :func:`fedjax_pfl.privacy.client_level_dp`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.aggregators import Aggregator
from fedjax_pfl.core import (
    Algorithm,
    ClientResult,
    ModelView,
    client_steps,
    make_local_config,
    passes_needed,
    resolve_unroll,
)
from fedjax_pfl.models import Model
from fedjax_pfl.privacy import (
    DPConfig,
    dp_local_train,
    dp_sgd_mechanism,
    make_dp_config,
)
from fedjax_pfl.toolkit import (
    attack_delta,
    check_cohort,
    global_solver,
    stateless_algorithm,
)
from fedjax_pfl.validation import check_clip, check_int, is_concrete


def dp_steps(cfg, dp: DPConfig, sampling: str, split, cid):
    """``(static step bound, this client's steps or None)`` of local DP-SGD.

    With ``cfg.epochs`` and Poisson sampling an epoch is ``1 / q`` expected
    batches, the same for every client: ``ceil(epochs / q)`` steps (so the
    accountant's steps per round are that number); other sampling modes count
    each client's own epochs as :func:`fedjax_pfl.core.client_steps` does."""
    if cfg.epochs is not None and sampling == "poisson":
        if not is_concrete(dp.sampling_rate):
            raise ValueError("local_epochs: with Poisson sampling the step count "
                             "ceil(epochs / sampling_rate) must be static; give a "
                             "concrete sampling_rate or num_local_steps")
        return max(1, math.ceil(cfg.epochs / float(dp.sampling_rate))), None
    return client_steps(cfg, split, cid)


def check_dp_aggregator(aggregator) -> None:
    """Refuses an aggregator that reads the clients' exact training losses
    (TERM's tilted mean, k-loss): with DP they would be released un-noised."""
    if aggregator is not None and aggregator.needs_losses:
        raise ValueError("aggregator: this rule weights or selects the noisy "
                         "uploads by each client's exact, un-noised training "
                         "loss, which DP does not cover; use a rule that reads "
                         "only the uploads (mean, median, Krum, ...)")


def dp_mechanism(cfg, dp: DPConfig, sampling: str, what: str, loss_release=None):
    """``data -> privacy.Mechanism`` of FedAvg's client update with local DP-SGD
    (``Algorithm.privacy``): ``steps`` Poisson-subsampled Gaussian steps per
    round, ``ceil(local_epochs / q)`` with epochs; with ``loss_release =
    (loss_clip, loss_noise_multiplier)`` also one loss release per round
    (:func:`fedjax_pfl.privacy.dp_client_loss`, FedFDP's composition)."""
    steps = cfg.num_steps
    if sampling == "poisson" and cfg.epochs is not None:
        steps = dp_steps(cfg, dp, sampling, None, None)[0]

    def mechanism(data):
        return dp_sgd_mechanism(dp, sampling=sampling, steps_per_round=steps,
                                max_count=data.train.max_count, what=what,
                                loss_release=loss_release)

    return mechanism


def dp_trainer(model: Model, cfg, dp: DPConfig, sampling: str):
    """``train(params, penalty, cid, key, data) -> (params, loss, dp metrics)``:
    one client's local DP-SGD under ``cfg`` (steps or epochs, :func:`dp_steps`).
    ``penalty`` is ``None`` or a data-independent ``params -> scalar`` term of
    the local objective (what the non-private methods pass to ``run_local``);
    its gradient is added to the private gradient outside the clip and the
    noise (``dp_local_train``'s ``correction``)."""

    def train(params, penalty, cid, key, data):
        steps, active = dp_steps(cfg, dp, sampling, data.train, cid)
        return dp_local_train(
            model, params, data.train, cid, key, lr=cfg.lr, num_steps=steps,
            batch_size=cfg.batch_size, sampling=sampling, dp=dp,
            unroll=resolve_unroll(cfg.unroll, steps),
            active_steps=active, drop_last=cfg.drop_last,
            num_passes=(passes_needed(cfg, data.train, steps) if sampling == "epoch"
                        else None),
            correction=None if penalty is None else jax.grad(penalty))

    return train


def dp_client_update(model: Model, cfg, dp: DPConfig, sampling: str, solver,
                     attack=None, malicious=None, local_penalty=None):
    """FedAvg's client update with local DP-SGD instead of SGD (same upload
    ``w_k - w``, weight ``n_k`` and attack hook as ``global_solver``).
    ``local_penalty`` is ``global_solver``'s (``w^t -> penalty``, e.g.
    FedProx's ``mu/2 ||w - w^t||^2``); its gradient joins the private gradient
    after clipping and noise (:func:`dp_trainer`)."""
    mal = None if malicious is None else jnp.asarray(malicious, bool)
    train = dp_trainer(model, cfg, dp, sampling)

    def client_update(server, cid, key, data, cohort_size):
        w = server.params
        penalty = None if local_penalty is None else local_penalty(w)
        w_k, loss, dpm = train(w, penalty, cid, key, data)
        delta = jax.tree.map(jnp.subtract, w_k, w)
        if attack is not None:
            delta = attack_delta(attack, mal, key, delta, cid, cohort_size)
        metrics = {"loss": loss, **dpm}
        n = data.train.counts[cid].astype(jnp.float32)
        return ClientResult((), delta, n, metrics)

    return client_update


def make_dp_configs(*, clip, noise_multiplier, sampling_rate, client_lr,
                    num_local_steps, batch_size, sampling, max_batch_size, normalize,
                    clip_method, chunk_size, aggregator=None, local_epochs=None):
    """Validates the arguments every local-DP-SGD factory shares
    (``ValueError`` naming the argument; a loss-reading ``aggregator`` is
    refused) and returns ``(LocalConfig, DPConfig)``. With Poisson sampling
    the local config's sampling is a placeholder (its batch size is unused)."""
    check_clip("clip", clip)
    check_dp_aggregator(aggregator)
    check_int("max_batch_size", max_batch_size, lo=1, allow_none=True)
    check_int("chunk_size", chunk_size, lo=1, allow_none=True)
    dp = make_dp_config(clip, noise_multiplier, sampling, sampling_rate,
                        max_batch_size, normalize, clip_method, chunk_size)
    cfg = make_local_config(client_lr, num_local_steps, batch_size,
                            "with_replacement" if sampling == "poisson" else sampling,
                            local_epochs)
    return cfg, dp


def dp_global_algorithm(model: Model, cfg, dp: DPConfig, sampling: str, *,
                        what: str, cohort_size, cohort, server_optimizer,
                        aggregator, weighted, attack, malicious,
                        local_penalty=None) -> Algorithm:
    """FedAvg's server (``global_solver``: aggregator, server optimizer) over
    clients that run local DP-SGD (:func:`dp_client_update`), declaring
    :func:`dp_mechanism` named ``what``: DP-FedAvg, and DP-FedProx with
    ``local_penalty``."""
    check_cohort(cohort_size, cohort)
    solver = global_solver(model, cfg, aggregator=aggregator, weighted=weighted,
                           server_optimizer=server_optimizer,
                           attack=attack, malicious=malicious)
    client_update = dp_client_update(model, cfg, dp, sampling, solver, attack,
                                     malicious, local_penalty)

    def eval_models(state, data, key):
        return {"global": ModelView(model, state.server.params, False)}

    alg = stateless_algorithm(solver, client_update, eval_models,
                              cohort_size=cohort_size, cohort=cohort,
                              malicious=malicious)
    return alg._replace(privacy=dp_mechanism(cfg, dp, sampling, what))


def dp_fedavg(
    model: Model,
    *,
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
    """FedAvg whose clients run DP-SGD (sample-level DP per client).

    Every local step draws a batch (Poisson with rate ``sampling_rate`` by
    default), clips each example's gradient to ``clip``, adds
    ``N(0, (noise_multiplier * clip)^2)`` to the sum and divides by the
    normaliser, then takes an SGD step. The server is FedAvg's (aggregator and
    server optimizer): uploads are post-processing of the noisy steps.
    ``num_local_steps=1`` is DP-FedSGD, the FedFDP paper's DP-FedAvg baseline.

    Privacy of client k (add/remove one of its records): ``rounds *
    num_local_steps`` Poisson-subsampled Gaussians, declared as
    ``Algorithm.privacy`` (``privacy.Monitor.of(alg, data, delta)`` reports its
    epsilon; ``privacy.dp_sgd_event(q, sigma, rounds, steps)`` is its event).
    The guarantee needs ``sampling='poisson'``, a finite clip, noise and a
    data-independent normaliser; other settings run, for comparisons (e.g.
    ``clip=inf, noise_multiplier=0`` with ``'with_replacement'`` is FedAvg), but
    their declared mechanism is not accounted and no epsilon is reported.

    Args:
      model: the model.
      clip: per-example L2 bound C (traceable; ``inf`` disables clipping).
      noise_multiplier: sigma (traceable).
      sampling_rate: q, required with ``sampling='poisson'``.
      client_lr, num_local_steps: local DP-SGD step size and steps per round.
      local_epochs: count local work in epochs instead: ``ceil(local_epochs /
        sampling_rate)`` steps with Poisson sampling (account that many steps
        per round), each client's own epoch count otherwise.
      batch_size: batch size of the non-Poisson modes.
      sampling: ``'poisson'`` or a mode of ``data.client_batch_indices``.
      max_batch_size: static cap of a Poisson batch (default: truncation
        chance <= 1e-12 per draw for the largest client plus one record,
        ``privacy.default_max_batch_size``; truncations are counted in
        ``dp/truncated`` and their chance is added to the reported delta).
      normalize: ``'expected'`` (q n_k, accounted), a number (accounted) or
        ``'realized'`` (|B|, FedFDP's eq. 12; NOT accounted: the realised size
        depends on the data).
      clip_method, chunk_size: ``'auto'`` (ghost norms when the model allows,
        else nested vmap with a warning; metric ``dp/ghost``), ``'ghost'``,
        ``'vmap'``; ``chunk_size`` bounds the nested-vmap memory.
      cohort_size, cohort, server_optimizer, aggregator, weighted, attack,
        malicious: as in :func:`fedavg`.

    Raises:
      ValueError: naming the argument, for out-of-range values, or
        ``aggregator`` for a rule that reads the clients' training losses.
    """
    cfg, dp = make_dp_configs(
        clip=clip, noise_multiplier=noise_multiplier, sampling_rate=sampling_rate,
        client_lr=client_lr, num_local_steps=num_local_steps, batch_size=batch_size,
        sampling=sampling, max_batch_size=max_batch_size, normalize=normalize,
        clip_method=clip_method, chunk_size=chunk_size, aggregator=aggregator,
        local_epochs=local_epochs)
    return dp_global_algorithm(
        model, cfg, dp, sampling, what="DP-FedAvg", cohort_size=cohort_size,
        cohort=cohort, server_optimizer=server_optimizer, aggregator=aggregator,
        weighted=weighted, attack=attack, malicious=malicious)
