"""Drivers: ``simulate`` (rounds as one lax.scan between evaluations) and
``sweep`` (a whole simulation vmapped over float hyperparameters).

Both check everything they can before the first round (docs/engine.md,
"Validation"): the run's arguments, the output paths, the evaluation options
(split names, the ``[num_clients]`` mask), the data against the evaluated models
(features that fit the model's input, labels inside its classes: found by
tracing, no computation) and the round itself (traced once before any round
runs, so an algorithm that cannot run on this data, e.g. a cohort larger than
the number of clients, fails before the first evaluation or file is written).
"""

from __future__ import annotations

import copy
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.data import FederatedData
from fedjax_pfl.models import cross_entropy
from fedjax_pfl.validation import check_choice, check_file, check_int, is_concrete

from . import _checkpoint
from ._eval import check_eval_args, evaluate
from ._keys import KeyTag
from ._round import EngineConfig, check_engine, current_engine, execution
from ._types import Algorithm, AlgorithmState


class SimulationResult(NamedTuple):
    """Final state and the metrics history (one dict per evaluation)."""

    state: AlgorithmState
    history: list[dict[str, Any]]
    resumed_from: int | None = None
    """The rounds done of the checkpoint this run was restored from (None: it
    started afresh)."""

    @property
    def rounds_run(self) -> int:
        """Rounds from the first history row to the last (fewer than
        ``num_rounds`` when a privacy target or ``stop_when`` stopped the run)."""
        if not self.history:
            return 0
        return self.history[-1]["round"] - self.history[0]["round"]

    @property
    def privacy_stopped(self) -> bool:
        """Whether the privacy monitor's ``target_epsilon`` stopped the run."""
        return bool(self.history and self.history[-1].get("privacy/stopped", False))

    @property
    def stopped_early(self) -> bool:
        """Whether ``simulate``'s ``stop_when`` ended the run."""
        return bool(self.history and self.history[-1].get("stopped", False))


def _validate_run(num_rounds, eval_every, key) -> int:
    check_int("num_rounds", num_rounds, lo=1)
    eval_every = check_int("eval_every", num_rounds if eval_every is None
                           else eval_every, lo=1)
    if not (isinstance(key, jax.Array)
            and jnp.issubdtype(key.dtype, jax.dtypes.prng_key)):
        raise ValueError(
            "key: must be a typed PRNG key from jax.random.key(seed), "
            f"got {type(key).__name__}"
        )
    return eval_every


def _validate_data(data) -> None:
    if not isinstance(data, FederatedData):
        raise ValueError("data: must be a fedjax_pfl.data.FederatedData, got "
                         f"{type(data).__name__}")


def _validate_algorithm(algorithm) -> None:
    if not all(callable(getattr(algorithm, a, None))
               for a in ("init", "round_step", "eval_models")):
        raise ValueError("algorithm: must be a fedjax_pfl.Algorithm (init, "
                         f"round_step, eval_models), got {type(algorithm).__name__}")


_EVAL_OPTIONS = ("splits", "mask", "metrics", "per_client")


def check_models(views, data) -> dict[str, int]:
    """Static checks of the evaluated models against ``data``: one example's
    features must fit each model's input (``jax.eval_shape`` of its ``apply``:
    no computation). Returns ``{view: number of classes}`` for the views with
    a cross-entropy loss, whose labels :func:`check_labels` then checks."""
    classes = {}
    shapes = {(s.x.shape[1:], s.x.dtype) for s in data.splits().values()}
    for name, view in views.items():
        def one(p, per_client=view.per_client):
            return jax.ShapeDtypeStruct(p.shape[1:] if per_client else p.shape,
                                        p.dtype)

        params = jax.tree.map(one, view.params)
        for shape, dtype in sorted(shapes, key=str):
            example = jax.ShapeDtypeStruct((1, *shape), dtype)
            try:
                out = jax.eval_shape(view.model.apply, params, example)
            except Exception as e:  # the model's own shape error, rephrased
                raise ValueError(
                    f"data: features of shape {tuple(shape)} ({dtype}) do not match "
                    f"the model's input (evaluated model {name!r}): "
                    f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                ) from e
        if view.model.loss is cross_entropy and getattr(out, "ndim", 0) >= 1:
            classes[name] = int(out.shape[-1])
    return classes


def check_labels(data, classes: Mapping[str, int]) -> None:
    """``ValueError`` unless every split's labels are class indices in
    ``[0, C)`` for each cross-entropy model with ``C`` outputs (on the host;
    out-of-range labels would otherwise give silent garbage inside jit)."""
    if not classes:
        return
    name, num = min(classes.items(), key=lambda kv: kv[1])
    for split_name, split in data.splits().items():
        y = split.y
        if not is_concrete(y) or y.size == 0:
            continue
        with jax.ensure_compile_time_eval():  # concrete even inside a trace
            if not jnp.issubdtype(y.dtype, jnp.integer) and not bool(
                    jnp.all(y == jnp.round(y))):
                raise ValueError(f"data: labels of the {split_name!r} split must be "
                                 f"integer class indices for model {name!r} "
                                 f"(cross-entropy), got dtype {y.dtype} with "
                                 "fractional values")
            lo, hi = float(jnp.min(y)), float(jnp.max(y))
        if lo < 0 or hi >= num:
            raise ValueError(
                f"data: labels of the {split_name!r} split must be class indices in "
                f"[0, {num}) for model {name!r} ({num} outputs), got labels in "
                f"[{lo:g}, {hi:g}]")


def _validate_privacy(privacy) -> None:
    needed = ("metrics", "allows", "config", "target_epsilon", "bind")
    if privacy is not None and not all(hasattr(privacy, a) for a in needed):
        raise ValueError("privacy: must be a fedjax_pfl.privacy.Monitor or None, got "
                         f"{type(privacy).__name__}")


class Interrupted(KeyboardInterrupt):
    """``simulate`` stopped at a round boundary by SIGINT (Ctrl-C) or SIGTERM.

    A ``KeyboardInterrupt``, so a script that does not catch it ends as on
    Ctrl-C, and ``except Exception`` does not swallow it.

    Attributes:
      result: the :class:`SimulationResult` so far (state and history up to
        ``round``).
      round: the round the run stopped at.
      checkpointed: whether a checkpoint of that round was written (then
        ``resume=True`` continues exactly).
      signal: ``"SIGINT"`` or ``"SIGTERM"``.
    """

    def __init__(self, result, round_, checkpointed, signal_name):
        self.result, self.round = result, int(round_)
        self.checkpointed, self.signal = checkpointed, signal_name
        super().__init__(self.message())

    def message(self) -> str:
        how = ("; continue with resume (--resume)" if self.checkpointed else
               "; no checkpoint was written (no checkpoint_dir)")
        return f"stopped by {self.signal} at round {self.round}{how}"


class _StopSignals:
    """Turns the first SIGINT/SIGTERM into a request to stop at the next round
    boundary; a second signal interrupts at once (``KeyboardInterrupt``).
    Installed only in the main thread of a single-process run (elsewhere the
    handlers are left alone)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: str | None = None
        self._old: dict = {}

    def __enter__(self):
        if (threading.current_thread() is threading.main_thread()
                and jax.process_count() == 1):
            for sig in self.SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received is not None:
            self._restore()
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    def _restore(self):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old = {}

    def __exit__(self, *exc):
        self._restore()
        return False


def _truncate_jsonl(jsonl_path, saved) -> None:
    """Drops the rows a crashed run wrote after its last checkpoint."""
    if not (jsonl_path and saved and saved["path"] == os.path.abspath(jsonl_path)):
        return
    if os.path.exists(jsonl_path) and os.path.getsize(jsonl_path) > saved["bytes"]:
        with open(jsonl_path, "r+b") as f:
            f.truncate(saved["bytes"])


def _chunk_lengths(num_rounds: int, eval_every: int) -> list[int]:
    full, rest = divmod(num_rounds, eval_every)
    return [eval_every] * full + ([rest] if rest else [])


def run_rounds(algorithm: Algorithm, state, data, key, num_rounds: int, *,
               engine: EngineConfig | None = None):
    """``num_rounds`` rounds as one ``lax.scan`` under ``engine`` (default:
    the one in force, :func:`execution`); returns the state and the per-round
    metrics averaged over the chunk."""

    def body(s, _):
        return algorithm.round_step(s, data, key)

    with execution(engine):
        state, metrics = jax.lax.scan(body, state, None, length=num_rounds)
    return state, jax.tree.map(lambda m: jnp.mean(m, axis=0), metrics)


def _evaluate(algorithm, state, data, key, eval_kwargs, views=None, classes=None):
    """``algorithm``'s views of ``state`` evaluated on ``data``; checks the models
    against the data first (labels too when ``data`` is concrete; else the
    classes found go into ``classes`` for the caller to check after tracing)."""
    ekey = jax.random.fold_in(jax.random.fold_in(key, KeyTag.EVAL), state.round)
    models = algorithm.eval_models(state, data, ekey)
    if views is not None:
        unknown = [v for v in views if v not in models]
        if unknown:
            raise ValueError(f"views: unknown {unknown}; this algorithm evaluates "
                             f"{tuple(models)}")
        models = {k: v for k, v in models.items() if k in views}
    found = check_models(models, data)
    if classes is not None:
        classes.update(found)
    if is_concrete(data.train.y):
        check_labels(data, found)
    return evaluate(models, data, **eval_kwargs)


def evaluate_state(algorithm: Algorithm, state: AlgorithmState, data, *,
                   key: jax.Array, views: Sequence[str] | None = None,
                   engine: EngineConfig | None = None,
                   **eval_kwargs) -> dict[str, jax.Array]:
    """The metrics of ``state`` exactly as ``simulate(..., key=key)`` computes them
    at ``state.round`` (same evaluation-time randomness, e.g. finetuning), e.g.
    per-client values of a finished run. Not jitted: wrap it in ``jax.jit`` (or
    ``vmap`` it over swept states).

    Args:
      algorithm, state, data: the algorithm, a state of it, the data it ran on.
      key: the ``key`` given to :func:`simulate`.
      views: the ``eval_models`` names to evaluate (default: all).
      engine: the engine the run used (as in :func:`simulate`).
      **eval_kwargs: :func:`fedjax_pfl.metrics.evaluate`'s options (``splits``,
        ``per_client``, ``mask``, ``metrics``).

    Raises:
      ValueError: before any evaluation: an unknown option, split, metric or
        view name; a mask that is not one 0/1 flag per client; features that do
        not fit a model's input; labels outside a cross-entropy model's classes
        (checked when ``data`` is concrete, i.e. not under ``jit``).
    """
    _validate_algorithm(algorithm)
    _validate_data(data)
    unknown = sorted(set(eval_kwargs) - set(_EVAL_OPTIONS))
    if unknown:
        raise ValueError(f"eval_kwargs: unknown option(s) {unknown}; evaluate takes "
                         f"{_EVAL_OPTIONS}")
    check_eval_args(data, **eval_kwargs)
    if views is not None and (isinstance(views, str)
                              or not all(isinstance(v, str) for v in views)):
        raise ValueError(f"views: must be a sequence of view names, got {views!r}")
    run_key = jax.random.split(key)[1]
    with execution(engine):  # checks engine first
        return _evaluate(algorithm, state, data, run_key, eval_kwargs, views)


def _row(round_, eval_metrics, train_metrics, extra=None) -> dict[str, Any]:
    row: dict[str, Any] = {"round": int(round_)}
    for d in (train_metrics or {}), eval_metrics:
        for k, v in d.items():
            a = np.asarray(v)
            row[k] = a.tolist() if a.ndim else (
                float(a) if a.dtype.kind == "f" else int(a))
    if extra:
        row.update(extra)
    return row


class Plateau(NamedTuple):
    """An early-stopping rule for :func:`simulate` (``stop_when=``): stop once
    none of ``metrics`` has improved by more than ``min_delta`` over the last
    ``patience`` rounds.

    After each evaluation at round ``r``, for each metric, ``best_before`` is the
    best value at rounds ``<= r - patience`` and ``best_recent`` the best value at
    later rounds (higher is better, or lower with ``mode="min"``). The rule holds
    when ``r - patience`` is at least the run's first evaluated round and, for
    EVERY metric, ``best_recent`` is not better than ``best_before`` by more than
    ``min_delta``. It reads the history only, so a resumed run stops at the same
    round as an uninterrupted one. Stop on validation metrics (e.g.
    ``"personal/val/accuracy/mean"``), never on test metrics.

    Attributes:
      metrics: history keys to watch (a name or a tuple of names).
      patience: rounds without improvement before stopping.
      min_delta: the least change that counts as an improvement.
      mode: ``"max"`` (accuracy) or ``"min"`` (loss).
    """

    metrics: str | tuple[str, ...]
    patience: int
    min_delta: float = 0.0
    mode: str = "max"

    def names(self) -> tuple[str, ...]:
        return (self.metrics,) if isinstance(self.metrics, str) else tuple(self.metrics)

    def check(self) -> None:
        names = self.names()
        if not names or not all(isinstance(m, str) and m for m in names):
            raise ValueError("stop_when: Plateau.metrics must be a history key or a "
                             f"tuple of them, got {self.metrics!r}")
        check_int("stop_when: Plateau.patience", self.patience, lo=1)
        if not (isinstance(self.min_delta, (int, float)) and self.min_delta >= 0
                and np.isfinite(self.min_delta)):
            raise ValueError("stop_when: Plateau.min_delta must be a finite number "
                             f">= 0, got {self.min_delta!r}")
        check_choice("stop_when: Plateau.mode", self.mode, ("max", "min"))

    def __call__(self, history: Sequence[Mapping[str, Any]]) -> bool:
        last = history[-1]["round"] - self.patience
        if last < history[0]["round"]:
            return False
        sign = 1.0 if self.mode == "max" else -1.0
        for m in self.names():
            before = [sign * r[m] for r in history if r["round"] <= last and m in r]
            recent = [sign * r[m] for r in history if r["round"] > last and m in r]
            if not before or not recent or max(recent) > max(before) + self.min_delta:
                return False
        return True


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
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    privacy: Any = None,
    engine: EngineConfig | None = None,
    stop_when: Callable[[Sequence[Mapping[str, Any]]], bool] | None = None,
    checkpoint_config: Mapping[str, Any] | None = None,
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
      jsonl_path: append each history row to this JSON-lines file (its folder
        is created if needed).
      state: continue from this state instead of ``algorithm.init``.
      callback: called with ``(state, row)`` after every evaluation (after the
        checkpoint of that evaluation, if any, is written).
      scan_rounds: see above; ``None`` picks the backend's default.
      checkpoint_dir: write atomic orbax checkpoints (state, history, rounds
        done, the run's fingerprint) here; the last 2 are kept
        (docs/checkpointing.md).
      checkpoint_every: rounds between checkpoints, a multiple of ``eval_every``
        (default ``eval_every``); the last evaluation of the run (the end, or a
        privacy stop) is always checkpointed.
      resume: continue from the newest readable checkpoint in ``checkpoint_dir``
        (or start afresh if there is none); the final state and history equal
        those of an uninterrupted run, except the wall-clock ``seconds``.
      checkpoint_config: a JSON-serializable description of what the
        checkpoint's fingerprint cannot see (hyperparameters, data, a method
        name), stored with each checkpoint: ``resume`` refuses a checkpoint
        written with another one (or with none), so a changed learning rate
        cannot continue another configuration's run. Needs ``checkpoint_dir``.
      privacy: a :class:`fedjax_pfl.privacy.Monitor`: adds ``privacy/epsilon`` and
        ``privacy/delta`` to every row, and with a ``target_epsilon`` stops
        before a chunk of rounds whose end would exceed it (docs/privacy.md).
        Refused unless ``algorithm`` declares an accounted mechanism
        (``Algorithm.privacy``) whose epsilon the monitor's event gives.
      engine: the :class:`EngineConfig` every round, evaluation and finetuning
        of the run executes under (strategy, mesh, buckets, determinism,
        local-loop unroll; default ``EngineConfig()``, or the one of an
        enclosing :func:`execution` block). Algorithms never take it.
      stop_when: early stopping: called with the history (the rows so far) after
        every evaluation but the last; when it returns true, the row gets
        ``"stopped": True``, is checkpointed, and the run ends there (a resumed
        run that reaches a stopped checkpoint ends too). A :class:`Plateau`
        (e.g. ``Plateau("personal/val/accuracy/mean", patience=1000,
        min_delta=0.002)``) has its metric names checked against the
        evaluation's before any work.

    Interrupting: in the main thread of a single-process run, the first SIGINT
    (Ctrl-C) or SIGTERM stops the run at the next evaluation (the rounds in
    between are one compiled program and are not cut): the state there is
    checkpointed (when ``checkpoint_dir`` is given) and :class:`Interrupted`
    is raised, carrying the result so far; ``resume=True`` then continues
    exactly. A second signal interrupts at once, like a plain Ctrl-C, and the
    newest checkpoint written before it is where a resumed run starts.

    Returns:
      :class:`SimulationResult` with the final state and one history row per
      evaluation (the first at the starting round).

    Raises:
      ValueError: before the first evaluation, round or file written: invalid
        arguments (naming the argument); unknown split names; an ``eval_mask``
        that is not one 0/1 flag per client; a ``checkpoint_dir`` or
        ``jsonl_path`` that cannot be written (a file where a folder is needed,
        or the reverse); features of ``data`` that do not fit an evaluated
        model's input, or labels outside a cross-entropy model's classes
        (``data: ...``); whatever the algorithm refuses when its round is
        traced for ``data`` (e.g. a cohort larger than the number of clients);
        ``resume`` with a checkpoint of another run (different key, schedule,
        starting state, privacy monitor or ``checkpoint_config``); a
        ``checkpoint_dir`` that holds checkpoints without ``resume``; a ``stop_when`` that is not callable, or
        a :class:`Plateau` whose settings are invalid or whose metrics the run
        does not record.
      Interrupted: SIGINT or SIGTERM stopped the run (see above).
    """
    with execution(engine):  # checks engine first
        return _simulate(
            algorithm, data, num_rounds=num_rounds, eval_every=eval_every, key=key,
            eval_mask=eval_mask, splits=splits, progress=progress,
            jsonl_path=jsonl_path, state=state, callback=callback,
            scan_rounds=scan_rounds, checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every, resume=resume, privacy=privacy,
            stop_when=stop_when, checkpoint_config=checkpoint_config)


def _simulate(algorithm, data, *, num_rounds, eval_every, key, eval_mask, splits,
              progress, jsonl_path, state, callback, scan_rounds, checkpoint_dir,
              checkpoint_every, resume, privacy, stop_when,
              checkpoint_config) -> SimulationResult:
    """:func:`simulate` under the engine in force."""
    eval_every = _validate_run(num_rounds, eval_every, key)
    checkpoint_every = _checkpoint.validate(checkpoint_dir, checkpoint_every, resume,
                                            eval_every, checkpoint_config)
    _validate_privacy(privacy)
    _validate_algorithm(algorithm)
    _validate_data(data)
    if privacy is not None:  # the epsilon must be the declared mechanism's
        privacy.bind(algorithm, data)
    splits = check_eval_args(data, splits=splits, mask=eval_mask,
                             mask_name="eval_mask")
    check_file("jsonl_path", jsonl_path)
    if callback is not None and not callable(callback):
        raise ValueError(f"callback: must be callable or None, got {callback!r}")
    if stop_when is not None and not callable(stop_when):
        raise ValueError(f"stop_when: must be callable or None, got {stop_when!r}")
    if isinstance(stop_when, Plateau):
        stop_when.check()
    check_choice("scan_rounds", scan_rounds, (True, False, None))
    if state is not None and not isinstance(state, AlgorithmState):
        raise ValueError("state: must be an AlgorithmState (e.g. a previous run's "
                         f"SimulationResult.state), got {type(state).__name__}")
    init_key, run_key = jax.random.split(key)
    template = state if state is not None else jax.eval_shape(
        lambda k: algorithm.init(k, data), init_key)
    # Trace (no computation) the evaluation and the first chunk of rounds now:
    # a model that does not fit the data, labels outside its classes or a round
    # that cannot run on this data fail before any file is written. jit reuses
    # these traces for the real calls.
    chunk, evaluate, preflight = _compile(algorithm, eval_mask, splits, scan_rounds)
    recorded = preflight(template, data, run_key,
                         _chunk_lengths(num_rounds, eval_every)[0])
    if isinstance(stop_when, Plateau):
        missing = [m for m in stop_when.names() if m not in recorded]
        if missing:
            raise ValueError(f"stop_when: the history has no {missing}; its metrics "
                             f"are {sorted(recorded)}")
    ckpt = restored = resumed_from = fingerprint = fh = bar = None
    stop = _StopSignals()
    saved_at = [None]  # the rounds done of the last checkpoint written
    try:
        if checkpoint_dir is not None:
            fingerprint = _checkpoint.fingerprint(
                num_rounds=num_rounds, eval_every=eval_every, run_key=run_key,
                start_round=None if state is None else int(state.round),
                template=template,
                privacy=None if privacy is None else privacy.config(),
                config=checkpoint_config)
            ckpt = _checkpoint.Checkpointer(checkpoint_dir)
            if resume:
                restored = ckpt.restore(template, fingerprint)
            else:
                ckpt.require_empty()
        if restored is not None:
            state, history, done = restored.state, list(restored.history), \
                restored.rounds_done
            resumed_from = done
            _truncate_jsonl(jsonl_path, restored.jsonl_bytes)
        else:
            history, done = [], 0
            if resume and jsonl_path and os.path.exists(jsonl_path):
                # a run stopped before its first checkpoint starts afresh
                _truncate_jsonl(jsonl_path, {"path": os.path.abspath(jsonl_path),
                                             "bytes": 0})
            if state is None:
                state = algorithm.init(init_key, data)
            else:  # the state is donated below: never consume the caller's arrays
                state = jax.tree.map(jnp.copy, state)
        lengths = _chunk_lengths(num_rounds, eval_every)
        todo = lengths[list(np.cumsum(lengths)).index(done) + 1 if done else 0:]
        # multi-process runs: every process runs the same program; only the
        # first writes the history file and shows the progress bar
        main_process = jax.process_index() == 0
        if jsonl_path and main_process:
            os.makedirs(os.path.dirname(os.path.abspath(jsonl_path)), exist_ok=True)
            fh = open(jsonl_path, "a")

        def save(done):
            saved = fh and {"path": os.path.abspath(jsonl_path), "bytes": fh.tell()}
            ckpt.save(done, state, history, fingerprint, saved)
            saved_at[0] = done

        def interrupt(done):
            if ckpt is not None and saved_at[0] != done:
                save(done)
            raise Interrupted(SimulationResult(state, history, resumed_from),
                              history[-1]["round"],
                              ckpt is not None, stop.received)

        def record(row, done, next_chunk):
            if privacy is not None:
                row.update(privacy.metrics(row["round"]))
                if privacy.target_epsilon is not None:
                    row["privacy/stopped"] = bool(next_chunk) and not privacy.allows(
                        row["round"] + next_chunk)
            history.append(row)
            if (stop_when is not None and next_chunk and not row.get("privacy/stopped")
                    and stop_when(history)):
                row["stopped"] = True
            if fh is not None:
                fh.write(json.dumps(row) + "\n")
                fh.flush()
            if ckpt is not None and (done == num_rounds or _stopped(row)
                                     or (done and done % checkpoint_every == 0)):
                save(done)
            if callback is not None:
                callback(state, row)

        if progress and main_process:
            from tqdm.auto import tqdm

            bar = tqdm(total=num_rounds, initial=done, unit="round", dynamic_ncols=True,
                       desc="compiling")  # until the first chunk of rounds is done
        stop.__enter__()
        if restored is None:
            record(_row(state.round, evaluate(state, data, run_key), None), 0,
                   todo[0] if todo else 0)
        for i, n in enumerate(todo):
            if _stopped(history[-1]):
                break
            if stop.received:
                interrupt(done)
            t0 = time.perf_counter()
            state, train_metrics = chunk(state, data, run_key, n)
            ev = evaluate(state, data, run_key)
            done += n
            row = _row(state.round, ev, train_metrics)  # blocks on the results
            row["seconds"] = time.perf_counter() - t0  # rounds + evaluation
            record(row, done, todo[i + 1] if i + 1 < len(todo) else 0)
            if bar is not None:  # the metrics of the evaluation just made
                bar.set_description_str("", refresh=False)
                bar.set_postfix(_postfix(row), refresh=False)
                bar.update(n)
    finally:
        stop.__exit__()
        if bar is not None:
            bar.close()
        if fh is not None:
            fh.close()
        if ckpt is not None:
            ckpt.close()
    return SimulationResult(state, history, resumed_from)


def _compile(algorithm, eval_mask, splits, scan_rounds):
    """The jitted chunk of rounds (state donated), the jitted evaluation, and
    ``preflight(state, data, key, n)``: traces both (no computation; the traces
    are reused by the calls) and checks the labels against the models found."""
    eval_kwargs = {"splits": tuple(splits), "mask": eval_mask}
    classes: dict[str, int] = {}
    if scan_rounds is None:
        scan_rounds = jax.default_backend() != "cpu"
    if scan_rounds:
        scan = jax.jit(lambda s, d, k, n: run_rounds(algorithm, s, d, k, n),
                       static_argnums=3, donate_argnums=0)
        chunk = scan

        def trace_round(s, d, k, n):
            return scan.trace(s, d, k, n).out_info[1]
    else:
        # a new closure: jit must not reuse a trace made under another engine
        one = jax.jit(lambda s, d, k: algorithm.round_step(s, d, k),
                      donate_argnums=0)

        def chunk(s, d, k, n):
            rows = []
            for _ in range(n):
                s, m = one(s, d, k)
                rows.append(m)
            return s, jax.tree.map(lambda *a: jnp.mean(jnp.stack(a), axis=0), *rows)

        def trace_round(s, d, k, n):
            return one.trace(s, d, k).out_info[1]

    evaluate = jax.jit(lambda s, d, k: _evaluate(algorithm, s, d, k, eval_kwargs,
                                                 classes=classes))

    def preflight(state, data, key, n):
        """Traces; returns the names of the metrics a history row holds."""
        ev = evaluate.trace(state, data, key).out_info
        check_labels(data, classes)
        train = trace_round(state, data, key, n)
        return {"round", "seconds", *ev, *(train or {})}

    return chunk, evaluate, preflight


def _stopped(row: Mapping[str, Any]) -> bool:
    """Whether the run ended at ``row`` (early stop or privacy budget)."""
    return bool(row.get("stopped") or row.get("privacy/stopped"))


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
    engine: EngineConfig | None = None,
) -> tuple[AlgorithmState, dict[str, np.ndarray]]:
    """Runs one whole simulation per hyperparameter value (or per seed),
    vmapped: ONE program.

    Args:
      make_algorithm: ``(**hparams) -> Algorithm``; called inside the trace with
        scalar (traced) values, e.g. ``lambda lam: ditto(model, lam=lam, ...)``.
      hparams: name -> 1-D array of values; all the same length ``S`` (may be
        empty when ``key`` holds one key per run).
      key: one typed key (every run uses it, so results equal separate
        ``simulate`` runs with that key), or ``S`` keys, e.g.
        ``jax.vmap(jax.random.key)(jnp.arange(5))``: one run per key (seeds of
        the initialization, cohorts and batches; the data stay the same), each
        equal to ``simulate`` with that key.
      data, num_rounds, eval_every, eval_mask, splits, engine: as in
        :func:`simulate`.

    Returns:
      ``(states, history)``: final states with a leading ``S`` axis, and a dict of
      metrics with shape ``[S, num_evals]`` plus ``history['round']``.

    Raises:
      ValueError: as :func:`simulate`, before any computation (the whole program
        is traced first).
    """
    keys = key if isinstance(key, jax.Array) and key.ndim == 1 else None
    if isinstance(key, jax.Array) and (key.ndim > 1 or key.size == 0):
        raise ValueError(f"key: one key, or a 1-D array of keys (one per run), got "
                         f"shape {key.shape}")
    eval_every = _validate_run(num_rounds, eval_every,
                               key if keys is None else keys[0])
    check_engine(engine)
    if not callable(make_algorithm):
        raise ValueError(f"make_algorithm: must be callable, got {make_algorithm!r}")
    _validate_data(data)
    splits = check_eval_args(data, splits=splits, mask=eval_mask,
                             mask_name="eval_mask")
    if not isinstance(hparams, Mapping) or (not hparams and keys is None):
        raise ValueError("hparams: give at least one hyperparameter to sweep, as "
                         f"{{name: values}}, or one key per run, got {hparams!r}")
    values = {k: jnp.asarray(v, jnp.float32) for k, v in hparams.items()}
    sizes = {k: v.shape for k, v in values.items()}
    if keys is not None:
        sizes["key"] = keys.shape
    if any(len(s) != 1 for s in sizes.values()) or len(
        {s[0] for s in sizes.values()}
    ) != 1:
        raise ValueError(
            f"hparams: every value (and key, when it holds one key per run) must "
            f"be a 1-D array of the same length, got shapes {sizes}"
        )
    lengths = _chunk_lengths(num_rounds, eval_every)
    eval_kwargs = {"splits": splits, "mask": eval_mask}
    classes: dict[str, int] = {}

    def run(hp, k, d):
        init_key, run_key = jax.random.split(k)
        alg = make_algorithm(**hp)
        state = alg.init(init_key, d)
        evals = [_evaluate(alg, state, d, run_key, eval_kwargs, classes=classes)]
        for n in lengths:
            state, _ = run_rounds(alg, state, d, run_key, n)
            evals.append(_evaluate(alg, state, d, run_key, eval_kwargs))
        return state, jax.tree.map(lambda *a: jnp.stack(a), *evals)

    program = jax.jit(jax.vmap(run, in_axes=(0 if values else None,
                                             None if keys is None else 0, None)))
    k = key if keys is None else keys
    engine = engine or current_engine()
    if engine.batch_ladder is None:
        # runs that draw different Poisson batches (one key per run, a swept
        # sampling rate) would vmap a batch ladder's switch into every rung
        engine = copy.copy(engine)
        engine.batch_ladder = False
    with execution(engine):
        program.trace(values, k, data)  # every check fires here, before computing
        check_labels(data, classes)
        states, metrics = program(values, k, data)
    history = {k: np.asarray(v) for k, v in metrics.items()}
    history["round"] = np.cumsum([0] + lengths)
    return states, history
