"""Per-client evaluation of shared or personal models, and fairness summaries."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_pfl.data import Split
from fedjax_pfl.models import Model
from fedjax_pfl.validation import check_choice, check_int, check_mask, check_number

from ._clients import default_strategy
from ._types import ModelView

TAIL_CHUNK = 8  # rows per chunk of the rest of a client's rows after full chunks


def _per_example(model: Model, params, x, y):
    out = model.apply(params, x)
    return model.loss(out, y), model.metric(out, y)


SPLITS = ("train", "val", "test")
METRICS = ("accuracy", "loss")


def check_eval_args(data, *, splits=SPLITS, mask=None, metrics=METRICS,
                    per_client: bool = False, mask_name: str = "mask"
                    ) -> tuple[str, ...]:
    """Checks :func:`evaluate`'s options against ``data``; returns the splits
    as a tuple. Static (works on traced data and masks); ``mask_name`` is the
    caller's name for the mask (``simulate``'s ``eval_mask``)."""
    if isinstance(splits, str) or not hasattr(splits, "__iter__"):
        raise ValueError(f"splits: must be a sequence of split names from {SPLITS}, "
                         f"got {splits!r}")
    splits = tuple(splits)
    for name in splits:
        check_choice("splits", name, SPLITS)
    if isinstance(metrics, str) or not hasattr(metrics, "__iter__"):
        raise ValueError(f"metrics: must be a sequence of names from {METRICS}, "
                         f"got {metrics!r}")
    for name in metrics:
        check_choice("metrics", name, METRICS)
    if mask is not None:
        check_mask(mask_name, mask, data.num_clients)
    check_choice("per_client", per_client, (True, False))
    return splits


def _shared_sums(model: Model, params, split: Split, chunk: int):
    """Per-client sums of loss and metric of one shared model: all rows in
    chunks of ``chunk`` (the last chunk is the split's last ``chunk`` rows, its
    rows already counted masked out), summed per client as they go."""
    n, num_clients = split.num_examples, split.num_clients
    b = max(1, min(n, chunk))
    owner = split.client_of_row
    ar = jnp.arange(b)

    def body(i, acc):
        start = jnp.minimum(i * b, n - b)  # in bounds, no padded copy of the rows
        loss, score = _per_example(model, params, *(jax.lax.dynamic_slice_in_dim(
            a, start, b) for a in (split.x, split.y)))
        keep = start + ar >= i * b
        own = jax.lax.dynamic_slice_in_dim(owner, start, b)
        return tuple(
            s + jax.ops.segment_sum(jnp.where(keep, v, 0.0).astype(s.dtype), own,
                                    num_clients)
            for s, v in zip(acc, (loss, score)))

    zero = jnp.zeros((num_clients,), jnp.float32)
    return jax.lax.fori_loop(0, -(-n // b), body, (zero, zero))


def _client_sums(model: Model, params, split: Split, c, b: int):
    """Sums of loss and metric over client ``c``'s own rows with ``params``:
    ``count // b`` full chunks of ``b`` rows, then the rest in chunks of
    ``t = min(b, TAIL_CHUNK)`` rows (the last one masked). Trip counts are
    dynamic, so the work is the client's rows plus fewer than ``t`` padded
    ones, never the largest client's."""
    offset, count = split.offsets[c], split.counts[c]
    full = count // b
    t = min(b, TAIL_CHUNK)

    def full_chunk(j, acc):
        loss, score = _per_example(model, params, *(jax.lax.dynamic_slice_in_dim(
            a, offset + j * b, b) for a in (split.x, split.y)))
        return (acc[0] + jnp.sum(loss).astype(jnp.float32),
                acc[1] + jnp.sum(score).astype(jnp.float32))

    art = jnp.arange(t)

    def tail_chunk(j, acc):
        idx = full * b + j * t + art
        rows = offset + jnp.minimum(idx, jnp.maximum(count - 1, 0))
        loss, score = _per_example(model, params, split.x[rows], split.y[rows])
        keep = idx < count
        return (acc[0] + jnp.sum(jnp.where(keep, loss, 0.0)).astype(jnp.float32),
                acc[1] + jnp.sum(jnp.where(keep, score, 0.0)).astype(jnp.float32))

    zero = jnp.zeros((), jnp.float32)
    acc = jax.lax.fori_loop(0, full, full_chunk, (zero, zero))
    return jax.lax.fori_loop(0, (count - full * b + t - 1) // t, tail_chunk, acc)


def _personal_sums(model: Model, stacked, split: Split, b: int, k: int):
    """Per-client sums of every client's own model on its own rows: a loop over
    the clients, ``k`` at a time (vmapped when ``k > 1``), each client's
    parameters read from the stacked ones by a dynamic index (never a slice of
    the whole stack, which XLA would copy)."""
    num_clients = split.num_clients

    def one(c):
        params = jax.tree.map(
            lambda a: jax.lax.dynamic_index_in_dim(a, c, keepdims=False), stacked)
        return _client_sums(model, params, split, c, b)

    ids = jnp.arange(k)

    def body(i, acc):
        if k == 1:  # no client axis at all: plain (non-batched) convolutions
            c = i
            sums = one(c)
        else:  # the last block repeats the last client (same values written)
            c = jnp.minimum(i * k + ids, num_clients - 1)
            sums = jax.vmap(one)(c)
        return tuple(a.at[c].set(s) for a, s in zip(acc, sums))

    zero = jnp.zeros((num_clients,), jnp.float32)
    return jax.lax.fori_loop(0, -(-num_clients // k), body, (zero, zero))


def evaluate_split(
    view: ModelView,
    split: Split,
    *,
    chunk_size: int = 512,
    row_chunk: int = 64,
    clients_per_step: int | None = None,
) -> dict[str, jax.Array]:
    """Per-client mean loss and accuracy on one split, all clients in one call.

    A shared model runs over all rows in chunks of ``chunk_size`` and the
    results are summed per client as they go. Personal models (stacked over
    clients) run in a loop over the clients, ``clients_per_step`` at a time,
    each over its own rows only: full chunks of ``row_chunk`` rows, then the
    rest in chunks of 8 (the last one masked); never padded to the split's
    largest client, and never a copy of the stacked parameters (docs/engine.md,
    "Evaluation").

    Args:
      view: the model and its parameters (shared, or stacked with ``per_client``).
      split: the split to evaluate.
      chunk_size: rows per chunk of a shared model.
      row_chunk: rows per full chunk of a personal model.
      clients_per_step: personal models evaluated together (vmapped); default
        the backend's :func:`fedjax_pfl.core.default_strategy`: 1 on CPU (where a
        conv net vmapped over per-client weights runs slowly), else
        ``max(1, chunk_size // row_chunk)``.

    Returns:
      ``{'loss': [C], 'accuracy': [C], 'count': [C]}``; clients with no rows get
      NaN loss/accuracy.

    Raises:
      ValueError: a size that is not a positive integer.
    """
    chunk_size = check_int("chunk_size", chunk_size, lo=1)
    row_chunk = check_int("row_chunk", row_chunk, lo=1)
    clients_per_step = check_int("clients_per_step", clients_per_step, lo=1,
                                 allow_none=True)
    counts = split.counts
    if not view.per_client:
        loss_sum, score_sum = _shared_sums(view.model, view.params, split, chunk_size)
    else:
        b = max(1, min(split.max_count, row_chunk))
        if clients_per_step is None:
            strategy, batch = default_strategy()
            clients_per_step = (batch or 1) if strategy == "map" else max(
                1, chunk_size // b)
        k = max(1, min(clients_per_step, split.num_clients))
        loss_sum, score_sum = _personal_sums(view.model, view.params, split, b, k)
    denom = counts.astype(jnp.float32)
    safe = jnp.where(denom > 0, denom, jnp.nan)
    return {"loss": loss_sum / safe, "accuracy": score_sum / safe, "count": counts}


def summarize(
    values: jax.Array,
    weights: jax.Array,
    mask: jax.Array | None = None,
    *,
    tail: float = 0.1,
    psi_weights: jax.Array | None = None,
    lower_is_better: bool = False,
) -> dict[str, jax.Array]:
    """Fairness/robustness summaries of a per-client metric over a client mask.

    Clients with ``mask == 0`` or a NaN value (no examples) are ignored.

    Returns:
      ``mean`` (weighted by ``weights``, e.g. test-set sizes: the Ditto code's
      'benign test accu'), ``mean_unweighted``, ``std`` and ``var`` (ddof=0,
      across clients; the Ditto paper's fairness measure), ``worst10``/``best10``
      (mean over the worst/best ``tail`` fraction of clients, at least one:
      the lowest/highest values, or with ``lower_is_better`` (a loss) the
      highest/lowest);
      with ``psi_weights`` also ``psi``: the weighted variance
      ``sum_i p_i (v_i - sum_j p_j v_j)^2`` with ``p`` the normalized
      ``psi_weights`` (FedFDP's fairness measure Psi, eq. 6, with ``p_i``
      proportional to the clients' training-set sizes).

    Raises:
      ValueError: ``tail`` not in (0, 1], or a ``mask`` that is not one flag
        per client.
    """
    check_number("tail", tail, lo=0.0, hi=1.0, lo_open=True)
    if mask is not None:
        check_mask("mask", mask, values.shape[0])
    valid = jnp.isfinite(values)
    if mask is not None:
        valid = valid & (mask > 0)
    v = jnp.where(valid, values, 0.0)
    w = jnp.where(valid, weights.astype(jnp.float32), 0.0)
    n = jnp.sum(valid)
    nf = jnp.maximum(n, 1).astype(jnp.float32)
    mean_w = jnp.sum(w * v) / jnp.maximum(jnp.sum(w), 1e-12)
    mean_u = jnp.sum(v) / nf
    var = jnp.sum(jnp.where(valid, (v - mean_u) ** 2, 0.0)) / nf
    k = jnp.maximum(1, jnp.floor(tail * n)).astype(jnp.int32)
    order = jnp.arange(values.shape[0])
    low = jnp.sort(jnp.where(valid, values, jnp.inf))
    high = -jnp.sort(jnp.where(valid, -values, jnp.inf))
    take = (order < k).astype(jnp.float32)
    low_tail = jnp.sum(jnp.where(take > 0, low, 0.0)) / k
    high_tail = jnp.sum(jnp.where(take > 0, high, 0.0)) / k
    worst, best = (high_tail, low_tail) if lower_is_better else (low_tail, high_tail)
    nan = jnp.float32(jnp.nan)
    extra = {}
    if psi_weights is not None:
        p = jnp.where(valid, psi_weights.astype(jnp.float32), 0.0)
        p = p / jnp.maximum(jnp.sum(p), 1e-12)
        extra["psi"] = jnp.sum(p * (v - jnp.sum(p * v)) ** 2)
    out = {
        "mean": mean_w,
        "mean_unweighted": mean_u,
        "std": jnp.sqrt(var),
        "var": var,
        "worst10": worst,
        "best10": best,
        **extra,
    }
    return {key: jnp.where(n > 0, val, nan) for key, val in out.items()}


def evaluate(
    views: dict[str, ModelView],
    data,
    *,
    splits: tuple[str, ...] = ("train", "val", "test"),
    mask: jax.Array | None = None,
    metrics: tuple[str, ...] = ("accuracy", "loss"),
    per_client: bool = False,
) -> dict[str, jax.Array]:
    """Evaluates every model view on every split; jittable.

    Returns a flat dict ``"{model}/{split}/{metric}/{summary}"`` (summaries of
    :func:`summarize`, ``psi`` weighted by training-set sizes; and, with
    ``per_client=True``, also ``"{model}/{split}/{metric}/per_client"`` arrays).
    ``mask`` restricts the summaries to some clients (e.g. benign ones). A split
    that ``data`` does not have (e.g. ``val``) is skipped.

    Raises:
      ValueError: an unknown split or metric name, or a ``mask`` that is not a
        ``[num_clients]`` 0/1 mask (checked before any work; a traced mask has
        only its shape checked).
    """
    splits = check_eval_args(data, splits=splits, mask=mask, metrics=metrics,
                             per_client=per_client)
    out = {}
    for split_name in splits:
        split = getattr(data, split_name)
        if split is None:
            continue
        for name, view in views.items():
            res = evaluate_split(view, split)
            for metric in metrics:
                summ = summarize(res[metric], res["count"], mask,
                                 psi_weights=data.train.counts,
                                 lower_is_better=metric == "loss")
                for s, val in summ.items():
                    out[f"{name}/{split_name}/{metric}/{s}"] = val
                if per_client:
                    out[f"{name}/{split_name}/{metric}/per_client"] = res[metric]
    return out
