"""Ditto's costs: a lambda sweep in ONE program vs separate runs, and a Ditto
round vs a FedAvg round.

1. ``sweep``: ``fedjax_pfl.sweep`` over ``--lams`` (8 values by default) runs all
   the simulations as one vmapped program; ``separate``: one ``simulate`` per
   value. Both include compilation (a sweep compiles once, separate runs compile
   once too but run S times); steady-state times are reported apart.
2. ``round``: one jitted Ditto round (global update + personal update) vs one
   FedAvg round on the same cohort.

Same data, same process, one JSON record per measurement (``--out``).

    python benchmarks/ditto_cost.py --out docs/results/ditto_cost_cpu.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

import fedjax_pfl as fp
from fedjax_pfl import algorithms, data, models

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import _meta, _timed, parse_or_report, read_jsonl, write_jsonl


def report(path: str) -> str:
    """Markdown tables of the records of a ``--out`` file."""
    recs = read_jsonl(path)
    lines = ["| model | clients | lambdas | rounds | sweep s (1 program) | separate s | "
             "separate / sweep | max abs diff of final accuracy |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['clients']} | {r['num_lams']} | {r['rounds']} | "
              f"{r['sweep_s']:.1f} | {r['separate_s']:.1f} | **{r['speedup']:.2f}** | "
              f"{r['max_abs_diff_accuracy']:.1e} |"
              for r in recs if r["measure"] == "lambda_sweep"]
    lines += ["", "| model | clients | FedAvg round s | Ditto round s | Ditto / FedAvg |",
              "|---|---|---|---|---|"]
    rounds = {}
    for r in recs:
        if r["measure"] == "round":
            rounds[(r["model"], r["clients"], r["algorithm"])] = r["round_s"]
        elif r["measure"] == "round_ratio":
            f, d = (rounds[(r["model"], r["clients"], a)] for a in ("fedavg", "ditto"))
            lines.append(f"| {r['model']} | {r['clients']} | {f:.4f} | {d:.4f} | "
                         f"**{r['ditto_over_fedavg']:.2f}** |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lams", type=float, nargs="+",
                   default=[0.0, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0])
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--cohort-size", type=int, default=10)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--model", default="logreg", choices=["logreg", "mlp"])
    p.add_argument("--repeats", type=int, default=3)
    args = parse_or_report(p, argv, report)
    if args is None:
        return []
    meta = _meta()
    fed = data.fedprox_synthetic(1.0, 1.0, num_clients=args.clients, max_size=500)
    model = (models.logistic_regression((60,), 10) if args.model == "logreg"
             else models.mlp((60,), 10, hidden=(200, 200)))
    # Ditto's Alg. 2 harness: size-weighted cohorts, an unweighted mean
    kw = dict(client_lr=0.05, num_local_steps=10, batch_size=10,
              cohort_size=args.cohort_size, cohort="size_weighted", weighted=False)
    key = jax.random.key(0)
    records = []

    def record(**r):
        rec = dict(meta, model=args.model, clients=args.clients, **r)
        records.append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k not in meta}))

    # 1. sweep vs separate runs (end-to-end wall time, compile included)
    run = dict(num_rounds=args.rounds, eval_every=args.eval_every, key=key)
    t0 = time.perf_counter()
    _, hist = fp.sweep(lambda lam: algorithms.ditto(model, lam=lam, **kw),
                       {"lam": args.lams}, fed, **run)
    jax.block_until_ready(hist["personal/test/accuracy/mean"])
    sweep_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    sep = [fp.simulate(algorithms.ditto(model, lam=lam, **kw), fed, progress=False,
                       **run).history[-1]["personal/test/accuracy/mean"]
           for lam in args.lams]
    separate_s = time.perf_counter() - t0
    diff = float(np.max(np.abs(np.asarray(sep) - hist["personal/test/accuracy/mean"][:, -1])))
    record(measure="lambda_sweep", num_lams=len(args.lams), rounds=args.rounds,
           sweep_s=sweep_s, separate_s=separate_s, speedup=separate_s / sweep_s,
           max_abs_diff_accuracy=diff)

    # 2. one Ditto round vs one FedAvg round (same cohort, same global update)
    times = {}
    for name, alg in (("fedavg", algorithms.fedavg(model, **kw)),
                      ("ditto", algorithms.ditto(model, lam=1.0, **kw))):
        state = alg.init(key, fed)
        step = jax.jit(lambda s, d, k, alg=alg: alg.round_step(s, d, k)[0])
        _, first, t = _timed(lambda: step(state, fed, key), args.repeats)
        times[name] = t
        record(measure="round", algorithm=name, round_s=t, first_call_s=first)
    record(measure="round_ratio", ditto_over_fedavg=times["ditto"] / times["fedavg"])
    write_jsonl(args.out, records)
    return records


if __name__ == "__main__":
    main()
