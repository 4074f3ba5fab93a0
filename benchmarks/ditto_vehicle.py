"""Ditto's Table 7 on Vehicle (linear SVM, 23 vehicles) through the
``ditto-vehicle`` preset: global / local / Ditto (fixed lambda 0.1, 1, 2),
the MOCHA-style baseline (``algorithms.mocha``, its default lam1 = lam2 = 1e-3) and
the robust baselines (the global model with median, Krum, multi-Krum,
clipping, k-norm, k-loss, FedMGDA+) under the clean, A1, A2 and A3 columns.

Every run is ``fedjax_pfl.experiments.run_preset("ditto-vehicle", ...)`` (600
rounds, lr 0.1, batch 32, one local iteration, 10 vehicles a round by size,
the seeded 72/8/20 hold-out per vehicle: only the authors' training file
exists). One JSON record per run: the final evaluation's benign-vehicle test
accuracy (mean over vehicles, std across vehicles) of the method's model, with
git commit, date, machine, seed and the full preset configuration.

    FEDJAX_PFL_DATA_DIR=/path/to/data python benchmarks/ditto_vehicle.py \\
        --seeds 0 1 2 --out docs/results/ditto_vehicle.jsonl
    python benchmarks/ditto_vehicle.py --report docs/results/ditto_vehicle.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import _meta, parse_or_report, read_jsonl, write_jsonl  # noqa: E402

from fedjax_pfl import experiments  # noqa: E402

COLUMNS = {"clean": ("none", 0.0), "A1 50%": ("A1", 0.5), "A2 50%": ("A2", 0.5),
           "A3 50%": ("A3", 0.5)}
# row -> (preset method, view, extra keys)
ROWS = {
    "global": ("global", "global", {}),
    "local": ("local", "personal", {}),
    "Ditto, lam=0.1": ("ditto", "personal", {"lam": "0.1"}),
    "Ditto, lam=1": ("ditto", "personal", {"lam": "1"}),
    "Ditto, lam=2": ("ditto", "personal", {"lam": "2"}),
    "MOCHA": ("mocha", "personal", {}),
}
# the robust baselines: row name -> the preset's aggregator
AGGREGATOR_KEYS = {"median": "median", "Krum": "krum", "multi-Krum": "multi_krum",
                   "clipping": "clipping", "k-norm": "k_norm", "k-loss": "k_loss",
                   "FedMGDA+": "fedmgda"}
AGGREGATORS = tuple(AGGREGATOR_KEYS)
ROWS.update({name: ("global", "global", {"aggregator": agg})
             for name, agg in AGGREGATOR_KEYS.items()})
# Ditto + robust aggregation (the paper's Tables 3 and 6 run it on FEMNIST and
# CelebA only): Ditto whose global model is the robust baseline's.
DITTO_LAMS = ("0.1", "1")
COMBINED = {f"Ditto + {name}, lam={lam}": ("ditto", "personal",
                                           {"lam": lam, **ROWS[name][2]})
            for lam in DITTO_LAMS for name in AGGREGATORS}
ROWS.update(COMBINED)
# The paper's Table 7: benign mean test accuracy (std across vehicles).
PAPER = {
    "global": ("0.866 (.16)", "0.643 (.10)", "0.840 (.21)", "0.350 (.19)"),
    "local": ("0.836 (.07)", "0.840 (.09)", "0.840 (.09)", "0.840 (.09)"),
    "median": ("0.863 (.16)", "0.676 (.11)", "0.838 (.21)", "0.319 (.17)"),
    "Krum": ("0.852 (.17)", "0.830 (.22)", "0.828 (.22)", "0.588 (.14)"),
    "multi-Krum": ("0.866 (.16)", "0.839 (.20)", "0.839 (.22)", "0.406 (.15)"),
    "clipping": ("0.864 (.16)", "0.678 (.34)", "0.839 (.22)", "0.315 (.17)"),
    "k-norm": ("0.866 (.16)", "0.838 (.21)", "0.839 (.22)", "0.458 (.16)"),
    "k-loss": ("0.850 (.05)", "0.732 (.09)", "0.840 (.07)", "0.328 (.16)"),
    "FedMGDA+": ("0.860 (.16)", "0.674 (.14)", "0.843 (.22)", "0.676 (.17)"),
    "MOCHA": ("0.880 (.04)", "0.832 (.08)", "0.843 (.07)", "0.834 (.07)"),
    "Ditto, lam=0.1": ("0.845 (.07)", "0.841 (.09)", "0.848 (.08)", "0.827 (.08)"),
    "Ditto, lam=1": ("0.875 (.05)", "0.821 (.07)", "0.870 (.07)", "0.757 (.08)"),
    "Ditto, lam=2": ("0.882 (.05)", "0.800 (.07)", "0.872 (.06)", "0.690 (.09)"),
}


def run_one(row: str, column: str, seed: int, rounds: int,
            test_fraction: float = 0.2, a3_scale: float = 0.0,
            lr: float | None = None) -> dict:
    method, view, extra = ROWS[row]
    attack, ratio = COLUMNS[column]
    sets = {"method": method, "attack": attack, "ratio": str(ratio),
            "seed": str(seed), "rounds": str(rounds), "eval_every": str(rounds),
            "test_fraction": str(test_fraction), **extra}
    if method == "ditto":
        sets["lam_selection"] = "fixed"
    if a3_scale:
        sets["a3_scale"] = str(a3_scale)
    if lr is not None:
        sets["lr"] = str(lr)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        res = experiments.run_preset("ditto-vehicle", sets, out=out, progress=False)
        info = json.loads(open(os.path.join(out, "config.json")).read())["info"]
    last = res["final"]
    return {"benchmark": "ditto_vehicle", "row": row, "column": column, "seed": seed,
            "view": view, "preset": "ditto-vehicle", "config": res["config"],
            "info": info, "round": last["round"],
            "accuracy_mean": last[f"{view}/test/accuracy/mean"],
            "accuracy_std": last[f"{view}/test/accuracy/std"],
            "wall_s": time.perf_counter() - t0}


# the preset values the ablations change (records older than a key lack it)
ABLATED = {"a3_scale": 0.0, "test_fraction": 0.2, "lr": 0.1}


def _varied(r) -> set[str]:
    """The ablated keys whose value in record ``r`` is not the preset's."""
    return {k for k, v in ABLATED.items() if r["config"].get(k, v) != v}


def report(path: str) -> str:
    every = read_jsonl(path)
    recs = [r for r in every if not _varied(r)]
    cols = list(COLUMNS)
    lines = ["| method | " + " | ".join(f"{c} (ours) | {c} (paper)" for c in cols)
             + " |", "|---|" + "---|---|" * len(cols)]
    for row in [r for r in ROWS if r not in COMBINED]:
        cells = []
        for i, c in enumerate(cols):
            rs = [r for r in recs if r["row"] == row and r["column"] == c]
            if rs:
                m = np.array([r["accuracy_mean"] for r in rs])
                s = np.mean([r["accuracy_std"] for r in rs])
                spread = f" +- {m.std():.3f}" if len(rs) > 1 else ""
                cells.append(f"{m.mean():.3f}{spread} ({s:.2f}), {len(rs)} seed"
                             + ("s" if len(rs) > 1 else ""))
            else:
                cells.append("-")
            cells.append(PAPER.get(row, ("",) * 4)[i])
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    if any(r["row"] in COMBINED for r in recs):
        lines += ["", _combined_table(recs)]
    if any(_varied(r) == {"a3_scale"} for r in every):
        lines += ["", _a3_scale_table(every)]
    return "\n".join(lines)


def _seeds_cell(recs) -> str:
    """``mean +- std (n)`` (ddof 0) of the records' accuracies, or ``-``."""
    m = np.array([r["accuracy_mean"] for r in recs])
    return f"{m.mean():.3f} +- {m.std():.3f} ({len(m)})" if len(m) else "-"


def _cell(recs, row, column) -> str:
    return _seeds_cell([r for r in recs if r["row"] == row and r["column"] == column])


def _combined_table(recs) -> str:
    """Ditto alone, then Ditto + each robust aggregator, at each lambda: the
    benign mean test accuracy, mean +- std over seeds (number of seeds). The
    aggregators alone are rows of the table above."""
    cols = list(COLUMNS)
    lines = ["| method | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for lam in DITTO_LAMS:
        for row in (f"Ditto, lam={lam}",
                    *(f"Ditto + {name}, lam={lam}" for name in AGGREGATORS)):
            lines.append(f"| {row} | " + " | ".join(_cell(recs, row, c) for c in cols)
                         + " |")
    return "\n".join(lines)


def _a3_scale_table(recs) -> str:
    """A3 50 % by the factor on the malicious updates (0: the cohort size)."""
    recs = [r for r in recs if r["column"] == "A3 50%" and _varied(r) <= {"a3_scale"}]
    scale_of = {id(r): r["config"].get("a3_scale", 0.0) or r["config"]["cohort_size"]
                for r in recs}
    scales = sorted(set(scale_of.values()))
    rows = [row for row in ROWS if any(r["row"] == row and _varied(r) for r in recs)]
    lines = ["| method | " + " | ".join(f"A3 x{s:g}" for s in scales) +
             " | paper (A3 50 %) |", "|---|" + "---|" * (len(scales) + 1)]
    for row in rows:
        cells = [_seeds_cell([r for r in recs
                              if r["row"] == row and scale_of[id(r)] == sc])
                 for sc in scales]
        lines.append(f"| {row} | " + " | ".join(cells) + f" | {PAPER[row][3]} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--columns", nargs="+", default=list(COLUMNS),
                   choices=list(COLUMNS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--rounds", type=int, default=600)
    p.add_argument("--test-fraction", type=float, default=0.2,
                   help="each vehicle's test share (an ablation of the split)")
    p.add_argument("--lr", type=float, default=None,
                   help="the learning rate (default: the preset's, the paper's 0.1; "
                   "an ablation)")
    p.add_argument("--a3-scale", type=float, default=0.0,
                   help="A3's factor (0: the cohort size, the authors' code; an "
                   "ablation, A3 column only)")
    args = parse_or_report(p, argv, report)
    if args is None:
        return []
    if args.rounds < 1:
        p.error("--rounds must be positive")
    meta, records = _meta(), []
    for seed in args.seeds:
        for column in args.columns:
            for row in args.rows:
                rec = dict(meta, **run_one(row, column, seed, args.rounds,
                                           args.test_fraction, args.a3_scale,
                                           args.lr))
                records.append(rec)
                write_jsonl(args.out, [rec])
                print(f"seed {seed} {column:>7} {row:>15}: {rec['accuracy_mean']:.3f} "
                      f"({rec['accuracy_std']:.2f}) {rec['wall_s']:.0f} s", flush=True)
    return records


if __name__ == "__main__":
    main()
