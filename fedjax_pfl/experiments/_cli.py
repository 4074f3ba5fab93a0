"""The ``fedjax-pfl`` console command."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys


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
    sub = parser.add_subparsers(dest="command")
    _demo_parser(sub)
    _preset_parsers(sub)
    ds = sub.add_parser("datasets", help="list datasets found under a data directory")
    ds.add_argument("--data-dir", default=None,
                    help="default: $FEDJAX_PFL_DATA_DIR")
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in (*sub.choices, "-h", "--help"):
        argv = ["demo", *argv]  # options without a command go to the demo
    args = parser.parse_args(argv)
    if args.command == "datasets":
        return _datasets(args.data_dir)
    if args.command == "list":
        return _list(args.preset)
    if args.command == "run":
        return _run(args)
    return _demo(args)


def _preset_parsers(sub) -> None:
    ls = sub.add_parser("list", help="the papers' experiment presets (with a name: "
                                     "its keys, defaults and allowed values)")
    ls.add_argument("preset", nargs="?", default=None)
    run = sub.add_parser("run", help="run a preset into a run directory (config, "
                                     "history.jsonl, clients.csv, plots, checkpoints)")
    run.add_argument("preset")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a key (repeatable); `fedjax-pfl list PRESET` "
                          "lists them")
    run.add_argument("--out", default=None, help="run directory (default: "
                     "runs/<preset>)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run in --out from its last checkpoint")
    run.add_argument("--quiet", action="store_true", help="no progress bar")


def _list(name) -> int:
    from ._presets import PRESETS
    from ._run import get_preset

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
    if p.needs:
        print(f"  reads from $FEDJAX_PFL_DATA_DIR: {', '.join(p.needs)}")
    for k, key in p.keys.items():
        allowed = (f" {{{', '.join(map(str, key.choices))}}}" if key.choices else "")
        print(f"  {k} = {key.default!r}{allowed}  {key.help}")
    return 0


def _run(args) -> int:
    from ._config import parse_sets
    from ._run import format_final, run_preset

    try:
        overrides = parse_sets(args.set)
        out = args.out or f"runs/{args.preset}"
        result = run_preset(args.preset, overrides, out=out, resume=args.resume,
                            progress=not args.quiet)
    except ValueError as e:
        raise SystemExit(f"fedjax-pfl run: {e}") from None
    print(format_final(result))
    print(f"wrote {', '.join(result['files'])} under {out}")
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
