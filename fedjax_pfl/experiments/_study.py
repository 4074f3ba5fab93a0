"""Studies: a preset over a grid of settings and several seeds, into one
resumable directory, and a report of mean +- std and a 95 % interval across
seeds for every summary metric, per setting.

Layout: ``<out>/study.json`` (the preset, the grid, the seeds and each run's
directory and state), one run directory per setting and seed
(``<out>/<setting>/seed<k>/``, as :func:`run_preset` writes it), and the
report: ``report.md``, ``report.csv`` and ``report.png`` / ``report.pdf``.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_pfl.validation import check_dir

from ._config import resolve
from ._run import _write_atomic, get_preset, plot_formats, run_preset

STUDY_FILE = "study.json"
HEADLINE = re.compile(r"^[^/]+/test/accuracy/(mean|mean_unweighted|worst10)$|"
                      r"^privacy/epsilon$")
SKIP = {"round", "seconds"}


def parse_seeds(text: str | Sequence[int]) -> list[int]:
    """``"0-4"`` -> ``[0, 1, 2, 3, 4]``; ``"0,3,7"``, ``"2"`` or a list of
    integers as they are. Raises ``ValueError`` naming ``seeds``."""
    if not isinstance(text, str):
        seeds = list(text)
    else:
        seeds = []
        for part in text.split(","):
            lo, sep, hi = part.strip().partition("-")
            try:
                seeds += (list(range(int(lo), int(hi) + 1)) if sep else [int(lo)])
            except ValueError:
                raise ValueError(f"seeds: expected e.g. 0-4 or 0,1,2, got "
                                 f"{text!r}") from None
    if not seeds or any(not isinstance(s, int) or isinstance(s, bool) or s < 0
                        for s in seeds):
        raise ValueError(f"seeds: expected non-negative integers, got {text!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: repeated seeds in {text!r}")
    return seeds


def split_grid(preset_name: str, sets: Mapping[str, str]) -> dict[str, list]:
    """``--set`` strings to a grid: ``key=a,b,c`` gives three values for a key
    with choices or a number/bool type; a free-text key (e.g. ``hidden=128,64``)
    keeps its commas."""
    preset = get_preset(preset_name)
    grid = {}
    for name, text in sets.items():
        key = preset.keys.get(name)
        free_text = key is not None and key.kind is str and key.choices is None
        grid[name] = ([text] if free_text or not isinstance(text, str)
                      else [v.strip() for v in text.split(",")])
    return grid


def _label(value) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", str(value))


def expand(preset_name: str, grid: Mapping[str, Sequence] | None,
           seeds: Sequence[int]) -> list[dict]:
    """Every (setting, seed) of the study, each config resolved and checked
    before any run: ``[{'setting', 'overrides', 'seed', 'dir'}]``. A key that
    has no effect in one combination (e.g. ``term_t`` with ``method=ditto``)
    is dropped from it, and combinations that become equal are run once. A
    setting is named by the keys that take several values (``default`` when
    none does)."""
    preset = get_preset(preset_name)
    grid = {k: list(v) if isinstance(v, (list, tuple)) else [v]
            for k, v in (grid or {}).items()}
    if "seed" in grid:
        raise ValueError("grid: vary the seed with seeds= (--seeds), not as a key")
    for k, v in grid.items():
        if not v:
            raise ValueError(f"grid: {k} has no value")
    runs, seen = [], set()
    for combo in itertools.product(*grid.values()):
        overrides = dict(zip(grid, combo, strict=True))
        kept = {k: v for k, v in overrides.items() if _applies(preset, overrides, k)}
        cfg = resolve(preset, kept)  # raises for an unknown key, a bad value or rule
        setting = ",".join(f"{k}={_label(cfg[k])}" for k in grid
                           if k in kept and len(grid[k]) > 1)
        ident = json.dumps({k: cfg[k] for k in kept}, sort_keys=True, default=str)
        if ident in seen:
            continue
        seen.add(ident)
        for seed in seeds:
            resolve(preset, {**kept, "seed": seed})
            runs.append({"setting": setting or "default", "overrides": kept,
                         "seed": seed,
                         "dir": f"{setting or 'default'}/seed{seed}"})
    return runs


def _applies(preset, overrides, name) -> bool:
    """Whether key ``name`` has an effect given the other overrides (its
    ``only_if`` key at the value these overrides or the defaults give it)."""
    cond = preset.keys[name].only_if if name in preset.keys else None
    if cond is None:
        return True  # (an unknown key is refused by resolve)
    value = overrides.get(cond[0], preset.keys[cond[0]].default)
    try:
        value = resolve(preset, {cond[0]: value})[cond[0]]
    except ValueError:
        return True  # the resolve that follows names the bad value
    return value in cond[1]


def run_study(preset: str, grid: Mapping[str, Sequence] | None = None, *,
              seeds: Sequence[int] | str = (0,), out: str | os.PathLike,
              resume: bool = False, progress: bool = True,
              callback: Callable[[dict], Callable | None] | None = None,
              plots=None) -> dict:
    """Runs ``preset`` for every combination of ``grid`` (key -> values) and
    every seed into ``out``, then writes the report (:func:`study_report`).

    Every combination is resolved and checked before the first run. With
    ``resume``, finished runs are skipped and an interrupted one continues from
    its checkpoint, so an interrupted study resumes as a whole; without it, an
    ``out`` that holds a study is refused. Runs one after the other: each seed
    may partition the data differently, so seeds cannot share one program (for
    seeds on fixed data in one vmapped program, see :func:`fedjax_pfl.sweep`
    with one key per run). ``callback(run) -> simulate callback or None`` makes
    a callback per run (``run`` is the run's entry of ``study.json``), e.g. a
    TensorBoard writer in a folder per run. ``plots``: each run's figures'
    formats (:func:`~fedjax_pfl.experiments.run_preset`); the report's figure
    is always written.

    Returns ``{'runs', 'report'}``.
    """
    seeds = parse_seeds(seeds)
    plot_formats(plots)
    runs = expand(preset, grid, seeds)
    out = Path(out)
    check_dir("out", out)
    spec = {"preset": preset, "grid": {k: list(v) if isinstance(v, (list, tuple))
                                       else [v] for k, v in (grid or {}).items()},
            "seeds": seeds}
    path = out / STUDY_FILE
    if path.exists():
        old = json.loads(path.read_text())
        if not resume:
            raise ValueError(f"out: {out} already holds a study of {old['preset']}; "
                             "pass resume=True (--resume) to continue it, or another "
                             "directory")
        if {k: old.get(k) for k in spec} != json.loads(json.dumps(spec)):
            raise ValueError(f"resume: {out} holds another study ({old['preset']}, "
                             f"grid {old.get('grid')}, seeds {old.get('seeds')})")
        done = {r["dir"] for r in old["runs"] if r.get("done")}
    else:
        done = set()
    for r in runs:
        r["done"] = r["dir"] in done
    out.mkdir(parents=True, exist_ok=True)

    def save():
        _write_atomic(path, json.dumps({**spec, "runs": runs}, indent=1,
                                       default=str))

    save()
    for i, r in enumerate(runs):
        if r["done"]:
            continue
        run_dir = out / r["dir"]
        if progress:
            print(f"study: run {i + 1}/{len(runs)}: {r['setting']} seed {r['seed']}",
                  flush=True)
        cb = callback(r) if callback is not None else None
        try:
            run_preset(preset, {**r["overrides"], "seed": r["seed"]}, out=run_dir,
                       resume=(run_dir / "config.json").exists(), progress=progress,
                       callback=cb, plots=plots)
        finally:
            if cb is not None and hasattr(cb, "close"):
                cb.close()
        r["done"] = True
        save()
    return {"runs": runs, "report": study_report([out], out=out)}


def _run_dirs(paths: Sequence[str | os.PathLike]) -> list[Path]:
    found = []
    for p in map(Path, paths):
        if (p / STUDY_FILE).exists():
            study = json.loads((p / STUDY_FILE).read_text())
            found += [p / r["dir"] for r in study["runs"]
                      if (p / r["dir"] / "history.jsonl").exists()]
        elif (p / "config.json").exists():
            found.append(p)
        elif p.is_dir():
            found += sorted(c.parent for c in p.rglob("config.json"))
        else:
            raise ValueError(f"dirs: {p} is neither a study, a run nor a folder "
                             "holding runs")
    if not found:
        raise ValueError(f"dirs: no finished run under {[str(p) for p in paths]}")
    return found


def _final_row(run_dir: Path) -> dict | None:
    lines = (run_dir / "history.jsonl").read_text().splitlines()
    return json.loads(lines[-1]) if lines else None


def t_quantile(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom."""
    from scipy import stats  # a dependency of jax

    return float(stats.t.ppf(0.975, df))


def across_seeds(values) -> dict[str, float]:
    """``{'n', 'mean', 'std', 'ci_low', 'ci_high'}`` of one value per seed: the
    std with ddof 1 and the 95 % interval ``mean +- t(0.975, n - 1) std /
    sqrt(n)`` (NaN for one seed); e.g. of a ``sweep`` over seeds' final
    accuracies ``hist[name][:, -1]``."""
    v = np.asarray(values, float)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"values: one number per seed (a non-empty 1-D array), got "
                         f"shape {v.shape}")
    n, mean = v.size, float(v.mean())
    std = float(v.std(ddof=1)) if n > 1 else math.nan
    half = t_quantile(n - 1) * std / math.sqrt(n) if n > 1 else math.nan
    return {"n": n, "mean": mean, "std": std, "ci_low": mean - half,
            "ci_high": mean + half}


def study_report(dirs: Sequence[str | os.PathLike],
                 out: str | os.PathLike | None = None) -> dict:
    """Mean, std (across seeds, ddof 1) and a 95 % t interval of every numeric
    metric of each run's last history row, per setting (the runs' preset and
    config apart from the seed).

    ``dirs``: study directories, run directories or folders holding runs. With
    ``out``, writes ``report.md``, ``report.csv`` and the comparison figure
    ``report.png`` / ``report.pdf`` (the headline accuracy of each model per
    setting, with the interval) there.

    Returns ``{'rows': [...], 'markdown': str, 'files': [...]}``; each row has
    ``setting``, ``metric``, ``n``, ``mean``, ``std``, ``ci_low``, ``ci_high``
    and ``seeds``.
    """
    if isinstance(dirs, (str, os.PathLike)):
        dirs = [dirs]
    runs = []
    for d in _run_dirs(dirs):
        cfg = json.loads((d / "config.json").read_text())
        row = _final_row(d)
        if row is None:
            continue
        config = dict(cfg.get("config", {}))
        seed = config.pop("seed", None)
        config.pop("checkpoint_every", None)
        runs.append({"name": cfg.get("preset") or cfg.get("name"), "config": config,
                     "seed": seed, "row": row})
    if not runs:
        raise ValueError("dirs: no run has an evaluation yet")
    varying = sorted({k for r in runs for k in r["config"]
                      if len({json.dumps(x["config"].get(k), default=str)
                              for x in runs}) > 1})
    names = {r["name"] for r in runs}
    groups: dict[str, list] = {}
    for r in runs:
        label = ",".join(f"{k}={r['config'].get(k)}" for k in varying) or "default"
        if len(names) > 1:
            label = f"{r['name']}:{label}"
        groups.setdefault(label, []).append(r)
    rows = []
    for label, rs in groups.items():
        metrics = sorted({k for r in rs for k, v in r["row"].items()
                          if k not in SKIP and isinstance(v, (int, float))
                          and not isinstance(v, bool)})
        for m in metrics:
            rows.append({"setting": label, "metric": m,
                         **across_seeds([r["row"][m] for r in rs if m in r["row"]]),
                         "seeds": sorted(r["seed"] for r in rs if m in r["row"])})
    md = format_report(rows)
    files = []
    if out is not None:
        out = Path(out)
        check_dir("out", out)
        out.mkdir(parents=True, exist_ok=True)
        _write_atomic(out / "report.md", format_report(rows, headline_only=False))
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows({**r, "seeds": " ".join(map(str, r["seeds"]))} for r in rows)
        _write_atomic(out / "report.csv", buf.getvalue())
        files = ["report.md", "report.csv"] + _report_figure(rows, out)
    return {"rows": rows, "markdown": md, "files": files}


def _fmt(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.4f}"


def format_report(rows: Sequence[Mapping[str, Any]], headline_only: bool = True
                  ) -> str:
    """A Markdown table: one line per setting and metric (with
    ``headline_only``, just the test accuracy summaries and epsilon)."""
    lines = ["Mean +- std across seeds (ddof 1) and a 95 % t interval of the "
             "final evaluation. `mean` metrics are weighted by test examples, "
             "`mean_unweighted` and `std` are over clients.", "",
             "| setting | metric | seeds | mean +- std | 95 % interval |",
             "|---|---|---|---|---|"]
    for r in rows:
        if headline_only and not HEADLINE.match(r["metric"]):
            continue
        lines.append(f"| {r['setting']} | {r['metric']} | {r['n']} | "
                     f"{_fmt(r['mean'])} +- {_fmt(r['std'])} | "
                     f"[{_fmt(r['ci_low'])}, {_fmt(r['ci_high'])}] |")
    return "\n".join(lines) + "\n"


def _report_figure(rows, out: Path) -> list[str]:
    """Bars of each model's test accuracy (mean weighted by test examples) per
    setting, with the 95 % interval."""
    try:
        import matplotlib
        from matplotlib.figure import Figure

        from fedjax_pfl import plots
    except ImportError:  # matplotlib is an optional extra
        return []
    del matplotlib
    acc = [r for r in rows if re.fullmatch(r"[^/]+/test/accuracy/mean", r["metric"])]
    if not acc:
        return []
    settings = list(dict.fromkeys(r["setting"] for r in acc))
    views = list(dict.fromkeys(r["metric"].split("/")[0] for r in acc))
    colors = plots.model_colors(views)
    fig = Figure(figsize=(max(4.5, 2.0 + 0.9 * len(settings) * len(views) ** 0.5),
                          3.4), layout="constrained")
    ax = fig.add_subplot()
    width = 0.8 / len(views)
    for j, v in enumerate(views):
        by = {r["setting"]: r for r in acc if r["metric"].startswith(f"{v}/")}
        xs = [i + (j - (len(views) - 1) / 2) * width for i, s in enumerate(settings)
              if s in by]
        rs = [by[s] for s in settings if s in by]
        err = [[0 if math.isnan(r["ci_low"]) else r["mean"] - r["ci_low"]
                for r in rs],
               [0 if math.isnan(r["ci_high"]) else r["ci_high"] - r["mean"]
                for r in rs]]
        ax.bar(xs, [r["mean"] for r in rs], width, yerr=err, capsize=3,
               color=colors[v], label=v)
    ax.set_xticks(range(len(settings)), settings, rotation=20 if len(settings) > 3
                  else 0, ha="right" if len(settings) > 3 else "center")
    lo = min(r["mean"] if math.isnan(r["ci_low"]) else r["ci_low"] for r in acc)
    hi = max(r["mean"] if math.isnan(r["ci_high"]) else r["ci_high"] for r in acc)
    ax.set_ylim(max(0.0, lo - 0.05), min(1.0, hi + 0.02))
    ax.set_ylabel("test accuracy\n(mean weighted by test examples)", fontsize=9)
    seeds = sorted({r["n"] for r in acc})
    ax.set_title(f"final test accuracy: mean and 95 % interval\nover "
                 f"{'/'.join(map(str, seeds))} seeds", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    plots.save_figure(fig, out / "report.png", formats=("png", "pdf"))
    return ["report.png", "report.pdf"]
