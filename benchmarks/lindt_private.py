"""LINDT's private models alone: their accuracy per class-count group.

beta (negative federated learning) is measured against the clients' private
models, so their accuracy decides whether a federation is in NFL. The LINDT
paper gives no recipe for them, but its tables fix their mean accuracy (each
row's local accuracy minus its beta): 43.8 % with IID clients (43.1 % without
attackers), 65.2 / 76.5 / 90.3 % when every client holds 10 / 5 / 2 classes,
74.0 % under the Mixed allocation (half the clients with 10 classes, 30 %
with 5, 20 % with 2). This script trains only the private models
(``experiments.private_accuracy``, the same call and settings as
``benchmarks/lindt_nfl.py``, whose ``--private-cache`` files it shares) for
one allocation and reports their benign mean overall and per group of
clients holding the same number of classes, beside those values, with each
group's mean majority-class share (what a constant guess scores) and client
sizes. ``--class-sigma`` unbalances each client's classes (log-normal
proportions, ``data.lindt_cifar``): the ablation that asks whether the paper's
clients held unbalanced classes.

    FEDJAX_PFL_DATA_DIR=/path/to/data python benchmarks/lindt_private.py \\
        --model cnn --scheme mixed --class-sigma 1.5 --out docs/results/lindt_private.jsonl
    python benchmarks/lindt_private.py --report docs/results/lindt_private.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np

from fedjax_pfl import data

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lindt_nfl
from throughput import _meta, parse_or_report, read_jsonl, write_jsonl

# the mean private accuracy the paper's tables imply (local - beta), per
# (allocation, attacker share); and per class count (its single-count
# allocations, 20 % attackers)
PAPER = {("iid", 0.0): 43.05, ("iid", 0.2): 43.76, ("non_iid_10", 0.2): 65.23,
         ("non_iid_5", 0.2): 76.49, ("non_iid_2", 0.2): 90.31,
         ("mixed", 0.0): 72.64, ("mixed", 0.1): 73.10, ("mixed", 0.2): 74.02}
PAPER_BY_CLASSES = {k: PAPER[(f"non_iid_{k}", 0.2)] for k in (10, 5, 2)}


def group_stats(fd, ks, benign, acc) -> dict:
    """Per class count k: benign clients, their mean private accuracy (%), mean
    majority-class share of their training rows (%) and mean / std train size."""
    out = {}
    y, offsets, counts = (np.asarray(a) for a in (
        fd.train.y, fd.train.offsets, fd.train.counts))
    for k in sorted(set(ks.tolist()), reverse=True):
        idx = np.where((ks == k) & benign)[0]
        if not len(idx):
            continue
        ys = [y[offsets[i]:offsets[i] + counts[i]] for i in idx]
        major = [np.bincount(yi).max() / len(yi) for yi in ys if len(yi)]
        sizes = np.array([len(yi) for yi in ys], float)
        out[str(k)] = {"clients": len(idx),
                       "private_acc": 100 * float(np.nanmean(acc[idx])),
                       "majority_share": 100 * float(np.mean(major)),
                       "train_mean": float(sizes.mean()),
                       "train_std": float(sizes.std())}
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scheme", default="mixed", choices=data.LINDT_SCHEMES)
    p.add_argument("--class-sigma", type=float, default=0.0,
                   help="log-normal sigma of each client's class proportions "
                   "(0: balanced, the default)")
    p.add_argument("--model", choices=("mlp", "cnn"), default="cnn")
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 128],
                   help="MLP widths")
    p.add_argument("--attack-ratio", type=float, default=0.2,
                   help="the attackers (poisoned data, left out of the means)")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--private-rounds", type=int, default=20)
    p.add_argument("--private-steps", type=int, default=50)
    p.add_argument("--private-cache", default=None, metavar="DIR",
                   help="as in lindt_nfl.py (the same files)")
    p.add_argument("--seed", type=int, default=0)
    args = parse_or_report(p, argv, report)
    if args is None:
        return None
    if args.scheme == "iid" and args.class_sigma:
        p.error(f"--class-sigma: the iid scheme is balanced (0 only), got "
                f"{args.class_sigma}")
    if args.class_sigma < 0:
        p.error(f"--class-sigma: must be >= 0, got {args.class_sigma}")
    # the attributes lindt_nfl's loaders and private cache read, at its
    # defaults (they are part of the cache's key)
    args.data, args.num_clients, args.test_cap, args.lstm_hidden = (
        "cifar10", None, None, lindt_nfl.LSTM_HIDDEN)
    t0 = time.perf_counter()
    fd, mal, dim = lindt_nfl.load(args)
    args.num_clients = fd.num_clients
    dual = lindt_nfl.dual_model(args, dim)
    acc, cache = lindt_nfl.cached_private_accuracy(
        dual, fd, jax.random.key(args.seed), args)
    benign = ~mal
    ks = data.lindt_classes_per_client(args.scheme, fd.num_clients)
    rec = dict(_meta(), bench="lindt_private", model=args.model,
               hidden=None if args.model == "cnn" else args.hidden,
               scheme=args.scheme, class_sigma=args.class_sigma,
               num_clients=fd.num_clients, attack_ratio=args.attack_ratio,
               lr=args.lr, batch_size=args.batch_size,
               private_rounds=args.private_rounds, private_steps=args.private_steps,
               seed=args.seed, private_cache=cache,
               private_acc_benign=100 * float(np.nanmean(acc[benign])),
               groups=group_stats(fd, ks, benign, acc),
               seconds=time.perf_counter() - t0)
    print(report_lines([rec]))
    if args.out:
        write_jsonl(args.out, [rec])
    return rec


def _setting(rec) -> str:
    model = "CNN 32x32" if rec["model"] == "cnn" else f"MLP {rec['hidden']}"
    return (f"{model}, {rec['scheme']}, class sigma {rec['class_sigma']:g}, "
            f"attackers {rec['attack_ratio']:g}, "
            f"{rec['private_rounds']} x {rec['private_steps']} steps at lr "
            f"{rec['lr']:g}, batch {rec['batch_size']}, seed {rec['seed']}")


def report_lines(recs) -> str:
    lines = [("| setting | benign mean (paper) | 10 classes (paper) | 5 classes "
             "(paper) | 2 classes (paper) | majority share 10 / 5 / 2 |"),
             "|---|---|---|---|---|---|"]
    for r in recs:
        cells, shares = [], []
        for k in (10, 5, 2):
            g = r["groups"].get(str(k))
            paper = ("-" if r["scheme"] == "iid" else  # IID is its own row
                     f"{PAPER_BY_CLASSES[k]:.2f}")
            cells.append("-" if g is None else f"{g['private_acc']:.2f} ({paper})")
            shares.append("-" if g is None else f"{g['majority_share']:.0f}")
        paper = PAPER.get((r["scheme"], r["attack_ratio"]))
        lines.append(f"| {_setting(r)} | {r['private_acc_benign']:.2f} "
                     f"({'-' if paper is None else f'{paper:.2f}'}) | "
                     + " | ".join(cells)
                     + " | " + " / ".join(shares) + " |")
    return "\n".join(lines)


def report(path) -> str:
    return report_lines(read_jsonl(path))


if __name__ == "__main__":
    main()
