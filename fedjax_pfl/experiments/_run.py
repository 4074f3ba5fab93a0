"""Runs a preset into a run directory.

``<out>/config.json`` (the resolved config, the preset, versions),
``<out>/history.jsonl`` (one row per evaluation), ``<out>/clients.csv`` (final
per-client metrics), ``<out>/plots/*.png`` and ``<out>/checkpoints/`` (atomic
orbax checkpoints; ``resume=True`` continues a stopped run exactly). A preset
whose algorithm declares a DP mechanism also writes ``<out>/privacy.json``, the
privacy ledger (:func:`privacy_ledger`), rewritten atomically at every
evaluation.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_pfl.core import evaluate_state, simulate
from fedjax_pfl.plots import FORMATS
from fedjax_pfl.validation import check_choice, check_dir

from ._config import Experiment, Preset, preflight, resolve
from ._presets import PRESETS
from ._registry import engine

SPLITS = ("test",)
# Each preset's measured time and peak memory at its defaults, written by
# benchmarks/preset_cost.py --write-package (shown by `fedjax-pfl list`).
COSTS_FILE = Path(__file__).with_name("preset_costs.json")


def preset_cost(preset: Preset) -> str:
    """The measured cost of a run of ``preset`` at its defaults, or ``''``."""
    if preset.cost:
        return preset.cost
    try:
        return json.loads(COSTS_FILE.read_text()).get(preset.name, "")
    except (OSError, ValueError):
        return ""


def get_preset(name: str) -> Preset:
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"preset: unknown {name!r}; valid presets: "
                         f"{', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_atomic(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file and a rename, with
    the permissions of a plainly created file (mkstemp's are 0600)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.fchmod(fd, 0o666 & ~_umask())
    with os.fdopen(fd, "w", newline="") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _check_out(out: Path, record: dict, resume: bool) -> None:
    """Refuses to overwrite another run; on resume the config must match. Reads
    only: nothing is created until every check has passed."""
    check_dir("out", out)
    check_dir("out", out / "plots")
    check_dir("out", out / "checkpoints")
    cfg_path = out / "config.json"
    if cfg_path.is_dir():
        raise ValueError(f"out: {cfg_path} is a folder, not a run's config file")
    if cfg_path.exists():
        old = json.loads(cfg_path.read_text())
        name = old.get("preset") or old.get("name")
        if not resume:
            raise ValueError(f"out: {out} already holds a run ({name}); pass "
                             "resume=True (--resume) to continue it, or another "
                             "directory")
        new = json.loads(json.dumps(record["config"], default=str))
        if (name, old.get("config")) != (record.get("preset") or record.get("name"),
                                         new):
            raise ValueError(f"resume: {out} holds a run of {name} with config "
                             f"{old.get('config')}, not {new}")


def _check_experiment(exp, cfg: Mapping[str, Any], key, engine=None) -> int:
    """What needs the loaded data, before anything is written or trained:
    the builder's result, the number of rounds (a privacy plan may allow none)
    and :func:`preflight` (the models against the data, the evaluation options,
    one traced round: e.g. a cohort larger than the number of clients).
    Returns the number of rounds."""
    if not isinstance(exp, Experiment):
        raise ValueError(f"build: a preset must return an Experiment, got "
                         f"{type(exp).__name__}")
    if isinstance(exp.views, str) or not exp.views:
        raise ValueError(f"views: must be a non-empty tuple of view names, got "
                         f"{exp.views!r}")
    num_rounds = exp.info.get("num_rounds", cfg["rounds"])
    if num_rounds < 1:
        why = (" (the privacy budget allows no round: raise target_epsilon)"
               if "num_rounds" in exp.info else "")
        raise ValueError(f"rounds: the run has {num_rounds} rounds{why}")
    preflight(exp.algorithm, exp.data, key, eval_mask=exp.eval_mask, splits=SPLITS,
              views=exp.views, engine=engine)
    return int(num_rounds)


def privacy_ledger(exp: Experiment, rounds) -> dict | None:
    """The run's privacy ledger: the mechanism the algorithm declares
    (level, description, settings, whether it is accounted and why not), and,
    when the preset accounts it, the accountant's settings and epsilon and
    total delta at each evaluated round. ``None`` for a non-private
    algorithm."""
    fn = getattr(exp.algorithm, "privacy", None)
    if fn is None:
        return None
    if exp.privacy is not None:
        return exp.privacy.ledger(rounds)
    mech = fn(exp.data)
    return {"mechanism": mech.record(), "evaluations": [],
            "epsilon": None if not mech.accounted else
            "accounted, but this preset reports no epsilon"}


def _ledger_callback(out: Path, exp: Experiment, resume: bool):
    """A ``simulate`` callback that rewrites ``privacy.json`` after every
    evaluation (resumed runs keep the earlier rounds), then calls the preset's
    own callback."""
    path = out / "privacy.json"
    rounds: list[int] = []
    if resume and path.exists():
        rounds = [e["round"] for e in json.loads(path.read_text())["evaluations"]]

    def callback(state, row):
        rounds[:] = [r for r in rounds if r < row["round"]] + [row["round"]]
        _write_atomic(path, json.dumps(privacy_ledger(exp, rounds), indent=1))
        if exp.callback is not None:
            exp.callback(state, row)

    return callback


def per_client_table(algorithm, state, fed, key, views,
                     engine=None) -> dict[str, np.ndarray]:
    """Final per-client metrics of ``views`` on the test split, as columns, as
    ``simulate(key=key, engine=engine)`` evaluated them."""
    out = jax.jit(lambda s, d: evaluate_state(  # state, data as arguments
        algorithm, s, d, key=key, views=views, splits=SPLITS, per_client=True,
        engine=engine))(
            state, fed)
    cols = {"client": np.arange(fed.num_clients),
            "train_examples": np.asarray(fed.train.counts)}
    for k, v in sorted(out.items()):
        if k.endswith("/per_client"):
            cols[k[: -len("/per_client")]] = np.asarray(v)
    return cols


def write_csv(path: Path, cols: Mapping[str, np.ndarray]) -> None:
    names = list(cols)
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(names)
    w.writerows(zip(*(np.asarray(cols[n]).tolist() for n in names), strict=True))
    _write_atomic(path, buf.getvalue())


PLOTS_ENV = "FEDJAX_PFL_PLOTS"  # the default of ``plots``, e.g. "none" or "pdf"


def plot_formats(plots=None) -> tuple[str, ...]:
    """The formats a run writes its figures in: ``plots`` as a sequence or a
    comma-separated string (``"png,pdf"``), ``"none"`` or ``()`` for none;
    ``None`` reads ``$FEDJAX_PFL_PLOTS``, else PNG (300 dpi) and PDF.

    Raises:
      ValueError: a format that is not one of ``fedjax_pfl.plots.FORMATS``.
    """
    if plots is None:
        plots = os.environ.get(PLOTS_ENV, "png,pdf")
    if isinstance(plots, str):
        plots = [] if plots.strip().lower() == "none" else plots.split(",")
    try:
        fmts = tuple(dict.fromkeys(str(f).strip().lower().lstrip(".")
                                   for f in plots))
    except TypeError:
        fmts = (plots,)
    if any(f not in FORMATS for f in fmts):
        raise ValueError(f"plots: formats from {FORMATS} (e.g. 'png,pdf') or "
                         f"'none', got {plots!r}")
    return fmts


def make_plots(out: Path, history, cols, views, name: str, mask,
               formats: tuple[str, ...]) -> list[str]:
    """Training curves, LINDT's Delta and beta when recorded, and the
    per-client accuracy distribution, each in ``formats`` (from
    :func:`plot_formats`; PNG at 300 dpi)."""
    if not formats:
        return []
    try:
        from fedjax_pfl import plots
    except ImportError:  # matplotlib is an optional extra
        return []
    made = []
    (out / "plots").mkdir(exist_ok=True)

    def save(fn, stem, *args, **kwargs):
        fn(*args, path=out / "plots" / stem, formats=formats, **kwargs)
        made.extend(f"plots/{stem}.{f}" for f in formats)

    keys = [f"{v}/test/accuracy/{s}" for v in views for s in ("mean", "worst10")
            if f"{v}/test/accuracy/{s}" in history[-1]]
    who = "benign clients" if mask is not None else "all clients"
    if keys:
        save(plots.training_curves, "curves", history, keys=keys,
             ylabels="test accuracy", title=f"{name}: test accuracy over {who}")
    if "nfl/delta" in history[-1] or "nfl/beta" in history[-1]:
        save(plots.nfl_curves, "nfl", history,
             title=f"{name}: $\\Delta$ and gain $\\beta$")
    acc = {v: cols[f"{v}/test/accuracy"] for v in views
           if f"{v}/test/accuracy" in cols}
    if acc:
        save(plots.client_accuracy_distribution, "clients", acc, mask=mask,
             title=f"{name}: final test accuracy per client"
             + (" (benign)" if mask is not None else ""))
    return made


def provenance() -> dict[str, Any]:
    """What made a run: the package version, its git commit when the package
    runs from a git checkout (with ``dirty`` when it has uncommitted changes),
    python, jax, the backend and its device."""
    import platform
    import subprocess

    import fedjax_pfl

    out = {"fedjax_pfl": fedjax_pfl.__version__, "git_commit": None,
           "python": platform.python_version(), "jax": jax.__version__,
           "backend": jax.default_backend(),
           "device": jax.devices()[0].device_kind}
    here = Path(fedjax_pfl.__file__).parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, text=True,
                             capture_output=True, timeout=10)
        if sha.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--", "."],
                                   cwd=here, text=True, capture_output=True,
                                   timeout=10).stdout.strip()
            out["git_commit"] = sha.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def run_preset(name: str, overrides: Mapping[str, Any] | None = None, *,
               out: str | os.PathLike, resume: bool = False,
               progress: bool = True, callback=None, plots=None) -> dict:
    """Runs preset ``name`` with ``overrides`` into the directory ``out``.

    Every key and value is checked before anything is loaded or written, and
    everything that needs the loaded data (the model against the data, the
    cohort against the number of clients, a malicious ratio that leaves no
    attacker, the privacy plan) before anything is written or trained
    (docs/engine.md, "Validation"). ``callback(state, row)`` is called after
    every evaluation (e.g. a :mod:`fedjax_pfl.tracking` writer). ``plots``:
    the figures' formats (:func:`plot_formats`; ``"none"`` writes none).
    Returns ``{'config', 'history', 'final', 'files', 'views'}``.

    Raises:
      ValueError: unknown preset or key, invalid value, an ``out`` that is a file
        or holds another run (or, with ``resume``, a run of another config), or
        an experiment that cannot run on its data.
      fedjax_pfl.Interrupted: SIGINT or SIGTERM stopped the run at an
        evaluation (checkpointed unless ``checkpoint_every=0``).
    """
    preset = get_preset(name)
    cfg = resolve(preset, overrides)
    _check_run_args(out, resume, progress, callback)
    plot_formats(plots)
    record = {"preset": name, "paper": preset.paper, "scaled": preset.scaled,
              "config": cfg}
    _check_out(Path(out), record, resume)
    return run_experiment(preset.build(dict(cfg)), out, config=cfg, name=name,
                          record=record, resume=resume, progress=progress,
                          callback=callback, plots=plots)


def _check_run_args(out, resume, progress, callback) -> None:
    check_choice("resume", resume, (True, False))
    check_choice("progress", progress, (True, False))
    if out is None:
        raise ValueError("out: the run directory is required")
    check_dir("out", out)
    if callback is not None and not callable(callback):
        raise ValueError(f"callback: must be callable or None, got {callback!r}")


def run_experiment(exp: Experiment, out: str | os.PathLike, *,
                   config: Mapping[str, Any], name: str = "experiment",
                   resume: bool = False, progress: bool = True, callback=None,
                   record: Mapping[str, Any] | None = None, plots=None) -> dict:
    """Runs an :class:`Experiment` of your own into a run directory, as
    ``fedjax-pfl run`` does for a preset: ``config.json`` (``config`` and the
    provenance), ``history.jsonl``, ``clients.csv``, the plots, the
    checkpoints (``resume=True`` continues exactly) and, for a private
    algorithm, ``privacy.json``.

    Args:
      exp: what ``simulate`` needs (:class:`Experiment`).
      out: the run directory.
      config: the settings to record; the run reads ``rounds``, ``eval_every``
        and ``seed`` (required) and ``checkpoint_every`` (default: every
        evaluation; 0: none) and ``strategy`` (default ``auto``) from it.
      name: the experiment's name in config.json and in the plots' titles.
      resume, progress, callback: as :func:`run_preset`.
      record: extra fields for config.json (:func:`run_preset` passes the
        preset's).
      plots: the figures' formats (:func:`plot_formats`): default
        ``$FEDJAX_PFL_PLOTS``, else PNG and PDF; ``"none"`` writes none.

    Returns and raises as :func:`run_preset`.
    """
    _check_run_args(out, resume, progress, callback)
    formats = plot_formats(plots)
    if not isinstance(config, Mapping):
        raise ValueError(f"config: must be a mapping, got {type(config).__name__}")
    missing = [k for k in ("rounds", "eval_every", "seed") if k not in config]
    if missing:
        raise ValueError(f"config: needs {missing} (the run's schedule and seed)")
    cfg = {"checkpoint_every": None, "strategy": "auto", **config}
    out = Path(out)
    record = {"name": name, **(record or {}), "config": dict(cfg), **provenance()}
    _check_out(out, record, resume)
    key = jax.random.key(cfg["seed"])
    eng = engine(cfg)
    num_rounds = _check_experiment(exp, cfg, key, eng)
    if resume and cfg["checkpoint_every"] == 0:
        raise ValueError("resume: the run writes no checkpoints "
                         "(checkpoint_every=0); nothing to resume from")
    record["info"] = dict(exp.info)
    out.mkdir(parents=True, exist_ok=True)
    _write_atomic(out / "config.json", json.dumps(record, indent=1, default=str))
    eval_every = min(cfg["eval_every"], num_rounds)
    ckpt = cfg["checkpoint_every"]
    if ckpt is None or ckpt % eval_every:
        ckpt = eval_every
    if not resume and (out / "history.jsonl").exists():
        (out / "history.jsonl").unlink()  # a run that crashed before its 1st checkpoint
    private = getattr(exp.algorithm, "privacy", None) is not None
    callbacks = [c for c in (_ledger_callback(out, exp, resume) if private
                             else exp.callback, callback) if c is not None]
    res = simulate(exp.algorithm, exp.data, num_rounds=num_rounds,
                   eval_every=eval_every, key=key, eval_mask=exp.eval_mask,
                   splits=SPLITS, progress=progress,
                   jsonl_path=str(out / "history.jsonl"),
                   checkpoint_dir=out / "checkpoints" if ckpt else None,
                   checkpoint_every=ckpt or None,
                   resume=resume, privacy=exp.privacy, engine=eng,
                   callback=(lambda s, r: [c(s, r) for c in callbacks])
                   if callbacks else None)
    if exp.callback is not None:  # its keys come after simulate wrote each line
        _write_atomic(out / "history.jsonl",
                      "".join(json.dumps(r) + "\n" for r in res.history))
    cols = per_client_table(exp.algorithm, res.state, exp.data, key, exp.views, eng)
    if exp.eval_mask is not None:
        cols["benign"] = np.asarray(exp.eval_mask).astype(int)
    write_csv(out / "clients.csv", cols)
    files = ["config.json", "history.jsonl", "clients.csv"] + (
        ["checkpoints/"] if ckpt else [])
    if private:
        _write_atomic(out / "privacy.json", json.dumps(
            privacy_ledger(exp, [r["round"] for r in res.history]), indent=1))
        files.append("privacy.json")
    benign = None if exp.eval_mask is None else np.asarray(exp.eval_mask) > 0
    files += make_plots(out, res.history, cols, exp.views, name, benign, formats)
    return {"config": cfg, "history": res.history, "final": res.history[-1],
            "files": files, "views": exp.views}


def format_final(result: dict) -> str:
    """A table of the final test accuracy summaries of the run's views."""
    row = result["final"]
    lines = ["final test accuracy: mean weighted by test examples; std, worst10 "
             "and best10 over clients, unweighted",
             f"{'model':<12}{'mean':>8}{'std':>8}{'worst10':>9}{'best10':>8}"]
    for v in result["views"]:
        k = f"{v}/test/accuracy"
        if f"{k}/mean" in row:
            lines.append(f"{v:<12}" + "".join(
                f"{row[f'{k}/{s}']:>{w}.4f}" for s, w in
                (("mean", 8), ("std", 8), ("worst10", 9), ("best10", 8))))
    if "privacy/epsilon" in row:
        lines.append(f"epsilon {row['privacy/epsilon']:.3f} at delta "
                     f"{row['privacy/delta']:g} after {row['round']} rounds")
    return "\n".join(lines)
