"""Shared helpers of the figures: lazy matplotlib, input checks, history
rows."""

from __future__ import annotations

import math
import os
import re
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


_VECTOR = ("pdf", "svg", "eps", "ps")
_RASTER = ("png",)  # others (jpg, tif, webp) need Pillow; PNG is lossless
DPI = 300  # print resolution of raster files
FORMATS = _VECTOR + _RASTER  # what save_figure writes


def _targets(path, formats) -> list[tuple[str, str]]:
    """(file, format) pairs to write: ``path`` as is, or once per format."""
    if formats is None:
        if path is None:
            return []
        path = os.fspath(path)
        fmt = os.path.splitext(path)[1][1:].lower()
        if fmt not in _VECTOR + _RASTER:
            raise ValueError(f"path: must end in one of "
                             f"{', '.join('.' + f for f in _VECTOR + _RASTER)} "
                             f"(or pass formats=), got {path!r}")
        return [(path, fmt)]
    if isinstance(formats, str):
        formats = [formats]
    fmts = [str(f).lower().lstrip(".") for f in formats]
    if not fmts or any(f not in _VECTOR + _RASTER for f in fmts):
        raise ValueError(f"formats: must be a non-empty list of "
                         f"{_VECTOR + _RASTER}, got {formats!r}")
    if path is None:
        raise ValueError("formats: needs path= (the file name; its extension, if "
                         "any, is replaced by each format)")
    stem = os.path.splitext(os.fspath(path))[0]
    return [(f"{stem}.{f}", f) for f in dict.fromkeys(fmts)]


def save_figure(
    fig,
    path: str | os.PathLike,
    *,
    formats: Sequence[str] | None = None,
) -> list[str]:
    """Writes a figure as every function of :mod:`fedjax_pfl.plots` does.

    Vector graphics for ``.pdf``, ``.svg``, ``.eps`` and ``.ps``; ``.png`` at
    300 dpi. PDF and PostScript embed
    TrueType fonts (no Type 3 fonts, which some publishers reject); PDF and
    SVG carry no timestamp, so a file depends on the figure only.
    matplotlib's global settings are left as they were.

    Args:
      fig: a matplotlib figure (e.g. one of these functions', resized with
        ``fig.set_size_inches``).
      path: the file; its extension picks the format.
      formats: write one file per format instead, e.g. ``('pdf', 'png')``:
        ``path``'s extension, if any, is replaced by each.

    Returns:
      The files written.

    Raises:
      ValueError: ``path`` without a supported extension (and no
        ``formats``), or bad ``formats``.
    """
    if path is None:
        raise ValueError("path: must be a file name, got None")
    targets = _targets(path, formats)
    import matplotlib

    stamp = {"pdf": {"CreationDate": None}, "svg": {"Date": None}}
    with matplotlib.rc_context({"pdf.fonttype": 42, "ps.fonttype": 42}):
        for file, fmt in targets:
            fig.savefig(file, format=fmt, dpi=DPI, metadata=stamp.get(fmt))
    return [file for file, _ in targets]


def _finish(fig, title: str | None, path: str | os.PathLike | None,
            formats: Sequence[str] | None = None):
    """Adds the title, makes room for an outside legend, writes the files."""
    targets = _targets(path, formats)  # checked before drawing anything
    _make_room(fig)
    if title:  # wrapped to the figure's width (about 11 characters per inch)
        width = max(20, int(fig.get_figwidth() * 11))
        # no line break inside "10 %" or "= 0.1" (a no-break space joins them)
        title = re.sub(r"(?<=\S) (?=[%=])|(?<=[=]) (?=\S)", "\u00a0", title)
        fig.suptitle(textwrap.fill(title, width))
    if targets:
        save_figure(fig, path, formats=formats)
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


def _legends(fig, axes, *, inside_max: int = 3, **kwargs) -> None:
    """Each panel's legend inside it when every panel has at most
    ``inside_max`` entries; else one legend right of the panels (entries
    with the same label shown once), for which :func:`_finish` widens the
    figure, so that no legend hides data."""
    entries = [ax.get_legend_handles_labels() for ax in axes]
    if max(len(h) for h, _ in entries) <= inside_max:
        for ax, (handles, _) in zip(axes, entries, strict=True):
            if handles:
                ax.legend(**kwargs)
        return
    seen = {}
    for handles, labels in entries:
        for h, lab in zip(handles, labels, strict=True):
            seen.setdefault(lab, h)
    fig.legend(list(seen.values()), list(seen), loc="outside right upper",
               fontsize="small")


def _make_room(fig) -> None:
    """Widens the figure by its legend right of the panels, so that the
    panels keep their size."""
    for legend in fig.legends:
        fig.draw_without_rendering()
        width = legend.get_window_extent().width / fig.dpi
        fig.set_figwidth(fig.get_figwidth() + width + 0.1)


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

    return MaxNLocator(integer=True, steps=[1, 2, 5, 10])


def _percent():
    from matplotlib.ticker import PercentFormatter

    return PercentFormatter(xmax=1.0, decimals=0)
