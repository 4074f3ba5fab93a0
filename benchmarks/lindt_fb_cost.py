"""What FB (LINDT's finetuned baseline) costs: every client finetunes the top
layer (the top ``--layers`` layers) of LINDT's CIFAR CNN (940,362 parameters)
for ``--steps`` steps of batch 10, through the whole model with the lower
layers frozen (``whole``) or on the lower layers' features computed once
(``cached``, ``algorithms.finetune_top``'s default when they fit; the whole
model, ``--layers 5``, has only the first). Synthetic 32x32x3 images,
``--clients`` clients of ``--rows`` rows (the paper's CIFAR clients hold
about 500); seconds after a first compiling call, and the largest difference
between the two paths' parameters (only the finetuned layers can differ).

    python benchmarks/lindt_fb_cost.py --out docs/results/lindt_fb_cost_cpu.jsonl
    python benchmarks/lindt_fb_cost.py --layers 5 --steps 100 --out docs/results/lindt_fb_cost_cpu.jsonl
    python benchmarks/lindt_fb_cost.py --report docs/results/lindt_fb_cost_cpu.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import numpy as np

from fedjax_pfl import algorithms, data

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import _meta, _timed, parse_or_report, read_jsonl, write_jsonl


def report(path: str) -> str:
    head = ("| clients x rows | layers | steps | path | seconds "
            "| largest parameter difference |")
    lines = [head, "|---|---|---|---|---|---|"]
    for r in read_jsonl(path):
        diff = f"{r['max_abs_diff']:.1e}" if "max_abs_diff" in r else "-"
        lines.append(f"| {r['clients']} x {r['rows']} | {r.get('layers', 1)} | "
                     f"{r['steps']} | {r['path']} | "
                     f"{r['seconds']:.2f} | {diff} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--rows", type=int, default=500)
    p.add_argument("--steps", type=int, nargs="+", default=[100, 10000],
                   help="the whole-model path runs only the first")
    p.add_argument("--layers", type=int, default=1,
                   help="the top layers finetuned (the CNN has 5; 5: all of it)")
    args = parse_or_report(p, argv, report)
    if args is None:
        return []
    for name in ("clients", "rows"):
        if getattr(args, name) < 1:
            p.error(f"--{name}: must be >= 1, got {getattr(args, name)}")
    if min(args.steps) < 1:
        p.error(f"--steps: must all be >= 1, got {args.steps}")
    dual = algorithms.dual_lindt_cnn()
    if not 1 <= args.layers <= len(dual.layers):
        p.error(f"--layers: must be in [1, {len(dual.layers)}] (the CNN's layers), "
                f"got {args.layers}")
    rng = np.random.default_rng(0)
    fd = data.from_client_arrays([
        (rng.normal(size=(args.rows, 32, 32, 3)).astype(np.float32),
         rng.integers(0, 10, args.rows)) for _ in range(args.clients)])
    params = dual.model.init(jax.random.key(0))
    records, tops = [], {}
    for i, steps in enumerate(args.steps):
        if args.layers == len(dual.layers):  # nothing frozen to cache: one path
            paths = (("whole", 0),)
        else:
            paths = (("cached", None), ("whole", 0))[:2 if i == 0 else 1]
        for path, limit in paths:
            fb = jax.jit(lambda w, s=steps, lim=limit: algorithms.finetune_top(
                dual, w, fd, jax.random.key(1), steps=s, lr=0.01, batch_size=10,
                feature_cache_bytes=lim, layers=args.layers))
            out, _, secs = _timed(lambda fb=fb: fb(params), 1)
            tops[path] = jax.tree.leaves(out)
            rec = {**_meta(), "bench": "lindt_fb_cost", "clients": args.clients,
                   "rows": args.rows, "layers": args.layers, "steps": steps,
                   "path": path, "seconds": secs}
            if path == "whole" and "cached" in tops:
                rec["max_abs_diff"] = max(float(np.abs(a - b).max())
                                          for a, b in zip(tops["whole"], tops["cached"]))
            records.append(rec)
            write_jsonl(args.out, [rec])
            print(f"{steps} steps, {path}: {secs:.2f} s")
    return records


if __name__ == "__main__":
    main()
