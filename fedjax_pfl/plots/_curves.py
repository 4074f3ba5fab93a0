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
    _legends,
    _missing,
    _rows,
    _series,
)
from ._style import model_color, model_colors, parse_key, summary_style, summary_words


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


def _ylabel(group: Sequence[str]) -> str:
    """The panel's default y label: what its keys have in common."""
    parsed = [parse_key(k) for k in group]
    if all(parsed):
        splits, metrics, sums = ({p[i] for p in parsed} for i in (1, 2, 3))
        if len(metrics) == 1:
            what = metrics.pop().replace("_", " ")
            if len(splits) != 1:
                return what
            split = splits.pop()
            if len(sums) == 1:
                return f"{split} {what} ({summary_words(sums.pop(), split)})"
            return f"{split} {what}"
    parts = [k.split("/") for k in group]
    out = []
    for seg in zip(*(p[::-1] for p in parts)):
        if len(set(seg)) != 1:
            break
        out.append(seg[0])
    return " ".join(out[::-1]) or "value"


def _label(key: str, given: str | None) -> str:
    """The legend label of a key; a mean always says how it is weighted."""
    parsed = parse_key(key)
    if given is None:
        if parsed is None:
            return key
        view, split, _, summary = parsed
        return f"{view}: {summary_words(summary, split)}"
    if parsed and parsed[3] in ("mean", "mean_unweighted") and \
            "weighted" not in given.lower():
        how = (f"weighted by {parsed[1]} examples" if parsed[3] == "mean"
               else "unweighted")
        return f"{given} ({how})"
    return given


def _styles(group: Sequence[str]) -> dict[str, dict]:
    """Colour by model (the view of a history key, else the key), line style
    by summary; markers tell apart keys that still look alike."""
    names = {k: (parse_key(k) or (k,))[0] for k in group}
    colors = model_colors(names.values())
    seen: dict[tuple[str, str], int] = {}
    out = {}
    for k in group:
        parsed = parse_key(k)
        ls = summary_style(parsed[3] if parsed else None)
        n = seen[colors[names[k]], ls] = seen.get((colors[names[k]], ls), -1) + 1
        out[k] = {"color": colors[names[k]], "ls": ls, "marker": "osD^v*"[n % 6],
                  "repeat": n > 0}
    return out


def training_curves(
    history,
    keys,
    *,
    labels: Mapping[str, str] | None = None,
    ylabels: str | Sequence[str] | None = None,
    logy: bool = False,
    title: str | None = None,
    path: str | os.PathLike | None = None,
    formats: Sequence[str] | None = None,
):
    """Metrics against the round, from a :func:`fedjax_pfl.simulate` history.

    Args:
      history: the list of rows (``SimulationResult.history``; a
        ``SimulationResult`` is accepted too); rows without a finite number
        under a key are skipped for that key.
      keys: a key (``'personal/test/accuracy/mean'``), a list of keys (one
        panel) or a list of lists of keys (one panel each, e.g. accuracies and
        losses apart).
      labels: optional key -> legend label. The label of a ``.../mean`` or
        ``.../mean_unweighted`` key that does not say how it is weighted gets
        ``(weighted by test examples)`` / ``(unweighted)`` appended. Default:
        ``'personal: mean weighted by test examples'`` for a history summary
        key, else the key.
      ylabels: y-axis label(s), one per panel (default: the split and metric
        the keys share, e.g. ``test accuracy``).
      logy: log-scale y axes.
      title: figure title.
      path, formats: write the figure (see :func:`client_accuracy_distribution`).

    Returns:
      The figure: one line per key, x the rows' ``round``. A history summary
      key ``'{view}/{split}/{metric}/{summary}'`` is drawn in
      ``model_color(view)``, solid for ``mean``, dash-dot for
      ``mean_unweighted``, dashed for ``worst10``, dotted for ``best10``; any
      other key in ``model_color(key)``.

    Raises:
      ValueError: a bad ``history``, ``keys``, ``path`` or ``formats``, or a key
        in no row.
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
        styles = _styles(group)
        for key in group:
            x, y = _series(rows, key)
            if not x.size:
                raise _missing("keys", key, rows)
            st, few = styles[key], x.size <= 30
            ax.plot(x, y, color=st["color"], ls=st["ls"], lw=1.5,
                    marker=st["marker"] if few or st["repeat"] else None, ms=3.5,
                    markevery=None if few else max(1, x.size // 10),
                    label=_label(key, labels.get(key)))
        ax.set_ylabel(ylabels[i] if ylabels else _ylabel(group))
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(_integer_ticks())
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    _legends(fig, axes, fontsize="small")
    return _finish(fig, title, path, formats)


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
    formats: Sequence[str] | None = None,
):
    r"""NFL detection and gain over rounds (LINDT, Sec. 3.4).

    Panel :math:`\Delta`: the server's noise-corrected weight divergence
    ``Delta = (1/K) sum_k ||w_k - w|| - ||noise||`` (an unweighted mean over
    the ``K`` clients of the round) with the threshold ``epsilon`` (dashed) and
    the round NFL was detected (dotted). Panel :math:`\beta`: the gain
    ``beta = sum_i alpha_i (V_i^G - V_i^P)`` of the deployed model over the
    clients' private models (``alpha_i = 1/N``, an unweighted mean, unless
    :func:`fedjax_pfl.metrics.gain_callback` was given ``alpha``), with the
    zero line (below it: negative FL).

    Args:
      history: a simulate history (list of rows) holding ``delta_key`` and/or
        ``beta_key``; a panel is drawn for each key present.
      delta_key, beta_key: the history keys of Delta and beta.
      epsilon: the detection threshold drawn on the Delta panel (``None``: none).
      detected_key: a row key whose first truthy value marks the detection
        round (used when ``detection_round`` is None; absent: no marker).
      detection_round: the round to mark, overriding ``detected_key``.
      title: figure title.
      path, formats: write the figure (see :func:`client_accuracy_distribution`).

    Returns:
      The figure. Lines carry labels (matplotlib mathtext): the data
      ``'$\Delta$'`` / ``'$\beta$'``, and ``'threshold $\varepsilon = ...$'``,
      ``'NFL detected (round r)'``, ``'$\beta = 0$'``.

    Raises:
      ValueError: a bad ``history``, neither key in any row, a bad ``epsilon``,
        ``detection_round``, ``path`` or ``formats``.
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
    color = model_color("global")
    for ax, (name, (x, y)) in zip(axes, series.items(), strict=True):
        ax.plot(x, y, "-" if x.size > 30 else "o-", ms=3, color=color,
                label=rf"$\{name}$")
        if name == "Delta":
            if epsilon is not None:
                ax.axhline(epsilon, color="0.35", ls="--",
                           label=rf"threshold $\varepsilon = {epsilon:g}$")
            ax.set_ylabel(r"$\Delta = \frac{1}{K}\Sigma_k \Vert w_k - w\Vert"
                          r" - \Vert\mathrm{noise}\Vert$")
            ax.set_title("NFL detection (server side)")
        else:
            ax.axhline(0.0, color="0.35", lw=0.8, label=r"$\beta = 0$")
            ax.set_ylabel(r"$\beta = \Sigma_i\,\alpha_i\,(V^G_i - V^P_i)$")
            ax.set_title("gain over the private models (< 0: NFL)")
        if detection_round is not None:
            ax.axvline(detection_round, color="0.15", ls=":",
                       label=f"NFL detected (round {detection_round:g})")
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.grid(alpha=0.3)
    _legends(fig, axes, fontsize="small")
    return _finish(fig, title, path, formats)
