"""Experiment tracking: follow a run in TensorBoard, Weights & Biases or the log.

Every writer here is a ``simulate`` callback: :func:`fedjax_pfl.simulate` calls
``writer(state, row)`` after each evaluation, and the writer records the row's
finite numbers (:func:`scalars`) at step ``row["round"]``. ``writer.write(row)``
records a row without a state, e.g. to replay a saved history. Writers are
context managers; ``close()`` flushes and ends what they opened, and may be
called more than once::

    with tracking.TensorBoardWriter("runs/ditto") as tb:
        fp.simulate(alg, data, num_rounds=500, eval_every=10, key=key,
                    callback=tracking.combine(tb, tracking.LogWriter()))

Writers open their file or run at the first row, not when they are made, so a
``simulate`` that refuses its arguments leaves nothing behind. In a
multi-process run only the first process (``jax.process_index() == 0``)
writes, as with ``simulate``'s ``jsonl_path``. TensorBoard and W&B are optional
dependencies, imported when a writer is made (docs/tracking.md).
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

import jax
import numpy as np

from fedjax_pfl.validation import check_dir

__all__ = ["scalars", "TensorBoardWriter", "WandbWriter", "LogWriter", "combine",
           "CombinedCallback"]

_HEADLINE = "/test/accuracy/mean"


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a history row as floats, without ``round``.

    Booleans (flags such as ``stopped``), ``None``, strings, lists and other
    non-scalars, NaN and infinities are left out.
    """
    out = {}
    for k, v in row.items():
        if k == "round" or v is None or isinstance(v, (bool, np.bool_, str, bytes)):
            continue
        try:
            a = np.asarray(v)
        except Exception:  # an object numpy cannot read is not a number
            continue
        if a.ndim == 0 and a.dtype.kind in "iuf" and math.isfinite(float(a)):
            out[k] = float(a)
    return out


def _step(row) -> int:
    if not isinstance(row, Mapping):
        raise ValueError(f"row: must be a mapping of metric names to values, got "
                         f"{type(row).__name__}")
    step = row.get("round")
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)):
        raise ValueError(f"row: needs an integer 'round' (the step), got {step!r}")
    return int(step)


def _require(module: str, extra: str, who: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{who} needs the {extra} package: pip install "
                          f"'fedjax-pfl[{extra}]'") from e


class _Writer:
    """A ``simulate`` callback that records rows at step ``row['round']``."""

    def __init__(self):
        self._closed = False
        # whether this is the first process: asked at the first row, since
        # jax.distributed may not be initialized yet when the writer is made
        self._main: bool | None = None

    def __call__(self, state, row: Mapping[str, Any]) -> None:
        """Records ``row`` (``state`` is not read): the ``simulate`` callback."""
        del state
        self.write(row)

    def write(self, row: Mapping[str, Any]) -> None:
        """Records the finite numbers of ``row`` at step ``row['round']``.

        Raises:
          ValueError: the writer is closed, or ``row`` has no integer ``round``.
        """
        if self._closed:
            raise ValueError(f"{type(self).__name__} is closed")
        step = _step(row)
        if self._main is None:
            self._main = jax.process_index() == 0
        if self._main:
            self._write(step, row)

    def close(self) -> None:
        """Flushes and closes what the writer opened; later calls do nothing."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _write(self, step: int, row: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        pass


class TensorBoardWriter(_Writer):
    """Writes each row's finite numbers as TensorBoard scalars.

    The tag of a value is its metric name (``personal/test/accuracy/mean``;
    TensorBoard groups tags by their first component) and its step is
    ``row["round"]``. Values are stored as float32 ``simple_value`` summaries,
    which every TensorBoard version reads. The event file
    (``events.out.tfevents.*``) is created in ``logdir`` at the first row and
    flushed after every row, so a running TensorBoard shows each evaluation
    as it arrives. Writing needs the ``tensorboard`` package only, not
    TensorFlow.

    Args:
      logdir: folder of the run's event file (created if needed). Give each
        run its own folder: TensorBoard overlays the event files of one folder
        as one run, and lists sibling folders as runs to compare.

    Raises:
      ValueError: ``logdir`` is not a path, or is (or lies under) a file.
      ImportError: ``tensorboard`` is not installed.
    """

    def __init__(self, logdir: str | os.PathLike):
        check_dir("logdir", logdir)
        who = "TensorBoardWriter"
        self._event_pb2 = _require("tensorboard.compat.proto.event_pb2",
                                   "tensorboard", who)
        self._summary_pb2 = _require("tensorboard.compat.proto.summary_pb2",
                                     "tensorboard", who)
        self._writer_module = _require(
            "tensorboard.summary.writer.event_file_writer", "tensorboard", who)
        super().__init__()
        self.logdir = os.fspath(logdir)
        self._writer = None

    def _write(self, step, row):
        if self._writer is None:
            self._writer = self._writer_module.EventFileWriter(self.logdir)
        summary = self._summary_pb2.Summary(value=[
            self._summary_pb2.Summary.Value(tag=k, simple_value=v)
            for k, v in scalars(row).items()])
        self._writer.add_event(self._event_pb2.Event(
            wall_time=time.time(), step=step, summary=summary))
        self._writer.flush()

    def _close(self):
        if self._writer is not None:
            self._writer.close()


class WandbWriter(_Writer):
    """Logs each row's finite numbers to a Weights & Biases run.

    At the first row the writer starts a run with ``wandb.init(project=project,
    config=config, **init_kwargs)`` (available as ``writer.run`` from then on)
    and logs ``run.log(scalars(row), step=row["round"])``; ``close()`` calls
    ``run.finish()``. W&B keeps steps increasing within a run: rows with a
    smaller round than one already logged are dropped by W&B with a warning.

    Args:
      project: the W&B project (``None``: W&B's default, e.g. from
        ``WANDB_PROJECT``).
      config: the run's configuration (hyperparameters, seed, preset), shown
        beside its curves and used to filter and group runs.
      **init_kwargs: passed to ``wandb.init`` (``name``, ``group``, ``tags``,
        ``mode="offline"``, ``dir``, ...).

    Raises:
      ValueError: ``project`` is not a non-empty string or ``None``, or
        ``config`` is not a mapping or ``None``.
      ImportError: ``wandb`` is not installed.
    """

    def __init__(self, project: str | None = None, *,
                 config: Mapping[str, Any] | None = None, **init_kwargs):
        if project is not None and (not isinstance(project, str) or not project):
            raise ValueError(f"project: must be a non-empty string or None, got "
                             f"{project!r}")
        if config is not None and not isinstance(config, Mapping):
            raise ValueError(f"config: must be a mapping (e.g. a dict) or None, got "
                             f"{type(config).__name__}")
        self._wandb = _require("wandb", "wandb", "WandbWriter")
        super().__init__()
        self._init = dict(project=project,
                          config=None if config is None else dict(config),
                          **init_kwargs)
        self.run = None

    def _write(self, step, row):
        if self.run is None:
            self.run = self._wandb.init(**self._init)
        self.run.log(scalars(row), step=step)

    def _close(self):
        if self.run is not None:
            self.run.finish()


class LogWriter(_Writer):
    """One line per evaluation: the round, the time since the writer was made,
    and a few headline metrics, e.g.
    ``round 20 | 12.3 s | global/test/accuracy/mean=0.8123``.

    Args:
      stream: a text stream (``sys.stderr``, an open file) to write the lines
        to; ``None``: log them through ``logger``.
      metrics: the names to show when a row has them (missing ones are left
        out); ``None``: every ``*/test/accuracy/mean`` and ``privacy/epsilon``.
        A stopped run (early stopping or a privacy budget) is marked
        ``(stopped)``.
      logger: the ``logging.Logger`` used when ``stream`` is ``None`` (default
        ``logging.getLogger("fedjax_pfl")``). Python shows INFO lines only once
        logging is configured, e.g. ``logging.basicConfig(level=logging.INFO)``.
      level: the logging level of the lines.

    Raises:
      ValueError: ``stream`` has no ``write``; ``stream`` and ``logger`` both
        given; ``metrics`` is not a sequence of names; ``level`` is not an int.
    """

    def __init__(self, stream: TextIO | None = None, *,
                 metrics: Sequence[str] | None = None,
                 logger: logging.Logger | None = None, level: int = logging.INFO):
        if stream is not None and not callable(getattr(stream, "write", None)):
            raise ValueError(f"stream: must be a text stream (with write) or None, "
                             f"got {type(stream).__name__}")
        if stream is not None and logger is not None:
            raise ValueError("logger: give a stream or a logger, not both")
        if logger is not None and not isinstance(logger, logging.Logger):
            raise ValueError(f"logger: must be a logging.Logger or None, got "
                             f"{type(logger).__name__}")
        if metrics is not None and (isinstance(metrics, str) or not all(
                isinstance(m, str) for m in metrics)):
            raise ValueError(f"metrics: must be a sequence of metric names or None, "
                             f"got {metrics!r}")
        if isinstance(level, bool) or not isinstance(level, int):
            raise ValueError(f"level: must be a logging level (int), got {level!r}")
        super().__init__()
        self._stream = stream
        self._logger = logger or logging.getLogger("fedjax_pfl")
        self._metrics = None if metrics is None else tuple(metrics)
        self._level = level
        self._t0 = time.perf_counter()

    def format(self, row: Mapping[str, Any]) -> str:
        """The line written for ``row``."""
        values = scalars(row)
        names = self._metrics
        if names is None:
            names = [k for k in values if k.endswith(_HEADLINE)] + ["privacy/epsilon"]
        parts = [f"round {_step(row)}", f"{time.perf_counter() - self._t0:.1f} s"]
        parts += [f"{k}={values[k]:.4g}" for k in names if k in values]
        line = " | ".join(parts)
        if row.get("stopped") or row.get("privacy/stopped"):
            line += " (stopped)"
        return line

    def _write(self, step, row):
        line = self.format(row)
        if self._stream is None:
            self._logger.log(self._level, line)
        else:
            self._stream.write(line + "\n")
            self._stream.flush()


class CombinedCallback:
    """Callbacks called in order (made by :func:`combine`); closing it closes
    those that have ``close``."""

    def __init__(self, callbacks: tuple[Callable, ...]):
        self.callbacks = callbacks

    def __call__(self, state, row: Mapping[str, Any]) -> None:
        for callback in self.callbacks:
            callback(state, row)

    def close(self) -> None:
        """Closes every callback with a ``close`` (all of them, even if one
        raises; the first error is raised after)."""
        error = None
        for callback in self.callbacks:
            try:
                if callable(getattr(callback, "close", None)):
                    callback.close()
            except Exception as e:  # the first error is raised below
                error = error or e
        if error is not None:
            raise error

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def combine(*callbacks: Callable[[Any, Mapping[str, Any]], None] | None
            ) -> CombinedCallback:
    """One ``simulate`` callback that calls ``callbacks`` in order.

    ``None`` entries are skipped (``combine(tb if log_dir else None, log)``).
    The result is a context manager whose ``close()`` closes every callback
    that has a ``close`` method.

    Raises:
      ValueError: a callback that is neither callable nor ``None``.
    """
    for i, callback in enumerate(callbacks):
        if callback is not None and not callable(callback):
            raise ValueError(f"callbacks[{i}]: must be callable or None, got "
                             f"{callback!r}")
    return CombinedCallback(tuple(c for c in callbacks if c is not None))
