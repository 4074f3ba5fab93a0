"""Per-client evaluation of shared or personal models, and fairness summaries."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_pfl.core._types import ModelView
from fedjax_pfl.data._federated import Split
from fedjax_pfl.models._model import Model


def _per_example(model: Model, params, x, y):
    out = model.apply(params, x)
    return model.loss(out, y), model.metric(out, y)


def evaluate_split(
    view: ModelView, split: Split, *, chunk_size: int = 512, row_chunk: int = 64
) -> dict[str, jax.Array]:
    """Per-client mean loss and accuracy on one split, all clients in one call.

    A shared model runs over all rows in chunks and the results are summed per
    client (``segment_sum``); personal models run client by client over each
    client's own rows in chunks of ``row_chunk`` (the last one masked), never
    padded to the split's largest client.

    Returns:
      ``{'loss': [C], 'accuracy': [C], 'count': [C]}``; clients with no rows get
      NaN loss/accuracy.
    """
    model = view.model
    counts = split.counts
    num_clients = split.num_clients
    if not view.per_client:
        n = split.num_examples
        pad = (-n) % chunk_size
        x = jnp.pad(split.x, [(0, pad)] + [(0, 0)] * (split.x.ndim - 1))
        y = jnp.pad(split.y, [(0, pad)] + [(0, 0)] * (split.y.ndim - 1))
        shape = (-1, chunk_size)
        xc = x.reshape(shape + x.shape[1:])
        yc = y.reshape(shape + y.shape[1:])
        loss, score = jax.lax.map(
            lambda xy: _per_example(model, view.params, *xy), (xc, yc)
        )
        loss, score = loss.reshape(-1)[:n], score.reshape(-1)[:n]
        owner = split.client_of_row
        loss_sum = jax.ops.segment_sum(loss, owner, num_clients)
        score_sum = jax.ops.segment_sum(score, owner, num_clients)
    else:
        # Each client's rows in fixed chunks of ``b``, as many as the client needs
        # (a dynamic trip count): O(total rows + clients * b) work, not
        # O(clients * largest client) (12x less for Ditto's FMNIST test split).
        b = max(1, min(split.max_count, row_chunk))
        ar = jnp.arange(b)

        def one(params, offset, count):
            def body(j, acc):
                idx = j * b + ar
                rows = offset + jnp.minimum(idx, jnp.maximum(count - 1, 0))
                mask = (idx < count).astype(jnp.float32)
                loss, score = _per_example(model, params, split.x[rows], split.y[rows])
                return acc[0] + jnp.sum(loss * mask), acc[1] + jnp.sum(score * mask)

            zero = jnp.zeros((), jnp.float32)
            return jax.lax.fori_loop(0, (count + b - 1) // b, body, (zero, zero))

        loss_sum, score_sum = jax.lax.map(
            lambda a: one(*a),
            (view.params, split.offsets, counts),
            batch_size=max(1, min(num_clients, chunk_size // b)),
        )
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
) -> dict[str, jax.Array]:
    """Fairness/robustness summaries of a per-client metric over a client mask.

    Clients with ``mask == 0`` or a NaN value (no examples) are ignored.

    Returns:
      ``mean`` (weighted by ``weights``, e.g. test-set sizes: the Ditto code's
      'benign test accu'), ``mean_unweighted``, ``std`` and ``var`` (ddof=0,
      across clients; the Ditto paper's fairness measure), ``worst10``/``best10``
      (mean of the lowest/highest ``tail`` fraction of clients, at least one);
      with ``psi_weights`` also ``psi``: the weighted variance
      ``sum_i p_i (v_i - sum_j p_j v_j)^2`` with ``p`` the normalized
      ``psi_weights`` (FedFDP's fairness measure Psi, eq. 6, with ``p_i``
      proportional to the clients' training-set sizes).
    """
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
    worst = jnp.sum(jnp.where(take > 0, low, 0.0)) / k
    best = jnp.sum(jnp.where(take > 0, high, 0.0)) / k
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
    ``mask`` restricts the summaries to some clients (e.g. benign ones).
    """
    out = {}
    for split_name in splits:
        split = getattr(data, split_name)
        if split is None:
            continue
        for name, view in views.items():
            res = evaluate_split(view, split)
            for metric in metrics:
                summ = summarize(res[metric], res["count"], mask,
                                 psi_weights=data.train.counts)
                for s, val in summ.items():
                    out[f"{name}/{split_name}/{metric}/{s}"] = val
                if per_client:
                    out[f"{name}/{split_name}/{metric}/per_client"] = res[metric]
    return out
