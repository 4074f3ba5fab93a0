"""Drivers: ``simulate`` (rounds as one lax.scan between evaluations) and
``sweep`` (a whole simulation vmapped over float hyperparameters)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._types import Algorithm, AlgorithmState

EVAL_TAG = 7  # sub-key tag for evaluation-time randomness (e.g. finetuning)


class SimulationResult(NamedTuple):
    """Final state and the metrics history (one dict per evaluation)."""

    state: AlgorithmState
    history: list[dict[str, Any]]


def _validate_run(num_rounds, eval_every, key) -> int:
    if not isinstance(num_rounds, (int, np.integer)) or num_rounds < 1:
        raise ValueError(f"num_rounds: must be a positive integer, got {num_rounds!r}")
    if eval_every is None:
        eval_every = num_rounds
    if not isinstance(eval_every, (int, np.integer)) or eval_every < 1:
        raise ValueError(f"eval_every: must be a positive integer, got {eval_every!r}")
    if not (isinstance(key, jax.Array) and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)):
        raise ValueError(
            "key: must be a typed PRNG key from jax.random.key(seed), "
            f"got {type(key).__name__}"
        )
    return int(eval_every)


def _chunk_lengths(num_rounds: int, eval_every: int) -> list[int]:
    full, rest = divmod(num_rounds, eval_every)
    return [eval_every] * full + ([rest] if rest else [])


def run_rounds(algorithm: Algorithm, state, data, key, num_rounds: int):
    """``num_rounds`` rounds as one ``lax.scan``; returns the state and the
    per-round metrics averaged over the chunk."""

    def body(s, _):
        return algorithm.round_step(s, data, key)

    state, metrics = jax.lax.scan(body, state, None, length=num_rounds)
    return state, jax.tree.map(lambda m: jnp.mean(m, axis=0), metrics)


def _evaluate(algorithm, state, data, key, eval_kwargs):
    from fedjax_pfl.metrics._eval import evaluate

    ekey = jax.random.fold_in(jax.random.fold_in(key, EVAL_TAG), state.round)
    views = algorithm.eval_models(state, data, ekey)
    return evaluate(views, data, **eval_kwargs)


def _row(round_, eval_metrics, train_metrics, extra=None) -> dict[str, Any]:
    row: dict[str, Any] = {"round": int(round_)}
    for d in (train_metrics or {}), eval_metrics:
        for k, v in d.items():
            a = np.asarray(v)
            row[k] = a.tolist() if a.ndim else (float(a) if a.dtype.kind == "f" else int(a))
    if extra:
        row.update(extra)
    return row


def simulate(
    algorithm: Algorithm,
    data,
    *,
    num_rounds: int,
    eval_every: int | None = None,
    key: jax.Array,
    eval_mask: jax.Array | None = None,
    splits: Sequence[str] = ("train", "test"),
    progress: bool = True,
    jsonl_path: str | None = None,
    state: AlgorithmState | None = None,
    callback: Callable[[AlgorithmState, dict], None] | None = None,
    scan_rounds: bool | None = None,
) -> SimulationResult:
    """Runs ``num_rounds`` rounds, evaluating every ``eval_every`` rounds.

    The rounds between two evaluations run as ONE jitted ``lax.scan``
    (``scan_rounds=True``, the default on GPU/TPU) or as one jitted call per round
    (the default on CPU, where XLA runs big models slower inside while loops:
    docs/results/throughput.md); the numbers are the same either way. The state
    is donated to each call (a copy is made of a ``state`` you pass). The
    evaluation of every client on every split is one more jitted call. Randomness:
    ``key`` is split into an init key and a run key; round ``t`` uses
    ``fold_in(run_key, t)``, so a run resumed from a saved state continues exactly.

    Args:
      algorithm: the :class:`Algorithm`.
      data: :class:`fedjax_pfl.data.FederatedData`.
      num_rounds: rounds to run (in addition to those already in ``state``).
      eval_every: rounds between evaluations (default: only at the end).
      key: a typed key, ``jax.random.key(seed)``.
      eval_mask: optional ``[num_clients]`` mask restricting the summaries (e.g.
        benign clients).
      splits: splits to evaluate.
      progress: show a progress bar (tqdm) with rounds/s and the latest metrics.
      jsonl_path: append each history row to this JSON-lines file.
      state: continue from this state instead of ``algorithm.init``.
      callback: called with ``(state, row)`` after every evaluation.
      scan_rounds: see above; ``None`` picks the backend's default.

    Returns:
      :class:`SimulationResult` with the final state and one history row per
      evaluation (the first at the starting round).
    """
    eval_every = _validate_run(num_rounds, eval_every, key)
    init_key, run_key = jax.random.split(key)
    if state is None:
        state = algorithm.init(init_key, data)
    else:  # the state is donated below: never consume the caller's arrays
        state = jax.tree.map(jnp.copy, state)
    eval_kwargs = {"splits": tuple(splits), "mask": eval_mask}
    if scan_rounds is None:
        scan_rounds = jax.default_backend() != "cpu"
    if scan_rounds:
        chunk = jax.jit(lambda s, d, k, n: run_rounds(algorithm, s, d, k, n),
                        static_argnums=3, donate_argnums=0)
    else:
        one = jax.jit(algorithm.round_step, donate_argnums=0)

        def chunk(s, d, k, n):
            rows = []
            for _ in range(n):
                s, m = one(s, d, k)
                rows.append(m)
            return s, jax.tree.map(lambda *a: jnp.mean(jnp.stack(a), axis=0), *rows)

    evaluate = jax.jit(lambda s, d, k: _evaluate(algorithm, s, d, k, eval_kwargs))

    history: list[dict[str, Any]] = []
    fh = open(jsonl_path, "a") if jsonl_path else None

    def record(row):
        history.append(row)
        if fh is not None:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
        if callback is not None:
            callback(state, row)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_rounds, unit="round", dynamic_ncols=True)
    try:
        record(_row(state.round, evaluate(state, data, run_key), None))
        for n in _chunk_lengths(num_rounds, eval_every):
            t0 = time.perf_counter()
            state, train_metrics = chunk(state, data, run_key, n)
            ev = evaluate(state, data, run_key)
            row = _row(state.round, ev, train_metrics,
                       {"seconds": time.perf_counter() - t0})
            record(row)
            if bar is not None:
                bar.update(n)
                bar.set_postfix(_postfix(row), refresh=False)
    finally:
        if bar is not None:
            bar.close()
        if fh is not None:
            fh.close()
    return SimulationResult(state, history)


def _postfix(row: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for k, v in row.items():
        if k.endswith("/test/accuracy/mean") and isinstance(v, float):
            out[k.split("/")[0]] = f"{v:.3f}"
    return out


def sweep(
    make_algorithm: Callable[..., Algorithm],
    hparams: Mapping[str, Any],
    data,
    *,
    num_rounds: int,
    eval_every: int | None = None,
    key: jax.Array,
    eval_mask: jax.Array | None = None,
    splits: Sequence[str] = ("train", "test"),
) -> tuple[AlgorithmState, dict[str, np.ndarray]]:
    """Runs one whole simulation per hyperparameter value, vmapped: ONE program.

    Args:
      make_algorithm: ``(**hparams) -> Algorithm``; called inside the trace with
        scalar (traced) values, e.g. ``lambda lam: ditto(model, lam=lam, ...)``.
      hparams: name -> 1-D array of values; all the same length ``S``.
      data, num_rounds, eval_every, key, eval_mask, splits: as in :func:`simulate`;
        every run uses the same key, so results equal separate ``simulate`` runs.

    Returns:
      ``(states, history)``: final states with a leading ``S`` axis, and a dict of
      metrics with shape ``[S, num_evals]`` plus ``history['round']``.
    """
    eval_every = _validate_run(num_rounds, eval_every, key)
    if not hparams:
        raise ValueError("hparams: give at least one hyperparameter to sweep")
    values = {k: jnp.asarray(v, jnp.float32) for k, v in hparams.items()}
    sizes = {k: v.shape for k, v in values.items()}
    if any(len(s) != 1 for s in sizes.values()) or len(
        {s[0] for s in sizes.values()}
    ) != 1:
        raise ValueError(
            f"hparams: every value must be a 1-D array of the same length, got "
            f"shapes {sizes}"
        )
    init_key, run_key = jax.random.split(key)
    lengths = _chunk_lengths(num_rounds, eval_every)
    eval_kwargs = {"splits": tuple(splits), "mask": eval_mask}

    def run(hp, d):
        alg = make_algorithm(**hp)
        state = alg.init(init_key, d)
        evals = [_evaluate(alg, state, d, run_key, eval_kwargs)]
        for n in lengths:
            state, _ = run_rounds(alg, state, d, run_key, n)
            evals.append(_evaluate(alg, state, d, run_key, eval_kwargs))
        return state, jax.tree.map(lambda *a: jnp.stack(a), *evals)

    states, metrics = jax.jit(jax.vmap(run, in_axes=(0, None)))(values, data)
    history = {k: np.asarray(v) for k, v in metrics.items()}
    history["round"] = np.cumsum([0] + lengths)
    return states, history
