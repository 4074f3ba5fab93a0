"""The batch ladder of Poisson batches (``EngineConfig(batch_ladder=...)``): one
round of the FedFDP tables' setting with and without it.

A Poisson batch has a static cap sized for the largest client (FedFDP's MNIST
split: 655 rows at q = 0.05 for the 9,909-example client), and without the
ladder every client computes its per-example gradients on all of them, masked.
With it each step runs at the smallest of a few static sizes that holds its
sampled rows (``privacy.batch_ladder``). The non-private methods of the
tables (FedAvg, FedFair, ...) draw the same Poisson batches and profit too.
For each dataset, method and
strategy this script times one round (the median of ``--repeats`` after the
first call, whose time, compile included, is kept as ``first_s``) with the
ladder on and off, interleaved over ``--cycles`` (the first call compiles
only in the first), and records:

* ``rows_per_round``: the expected number of rows the clients' gradients are
  computed on (the sum over clients of the expected rung of a Binomial(n_k, q)
  batch; off: clients x cap), and ``sampled_rows``, the expected sampled ones;
* ``max_abs_diff``: the largest difference of the server's parameters after
  the round, ladder on against off (float rounding only).

    FEDJAX_PFL_DATA_DIR=/path/to/data python benchmarks/batch_ladder.py \
        --datasets mnist --methods dp_fedavg fedfdp --out docs/results/batch_ladder.jsonl
    python benchmarks/batch_ladder.py --report docs/results/batch_ladder.jsonl
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys

import jax
import numpy as np

from fedjax_pfl import privacy
from fedjax_pfl.core import EngineConfig, run_rounds
from fedjax_pfl.experiments import _presets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fedfdp_sweeps import MODELS
from throughput import _meta, _timed, parse_or_report, read_jsonl, write_jsonl


def expected_rows(counts, q: float, cap: int, ladder: bool) -> tuple[float, float]:
    """``(rows computed, rows sampled)`` per round, expected over the Poisson
    draws: each client computes on the smallest rung holding its batch
    (Binomial(n_k, q), truncated at the cap), or on the whole cap."""
    from scipy.stats import binom

    rungs = privacy.batch_ladder(cap) if ladder else (cap,)
    computed = sampled = 0.0
    for n in counts:
        below = 0.0
        for r in rungs:
            upto = 1.0 if r == rungs[-1] else float(binom.cdf(r, n, q))
            computed += r * (upto - below)
            below = upto
        sampled += min(n * q, cap)
    return computed, sampled


def one_round(alg, strategy: str, ladder: bool):
    """``(state, data) -> server state`` after one round, jitted, under
    ``strategy`` with the ladder on or off."""
    engine = EngineConfig(strategy, 1 if strategy == "map" else None,
                          batch_ladder=ladder)
    return jax.jit(lambda s, d: run_rounds(alg, s, d, jax.random.key(0), 1,
                                           engine=engine)[0].server)


def report(path: str) -> str:
    recs = [r for r in read_jsonl(path) if "round_s" in r]
    groups: dict = {}
    for r in recs:
        groups.setdefault((r["dataset"], r["model"], r["method"], r["strategy"],
                           r["batch_ladder"]), []).append(r)
    rows = [("| dataset | model | method | strategy | ladder | round s (median) "
             "| first call s | rows computed / round | sampled | max abs diff |"),
            "|---|---|---|---|---|---|---|---|---|---|"]
    for (ds, model, m, s, on), rs in groups.items():
        rows.append(
            f"| {ds} | {model} | {m} | {s} | {'on' if on else 'off'} | "
            f"{statistics.median(r['round_s'] for r in rs):.3f} | "
            f"{rs[0]['first_s']:.1f} | "  # the first cycle's: compile included
            f"{rs[0]['rows_per_round']:,.0f} | {rs[0]['sampled_rows']:,.0f} | "
            f"{max(r['max_abs_diff'] for r in rs):.1e} |")
    return "\n".join(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=["mnist"],
                   choices=["mnist", "fmnist", "cifar10"])
    p.add_argument("--methods", nargs="+", default=["fedavg", "dp_fedavg", "fedfdp"],
                   choices=sorted(_presets.FEDFDP_PRIVATE + _presets.FEDFDP_NONPRIVATE),
                   help="the FedFDP tables' methods (the non-private ones draw the "
                   "same Poisson batches, without clipping or noise)")
    p.add_argument("--strategies", nargs="+", default=["unroll"],
                   choices=["unroll", "map"])
    p.add_argument("--model", default="cnn", choices=sorted(MODELS))
    p.add_argument("--q", type=float, default=0.05)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--cycles", type=int, default=1)
    p.add_argument("--max-examples", type=int, default=None, help="smoke runs only")
    args = parse_or_report(p, argv, report)
    if args is None:
        return []
    if args.repeats < 1 or args.cycles < 1:
        p.error(f"--repeats, --cycles: must be positive, got {args.repeats}, "
                f"{args.cycles}")
    if not 0 < args.q <= 1:
        p.error(f"--q: must be in (0, 1], got {args.q}")
    records = []
    for ds in args.datasets:
        fed = _presets.fedfdp_data(ds, 1, 10, args.max_examples, 0.1, 0.0)
        model = MODELS[args.model](tuple(np.asarray(fed.train.x).shape[1:]))
        counts = np.asarray(fed.train.counts).tolist()
        cap = privacy.default_max_batch_size(args.q, max(counts))
        rows = {on: expected_rows(counts, args.q, cap, on) for on in (True, False)}
        for method in args.methods:
            alg = _presets.fedfdp_algorithm(
                method, model, q=args.q, lam=0.1, clip=0.1, sigma=2.0, sigma_loss=5.0,
                lr=1.0 if method in _presets.FEDFDP_PRIVATE else 0.1,  # the tables'
                num_clients=fed.num_clients)
            state = alg.init(jax.random.key(1), fed)
            for strategy in args.strategies:
                runs = {on: one_round(alg, strategy, on) for on in (True, False)}
                for cycle in range(args.cycles):
                    outs = {on: _timed(functools.partial(runs[on], state, fed),
                                       args.repeats) for on in (True, False)}
                    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                               for a, b in zip(jax.tree.leaves(outs[True][0]),
                                               jax.tree.leaves(outs[False][0]),
                                               strict=True))
                    for on in (True, False):
                        computed, sampled = rows[on]
                        rec = {**_meta(), "dataset": ds, "method": method,
                               "strategy": strategy, "batch_ladder": on,
                               "model": args.model, "q": args.q, "cap": cap,
                               "counts": counts, "cycle": cycle,
                               "repeats": args.repeats,
                               "first_s": outs[on][1], "round_s": outs[on][2],
                               "rows_per_round": computed, "sampled_rows": sampled,
                               "max_abs_diff": diff}
                        records.append(rec)
                        write_jsonl(args.out, [rec])
                        print(f"{ds} {method} {strategy} ladder {'on' if on else 'off'}"
                              f": round {outs[on][2]:.3f} s (first {outs[on][1]:.1f} "
                              f"s), rows {computed:,.0f}, diff {diff:.1e}", flush=True)
    return records


if __name__ == "__main__":
    main()
