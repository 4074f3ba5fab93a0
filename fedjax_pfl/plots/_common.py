"""Shared helpers of the figures: lazy matplotlib, input checks, history
rows."""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

_INSTALL = "fedjax_pfl.plots needs matplotlib: pip install fedjax_pfl[plots]"


def _figure(ncols: int, *, width: float = 5.0, height: float = 3.8):
    try:
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(_INSTALL) from e
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _finish(fig, title: str | None, path: str | os.PathLike | None, dpi: int = 120):
    if title:  # wrapped to the figure's width (about 11 characters per inch)
        width = max(20, int(fig.get_figwidth() * 11))
        fig.suptitle(textwrap.fill(title, width))
    if path is not None:
        fig.savefig(os.fspath(path), dpi=dpi)
    return fig


def _vector(name: str, value, *, length: int | None = None) -> np.ndarray:
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name}: must be a 1-D array of numbers, got "
                         f"{type(value).__name__}") from e
    if a.ndim != 1 or a.size == 0:
        raise ValueError(f"{name}: must be a non-empty 1-D array, got shape {a.shape}")
    if length is not None and a.size != length:
        raise ValueError(f"{name}: must have {length} entries, got {a.size}")
    return a


def _named_vectors(name: str, value, *, length: int | None = None):
    if not isinstance(value, Mapping) or not value:
        raise ValueError(f"{name}: must be a non-empty mapping name -> 1-D array, got "
                         f"{type(value).__name__}")
    return {str(k): _vector(f"{name}[{k!r}]", v, length=length)
            for k, v in value.items()}


def _legend(ax, **kwargs):
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def _rows(name: str, history) -> list[Mapping[str, Any]]:
    history = getattr(history, "history", history)  # a SimulationResult
    if (isinstance(history, (str, bytes, Mapping)) or not isinstance(history, Sequence)
            or not history or not all(isinstance(r, Mapping) for r in history)):
        raise ValueError(f"{name}: must be a non-empty list of dict rows (a simulate "
                         f"history), got {type(history).__name__}")
    return list(history)


def _series(rows, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Rounds and values of the rows that hold a finite scalar under ``key``."""
    xs, ys = [], []
    for i, row in enumerate(rows):
        v = row.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.number)):
            continue
        if math.isfinite(float(v)):
            xs.append(row.get("round", i))
            ys.append(float(v))
    return np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)


def _missing(name: str, key: str, rows) -> ValueError:
    have = sorted({k for r in rows for k in r if k != "round"})
    shown = ", ".join(have[:12]) + (", ..." if len(have) > 12 else "")
    return ValueError(f"{name}: no history row holds a number under {key!r}; "
                      f"keys present: {shown or 'none'}")


def _integer_ticks():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _percent():
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(xmax=1.0, decimals=0)
