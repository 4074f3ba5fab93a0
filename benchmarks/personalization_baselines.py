"""FedAvg, Local, Ditto, FedRep and LG-FedAvg on label-skewed Fashion-MNIST.

Fashion-MNIST's 70,000 images (train and test pooled, pixels in [-1, 1]) split
over ``--num-clients`` clients by PFLlib's Dirichlet(``--alpha``) label skew
(``fedjax_pfl.data.dirichlet``, partition seed 1 for every run), 75/25
train/test per client, an MLP. Every method gets the same local work per
selected client and round: ``--steps`` SGD steps of batch ``--batch`` at
``--lr`` on the shared part (Ditto: and as many on the personal model; FedRep:
``--head-steps`` on the head first), ``--cohort`` clients drawn uniformly per
round, the size-weighted mean of the uploads. Reported: the evaluated model's
test accuracy per client after ``--rounds`` rounds (FedAvg: the global model;
the others: each client's personal model), its mean over clients, the pooled
(sample-weighted) accuracy, the std across clients and the worst 10 %; the
seed varies the initialization, cohorts and minibatches. Hyperparameters are
common defaults, NOT tuned per method.

    FEDJAX_PFL_DATA_DIR=/path/to/data python benchmarks/personalization_baselines.py \\
        --seeds 0 1 2 --out docs/results/personalization_baselines.jsonl
    python benchmarks/personalization_baselines.py \\
        --report docs/results/personalization_baselines.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np

import fedjax_pfl as fp
from fedjax_pfl import algorithms, data, models

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import _meta, cpu_model, parse_or_report, read_jsonl, write_jsonl  # noqa: E402

METHODS = ("fedavg", "local", "ditto", "fedrep", "lg_fedavg")
VIEW = {"fedavg": "global"}  # the others: "personal"


def load(args):
    """``(FederatedData, input dim)`` of ``args.dataset``."""
    if args.dataset == "synthetic":  # the smoke test's tiny stand-in
        fed = data.fedprox_synthetic(1.0, 1.0, num_clients=args.num_clients, dim=10,
                                     num_classes=10, min_size=20, max_size=60,
                                     fractions=(0.75, 0.0, 0.25), seed=1)
        return fed, 10
    x_tr, y_tr, x_te, y_te = data.load_fashion_mnist(as_float=True)
    x = np.concatenate([x_tr, x_te]).reshape(-1, 784) * 2.0 - 1.0
    y = np.concatenate([y_tr, y_te])
    return data.dirichlet(x.astype(np.float32), y, args.num_clients, args.alpha,
                          seed=1), 784


def make(method: str, model, args) -> fp.Algorithm:
    common = dict(client_lr=args.lr, num_local_steps=args.steps,
                  batch_size=args.batch, cohort_size=args.cohort, cohort="uniform")
    if method == "fedavg":
        return algorithms.fedavg(model, weighted=True, **common)
    if method == "local":
        return algorithms.local_only(model, **common)
    if method == "ditto":  # personal_steps = num_local_steps, personal_lr = lr
        return algorithms.ditto(model, lam=args.lam, weighted=True, **common)
    if method == "fedrep":  # head: the last layer (personal)
        return algorithms.fedrep(model, head_steps=args.head_steps or args.steps,
                                 **common)
    return algorithms.lg_fedavg(model, **common)  # head: the last layer (global)


def hparams(method: str, args) -> dict:
    return {"ditto": {"lam": args.lam},
            "fedrep": {"head_steps": args.head_steps or args.steps,
                       "head_layers": "last"},
            "lg_fedavg": {"head_layers": "last"}}.get(method, {})


def run_one(method: str, seed: int, fed, dim: int, args) -> dict:
    model = models.mlp((dim,), 10, hidden=tuple(args.hidden))
    t0 = time.perf_counter()
    res = fp.simulate(make(method, model, args), fed, num_rounds=args.rounds,
                      key=jax.random.key(seed), splits=("test",), progress=False,
                      engine=fp.EngineConfig(unroll=args.unroll))
    seconds = time.perf_counter() - t0
    last, view = res.history[-1], VIEW.get(method, "personal")
    k = f"{view}/test/accuracy"
    return {
        "benchmark": "personalization_baselines", "method": method, "view": view,
        "dataset": args.dataset, "partition": f"dirichlet(alpha={args.alpha})",
        "model": f"mlp{tuple(args.hidden)}", "num_clients": fed.num_clients,
        "num_examples": {s: int(getattr(fed, s).num_examples)
                         for s in ("train", "test")},
        "partition_seed": 1, "rounds": args.rounds, "cohort": args.cohort,
        "cohort_mode": "uniform", "aggregation": "size-weighted mean",
        "steps": args.steps, "batch": args.batch, "lr": args.lr,
        "unroll": args.unroll, "seed": seed, "hparams": hparams(method, args),
        "acc_client_mean": last[f"{k}/mean_unweighted"],
        "acc_pooled": last[f"{k}/mean"], "acc_client_std": last[f"{k}/std"],
        "acc_worst10": last[f"{k}/worst10"], "train_loss": last.get("train/loss"),
        "seconds": seconds, "cpu_model": cpu_model(),
        "cores": len(os.sched_getaffinity(0)), **_meta()}


def report(path: str) -> str:
    """Markdown table: mean +- std over seeds of each method's accuracies."""
    recs = read_jsonl(path)
    groups: dict = {}
    for r in recs:
        groups.setdefault((r["method"], r["view"]), []).append(r)
    r0 = recs[0]
    lines = [f"{r0['dataset']}, {r0['partition']}, {r0['num_clients']} clients, "
             f"{r0['model']}, {r0['rounds']} rounds, {r0['cohort']} clients a round, "
             f"{r0['steps']} steps of batch {r0['batch']} at lr {r0['lr']}; "
             f"{r0['cpu_model']}, {r0['cores']} cores, git {r0['git_sha']}.", "",
             "| method | model evaluated | seeds | per-client accuracy | pooled "
             "accuracy | std across clients | worst 10 % | s / run |",
             "|---|---|---|---|---|---|---|---|"]

    def cell(rs, key):
        v = np.array([r[key] for r in rs]) * 100
        return f"{v.mean():.1f} +- {v.std():.1f}"

    for m in METHODS:
        for (method, view), rs in groups.items():
            if method == m:
                lines.append(
                    f"| {method} | {view} | {len(rs)} | {cell(rs, 'acc_client_mean')} "
                    f"| {cell(rs, 'acc_pooled')} | {cell(rs, 'acc_client_std')} | "
                    f"{cell(rs, 'acc_worst10')} | "
                    f"{np.mean([r['seconds'] for r in rs]):.1f} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="fmnist", choices=("fmnist", "synthetic"))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--num-clients", type=int, default=20)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--hidden", nargs="+", type=int, default=[200, 200])
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--cohort", type=int, default=10)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--head-steps", type=int, default=None)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--lam", type=float, default=1.0)
    p.add_argument("--unroll", type=int, default=1, help="local-step loop unroll "
                   "(1: a loop; same numbers, half the compile time of the CPU "
                   "default's full unroll, which dominates at this scale)")
    args = parse_or_report(p, argv, report)
    if args is None:
        return None
    fed, dim = load(args)
    recs = []
    for seed in args.seeds:
        for method in args.methods:
            r = run_one(method, seed, fed, dim, args)
            write_jsonl(args.out, [r])
            recs.append(r)
            print(f"seed {seed} {method:9s} {r['view']:8s} per-client acc "
                  f"{r['acc_client_mean']:.3f} pooled {r['acc_pooled']:.3f} std "
                  f"{r['acc_client_std']:.3f} worst10 {r['acc_worst10']:.3f} "
                  f"({r['seconds']:.1f} s)", flush=True)
    return recs


if __name__ == "__main__":
    main()
