"""Figures of per-client distributions, lambda sweeps and adversary ratios.

Every function takes plain data (a :func:`fedjax_pfl.simulate` history: a list
of dict rows; a :func:`fedjax_pfl.sweep` history: a dict of ``[S, evals]``
arrays; or per-client arrays), returns a ``matplotlib.figure.Figure`` (made
without pyplot, so nothing is shown or kept alive behind your back; a notebook
with ``%matplotlib inline`` displays the returned figure) and, with ``path=``,
also writes it (PDF/SVG as vector, PNG at 300 dpi). Colours follow
:func:`model_color`. matplotlib is imported lazily:
``pip install fedjax_pfl[plots]``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._common import (
    _figure,
    _finish,
    _integer_ticks,
    _legends,
    _named_vectors,
    _percent,
    _vector,
)
from ._style import PALETTE, model_color, model_colors, summary_style, summary_words

_KINDS = ("cdf", "hist", "both")
_SCALES = ("linear", "log", "symlog")


def client_accuracy_distribution(
    per_client: Mapping[str, Any],
    *,
    mask=None,
    kind: str = "cdf",
    bins: int = 20,
    xlabel: str = "test accuracy per client",
    title: str | None = None,
    path: str | os.PathLike | None = None,
    formats: Sequence[str] | None = None,
):
    """Per-client accuracy distribution of several models (e.g. global vs personal).

    Args:
      per_client: model name -> ``[num_clients]`` per-client values, e.g. from
        :func:`per_client_metric`; NaN entries (clients without examples) are
        left out.
      mask: optional ``[num_clients]`` mask of the clients to show (e.g.
        ``threat.benign``).
      kind: ``'cdf'`` (empirical CDF: the fraction of clients at or below each
        accuracy; the further right the better), ``'hist'`` (clients per bin,
        common bins) or ``'both'`` (two panels).
      bins: number of histogram bins.
      xlabel, title: axis label and figure title.
      path: also write the figure here: ``.pdf``, ``.svg``, ``.eps`` or
        ``.ps`` as vector graphics, ``.png`` at 300 dpi (see
        :func:`save_figure`).
      formats: write one file per format instead, e.g. ``('pdf', 'png')``:
        ``path``'s extension, if any, is replaced by each.

    Returns:
      The figure, each model in :func:`model_color`. CDF panel: one step line
      per model through ``(v_(1), 0), (v_(1), 1/n), ..., (v_(n), 1)`` for the
      sorted values ``v``, labelled with the unweighted mean of the values
      shown. Histogram panel: one bar container per model.

    Raises:
      ValueError: ``per_client`` not a non-empty mapping of equally long 1-D
        arrays, a bad ``mask``, ``kind``, ``bins``, ``path`` or ``formats``, or
        no value left to plot.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind: must be one of {_KINDS}, got {kind!r}")
    if not isinstance(bins, (int, np.integer)) or bins < 1:
        raise ValueError(f"bins: must be a positive integer, got {bins!r}")
    vals = _named_vectors("per_client", per_client)
    n = {v.size for v in vals.values()}
    if len(n) != 1:
        raise ValueError(f"per_client: every array must have one entry per client, "
                         f"got lengths {sorted(n)}")
    keep = np.ones(n.pop(), bool)
    if mask is not None:
        keep = _vector("mask", mask, length=keep.size) > 0
    vals = {k: v[keep & np.isfinite(v)] for k, v in vals.items()}
    for k, v in vals.items():
        if not v.size:
            raise ValueError(f"per_client[{k!r}]: no finite value among the clients "
                             "in mask")
    panels = ("cdf", "hist") if kind == "both" else (kind,)
    colors = model_colors(vals)
    who = f"{keep.sum()} clients" + (" in mask" if mask is not None else "")
    fig, axes = _figure(len(panels))
    for ax, panel in zip(axes, panels, strict=True):
        if panel == "cdf":
            for k, v in vals.items():
                s = np.sort(v)
                frac = np.arange(1, s.size + 1) / s.size
                ax.step(np.concatenate([s[:1], s]), np.concatenate([[0.0], frac]),
                        where="post", color=colors[k], lw=1.5,
                        label=f"{k} (unweighted mean {_fmt(v.mean())})")
            ax.set_ylabel("fraction of clients at or below $x$")
            ax.set_ylim(-0.02, 1.02)
            ax.set_title(f"empirical CDF over {who}")
        else:
            edges = np.histogram_bin_edges(np.concatenate(list(vals.values())), bins)
            ax.hist(list(vals.values()), bins=edges, alpha=0.85,
                    label=None if kind == "both" else list(vals),  # CDF's legend
                    color=[colors[k] for k in vals])
            ax.set_ylabel("number of clients")
            ax.yaxis.set_major_locator(_integer_ticks())
            ax.set_title(f"histogram over {who}")
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    _legends(fig, axes, loc="best" if kind == "hist" else "upper left",
             fontsize="small")
    return _finish(fig, title, path, formats)


def _fmt(x: float) -> str:
    return f"{x:.3f}" if abs(x) < 1 else f"{x:.4g}"


def lambda_sweep(
    lams,
    history: Mapping[str, Any],
    *,
    model: str = "personal",
    split: str = "test",
    metric: str = "accuracy",
    eval_index: int = -1,
    per_client=None,
    xscale: str = "symlog",
    title: str | None = None,
    path: str | os.PathLike | None = None,
    formats: Sequence[str] | None = None,
):
    """Mean, worst-10 % and std of a per-client metric against lambda.

    Args:
      lams: the ``S`` swept lambda values (any order; plotted sorted).
      history: the dict :func:`fedjax_pfl.sweep` returns: it must hold
        ``'{model}/{split}/{metric}/{mean,worst10,std}'`` arrays of shape
        ``[S, num_evals]`` (or ``[S]``); ``.../mean_unweighted`` is drawn too
        when present.
      model, split, metric: which entries to plot.
      eval_index: which evaluation (column) to plot; default the last.
      per_client: optional ``[S, num_clients]`` per-client values at each lambda
        (e.g. :func:`per_client_metric` per swept state): adds a third panel
        with one line per client (NaN clients left out).
      xscale: ``'symlog'`` (default: shows lambda = 0 and decades), ``'log'``
        (all lambdas must be > 0) or ``'linear'``.
      title: figure title.
      path, formats: write the figure (see :func:`client_accuracy_distribution`).

    Returns:
      The figure, in ``model_color(model)``: panel 1 lines ``'mean weighted by
      {split} examples'`` (solid), ``'worst 10 % of clients, unweighted
      mean'`` (dashed) and, if in ``history``, ``'unweighted mean over clients'``
      (dash-dot); panel 2 the ``std`` across clients; panel 3 (with
      ``per_client``) one grey line per client; x data are the sorted lambdas.

    Raises:
      ValueError: mismatched lengths, a missing history entry, bad ``xscale``,
        ``path`` or ``formats``.
    """
    lam = _vector("lams", lams)
    if not np.all(np.isfinite(lam)):
        raise ValueError("lams: must be finite")
    if xscale not in _SCALES:
        raise ValueError(f"xscale: must be one of {_SCALES}, got {xscale!r}")
    if xscale == "log" and np.any(lam <= 0):
        raise ValueError("xscale: 'log' needs every lambda > 0; use 'symlog'")
    if not isinstance(history, Mapping):  # ValueError naming the argument, as always
        raise ValueError(  # noqa: TRY004
            f"history: must be the dict fedjax_pfl.sweep returns, got "
            f"{type(history).__name__}")
    prefix = f"{model}/{split}/{metric}"
    stats = {}
    for s in ("mean", "worst10", "std", "mean_unweighted"):
        key = f"{prefix}/{s}"
        if s == "mean_unweighted" and key not in history:
            continue
        if key not in history:
            models = sorted({k.split("/")[0] for k in history if "/" in k})
            raise ValueError(f"history: has no {key!r} (models in it: {models})")
        a = np.asarray(history[key], dtype=np.float64)
        if a.ndim not in (1, 2) or a.shape[0] != lam.size:
            raise ValueError(f"history: {key!r} must have shape [{lam.size}] or "
                             f"[{lam.size}, num_evals] (one row per lambda), got "
                             f"{a.shape}")
        if a.ndim == 2:
            if not -a.shape[1] <= eval_index < a.shape[1]:
                raise ValueError(f"eval_index: must be in [-{a.shape[1]}, "
                                 f"{a.shape[1]}), got {eval_index}")
            a = a[:, eval_index]
        stats[s] = a
    pc = None
    if per_client is not None:
        pc = np.asarray(per_client, dtype=np.float64)
        if pc.ndim != 2 or pc.shape[0] != lam.size:
            raise ValueError(f"per_client: must have shape [{lam.size}, num_clients], "
                             f"got {pc.shape}")
    order = np.argsort(lam, kind="stable")
    x = lam[order]
    fig, axes = _figure(3 if pc is not None else 2)
    name = metric.replace("_", " ")
    ax = axes[0]
    color = model_color(model)
    for s, marker in (("mean", "o"), ("mean_unweighted", "^"), ("worst10", "s")):
        if s in stats:
            ax.plot(x, stats[s][order], marker=marker, ls=summary_style(s), ms=4,
                    color=color, label=summary_words(s, split))
    ax.set_ylabel(f"{split} {name}")
    ax.set_title(f"{model} model: {name} across clients")
    axes[1].plot(x, stats["std"][order], "o-", ms=4, color=color,
                 label=summary_words("std", split))
    axes[1].set_ylabel(f"std of {split} {name} across clients")
    axes[1].set_title("fairness (lower is fairer)")
    if pc is not None:
        ax = axes[2]
        drawn = 0
        for c in range(pc.shape[1]):
            col = pc[order, c]
            if np.all(np.isfinite(col)):
                ax.plot(x, col, color="0.35", alpha=0.35, lw=0.8)
                drawn += 1
        ax.set_ylabel(f"{split} {name} of each client")
        ax.set_title(f"each client ({drawn} lines)")
    from matplotlib.ticker import FuncFormatter

    for ax in axes:
        ax.set_xscale(xscale, **_symlog_kwargs(xscale, lam))
        if xscale != "linear":
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel(r"$\lambda$")
        ax.grid(alpha=0.3)
    _legends(fig, axes, fontsize="small")
    return _finish(fig, title, path, formats)


def _symlog_kwargs(xscale: str, lam: np.ndarray) -> dict:
    if xscale != "symlog":
        return {}
    pos = np.abs(lam[lam != 0])
    return {"linthresh": float(pos.min()) if pos.size else 1.0}


def adversary_ratio(
    ratios,
    accuracies: Mapping[str, Any],
    *,
    errors: Mapping[str, Any] | None = None,
    ylabel: str = "benign clients' test accuracy\n(mean weighted by test examples)",
    title: str | None = None,
    path: str | os.PathLike | None = None,
    formats: Sequence[str] | None = None,
):
    """Benign accuracy against the fraction of malicious clients, per method.

    Args:
      ratios: the ``R`` adversary ratios (fractions in [0, 1]; plotted sorted).
      accuracies: method name -> ``[R]`` accuracies, one per ratio.
      errors: optional method name -> ``[R]`` half-widths of a shaded band (e.g.
        the std across clients or seeds).
      ylabel: the y label; the default describes the history's
        ``'{view}/test/accuracy/mean'`` over ``eval_mask=threat.benign``: say
        so when plotting another summary (e.g. ``mean_unweighted``).
      title: figure title.
      path, formats: write the figure (see :func:`client_accuracy_distribution`).

    Returns:
      The figure: one line per method in :func:`model_colors` of the method
      names, each with a marker fixed by its colour (x the sorted ratios).

    Raises:
      ValueError: lengths that do not match ``ratios``, ratios outside [0, 1],
        ``errors`` naming an unknown method or negative, a bad ``path`` or
        ``formats``.
    """
    r = _vector("ratios", ratios)
    if np.any(~np.isfinite(r)) or np.any((r < 0) | (r > 1)):
        raise ValueError(f"ratios: must be fractions in [0, 1], got {r.tolist()}")
    acc = _named_vectors("accuracies", accuracies, length=r.size)
    err = {} if errors is None else _named_vectors("errors", errors, length=r.size)
    for k, e in err.items():
        if k not in acc:
            raise ValueError(f"errors: {k!r} is not a method in accuracies "
                             f"({sorted(acc)})")
        if np.any(e < 0):
            raise ValueError(f"errors[{k!r}]: must be >= 0")
    order = np.argsort(r, kind="stable")
    fig, (ax,) = _figure(1, width=6.0, height=4.2)
    colors = model_colors(acc)
    markers = "os^vDP*Xhd"
    for k, a in acc.items():
        (line,) = ax.plot(r[order], a[order], color=colors[k], label=k,
                          marker=markers[PALETTE.index(colors[k]) % len(markers)])
        if k in err:
            ax.fill_between(r[order], (a - err[k])[order], (a + err[k])[order],
                            color=line.get_color(), alpha=0.15, lw=0)
    ax.set_xlabel("fraction of malicious clients")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_formatter(_percent())
    ax.grid(alpha=0.3)
    _legends(fig, [ax], fontsize="small")
    return _finish(fig, title, path, formats)
