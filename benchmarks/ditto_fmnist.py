"""Ditto's Fashion-MNIST setting (Li et al. 2021, Table 1) on local data.

500 devices with 5 classes each (the authors' recipe, exact counts), the Ditto
FMNIST CNN, lr 0.05, batch 16, 2 local iterations, 10 clients per round sampled
proportionally to their sizes, an unweighted mean of the updates. One Ditto run
gives both the ``global`` model (its trajectory is exactly FedAvg's) and the
``personal`` models; ``--runs local`` adds local training (Ditto with lambda 0).
Metrics are over benign clients (test accuracy: sample-weighted mean, std across
clients, worst 10 %). Writes JSON lines (``--out``).

    FEDJAX_PFL_DATA_DIR=../shared/data python benchmarks/ditto_fmnist.py \
        --attack A1 --ratio 0.5 --rounds 300 --eval-every 50 --out docs/results/ditto_fmnist.jsonl
"""

from __future__ import annotations

import argparse
import json
import time

import jax

from fedjax_pfl import algorithms, attacks, data, models
from fedjax_pfl.core import EngineConfig, simulate


def load(seed: int):
    x_tr, y_tr, x_te, y_te = data.load_fashion_mnist()
    # the code's dynamic-lambda hold-out: the last 10 % of each train list
    return data.ditto_fmnist(x_tr, y_tr, x_te, y_te, val_fraction=0.1,
                             shuffle_seed=seed)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attack", default="none", choices=attacks.ATTACKS)
    p.add_argument("--ratio", type=float, default=0.0)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--runs", nargs="+", default=["ditto"], choices=["ditto", "local"])
    p.add_argument("--lam", type=float, default=1.0)
    p.add_argument("--lam-selection", default="paper",
                   choices=["fixed", "paper", "greedy_step"])
    p.add_argument("--strategy", default=None, help="vmap or map (default: engine's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    fed = load(args.seed)
    fed, threat = attacks.setup_attack(fed, args.attack, args.ratio, seed=args.seed,
                                       num_classes=10)
    strong = args.attack == "A3" or args.ratio > 0.5
    model = models.ditto_fmnist_cnn()
    common = dict(client_lr=0.05, num_local_steps=2, batch_size=16, cohort_size=10,
                  cohort="size_weighted", attack=threat.update_attack,
                  malicious=threat.malicious, engine=EngineConfig(args.strategy))
    algs = {
        "ditto": algorithms.ditto(model, lam=args.lam, lam_selection=args.lam_selection,
                                  strong_attack=strong, **common),
        "local": algorithms.ditto(model, lam=0.0, **common),
    }
    print(f"FMNIST: {fed.num_clients} clients, {fed.train.num_examples} train / "
          f"{fed.val.num_examples} val / {fed.test.num_examples} test rows; attack "
          f"{args.attack} {args.ratio:.0%} ({int(threat.malicious.sum())} malicious)")
    for run in args.runs:
        t0 = time.perf_counter()
        res = simulate(algs[run], fed, num_rounds=args.rounds,
                       eval_every=args.eval_every, key=jax.random.key(args.seed),
                       eval_mask=threat.benign, splits=("test",), progress=True)
        wall = time.perf_counter() - t0
        for row in res.history:
            rec = {"run": run, "attack": args.attack, "ratio": args.ratio,
                   "lam_selection": args.lam_selection if run == "ditto" else "fixed",
                   "lam": args.lam if run == "ditto" else 0.0, "seed": args.seed,
                   "wall_s": wall, **row}
            if args.out:
                with open(args.out, "a") as fh:
                    fh.write(json.dumps(rec) + "\n")
        last = res.history[-1]
        for view in ("global", "personal"):
            k = f"{view}/test/accuracy"
            if f"{k}/mean" in last:
                print(f"{run:>6} {view:>9}: mean {last[f'{k}/mean']:.4f} "
                      f"std {last[f'{k}/std']:.4f} worst10 {last[f'{k}/worst10']:.4f}")
        print(f"{run}: {args.rounds} rounds in {wall:.0f} s")


if __name__ == "__main__":
    main()
