"""The global-solver and fairness baselines on FedProx Synthetic(1, 1).

FedAvg (the reference, run in the same invocation), FedProx, SCAFFOLD, FedDyn,
q-FFL (q-FedAvg), AFL and pFedMe with logistic regression on
``fedjax_pfl.data.fedprox_synthetic(1, 1)`` (60 features, 10 classes, 80/20
train/test per client). Every method gets the same local work: ``--steps`` SGD
steps of batch ``--batch`` at ``--lr`` per selected client and round (pFedMe:
``--steps`` local rounds of its inner solver), ``--cohort`` clients a round
(AFL: every client, as it assumes). The hyperparameters are the papers' usual
ones, NOT tuned here. Reported: the global model's final test accuracy over
clients (mean, std, mean of the worst 10 %), pFedMe's personal models too, and
each run's round metrics averaged over all its rounds (``round_metrics``, e.g.
q-FFL's ``server/h`` and ``train/round_start_loss``).

    python benchmarks/baselines_synthetic.py --seeds 0 1 2 \\
        --out docs/results/baselines_synthetic.jsonl
    python benchmarks/baselines_synthetic.py \
        --report docs/results/baselines_synthetic.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np

import fedjax_pfl as fp
from fedjax_pfl import algorithms, models

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import _meta, parse_or_report, read_jsonl, write_jsonl

METHODS = ("fedavg", "fedprox", "scaffold", "feddyn", "qffl", "afl", "pfedme")
# Per-method hyperparameters (the papers' usual values for this dataset/model).
HPARAMS = {
    "fedavg": {},
    "fedprox": {"mu": 1.0},  # FedProx paper: best mu on Synthetic(1, 1)
    "scaffold": {"global_lr": 1.0},
    "feddyn": {"alpha": 0.01},
    "qffl": {"q": 1.0},  # lipschitz_L = 1 / lr, as in the q-FFL paper
    "afl": {"lambda_lr": 0.01},
    "pfedme": {"lam": 15.0, "inner_steps": 5},  # inner_lr = lr
}


def make(method: str, model, args) -> fp.Algorithm:
    local = {"client_lr": args.lr, "num_local_steps": args.steps,
             "batch_size": args.batch, "cohort_size": args.cohort}
    hp = HPARAMS[method]
    # SCAFFOLD, FedDyn and pFedMe: an unweighted mean of the uploads
    # (weighted=False), as in the published runs; FedAvg, FedProx: size-weighted.
    if method == "fedavg":
        return algorithms.fedavg(model, **local)
    if method == "fedprox":
        return algorithms.fedprox(model, **hp, **local)
    if method == "scaffold":
        return algorithms.scaffold(model, weighted=False, **hp, **local)
    if method == "feddyn":
        return algorithms.feddyn(model, weighted=False, **hp, **local)
    if method == "qffl":
        return algorithms.qffl(model, lipschitz_L=1.0 / args.lr, **hp, **local)
    if method == "afl":
        local.pop("cohort_size")
        return algorithms.afl(model, cohort="full", sampling="with_replacement",
                              **hp, **local)
    return algorithms.pfedme(model, inner_lr=args.lr, weighted=False, **hp, **local)


def run_one(method: str, seed: int, args) -> list[dict]:
    data = fp.data.fedprox_synthetic(1.0, 1.0, num_clients=args.num_clients,
                                     seed=seed)
    model = models.logistic_regression((60,), 10)
    alg = make(method, model, args)
    t0 = time.perf_counter()
    res = fp.simulate(alg, data, num_rounds=args.rounds, key=jax.random.key(seed),
                      splits=("test",), progress=False)
    seconds = time.perf_counter() - t0
    last = res.history[-1]
    out = []
    for view in ("global", "personal"):
        if f"{view}/test/accuracy/mean" not in last:
            continue
        out.append({
            "benchmark": "baselines_synthetic", "method": method, "view": view,
            "dataset": "fedprox_synthetic(1,1)", "model": "logreg",
            "num_clients": args.num_clients, "rounds": args.rounds, "seed": seed,
            "lr": args.lr, "steps": args.steps, "batch": args.batch,
            "cohort": data.num_clients if method == "afl" else args.cohort,
            "hparams": HPARAMS[method],
            **{f"test_accuracy_{s}": last[f"{view}/test/accuracy/{s}"]
               for s in ("mean", "std", "worst10")},
            "round_metrics": {k: v for k, v in last.items()  # run averages
                              if k.startswith(("train/", "server/"))},
            "seconds": seconds, **_meta()})
    return out


def report(path: str) -> str:
    """Markdown table: mean (sd over seeds) of each metric per method/view."""
    recs = read_jsonl(path)
    groups: dict = {}
    for r in recs:
        key = (r["method"], r["view"], r["num_clients"], r["rounds"])
        groups.setdefault(key, []).append(r)
    lines = [("| method | model | clients | rounds | seeds | accuracy mean | "
              "accuracy std | worst 10 % | s / run |"),
             "|---|---|---|---|---|---|---|---|---|"]

    def cell(rs, k):
        v = np.array([r[k] for r in rs]) * 100
        return f"{v.mean():.1f} ({v.std():.1f})"

    for (method, view, n, rounds), rs in groups.items():
        lines.append(
            f"| {method} | {view} | {n} | {rounds} | {len(rs)} | "
            f"{cell(rs, 'test_accuracy_mean')} | {cell(rs, 'test_accuracy_std')} | "
            f"{cell(rs, 'test_accuracy_worst10')} | "
            f"{np.mean([r['seconds'] for r in rs]):.1f} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--num-clients", type=int, default=30)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--cohort", type=int, default=10)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    args = parse_or_report(p, argv, report)
    if args is None:
        return None
    recs = []
    for seed in args.seeds:
        for method in args.methods:
            rows = run_one(method, seed, args)
            write_jsonl(args.out, rows)
            recs += rows
            for r in rows:
                print(f"seed {seed} {method:9s} {r['view']:8s} acc "
                      f"{r['test_accuracy_mean']:.3f} std "
                      f"{r['test_accuracy_std']:.3f} worst10 "
                      f"{r['test_accuracy_worst10']:.3f} ({r['seconds']:.1f} s)",
                      flush=True)
    return recs


if __name__ == "__main__":
    main()
