"""The ``fedjax-pfl`` console command."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path


def _demo_parser(sub) -> None:
    from ._demo import DemoConfig

    p = sub.add_parser("demo", help="Ditto vs global vs local vs finetuned on "
                                    "synthetic data with adversaries (the default)")
    for f in dataclasses.fields(DemoConfig):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=f.type if callable(
            f.type) else type(f.default), default=f.default)
    p.add_argument("--json", help="also write the final metrics to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fedjax-pfl",
        description="JAX-vectorized simulator for personalized federated learning. "
                    "Without a command, runs the demo.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command")
    _demo_parser(sub)
    _preset_parsers(sub)
    ds = sub.add_parser("datasets", help="list datasets found under a data directory")
    ds.add_argument("--data-dir", default=None,
                    help="default: $FEDJAX_PFL_DATA_DIR")
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in (*sub.choices, "-h", "--help", "--version"):
        argv = ["demo", *argv]  # options without a command go to the demo
    args = parser.parse_args(argv)
    if args.command == "datasets":
        return _datasets(args.data_dir)
    try:
        if args.command in ("list", "run"):
            _load_preset_files(args.preset_file)
        if args.command == "list":
            return _list(args.preset)
        if args.command == "run":
            return _run(args)
        if args.command == "report":
            return _report(args)
    except ValueError as e:
        raise SystemExit(f"fedjax-pfl {args.command}: {e}") from None
    return _demo(args)


def _version() -> str:
    import fedjax_pfl

    return f"fedjax-pfl {fedjax_pfl.__version__}"


def _load_preset_files(paths) -> None:
    from ._registry import load_preset_file

    env = os.environ.get("FEDJAX_PFL_PRESETS", "")
    for path in [*filter(None, env.split(os.pathsep)), *(paths or ())]:
        load_preset_file(path)


def _preset_parsers(sub) -> None:
    preset_file = dict(action="append", default=[], metavar="FILE.py",
                       help="a Python file that registers presets of your own "
                            "(experiments.register_preset); repeatable; also "
                            "$FEDJAX_PFL_PRESETS (paths separated by "
                            f"{os.pathsep!r})")
    ls = sub.add_parser("list", help="the papers' experiment presets (with a name: "
                                     "its keys, defaults and allowed values)")
    ls.add_argument("preset", nargs="?", default=None)
    ls.add_argument("--preset-file", **preset_file)
    run = sub.add_parser(
        "run", help="run a preset into a run directory (config, history.jsonl, "
                    "clients.csv, plots, checkpoints); with --seeds or a list of "
                    "values, a study of every combination")
    run.add_argument("preset", nargs="?", default=None,
                     help="the preset (or `preset` in --config)")
    run.add_argument("--config", metavar="FILE",
                     help="a TOML or YAML file: preset, seeds, out and a [set] table "
                          "of key = value (a list of values: a grid); --set and "
                          "--seeds override it")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a key (repeatable); KEY=a,b,c runs each value "
                          "(a study); `fedjax-pfl list PRESET` lists the keys")
    run.add_argument("--seeds", metavar="SEEDS",
                     help="run every setting for these seeds, e.g. 0-4 or 0,2,7 "
                          "(a study)")
    run.add_argument("--checkpoint-every", type=int, metavar="N",
                     help="rounds between checkpoints, a multiple of eval_every "
                          "(0: no checkpoints); the key checkpoint_every")
    run.add_argument("--out", default=None, help="run or study directory "
                     "(default: runs/<preset>, or runs/<preset>-study)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run (or study) in --out from its last "
                          "checkpoint")
    run.add_argument("--quiet", action="store_true",
                     help="no progress bar: one log line per evaluation instead")
    run.add_argument("--tensorboard", metavar="DIR",
                     help="also write TensorBoard scalars here (a folder per run "
                          "in a study); needs the tensorboard extra")
    run.add_argument("--wandb", metavar="PROJECT",
                     help="also log to this Weights & Biases project; needs the "
                          "wandb extra")
    run.add_argument("--plots", metavar="FORMATS", default=None,
                     help="the run's figures: formats from png, pdf, svg, eps, ps "
                          "(default png,pdf, or $FEDJAX_PFL_PLOTS), or none")
    run.add_argument("--preset-file", **preset_file)
    rep = sub.add_parser("report", help="mean +- std and a 95 %% interval across "
                                        "seeds of every metric, per setting, of "
                                        "studies or runs")
    rep.add_argument("dirs", nargs="+", metavar="DIR",
                     help="study directories, run directories or folders of runs")
    rep.add_argument("--out", default=None,
                     help="write report.md, report.csv and report.png/pdf here "
                          "(default: DIR when one is given)")


def _list(name) -> int:
    from ._presets import PRESETS
    from ._run import get_preset, preset_cost

    if name is None:
        width = max(map(len, PRESETS))
        for p in PRESETS.values():
            print(f"{p.name:<{width}}  {p.paper}")
            print(f"{'':<{width}}  {p.summary}")
        print("\n`fedjax-pfl list PRESET` shows a preset's keys; "
              "`fedjax-pfl run PRESET --set key=value` runs it.")
        return 0
    try:
        p = get_preset(name)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    print(f"{p.name}: {p.paper}\n  {p.summary}")
    if p.scaled:
        print(f"  scaled for CPU: {p.scaled}")
    print(f"  cost at the defaults: {preset_cost(p) or 'not measured yet'}")
    if p.needs:
        print(f"  reads from $FEDJAX_PFL_DATA_DIR: {', '.join(p.needs)}")
    for k, key in p.keys.items():
        allowed = (f" {{{', '.join(map(str, key.choices))}}}" if key.choices else "")
        print(f"  {k} = {key.default!r}{allowed}  {key.help}")
    return 0


def _run(args) -> int:
    from ._config import load_config, parse_sets
    from ._run import format_final, get_preset, run_preset
    from ._study import parse_seeds, run_study, split_grid

    file = load_config(args.config) if args.config else {}
    preset = args.preset or file.get("preset")
    if preset is None:
        raise ValueError("preset: name one (`fedjax-pfl list` shows them), or "
                         "give `preset` in --config")
    if args.preset and file.get("preset") not in (None, args.preset):
        raise ValueError(f"preset: {args.preset!r} on the command line, "
                         f"{file['preset']!r} in {args.config}")
    get_preset(preset)
    grid = {k: v if isinstance(v, list) else [v]
            for k, v in file.get("set", {}).items()}
    grid.update(split_grid(preset, parse_sets(args.set)))
    if args.checkpoint_every is not None:
        grid["checkpoint_every"] = [args.checkpoint_every]
    seeds_given = args.seeds if args.seeds is not None else file.get("seeds")
    if len(grid.get("seed", ())) > 1:  # --set seed=0,1,2 is --seeds 0,1,2
        if seeds_given is not None:
            raise ValueError("seeds: give them with --seeds (or seeds in --config) "
                             "or as --set seed=a,b, not both")
        seeds_given = ",".join(map(str, grid.pop("seed")))
    study = seeds_given is not None or any(len(v) > 1 for v in grid.values())
    out = args.out or file.get("out") or (f"runs/{preset}-study" if study
                                          else f"runs/{preset}")
    if study:
        seeds = parse_seeds(seeds_given if seeds_given is not None else "0")
        res = _interruptible(lambda: run_study(
            preset, grid, seeds=seeds, out=out, resume=args.resume,
            progress=not args.quiet, plots=args.plots,
            callback=_callbacks(args, preset, out, nested=True)),
            out)
        if isinstance(res, int):
            return res
        print(res["report"]["markdown"])
        print(f"wrote {len(res['runs'])} runs and "
              f"{', '.join(res['report']['files'])} under {out}")
        return 0
    overrides = {k: v[0] for k, v in grid.items()}
    cb = _callbacks(args, preset, out, nested=False)({"dir": ".",
                                                      "overrides": overrides})
    try:
        result = _interruptible(lambda: run_preset(
            preset, overrides, out=out, resume=args.resume, progress=not args.quiet,
            callback=cb, plots=args.plots), out)
    finally:
        if cb is not None:
            cb.close()
    if isinstance(result, int):
        return result
    print(format_final(result))
    print(f"wrote {', '.join(result['files'])} under {out}")
    return 0


def _interruptible(fn, out):
    """``fn()``, or the exit status 130 and a one-line message when SIGINT or
    SIGTERM stopped it."""
    from fedjax_pfl import Interrupted

    try:
        return fn()
    except Interrupted as e:
        print(f"fedjax-pfl run: {e.message().replace('resume (--resume)', '--resume')}"
              f" (the run in {out})", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"fedjax-pfl run: interrupted; `--resume` continues the run in {out} "
              "from its last checkpoint, if it wrote one", file=sys.stderr)
    return 130


def _callbacks(args, preset, out, nested):
    """``run -> simulate callback``: the per-evaluation log line (on stderr with
    --quiet, else in the run directory's log.txt) and the trackers asked for."""
    from fedjax_pfl import tracking

    def make(run):
        run_dir = Path(out) / run["dir"]
        stream = sys.stderr if args.quiet else _LazyFile(run_dir / "log.txt")
        writers = [tracking.LogWriter(stream)]
        if args.tensorboard:
            writers.append(tracking.TensorBoardWriter(
                Path(args.tensorboard) / run["dir"] if nested else args.tensorboard))
        if args.wandb:
            writers.append(tracking.WandbWriter(
                args.wandb, config={"preset": preset, **run["overrides"],
                                    **({"seed": run["seed"]} if nested else {})},
                name=f"{preset}/{run['dir']}" if nested else preset))
        return tracking.combine(*writers)
    return make


class _LazyFile:
    """A text stream appending each write to ``path`` (created at the first
    write, so nothing exists before the run's checks pass; nothing to close)."""

    def __init__(self, path):
        self.path = Path(path)

    def write(self, text):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(text)

    def flush(self):
        pass


def _report(args) -> int:
    from ._study import study_report

    out = args.out or (args.dirs[0] if len(args.dirs) == 1 else None)
    if out is None:
        raise ValueError("--out: name where the report goes when several DIRs "
                         "are given")
    res = study_report(args.dirs, out=out)
    print(res["markdown"])
    print(f"wrote {', '.join(res['files'])} under {out}")
    return 0


def _demo(args) -> int:
    from fedjax_pfl.validation import check_file

    from ._demo import DemoConfig, check_demo, format_table, run_demo

    cfg = DemoConfig(**{f.name: getattr(args, f.name)
                        for f in dataclasses.fields(DemoConfig)})
    try:  # every option, and where --json goes, before any training
        check_demo(cfg)
        check_file("json", args.json)
    except ValueError as e:
        name, _, rest = str(e).partition(":")
        raise SystemExit(f"fedjax-pfl demo: --{name.replace('_', '-')}:{rest}"
                         ) from None
    print(f"fedjax-pfl demo: FedProx Synthetic({cfg.alpha}, {cfg.beta}), "
          f"{cfg.num_clients} clients, attack {cfg.attack} on {cfg.ratio:.0%} of "
          f"them, {cfg.num_rounds} rounds, {cfg.cohort_size} clients/round, "
          f"logistic regression, Ditto lambda={cfg.lam}")
    try:
        final = run_demo(cfg, progress=not args.quiet)
    except ValueError as e:  # the data-dependent checks, before any round
        raise SystemExit(f"fedjax-pfl demo: {e}") from None
    d = final["data"]
    print(f"\n{d['clients']} clients ({d['malicious']} malicious), "
          f"{d['train_examples']} train / {d['test_examples']} test examples")
    print(format_table(final))
    print(f"\nwall time: ditto (+global, finetuned) "
          f"{final['ditto']['wall_seconds']:.1f} s, local "
          f"{final['local']['wall_seconds']:.1f} s")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(final, fh, indent=1)
    return 0


def _datasets(data_dir) -> int:
    data_dir = data_dir or os.environ.get("FEDJAX_PFL_DATA_DIR")
    try:
        from fedjax_pfl.data import dataset_status, format_dataset_status
    except ImportError:
        print("dataset loaders are not available in this version")
        return 1
    print(format_dataset_status(dataset_status(data_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
