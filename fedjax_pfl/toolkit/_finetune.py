"""Finetuning a shared model on every client's own data (an evaluation view)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.core import (
    LocalConfig,
    ModelView,
    client_keys,
    prox_penalty,
    run_local,
)
from fedjax_pfl.validation import check_nonnegative, check_positive, is_concrete

from ._round import lift_clients


class FinetuneConfig(NamedTuple):
    """Evaluation-time finetuning (:func:`make_finetune_config`): the local
    training of each client, the proximal weight ``lam`` towards the global
    model, and ``counts``, several step counts (one ``finetuned_<count>`` view
    each) or ``None``."""

    local: LocalConfig
    lam: float | jax.Array
    counts: tuple[int, ...] | None  # several step counts: one view each


def make_finetune_config(cfg: LocalConfig, steps, lr, lam) -> FinetuneConfig | None:
    """Validates the finetuning arguments; ``None`` when ``steps == 0``.

    ``steps`` is an int, or a tuple of step counts: every client then finetunes
    along ONE minibatch stream and each count is reported as its own view
    ``finetuned_<count>`` (the Ditto paper's Fig. 6 picks the best count)."""
    counts = tuple(steps) if isinstance(steps, (tuple, list)) else None

    def is_int(c):  # a bool is not a step count
        return isinstance(c, int) and not isinstance(c, bool)

    ok = all(is_int(c) and c > 0 for c in counts) if counts else (
        is_int(steps) and steps >= 0)
    if not ok:
        raise ValueError(f"finetune_steps: must be a non-negative integer or a tuple "
                         f"of positive integers, got {steps!r}")
    if lr is not None:
        check_positive("finetune_lr", lr)
    check_nonnegative("finetune_lam", lam)
    if steps == 0:
        return None
    return FinetuneConfig(cfg._replace(lr=cfg.lr if lr is None else lr,
                                       num_steps=max(counts) if counts else steps,
                                       epochs=None), lam, counts)


def finetune_views(model, params, data, key, ft: FinetuneConfig | None):
    """``{'finetuned': per-client view}`` (or one ``finetuned_<count>`` view per
    count); empty without finetuning."""
    if ft is None:
        return {}
    if ft.counts is None:
        return {"finetuned": ModelView(model, finetune_all(
            model, params, data, key, ft.local, lam=ft.lam), True)}
    return {f"finetuned_{c}": ModelView(model, finetune_all(
        model, params, data, key, ft.local, lam=ft.lam, active_steps=c), True)
        for c in ft.counts}


def finetune_all(model, params, data, key, cfg: LocalConfig,
                 lam: float | jax.Array = 0.0, active_steps: int | None = None):
    """Every client finetunes ``params`` on its training data, minimizing
    ``F_k(v) + lam/2 ||v - params||^2`` from ``v = params``: stacked results.
    ``active_steps`` stops after that many of ``cfg.num_steps`` steps (same
    minibatch stream for every count). Lifted over the clients by the engine
    in force (:func:`lift_clients`)."""
    ids = jnp.arange(data.num_clients, dtype=jnp.int32)
    keys = client_keys(key, data.key_ids)
    penalty = None if is_concrete(lam) and np.all(np.asarray(lam) == 0) else (
        prox_penalty(lam, params))

    def one(cid, k):
        return run_local(model, params, data, cid, k, cfg, penalty=penalty,
                         active_steps=active_steps)[0]

    return lift_clients(one)(ids, keys)


