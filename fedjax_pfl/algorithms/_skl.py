"""SKL finetuning: FedAvg, then finetuning with a symmetrized-KL penalty toward
the global model's predictions.

Reference: Li et al., "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021, §4 and Table 2 ("symmetrized KL", code
``flearn/trainers_MTL/kl.py``). Paper: Li et al., ICML 2021; decisions:
docs/baselines-personalization.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl.aggregators import Aggregator
from fedjax_pfl.core import Algorithm, make_local_config
from fedjax_pfl.data import client_batch_indices
from fedjax_pfl.models import Model
from fedjax_pfl.toolkit import check_cohort, global_solver
from fedjax_pfl.validation import check_choice, check_nonnegative

from ._ewc import finetune_local_config, penalized_finetuning

KL_WEIGHTS = ("code", "paper")


KL_CHUNK = 32  # rows of a client's training set per step of the KL penalty


def _kl_sum(logits_p, logits_q, mask):
    lp, lq = jax.nn.log_softmax(logits_p, -1), jax.nn.log_softmax(logits_q, -1)
    return jnp.sum(jnp.sum((jnp.exp(lp) - jnp.exp(lq)) * (lp - lq), axis=-1) * mask)


def symmetric_kl(logits_p, logits_q, mask):
    """Masked mean over examples of ``KL(p||q) + KL(q||p)`` of the softmaxes."""
    return _kl_sum(logits_p, logits_q, mask) / jnp.maximum(jnp.sum(mask), 1.0)


def kl_penalty(model: Model, w_star, split, cid, chunk: int = KL_CHUNK):
    """``p -> symmetric_kl(f_p(X), f_w*(X))`` over client ``cid``'s whole
    ``split``, ``f_w*(X)`` computed once. The rows are taken ``chunk`` at a
    time and chunks past the client's own rows are skipped (``lax.cond``), so
    a client run alone (the ``map`` strategy) pays for its own rows, not the
    largest client's; under ``vmap`` both branches run (the padded cost).
    The trip count is static, so the penalty is reverse-differentiable."""
    # full_batch: every row of the client (padded to the largest), no key used
    rows, mask = client_batch_indices(split, cid, jax.random.key(0), num_steps=1,
                                      batch_size=1, sampling="full_batch")
    rows, mask = rows[0], mask[0]
    n_chunks = -(-rows.shape[0] // chunk)
    pad = n_chunks * chunk - rows.shape[0]
    rows = jnp.pad(rows, (0, pad)).reshape(n_chunks, chunk)
    mask = jnp.pad(mask, (0, pad)).reshape(n_chunks, chunk)
    live = jnp.any(mask > 0, axis=1)
    xs = split.x[rows]  # [chunks, chunk, ...]

    out = jax.eval_shape(lambda: model.apply(w_star, xs[0]))

    def ref_of(i):
        return jax.lax.cond(live[i], lambda: model.apply(w_star, xs[i]),
                            lambda: jnp.zeros(out.shape, out.dtype))

    ref = jax.lax.stop_gradient(jax.lax.map(ref_of, jnp.arange(n_chunks)))
    count = jnp.maximum(jnp.sum(mask), 1.0)

    def penalty(p):
        def body(i, acc):
            return acc + jax.lax.cond(
                live[i], lambda: _kl_sum(model.apply(p, xs[i]), ref[i], mask[i]),
                lambda: jnp.zeros((), out.dtype))
        return jax.lax.fori_loop(0, n_chunks, body, jnp.zeros((), out.dtype)) / count

    return penalty


def skl(
    model: Model,
    *,
    lam: float | jax.Array = 1.0,
    kl_weight: str = "code",
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    local_epochs: float | None = None,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
    aggregator: Aggregator | None = None,
    weighted: bool = True,
    server_optimizer: optax.GradientTransformation | None = None,
    attack=None,
    malicious=None,
    finetune_steps: int = 50,
    finetune_epochs: float | None = None,
    finetune_lr: float | jax.Array | None = None,
) -> Algorithm:
    """FedAvg, then every client finetunes ``w*`` with a symmetrized KL penalty.

    Training is exactly FedAvg's. At evaluation every client k runs SGD from
    ``w*`` (the current global model) on ``F_k(w) + c lam (KL(f(w)||f(w*)) +
    KL(f(w*)||f(w)))``, ``f`` the softmax of the model's outputs, the KL terms
    averaged over the client's FULL training set with ``f(w*)`` computed once
    (as in the Ditto code). ``c = 1`` with ``kl_weight='code'`` (the code's
    update ``w - lr (grad f + lam grad[KL + KL])``), ``c = 1/2`` with ``'paper'``
    (the paper's ``lam/2``). Evaluated: ``global`` and ``personal`` (finetuned).
    ``lam = 0`` is plain finetuning (same minibatches as ``fedavg``'s
    ``finetuned`` view). Classification models (logits) only.

    Args:
      model: the model (its outputs are logits).
      lam: penalty strength ``>= 0`` (may be traced).
      kl_weight: ``code`` (lam) or ``paper`` (lam / 2).
      Other arguments: as in :func:`fedjax_pfl.algorithms.ewc`.

    Raises:
      ValueError: for invalid arguments (the message names the argument).
    """
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling,
                       local_epochs)
    check_cohort(cohort_size, cohort)
    check_nonnegative("lam", lam)
    check_choice("kl_weight", kl_weight, KL_WEIGHTS)
    scale = 1.0 if kl_weight == "code" else 0.5
    ft = finetune_local_config(cfg, finetune_steps, finetune_epochs, finetune_lr)
    solver = global_solver(model, cfg, aggregator=aggregator, weighted=weighted,
                           server_optimizer=server_optimizer,
                           attack=attack, malicious=malicious)

    def penalty_for(w_star, data):
        def pen(cid, k, p0):
            kl = kl_penalty(model, w_star, data.train, cid)
            return lambda p: scale * lam * kl(p)

        return pen

    return penalized_finetuning(model, solver, ft, penalty_for,
                                cohort_size=cohort_size, cohort=cohort,
                                malicious=malicious)
