"""Client-axis operations: cohort sampling, gather/scatter, lifting a kernel."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from fedjax_pfl.validation import check_nonnegative as check_nonnegative
from fedjax_pfl.validation import check_positive as check_positive
from fedjax_pfl.validation import is_concrete as is_concrete

from ._types import PyTree

COHORT_MODES = ("uniform", "size_weighted", "full")
STRATEGIES = ("vmap", "map", "unroll")


def tree_gather(tree: PyTree, ids: jax.Array) -> PyTree:
    """Rows ``ids`` of every leaf (the cohort's slice of stacked client state)."""
    return jax.tree.map(lambda a: a[ids], tree)


def tree_scatter(tree: PyTree, ids: jax.Array, values: PyTree) -> PyTree:
    """Writes ``values`` back into rows ``ids`` of every leaf (ids are unique)."""
    return jax.tree.map(lambda a, v: a.at[ids].set(v), tree, values)


def tree_stack(trees: list[PyTree]) -> PyTree:
    return jax.tree.map(lambda *a: jnp.stack(a), *trees)


def tree_broadcast(tree: PyTree, n: int) -> PyTree:
    """Stacks ``n`` copies of ``tree`` along a new leading client axis."""
    return jax.tree.map(lambda a: jnp.broadcast_to(a, (n, *jnp.shape(a))), tree)


def sample_cohort(
    key: jax.Array, counts: jax.Array, cohort_size: int, mode: str
) -> jax.Array:
    """Sorted ids of this round's cohort, ``[cohort_size]`` int32.

    Modes:
      * ``uniform``: ``cohort_size`` clients uniformly without replacement.
      * ``size_weighted``: without replacement with probability proportional to the
        number of training examples (Gumbel top-k; equal in distribution to the
        Ditto code's sequential ``np.random.choice(p=n_k/sum n)``).
      * ``full``: every client (``cohort_size`` must equal the number of clients).
    """
    num_clients = counts.shape[0]
    if mode == "full":
        return jnp.arange(num_clients, dtype=jnp.int32)
    if mode == "uniform":
        logits = jnp.zeros((num_clients,))
    elif mode == "size_weighted":
        logits = jnp.log(counts.astype(jnp.float32))
    else:
        raise ValueError(f"cohort: must be one of {COHORT_MODES}, got {mode!r}")
    g = logits + jax.random.gumbel(key, (num_clients,))
    _, ids = jax.lax.top_k(g, cohort_size)
    return jnp.sort(ids).astype(jnp.int32)


def lift(
    fn: Callable, strategy: str = "vmap", map_batch_size: int | None = None
) -> Callable:
    """Lifts a one-client function over a leading cohort axis of its arguments.

    ``fn(*per_client_args)``; every argument of the lifted function carries a
    leading cohort axis. Shared values must be closed over.

    Strategies (same numbers, different schedules):
      * ``vmap``: one batched program (best on GPU/TPU).
      * ``map``: a loop over clients inside the program, ``map_batch_size`` clients
        (vmapped) at a time (``1`` = sequential; bounded memory; best on CPU). See
        :func:`map_into_buffers`.
      * ``unroll``: the clients one after another as straight-line code, no loop
        (program size and compile time grow with the cohort). For small cohorts
        of models whose gradients XLA:CPU runs slowly inside a loop body, e.g.
        convolutions that ``models.conv_general_dilated`` does not cover
        (docs/engine.md).
    """
    if strategy == "vmap":
        return jax.vmap(fn)
    if strategy == "map":
        return lambda *args: map_into_buffers(fn, args, map_batch_size or 1)
    if strategy == "unroll":
        return lambda *args: _unrolled(fn, args, reduce=False)
    raise ValueError(f"strategy: must be one of {STRATEGIES}, got {strategy!r}")


def lift_sum(
    fn: Callable, strategy: str = "vmap", map_batch_size: int | None = None
) -> Callable:
    """Like :func:`lift` for ``fn`` returning ``(per_client, summand)``: returns
    ``(stacked per_client, sum of summands over clients)``. With ``map`` the sum is
    carried through the client loop, so summands are never stacked."""
    if strategy == "vmap":

        def summed(*args):
            per, add = jax.vmap(fn)(*args)
            return per, jax.tree.map(lambda a: jnp.tensordot(
                jnp.ones(a.shape[0], a.dtype), a, axes=1), add)

        return summed
    if strategy == "map":
        return lambda *args: map_into_buffers(fn, args, map_batch_size or 1,
                                              reduce=True)
    if strategy == "unroll":
        return lambda *args: _unrolled(fn, args, reduce=True)
    raise ValueError(f"strategy: must be one of {STRATEGIES}, got {strategy!r}")


def _unrolled(fn: Callable, args: tuple, *, reduce: bool) -> PyTree:
    """``fn`` on each client in turn, unrolled; summands are added in client order
    from zero, as :func:`map_into_buffers` with batch size 1 does."""
    n = jax.tree.leaves(args)[0].shape[0]
    pers, acc = [], None
    for i in range(n):
        out = fn(*jax.tree.map(lambda a, i=i: a[i], args))
        per, add = out if reduce else (out, None)
        pers.append(per)
        if reduce:
            acc = jax.tree.map(jnp.add, jax.tree.map(jnp.zeros_like, add)
                               if acc is None else acc, add)
    stacked = jax.tree.map(lambda *p: jnp.stack(p), *pers)
    return (stacked, acc) if reduce else stacked


def map_into_buffers(
    fn: Callable, args: tuple, batch_size: int = 1, *, reduce: bool = False
) -> PyTree:
    """``jax.lax.map(fn, args, batch_size=...)`` that writes into preallocated
    output buffers carried by a ``fori_loop``.

    Same result as ``lax.map``; the outputs are written with a
    dynamic-update-slice into buffers carried by the loop, which XLA updates in
    place.

    With ``reduce=True``, ``fn`` returns ``(per_client, summand)`` and the result is
    ``(stacked per_client, sum of summands)``, the sum carried through the loop.
    """
    n = jax.tree.leaves(args)[0].shape[0]
    b = min(batch_size, n)
    num_chunks, rem = divmod(n, b)
    chunk_fn = jax.vmap(fn)

    def chunk_sum(out):  # sums a chunk's summands (tensordot: see docs/engine.md)
        if not reduce:
            return out, None
        per, add = out
        return per, jax.tree.map(
            lambda a: jnp.tensordot(jnp.ones(a.shape[0], a.dtype), a, axes=1), add)

    head = jax.tree.map(lambda a: a[:b], args)
    per_shapes, add_shapes = jax.eval_shape(lambda *a: chunk_sum(chunk_fn(*a)), *head)
    bufs = jax.tree.map(lambda s: jnp.zeros((n, *s.shape[1:]), s.dtype), per_shapes)
    acc = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), add_shapes)

    def body(i, carry):
        bufs, acc = carry
        start = i * b
        if b == 1:  # no batch dimension at all: plain (non-batched) matmuls
            one = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(
                a, i, keepdims=False), args)
            per, add = fn(*one) if reduce else (fn(*one), None)
            per = jax.tree.map(lambda o: o[None], per)
        else:
            chunk = jax.tree.map(
                lambda a: jax.lax.dynamic_slice_in_dim(a, start, b), args)
            per, add = chunk_sum(chunk_fn(*chunk))
        bufs = jax.tree.map(
            lambda buf, o: jax.lax.dynamic_update_slice_in_dim(buf, o, start, 0),
            bufs, per)
        return bufs, jax.tree.map(jnp.add, acc, add)

    bufs, acc = jax.lax.fori_loop(0, num_chunks, body, (bufs, acc))
    if rem:
        per, add = chunk_sum(
            chunk_fn(*jax.tree.map(lambda a: a[num_chunks * b:], args)))
        bufs = jax.tree.map(lambda buf, t: buf.at[num_chunks * b:].set(t), bufs, per)
        acc = jax.tree.map(jnp.add, acc, add)
    return (bufs, acc) if reduce else bufs


def fixed_order_sum(tree: PyTree) -> PyTree:
    """Sums every leaf of ``tree`` over its leading axis in index order,
    ``((x[0] + x[1]) + x[2]) + ...``, one row per step of a loop.

    The additions and their order depend only on the leading size. The rows
    are read from memory and the sums written to it by a ``fori_loop``, so XLA
    cannot fuse them with the ops that produce or use them (a fused
    ``a * b + c`` may become one FMA, rounded once), split them over devices or
    vectorize them another way: the result is bitwise the same in every
    program of these shapes on one backend (``EngineConfig(deterministic=True)``).
    """
    first = jax.tree.map(lambda a: a[0], tree)

    def body(i, acc):
        return jax.tree.map(lambda s, a: s + jax.lax.dynamic_index_in_dim(
            a, i, keepdims=False), acc, tree)

    return jax.lax.fori_loop(1, jax.tree.leaves(tree)[0].shape[0], body, first)


def fixed_order_means(sums: PyTree, metrics: dict) -> tuple[PyTree, dict]:
    """The cohort sums of ``sums``' leaves and the NaN-skipping means of the
    per-client ``metrics`` (as ``jnp.nanmean``: a client that took no step
    reports a NaN loss), all added in index order by one
    :func:`fixed_order_sum` loop."""
    flat = {k: v.reshape(v.shape[0], -1) for k, v in metrics.items()}
    ok = {k: ~jnp.isnan(v) for k, v in flat.items()}
    vals = {k: jnp.where(ok[k], v, jnp.zeros((), v.dtype)) for k, v in flat.items()}
    cnts = {k: o.astype(flat[k].dtype) for k, o in ok.items()}
    if not jax.tree.leaves((sums, vals)):
        return sums, {}
    sums, vals, cnts = fixed_order_sum((sums, vals, cnts))
    return sums, {k: jnp.sum(vals[k]) / jnp.sum(cnts[k]) for k in flat}


def fixed_order_mean(updates: PyTree, c: jax.Array, c_sum: jax.Array,
                      rows: jax.Array | None = None) -> PyTree:
    """``sum_k (c_k / c_sum) u_k``, added in the order of ``c`` inside one
    ``fori_loop`` (see :func:`fixed_order_sum`); client ``k``'s upload is row
    ``rows[k]`` of the stacked ``updates`` (row ``k`` without ``rows``). The
    scaling is done in the loop too: a mean divided outside it would be
    rewritten by XLA in some programs and not others (``x / c`` as
    ``x * (1 / c)``, or fused into the server's update as an FMA)."""

    def body(i, acc):
        p = c[i] / c_sum
        r = i if rows is None else rows[i]
        return jax.tree.map(lambda s, a: s + p.astype(a.dtype) * jax.lax.
                            dynamic_index_in_dim(a, r, keepdims=False), acc, updates)

    zero = jax.tree.map(lambda a: jnp.zeros(a.shape[1:], a.dtype), updates)
    return jax.lax.fori_loop(0, c.shape[0], body, zero)


def default_strategy(backend: str | None = None) -> tuple[str, int | None]:
    """The client-parallel strategy chosen by measurement for a backend.

    See docs/results/throughput.md: on XLA:CPU batched (vmapped) matmuls are slower
    than a sequential map over clients; on GPU/TPU vmap wins.
    """
    backend = backend or jax.default_backend()
    if backend == "cpu":
        return "map", 1
    return "vmap", None


def client_keys(key: jax.Array, ids: jax.Array) -> jax.Array:
    """Per-client keys ``fold_in(key, id)``: independent of cohort order/devices."""
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(ids)


