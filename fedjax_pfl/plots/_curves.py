"""Metrics over rounds from a simulate history: training curves and LINDT's
NFL detection (Delta, epsilon, the detection round) and gain beta."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import numpy as np

from ._common import (
    _figure,
    _finish,
    _integer_ticks,
    _legend,
    _missing,
    _rows,
    _series,
)


def _panels(keys) -> list[list[str]]:
    if isinstance(keys, str):
        return [[keys]]
    if not isinstance(keys, Sequence) or not keys:
        raise ValueError(f"keys: must be a key, a list of keys or a list of lists "
                         f"of keys (one panel each), got {keys!r}")
    if all(isinstance(k, str) for k in keys):
        return [list(keys)]
    if all(isinstance(g, Sequence) and not isinstance(g, str) and g
           and all(isinstance(k, str) for k in g) for g in keys):
        return [list(g) for g in keys]
    raise ValueError(f"keys: must be a key, a list of keys or a list of non-empty "
                     f"lists of keys, got {keys!r}")


def _common_suffix(keys: Sequence[str]) -> str:
    parts = [k.split("/") for k in keys]
    out = []
    for seg in zip(*(p[::-1] for p in parts)):
        if len(set(seg)) != 1:
            break
        out.append(seg[0])
    return "/".join(out[::-1])


def training_curves(
    history,
    keys,
    *,
    labels: Mapping[str, str] | None = None,
    ylabels: str | Sequence[str] | None = None,
    logy: bool = False,
    title: str | None = None,
    path: str | os.PathLike | None = None,
):
    """Metrics against the round, from a :func:`fedjax_pfl.simulate` history.

    Args:
      history: the list of rows (``SimulationResult.history``; a
        ``SimulationResult`` is accepted too); rows without a finite number
        under a key are skipped for that key.
      keys: a key (``'personal/test/accuracy/mean'``), a list of keys (one
        panel) or a list of lists of keys (one panel each, e.g. accuracies and
        losses apart).
      labels: optional key -> legend label.
      ylabels: y-axis label(s), one per panel (default: the keys' common
        trailing part, e.g. ``test accuracy mean``).
      logy: log-scale y axes.
      title, path: figure title; also save as a PNG.

    Returns:
      The figure: one line per key, x the rows' ``round``.

    Raises:
      ValueError: a bad ``history`` or ``keys``, or a key in no row.
    """
    rows = _rows("history", history)
    panels = _panels(keys)
    labels = dict(labels or {})
    if ylabels is not None:
        ylabels = [ylabels] if isinstance(ylabels, str) else list(ylabels)
        if len(ylabels) != len(panels) or not all(isinstance(y, str) for y in ylabels):
            raise ValueError(f"ylabels: must be {len(panels)} string(s), one per "
                             f"panel, got {ylabels!r}")
    fig, axes = _figure(len(panels))
    for i, (ax, group) in enumerate(zip(axes, panels, strict=True)):
        for key in group:
            x, y = _series(rows, key)
            if not x.size:
                raise _missing("keys", key, rows)
            ax.plot(x, y, "o-" if x.size <= 30 else "-", ms=3,
                    label=labels.get(key, key))
        suffix = _common_suffix(group).replace("/", " ")
        ax.set_ylabel(ylabels[i] if ylabels else suffix or "value")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(_integer_ticks())
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        _legend(ax, fontsize="small")
    return _finish(fig, title, path)


def _detection_round(rows, detected_key: str) -> float | None:
    for i, row in enumerate(rows):
        v = row.get(detected_key)
        if v is not None and not isinstance(v, (list, str)) and float(v) > 0:
            return float(row.get("round", i))
    return None


def nfl_curves(
    history,
    *,
    delta_key: str = "nfl/delta",
    beta_key: str = "nfl/beta",
    epsilon: float = 0.1,
    detected_key: str = "nfl/detected",
    detection_round: float | None = None,
    title: str | None = None,
    path: str | os.PathLike | None = None,
):
    """NFL detection and gain over rounds (LINDT, Sec. 3.4).

    Panel "Delta": the server's noise-corrected weight divergence
    ``Delta = (1/K) sum_k ||w_k - w|| - ||noise||`` with the threshold
    ``epsilon`` (dashed) and the round NFL was detected (dotted). Panel "beta":
    the gain ``beta = mean_i (V_i^G - V_i^P)`` of the deployed model over the
    clients' private models, with the zero line (below it: negative FL).

    Args:
      history: a simulate history (list of rows) holding ``delta_key`` and/or
        ``beta_key``; a panel is drawn for each key present.
      delta_key, beta_key: the history keys of Delta and beta.
      epsilon: the detection threshold drawn on the Delta panel (``None``: none).
      detected_key: a row key whose first truthy value marks the detection
        round (used when ``detection_round`` is None; absent: no marker).
      detection_round: the round to mark, overriding ``detected_key``.
      title, path: figure title; also save as a PNG.

    Returns:
      The figure. Lines carry labels: the data ``'Delta'`` / ``'beta'``, and
      ``'epsilon = ...'``, ``'NFL detected (round r)'``, ``'beta = 0'``.

    Raises:
      ValueError: a bad ``history``, neither key in any row, a bad ``epsilon``.
    """
    rows = _rows("history", history)
    if epsilon is not None and not (isinstance(epsilon, (int, float, np.number))
                                    and math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon: must be a finite number >= 0 or None, got "
                         f"{epsilon!r}")
    series = {name: _series(rows, key) for name, key in
              (("Delta", delta_key), ("beta", beta_key))}
    series = {k: v for k, v in series.items() if v[0].size}
    if not series:
        raise ValueError(f"history: no row holds {delta_key!r} or {beta_key!r} "
                         "(pass delta_key= / beta_key= to name the keys)")
    if detection_round is None:
        detection_round = _detection_round(rows, detected_key)
    elif (isinstance(detection_round, bool)
          or not isinstance(detection_round, (int, float, np.number))
          or not math.isfinite(detection_round)):
        raise ValueError(f"detection_round: must be a round number or None, got "
                         f"{detection_round!r}")
    fig, axes = _figure(len(series))
    for ax, (name, (x, y)) in zip(axes, series.items(), strict=True):
        ax.plot(x, y, "-" if x.size > 30 else "o-", ms=3, label=name)
        if name == "Delta":
            if epsilon is not None:
                ax.axhline(epsilon, color="C3", ls="--", label=f"epsilon = {epsilon:g}")
            ax.set_ylabel("Delta = weight divergence - ||noise||")
            ax.set_title("NFL detection (server side)")
        else:
            ax.axhline(0.0, color="0.3", lw=0.8, label="beta = 0")
            ax.set_ylabel("beta = mean over clients of V^G - V^P")
            ax.set_title("gain over private models (< 0: NFL)")
        if detection_round is not None:
            ax.axvline(detection_round, color="C1", ls=":",
                       label=f"NFL detected (round {detection_round:g})")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.grid(alpha=0.3)
        _legend(ax, fontsize="small")
    return _finish(fig, title, path)
