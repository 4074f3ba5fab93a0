"""XLA:CPU's own defaults vs the package's setting, same machine, same run.

fedjax_pfl turns XLA's YNN library fusions off on the CPU at import
(``--xla_cpu_experimental_ynn_fusion_type=``, fedjax_pfl/_xla_cpu.py).
This script runs the same workloads twice in fresh processes, once with
``FEDJAX_PFL_XLA_CPU_DEFAULTS=0`` (XLA's defaults) and once without (the
package's setting), and records both with the children's CPU time split into
user and kernel (system) time and their minor page faults:

* ``benchmarks/privacy.py``: one local step of 10 clients, plain and DP
  (ghost clipping), with the CIFAR-10 FedAvgCNN, the MNIST FedAvgCNN and the
  MLP, at a batch of 250 (FedFDP's q = 0.05 of a 5,000-example client);
* ``benchmarks/throughput.py``: one round of 100 clients per strategy (logreg,
  MLP, the small CNN);
* with ``--benchmarks fedfdp``, a whole private run of
  ``benchmarks/fedfdp_tables.py`` (DP-FedAvg, the paper's CNN, CIFAR-10 by
  default) at ``--fedfdp-rounds`` and at twice that: the difference of their
  wall times is the time of the extra rounds.

``--ynn NAME=VALUE`` adds settings of its own: XLA's defaults with
``--xla_cpu_experimental_ynn_fusion_type=VALUE`` (e.g. ``-individual_convolution``
removes one fusion type from XLA's default list, ``individual_dot`` keeps only
that one), to find which of YNN's fusions costs and which pays. ``--cycles K``
runs the whole comparison K times, the settings interleaved, and the report
gives each workload's median and range over the cycles (on a shared 2-vCPU
machine one setting's time moved by a quarter between two runs).
``--env NAME=VAR=VALUE[,VAR=VALUE]`` adds the package's setting with more
environment variables, e.g. glibc's malloc parameters
(``malloc=MALLOC_ARENA_MAX=1,MALLOC_MMAP_MAX_=0,MALLOC_TRIM_THRESHOLD_=1073741824``:
one arena, large blocks kept mapped; measured slower, docs/results/throughput.md).

    python benchmarks/xla_cpu_flags.py --out docs/results/xla_cpu_flags_cpu.jsonl
    FEDJAX_PFL_DATA_DIR=... python benchmarks/xla_cpu_flags.py --benchmarks fedfdp \
        --out docs/results/xla_cpu_flags_cpu.jsonl
    python benchmarks/xla_cpu_flags.py --ynn no_conv=-individual_convolution \
        --out docs/results/xla_cpu_flags_cpu.jsonl
    python benchmarks/xla_cpu_flags.py --env malloc=MALLOC_ARENA_MAX=1,MALLOC_MMAP_MAX_=0 \
        --out docs/results/xla_cpu_flags_cpu.jsonl
    python benchmarks/xla_cpu_flags.py --report docs/results/xla_cpu_flags_cpu.jsonl
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from throughput import parse_or_report, read_jsonl, write_jsonl

import fedjax_pfl

FLAG = "--xla_cpu_experimental_ynn_fusion_type="


def _caller_xla_flags() -> str | None:
    """This process's XLA_FLAGS without what importing fedjax_pfl added: the
    children start from the caller's flags."""
    flags = os.environ.get("XLA_FLAGS")
    if fedjax_pfl.xla_cpu_setting == "applied":
        flags = " ".join(f for f in flags.split() if f != FLAG) or None
    return flags


META = ("jax", "backend", "device_kind", "num_devices", "cpu_count", "machine",
        "git_sha", "date", "xla_flags", "xla_cpu_setting")  # throughput._meta


def workloads(args) -> dict[str, list[list[str]]]:
    """Each benchmark's commands (one process each, run in order)."""
    def fedfdp(rounds):  # one record: the run's wall time after `rounds`
        return ["fedfdp_tables.py", "--model", "cnn", "--datasets", args.fedfdp_data,
                "--methods", "dp_fedavg", "--rounds", str(rounds), "--eval-every",
                str(rounds), "--partition-seed", "1", "--seed", "1", "--strategy",
                args.fedfdp_strategy, *shlex.split(args.fedfdp_extra)]

    return {
        "privacy": [["privacy.py", "--models", *args.privacy_models, "--clients",
                     str(args.clients), "--batch", str(args.batch), "--variants",
                     "plain", "ghost", "--repeats", str(args.repeats)]],
        "throughput": [["throughput.py", "--models", *args.throughput_models,
                        "--clients", str(args.throughput_clients), "--repeats",
                        str(args.repeats)]],
        # the same run at two lengths: the difference is rounds alone (the
        # compile, the data loading and the one evaluation cancel)
        "fedfdp": [fedfdp(args.fedfdp_rounds), fedfdp(2 * args.fedfdp_rounds)],
    }


def _fedfdp_round(recs, args) -> dict:
    """The per-round time of the two fedfdp runs (DP-FedAvg's rounds are the
    accountant's, so they are read from the records)."""
    short, long_ = recs
    return {"model": f"{short['model']}_{short['dataset']}", "clients": short["clients"],
            "variant": f"dp_fedavg:{args.fedfdp_strategy}",
            "rounds": [short["round"], long_["round"]],
            "round_s": (long_["wall_s"] - short["wall_s"])
            / (long_["round"] - short["round"])}


def _settings(ynn: list[str], env: list[str]
              ) -> dict[str, tuple[str, str | None, dict[str, str]]]:
    """Setting name -> (FEDJAX_PFL_XLA_CPU_DEFAULTS, YNN fusion value or None,
    more environment variables)."""
    out = {"xla": ("0", None, {}), "package": ("1", None, {})}

    def name_value(opt, item):
        name, sep, value = item.partition("=")
        if not sep or not name or name in out:
            raise SystemExit(f"{opt}: expected NAME=VALUE with a new name (not "
                             f"{sorted(out)}), got {item!r}")
        return name, value

    for item in ynn:
        name, value = name_value("--ynn", item)
        out[name] = ("0", value, {})
    for item in env:
        name, value = name_value("--env", item)
        pairs = [v.partition("=") for v in value.split(",")]
        if not all(k and sep for k, sep, _ in pairs):
            raise SystemExit(f"--env: expected NAME=VAR=VALUE[,VAR=VALUE...], "
                             f"got {item!r}")
        out[name] = ("1", None, {k: v for k, _, v in pairs})
    return out


def _run(commands: list[list[str]], setting: tuple[str, str | None, dict[str, str]]
         ) -> tuple[list[dict], dict]:
    """Runs one benchmark's commands, each in a fresh process; their records and
    CPU times."""
    defaults, ynn, more = setting
    env = {**os.environ, "FEDJAX_PFL_XLA_CPU_DEFAULTS": defaults, **more}
    env.pop("XLA_FLAGS", None)
    flags = [f for f in [_caller_xla_flags(), ynn is not None and FLAG + ynn] if f]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "records.jsonl")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        for script, *rest in commands:
            subprocess.run([sys.executable, os.path.join(HERE, script), *rest,
                            "--out", out], env=env, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        records = read_jsonl(out)
    times = {"user_s": after.ru_utime - before.ru_utime,
             "system_s": after.ru_stime - before.ru_stime,
             "minor_faults": after.ru_minflt - before.ru_minflt}
    return records, times


def _med(cycles: int) -> str:
    return f" (median of {cycles} cycles: min-max)" if cycles > 1 else ""


def _cell(times: list[float]) -> str:
    """One setting's seconds: the value, or over cycles the median and range."""
    if len(times) == 1:
        return f"{times[0]:.4f}"
    return f"{statistics.median(times):.4f}: {min(times):.4f}-{max(times):.4f}"


def _key(r) -> tuple:
    return (r["bench"], r["model"], r["clients"], r["variant"])


def _seconds(r) -> float:
    return r["step_s"] if r["bench"] == "privacy" else r["round_s"]


def runs(recs) -> list[list[dict]]:
    """The records split into the invocations that wrote them: by their ``run``
    (the invocation's start); records written before that field existed by
    their order (in one run each (benchmark, setting) writes its workload
    records, then its summary with the CPU times, once: a record of a pair
    whose summary is already there starts the next run)."""
    out, seen, current = [], set(), object()
    for r in recs:
        pair = (r["bench"], r["setting"])
        run = r.get("run")
        if not out or run != current or (run is None and pair in seen):
            out.append([])
            seen, current = set(), run
        out[-1].append(r)
        if "user_s" in r:
            seen.add(pair)
    return out


def report(paths) -> str:
    """Markdown tables per run: each workload's time under every setting, and
    each process's user / system time."""
    parts = []
    for i, run in enumerate(runs([r for p in paths for r in read_jsonl(p)]), 1):
        shas = ", ".join(dict.fromkeys(r["git_sha"] for r in run))
        dates = sorted(r["date"] for r in run)
        parts.append(f"Run {i}: git {shas}, {dates[0]} to {dates[-1]}\n\n"
                     + _tables(run))
    return "\n\n".join(parts)


def _tables(recs) -> str:
    by: dict[tuple, list[float]] = {}  # (workload, setting) -> seconds per cycle
    for r in recs:
        if "model" in r:
            by.setdefault((_key(r), r["setting"]), []).append(_seconds(r))
    cycles = max(map(len, by.values()), default=1)
    others = [s for s in dict.fromkeys(s for _, s in by) if s != "xla"]
    rows = [(f"| benchmark | model | clients | variant | XLA defaults s{_med(cycles)} | "
             + " | ".join(f"{s} s (speedup)" for s in others) + " |"),
            "|---|---|---|---|---|" + "---|" * len(others)]
    for key in dict.fromkeys(k for k, _ in by):
        if (key, "xla") not in by:
            continue
        a = statistics.median(by[key, "xla"])
        cells = [f"{_cell(b)} (**{a / statistics.median(b):.2f}x**)"
                 if (b := by.get((key, s))) else "" for s in others]
        rows.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | "
                    f"{_cell(by[key, 'xla'])} | " + " | ".join(cells) + " |")
    rows += ["", "| benchmark | setting | user s | system s | minor page faults |",
             "|---|---|---|---|---|"]
    for r in recs:
        if "user_s" in r:
            rows.append(f"| {r['bench']} | {r['setting']} | {r['user_s']:.1f} | "
                        f"{r['system_s']:.1f} | {r['minor_faults']:,} |")
    return "\n".join(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--benchmarks", nargs="+", default=["privacy", "throughput"],
                   choices=["privacy", "throughput", "fedfdp"],
                   help="fedfdp: a private FedFDP-table run (DP-FedAvg, the "
                   "paper's CNN) at --fedfdp-rounds and twice that (needs "
                   "FEDJAX_PFL_DATA_DIR)")
    p.add_argument("--privacy-models", nargs="+",
                   default=["fedavg_cnn_cifar", "fedavg_cnn", "mlp"])
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--batch", type=int, default=250)
    p.add_argument("--throughput-models", nargs="+", default=["logreg", "mlp", "cnn"])
    p.add_argument("--throughput-clients", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--fedfdp-data", default="cifar10", choices=["mnist", "fmnist",
                                                                "cifar10"])
    p.add_argument("--fedfdp-rounds", type=int, default=10)
    p.add_argument("--fedfdp-strategy", default="unroll",
                   choices=["auto", "unroll", "map", "vmap"])
    p.add_argument("--cycles", type=int, default=1,
                   help="run every (benchmark, setting) this many times, the "
                   "settings interleaved (a drifting machine then shifts all "
                   "settings alike); the report gives medians and ranges")
    p.add_argument("--ynn", nargs="+", default=[], metavar="NAME=VALUE",
                   help="more settings: XLA's defaults with "
                   f"{FLAG}VALUE (e.g. no_conv=-individual_convolution)")
    p.add_argument("--env", nargs="+", default=[], metavar="NAME=VAR=VALUE[,VAR=VALUE]",
                   help="more settings: the package's with these environment "
                   "variables (e.g. malloc=MALLOC_ARENA_MAX=1,MALLOC_MMAP_MAX_=0)")
    p.add_argument("--fedfdp-extra", default="",
                   help="more fedfdp_tables.py arguments (smoke runs: "
                   "'--clients 3 --max-examples 600 --model mlp')")
    args = parse_or_report(p, argv, report, multiple=True)
    if args is None:
        return []
    if args.cycles < 1:
        p.error(f"--cycles must be a positive integer, got {args.cycles}")
    settings = _settings(args.ynn, args.env)
    run = datetime.datetime.now().isoformat(timespec="seconds")  # see runs()
    records, work = [], workloads(args)
    for cycle, bench, (setting, how) in itertools.product(
            range(args.cycles), args.benchmarks, settings.items()):
        commands = work[bench]
        recs, times = _run(commands, how)
        if bench == "fedfdp":  # the runs' records: only the per-round time
            recs = [{**{k: recs[0][k] for k in META}, **_fedfdp_round(recs, args)}]
        tag = {"bench": bench, "setting": setting, "run": run, "cycle": cycle}
        recs = [{**r, **tag} for r in recs]
        summary = {**{k: recs[0][k] for k in META}, **tag, "command": commands,
                   "env": how[2], **times}  # env: the setting's own variables
        records += recs + [summary]
        write_jsonl(args.out, recs + [summary])
        print(f"{bench} {setting}: user {times['user_s']:.1f} s, system "
              f"{times['system_s']:.1f} s, {times['minor_faults']:,} minor faults")
    print(_tables(records))
    return records


if __name__ == "__main__":
    main()
