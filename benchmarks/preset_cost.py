"""The time and peak memory of each preset run at its defaults, with
checkpoints, as ``fedjax-pfl run PRESET`` does it (one fresh process per
preset; peak RSS from the kernel's accounting of that process).

    python benchmarks/preset_cost.py --out docs/results/preset_cost_cpu.jsonl
    python benchmarks/preset_cost.py --presets ditto-synthetic fedplus-table2 \\
        --out docs/results/preset_cost_cpu.jsonl
    python benchmarks/preset_cost.py --report docs/results/preset_cost_cpu.jsonl
    python benchmarks/preset_cost.py --write-package docs/results/preset_cost_cpu.jsonl

``--write-package`` turns the newest record of each preset measured on this
machine's core count into fedjax_pfl/experiments/preset_costs.json, which
``fedjax-pfl list PRESET`` prints ("measured ... on N CPU cores").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import _meta, cpu_model, parse_or_report, read_jsonl, write_jsonl  # noqa: E402

from fedjax_pfl.experiments import PRESETS, get_preset  # noqa: E402
from fedjax_pfl.experiments._run import COSTS_FILE  # noqa: E402


def measure(preset: str, sets: list[str]) -> dict:
    """Runs ``fedjax-pfl run preset`` in a fresh process: wall seconds, peak
    RSS (GiB), exit status."""
    out = tempfile.mkdtemp(prefix=f"preset-cost-{preset}-")
    cmd = [sys.executable, "-m", "fedjax_pfl.experiments._cli", "run", preset,
           "--quiet", "--out", os.path.join(out, "run"),
           *[f"--set={s}" for s in sets]]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err = proc.stderr.read()
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        proc.stderr.close()
        shutil.rmtree(out, ignore_errors=True)
    return {"preset": preset, "sets": sets, "seconds": wall,
            "peak_rss_gib": usage.ru_maxrss * 1024 / 2**30,  # ru_maxrss is KiB
            "returncode": proc.returncode, "stderr_tail": err[-600:],
            "config": {**get_preset(preset).defaults()}}


def _latest(path: str, cores: int | None = None) -> dict[str, dict]:
    """The newest successful default-settings record of each preset."""
    recs = {}
    for r in read_jsonl(path):
        if r["returncode"] == 0 and not r["sets"] and (
                cores is None or r["cpu_count"] == cores):
            recs[r["preset"]] = r
    return recs


def report(path: str) -> str:
    lines = ["| preset | cores | seconds | peak RSS GiB | git | date |",
             "|---|---|---|---|---|---|"]
    for name, r in sorted(_latest(path).items()):
        lines.append(f"| {name} | {r['cpu_count']} | {r['seconds']:.0f} | "
                     f"{r['peak_rss_gib']:.2f} | {r['git_sha']} | {r['date']} |")
    return "\n".join(lines)


def package_costs(path: str) -> dict[str, str]:
    """preset -> the line ``fedjax-pfl list`` prints."""
    costs = {}
    for name, r in sorted(_latest(path).items()):
        minutes = r["seconds"] / 60
        took = (f"{minutes:.0f} min" if minutes >= 2 else f"{r['seconds']:.0f} s")
        costs[name] = (f"about {took} and {r['peak_rss_gib']:.1f} GiB peak memory "
                       f"on {r['cpu_count']} CPU cores (measured {r['date'][:10]}, "
                       f"git {r['git_sha']}, with checkpoints)")
    return costs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=None,
                   help="default: every preset")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of every preset (smoke runs; such records "
                        "never reach the package's costs)")
    p.add_argument("--write-package", metavar="JSONL",
                   help=f"write {COSTS_FILE.name} from these records and exit")
    p.add_argument("--package-file", default=str(COSTS_FILE),
                   help="where --write-package writes (default: the package's)")
    args = parse_or_report(p, argv, report)
    if args is None:
        return
    if args.write_package:
        costs = package_costs(args.write_package)
        Path(args.package_file).write_text(json.dumps(costs, indent=1,
                                                      sort_keys=True) + "\n")
        print(f"wrote {args.package_file} ({len(costs)} presets)")
        return
    names = args.presets or sorted(PRESETS)
    for n in names:
        get_preset(n)  # unknown names fail before any run
    meta = {**_meta(), "cpu": cpu_model()}
    for n in names:
        rec = {**meta, **measure(n, args.set)}
        print(f"{n}: {rec['seconds']:.0f} s, {rec['peak_rss_gib']:.2f} GiB, "
              f"exit {rec['returncode']}", flush=True)
        write_jsonl(args.out, [rec])


if __name__ == "__main__":
    main()
