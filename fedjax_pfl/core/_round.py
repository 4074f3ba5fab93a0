"""The fused round: sample, gather, run the one-client kernel over the cohort,
aggregate on the server, scatter the personal states back. One jittable function."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.validation import check_int

from ._clients import (
    client_keys,
    fixed_order_mean,
    fixed_order_means,
    lift,
    lift_sum,
    sample_cohort,
    tree_gather,
    tree_scatter,
)
from ._keys import KeyTag
from ._types import AlgorithmState, ClientResult, PyTree


class EngineConfig:
    """How the round is executed. Every client's own computation does not depend
    on it; the sums over the cohort (the weighted mean of the uploads, the
    metrics' means) are reassociated by the device count and the engine's
    ordering, so results agree to float rounding (about 1e-7 relative a round),
    or bitwise with ``deterministic=True`` (docs/engine.md, "Determinism").

    Args:
      strategy: ``'vmap'`` or ``'map'`` (see :func:`fedjax_pfl.core.lift`);
        ``None`` picks the measured default for the backend.
      map_batch_size: clients per ``lax.map`` step for ``'map'``.
      mesh: optional ``jax.sharding.Mesh`` with a ``'clients'`` axis; the cohort
        axis of the round is then sharded over it. With ``'vmap'`` XLA partitions
        the batched program; with ``'map'`` / ``'unroll'`` every device runs
        its own loop over a share of the cohort (``jax.shard_map``), the shares
        balanced by training-set size (sorted, dealt in snake order), and the
        round reports ``engine/shard_imbalance`` (the largest device's share of
        examples over the mean, minus 1). On a multi-core CPU, devices made
        with ``jax.config.update("jax_num_cpu_devices", cores)`` then train
        different clients on different cores (docs/engine.md). The cohort size
        must be a multiple of the axis size.
      buckets: with ``'vmap'``, sort the cohort by training-set size and run it
        as this many vmapped groups of consecutive sizes. A vmapped loop runs to
        the largest trip count of its batch, so clients whose step counts follow
        their data (epochs) waste less on padding; the round reports
        ``engine/bucket_padding``, the share of the vmapped example-proportional
        work that is padding (0 = none). Results are unchanged (uploads are
        handed to the server in cohort order).
      deterministic: add up the cohort in one fixed order: every client's
        upload, weight and metrics are stacked, copied whole to every device
        and added one client after another in cohort (sorted-id) order inside
        a ``fori_loop`` (:func:`fixed_order_sum`), for the weighted mean and
        the metrics' means; robust aggregators get the whole stack in cohort
        order. The round's results are then bitwise the same for any device
        count and cohort order (per-device shares, buckets) on one backend,
        as far as each client's own numbers are (``map`` with batch 1 and
        ``unroll``: always; under ``vmap`` they may depend on the vmapped batch
        size). Costs memory (the weighted mean's ``[cohort, params]`` uploads
        are stacked, not summed inside the client loop) and time; default off.
        See docs/engine.md, "Determinism".
      unroll: how the local-step loops are compiled (``lax.scan``'s meaning:
        an integer ``>= 1`` of steps per loop trip, ``True`` a straight line,
        ``False`` = 1); ``None``: the backend's measured default
        (:func:`default_unroll`: a straight line on CPU up to 32 steps, a loop
        otherwise). Numbers agree either way up to float rounding; unrolling
        costs compile time. A :class:`LocalConfig` with its own ``unroll``
        keeps it.
      batch_ladder: Poisson batches (DP-SGD, :mod:`fedjax_pfl.privacy`) have a
        static cap sized for the largest client, mostly padding for the
        others. With the ladder each private step computes on the smallest of
        a few static sizes that holds its sampled rows (the cap, then down by
        factors of sqrt 2: :func:`fedjax_pfl.privacy.batch_ladder`), picked by
        ``lax.switch``. Same numbers up to float rounding (the rows left out
        are padding); one gradient program per rung (compile time). It pays
        when clients run one at a time; under ``vmap`` every rung would run,
        so ``None`` (default) turns it on for ``'unroll'`` and for ``'map'``
        with one client a step, off otherwise and in ``sweep`` (whose runs may
        draw different batches; ``True`` forces it there). Under ``'unroll'``
        the rungs compile once per client: for a small model (0.1 s rounds)
        ``False`` is faster in runs under about 1,000-2,000 rounds.

    An algorithm reads its engine when its round is traced (``simulate``,
    ``sweep`` and ``evaluate_state`` take ``engine=``; elsewhere, trace under
    :func:`execution`), so one algorithm runs under any engine.
    """

    def __init__(self, strategy: str | None = None, map_batch_size: int | None = None,
                 mesh: jax.sharding.Mesh | None = None, buckets: int | None = None,
                 deterministic: bool = False, unroll: int | bool | None = None,
                 batch_ladder: bool | None = None):
        from ._clients import STRATEGIES, default_strategy

        if strategy is None:
            strategy, default_b = default_strategy()
            map_batch_size = map_batch_size or default_b
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy: must be one of {STRATEGIES}, got {strategy!r}")
        if map_batch_size is not None and (
            not isinstance(map_batch_size, int) or map_batch_size < 1
        ):
            raise ValueError(
                f"map_batch_size: must be a positive integer, got {map_batch_size!r}"
            )
        if mesh is not None and "clients" not in mesh.axis_names:
            raise ValueError(
                f"mesh: needs an axis named 'clients', got axes {mesh.axis_names}"
            )
        if buckets is not None and (not isinstance(buckets, int) or buckets < 1):
            raise ValueError(f"buckets: must be a positive integer, got {buckets!r}")
        if buckets is not None and strategy != "vmap":
            raise ValueError(f"buckets: only applies to strategy='vmap' (the others "
                             f"run each client's own steps), got {strategy!r}")
        if not isinstance(deterministic, bool):
            raise ValueError(f"deterministic: must be True or False, got "
                             f"{deterministic!r}")
        check_unroll(unroll)
        if batch_ladder is not None and not isinstance(batch_ladder, bool):
            raise ValueError(f"batch_ladder: must be True, False or None, got "
                             f"{batch_ladder!r}")
        self.batch_ladder = batch_ladder
        self.strategy, self.map_batch_size, self.mesh = strategy, map_batch_size, mesh
        self.buckets, self.deterministic = buckets, deterministic
        self.unroll = None if unroll is None else (
            bool(unroll) if isinstance(unroll, (bool, np.bool_)) else int(unroll))

    def __repr__(self):
        return (f"EngineConfig(strategy={self.strategy!r}, "
                f"map_batch_size={self.map_batch_size}, mesh={self.mesh}, "
                f"buckets={self.buckets}, deterministic={self.deterministic}, "
                f"unroll={self.unroll}, batch_ladder={self.batch_ladder})")

    @property
    def uses_batch_ladder(self) -> bool:
        """Whether private steps run on :attr:`batch_ladder`'s rungs: as set,
        else when clients run one at a time (``'unroll'``, ``'map'`` with one
        client a step)."""
        if self.batch_ladder is not None:
            return self.batch_ladder
        return self.strategy == "unroll" or (
            self.strategy == "map" and (self.map_batch_size or 1) == 1)

    @property
    def shards_loop(self) -> bool:
        """Whether each device runs its own client loop (``shard_map``)."""
        return self.mesh is not None and self.strategy != "vmap"

    def lift(self, fn: Callable, *, reduce: bool = False,
             shared: PyTree = None) -> Callable:
        """``fn`` lifted over the cohort axis by this engine (:func:`lift`, or
        :func:`lift_sum` with ``reduce``), in ``buckets`` consecutive groups, or
        one loop per device of the mesh (:attr:`shards_loop`). With ``shared``,
        ``fn(shared, *per_client)``: values every client reads (server state,
        data), passed to each device whole."""
        lifter = lift_sum if reduce else lift
        if self.shards_loop:
            return self._shard_mapped(lifter, fn, reduce, shared)
        one = fn if shared is None else functools.partial(fn, shared)
        lifted = lifter(one, self.strategy, self.map_batch_size)
        if not self.buckets or self.buckets == 1:
            return lifted

        def run(*args):
            n = jax.tree.leaves(args)[0].shape[0]
            k = min(self.buckets, n)
            sizes = [n // k + (i < n % k) for i in range(k)]
            starts = np.cumsum([0] + sizes[:-1])
            outs = [lifted(*jax.tree.map(lambda a, s=s, z=z: a[s:s + z], args))
                    for s, z in zip(starts, sizes)]
            per = [o[0] for o in outs] if reduce else outs
            per = jax.tree.map(lambda *p: jnp.concatenate(p), *per)
            if not reduce:
                return per
            return per, jax.tree.map(lambda *a: sum(a[1:], a[0]),
                                     *[o[1] for o in outs])

        return run

    def _shard_mapped(self, lifter, fn, reduce: bool, shared) -> Callable:
        from jax.sharding import PartitionSpec as P

        def local(sh, *args):
            one = fn if shared is None else functools.partial(fn, sh)
            out = lifter(one, self.strategy, self.map_batch_size)(*args)
            if not reduce:
                return out
            per, acc = out
            return per, jax.lax.psum(acc, "clients")

        def run(*args):
            n = jax.tree.leaves(args)[0].shape[0]
            d = self.mesh.shape["clients"]
            if n % d:
                raise ValueError(
                    f"cohort_size: {n} clients cannot be split evenly over the "
                    f"mesh's {d} 'clients' devices; use a multiple of {d}")
            # check_vma=False: the shared values are replicated, and gradients
            # with respect to them must stay per client (no implicit psum)
            specs = (P(),) + (P("clients"),) * len(args)
            return jax.shard_map(local, mesh=self.mesh, in_specs=specs,
                                 out_specs=(P("clients"), P()) if reduce
                                 else P("clients"), check_vma=False)(shared, *args)

        return run

    def cohort_order(self, counts: jax.Array) -> tuple[jax.Array, dict] | None:
        """How this engine orders a cohort with training counts ``counts``:
        ``(order, metrics)``, or None to keep it. Buckets: sorted by size, with
        ``engine/bucket_padding``, the padded share of the bucketed vmap's
        example-proportional work. A sharded loop: sorted by decreasing size and
        dealt to the devices in snake order (device ``k`` gets positions
        ``k n/d .. (k+1) n/d - 1``), with ``engine/shard_imbalance``."""
        c = counts.astype(jnp.float32)
        n = c.shape[0]
        if self.shards_loop:
            d = self.mesh.shape["clients"]
            if n % d:
                return None  # refused by lift with a clear error
            desc = jnp.argsort(-c, stable=True)
            j = np.arange(n)
            rnd, t = j // d, j % d
            dev = np.where(rnd % 2 == 0, t, d - 1 - t)
            order = jnp.zeros((n,), jnp.int32).at[dev * (n // d) + rnd].set(desc)
            loads = jnp.sum(c[order].reshape(d, n // d), axis=1)
            imbalance = jnp.max(loads) / jnp.maximum(jnp.mean(loads), 1e-12) - 1.0
            return order, {"engine/shard_imbalance": imbalance}
        if not self.buckets:
            return None
        order = jnp.argsort(c, stable=True)
        c = c[order]
        k = min(self.buckets, n)
        sizes = [n // k + (i < n % k) for i in range(k)]
        ends = np.cumsum(sizes) - 1  # sorted: a bucket's largest is its last
        padded = sum(z * c[e] for z, e in zip(sizes, ends))
        return order, {"engine/bucket_padding":
                       1.0 - jnp.sum(c) / jnp.maximum(padded, 1.0)}

    def shard_cohort(self, tree: PyTree) -> PyTree:
        """Constrains the leading (cohort) axis to the mesh's 'clients' axis."""
        if self.mesh is None:
            return tree
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        def constrain(a):
            spec = P("clients", *([None] * (a.ndim - 1)))
            return jax.lax.with_sharding_constraint(a, NamedSharding(self.mesh, spec))

        return jax.tree.map(constrain, tree)

    def replicate(self, tree: PyTree) -> PyTree:
        """Constrains every leaf to be whole on every device of the mesh (an
        all-gather: data movement only), so that what reads it runs unsplit."""
        if self.mesh is None:
            return tree
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        whole = NamedSharding(self.mesh, P())
        return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, whole),
                            tree)


def check_unroll(unroll) -> None:
    """``unroll``: ``None`` (the backend's default), a bool (``lax.scan``'s
    meaning: ``True`` fully unrolled) or an integer ``>= 1``."""
    if unroll is not None and not isinstance(unroll, (bool, np.bool_)):
        check_int("unroll", unroll, lo=1)


_ENGINE: contextvars.ContextVar[EngineConfig | None] = contextvars.ContextVar(
    "fedjax_pfl_engine", default=None)


def check_engine(engine) -> None:
    """``engine``: ``None`` or an :class:`EngineConfig`."""
    if engine is not None and not isinstance(engine, EngineConfig):
        raise ValueError(f"engine: must be an EngineConfig or None, got {engine!r}")


@contextlib.contextmanager
def execution(engine: EngineConfig | None) -> Iterator[EngineConfig]:
    """Runs the block under ``engine``: every round, evaluation or finetuning
    TRACED inside it (``jax.jit(alg.round_step)(...)`` called in the block)
    lifts its clients and compiles its local loops as ``engine`` says.
    ``None`` keeps the engine in force (the outer block's, else the default
    ``EngineConfig()``). ``simulate``, ``sweep`` and ``evaluate_state`` take
    ``engine=`` and do this themselves.

    A function jitted once keeps the engine of its first trace: re-jit (a new
    ``jax.jit`` of a new closure) to run the same algorithm under another.
    """
    check_engine(engine)
    if engine is None:
        yield current_engine()
        return
    token = _ENGINE.set(engine)
    try:
        yield engine
    finally:
        _ENGINE.reset(token)


def current_engine() -> EngineConfig:
    """The engine in force (:func:`execution`), else ``EngineConfig()`` (the
    backend's defaults). Algorithms call it while their round is traced, never
    when they are built."""
    engine = _ENGINE.get()
    return EngineConfig() if engine is None else engine


def client_mesh(devices=None) -> jax.sharding.Mesh:
    """A 1-D mesh named ``clients`` over ``devices`` (default: every device of
    every process, ``jax.devices()``), for ``EngineConfig(mesh=...)``.

    Its axis type is ``Auto``, so unsharded inputs are accepted. In a
    multi-process run (after ``jax.distributed.initialize()``), every process
    builds the same mesh and runs the same program on the same data
    (docs/engine.md, "Many processes")."""
    devices = jax.devices() if devices is None else list(devices)
    return jax.sharding.Mesh(np.asarray(devices), ("clients",),
                             axis_types=(jax.sharding.AxisType.Auto,))


ClientFn = Callable[[PyTree, PyTree, jax.Array, jax.Array, Any], ClientResult]
ServerFn = Callable[..., tuple[PyTree, dict]]


def federated_round(
    client_fn: ClientFn,
    server_fn: ServerFn,
    *,
    cohort_size: int,
    cohort: str,
    engine: EngineConfig | None = None,
    linear_weights: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
) -> Callable[[AlgorithmState, Any, jax.Array], tuple[AlgorithmState, dict]]:
    """Builds ``round_step(state, data, key)`` from a one-client kernel.

    Args:
      client_fn: ``(server_state, client_state, client_id, key, data) ->
        ClientResult`` for ONE client; lifted over the cohort by ``engine``.
      server_fn: ``(server_state, updates, weights, mask, client_metrics, key) ->
        (server_state, server_metrics)`` with stacked ``[cohort, ...]`` inputs.
      cohort_size: clients per round.
      cohort: sampling mode (see :func:`sample_cohort`).
      engine: execution strategy (default: :func:`current_engine` when the
        round is traced).
      linear_weights: set when the server's aggregator is a weighted mean
        (``Aggregator.linear_weights``): the cohort's uploads are then averaged
        inside the client loop (never stacked) and ``server_fn`` receives that
        mean as a single upload with weight 1 (same result, O(params) memory).

    Keys: the round key is ``fold_in(key, round)``; client ``c`` trains with
    ``fold_in(fold_in(round_key, KeyTag.CLIENT), data.key_ids[c])``, so results do
    not depend on the cohort's order, its size, the clients' positions or the
    number of devices.
    """

    check_engine(engine)
    fixed_engine = engine

    def round_step(state: AlgorithmState, data, key: jax.Array):
        engine = fixed_engine or current_engine()
        rkey = jax.random.fold_in(key, state.round)
        ids = round_cohort(data, state.round, key, cohort_size, cohort)
        ordering = engine.cohort_order(data.train.counts[ids])
        if ordering is not None:  # buckets or per-device shares of similar size
            ids = ids[ordering[0]]
        keys = client_keys(jax.random.fold_in(rkey, KeyTag.CLIENT), data.key_ids[ids])
        cohort_states = tree_gather(state.clients, ids)
        cohort_states, ids_s, keys_s = engine.shard_cohort((cohort_states, ids, keys))

        def one(shared, client_state, cid, ckey):
            return client_fn(shared[0], client_state, cid, ckey, shared[1])

        shared = (state.server, data)
        det = engine.deterministic

        def scaled(r: ClientResult):  # the weighted mean's summand c_k u_k
            c = linear_weights(r.weight, jnp.float32(1.0))
            up = jax.tree.map(lambda u: c.astype(u.dtype) * u, r.update)
            bad = _count_nonfinite_rows(jax.tree.map(lambda u: u[None], r.update))
            return up, c, bad

        if det:  # stacked, then every sum over the cohort in cohort order
            (client_states, client_metrics, updates, weights, nonfinite,
             metrics) = _fixed_order_round(
                engine, one, shared, (cohort_states, ids_s, keys_s), ordering,
                None if linear_weights is None else scaled)
        elif linear_weights is not None:  # the mean summed inside the client loop

            def one_summed(shared, client_state, cid, ckey):
                r = one(shared, client_state, cid, ckey)
                return r._replace(update=()), scaled(r)

            res, (total, c_sum, nonfinite) = engine.lift(
                one_summed, reduce=True, shared=shared)(cohort_states, ids_s, keys_s)
            updates = jax.tree.map(
                lambda a: (a / jnp.maximum(c_sum, 1e-12).astype(a.dtype))[None], total
            )
            weights = jnp.ones((1,), jnp.float32)
            client_states, client_metrics = res.client_state, res.metrics
        else:  # stacked uploads for the aggregator, in cohort order
            res: ClientResult = engine.lift(one, shared=shared)(cohort_states, ids_s,
                                                                keys_s)
            if ordering is not None:  # back to cohort (sorted-id) order
                inv = jnp.argsort(ordering[0])
                res = jax.tree.map(lambda a: a[inv], res)
                ids = ids[inv]
            updates, weights = res.update, res.weight
            nonfinite = _count_nonfinite_rows(res.update)
            client_states, client_metrics = res.client_state, res.metrics
        if not det:  # nanmean: a client that took no step (drop_last) reports NaN
            metrics = {f"train/{k}": jnp.nanmean(v) for k, v in client_metrics.items()}
        mask = jnp.ones_like(weights)
        server, server_metrics = server_fn(
            engine.replicate(state.server) if det else state.server, updates,
            weights, mask, client_metrics, jax.random.fold_in(rkey, KeyTag.SERVER),
        )
        if det:  # whole on every device, as its inputs
            server, server_metrics = engine.replicate((server, server_metrics))
        clients = tree_scatter(state.clients, ids, client_states)
        metrics.update(server_metrics)
        metrics["nonfinite_clients"] = nonfinite
        if ordering is not None:
            metrics.update(ordering[1])
        return AlgorithmState(server, clients, state.round + 1), metrics

    return round_step


def round_cohort(data, round_: jax.Array, key: jax.Array, cohort_size: int,
                 cohort: str) -> jax.Array:
    """The cohort of round ``round_`` of a run with key ``key`` (as the round
    draws it)."""
    rkey = jax.random.fold_in(jax.random.fold_in(key, round_), KeyTag.COHORT)
    return sample_cohort(rkey, data.train.counts, cohort_size, cohort)


def participation_counts(data, num_rounds: int, key: jax.Array, cohort_size: int,
                         cohort: str, first_round: int = 0) -> np.ndarray:
    """How many of rounds ``first_round .. first_round + num_rounds - 1`` each
    client took part in, for a run whose ``round_step`` got ``key`` (in
    :func:`fedjax_pfl.simulate`, the second half of ``split(key)``)."""
    rounds = jnp.arange(first_round, first_round + num_rounds)
    ids = jax.jit(jax.vmap(lambda r: round_cohort(data, r, key, cohort_size, cohort)))(
        rounds)
    return np.bincount(np.asarray(ids).ravel(), minlength=data.num_clients)


def _fixed_order_round(engine: EngineConfig, one: Callable, shared: PyTree,
                       args: tuple, ordering, scaled: Callable | None) -> tuple:
    """The cohort's clients under ``EngineConfig(deterministic=True)``: ``one``
    lifted by ``engine`` over ``args`` (in the engine's order), every output
    that is summed over the cohort stacked and made whole on every device (an
    all-gather: no arithmetic), then read in cohort (sorted-id) order and added
    by ``fori_loop``s (:func:`fixed_order_sum`). ``scaled`` (``r -> (c u, c,
    nonfinite)``) is given for a weighted mean (``linear_weights``).

    Returns the clients' new states (engine order, for the scatter), their
    metrics (cohort order, whole), the server's ``updates`` and ``weights``
    (the mean as one upload of weight 1, or the stacked uploads), the
    non-finite count and the round's ``train/`` metrics."""
    if scaled is None:
        one_client = one
    else:

        def one_client(shared, client_state, cid, ckey):
            r = one(shared, client_state, cid, ckey)
            _, c, bad = scaled(r)  # (XLA drops the unused product)
            return r._replace(update=(r.update, bad), weight=c)

    res: ClientResult = engine.lift(one_client, shared=shared)(*args)
    update, weight, client_metrics = engine.replicate(
        (res.update, res.weight, res.metrics))
    rows = None if ordering is None else jnp.argsort(ordering[0])
    if rows is not None:  # small: reordered here (the uploads inside the loop)
        weight, client_metrics = jax.tree.map(lambda a: a[rows],
                                              (weight, client_metrics))
    if scaled is None:  # the aggregator gets the whole stack in cohort order
        if rows is not None:
            update = jax.tree.map(lambda a: a[rows], update)
        _, means = fixed_order_means((), client_metrics)
        updates, weights = update, weight
        nonfinite = _count_nonfinite_rows(update)
    else:
        (stacked, bad), c = update, weight
        c_sum, means = fixed_order_means(c, client_metrics)
        mean = fixed_order_mean(stacked, c, jnp.maximum(c_sum, 1e-12), rows)
        updates = jax.tree.map(lambda a: a[None], mean)
        weights = jnp.ones((1,), jnp.float32)
        nonfinite = jnp.sum(bad)  # integers: exact in any order
    metrics = {f"train/{k}": v for k, v in means.items()}
    return res.client_state, client_metrics, updates, weights, nonfinite, metrics


def _count_nonfinite_rows(tree: PyTree) -> jax.Array:
    """Number of cohort members whose upload has a NaN/inf (via row norms: a
    per-row reduction, fast on every backend)."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.zeros((), jnp.int32)
    sq = sum(jnp.sum(jnp.square(u.reshape(u.shape[0], -1)), axis=1) for u in leaves)
    return jnp.sum(~jnp.isfinite(sq)).astype(jnp.int32)
