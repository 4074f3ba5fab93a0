"""Where a small CNN's local step spends the CPU: one SGD step of FedAvgCNN
(582,026 parameters, batch 10, cross-entropy) inside a ``fori_loop``, as the
engine runs it, in milliseconds per step (minimum of ``--repeats``).

Variants (each in a fresh process, so device counts and core masks differ):
  * ``cores``: one JAX device, XLA splits each operation over every core;
  * ``one_core``: the same pinned to one core (``taskset``);
  * ``per_core``: one CPU device per core, each training its own model
    (``shard_map``), the time per model-step (what the engine's
    ``EngineConfig('map', mesh=...)`` does with independent clients);
  * ``reduce_window_pool``: ``cores`` with ``flax.linen.max_pool`` (the
    variadic reduce-window gradient) instead of ``models.max_pool``.

    python benchmarks/cnn_step.py --out docs/results/cnn_step_cpu.jsonl
    python benchmarks/cnn_step.py --report docs/results/cnn_step_cpu.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

VARIANTS = ("cores", "one_core", "per_core", "reduce_window_pool")


def measure(variant: str, steps: int, repeats: int) -> dict:
    """Runs in the child process."""
    cores = len(os.sched_getaffinity(0))
    import jax

    if variant == "per_core":
        jax.config.update("jax_num_cpu_devices", cores)
    import flax.linen as nn
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    from fedjax_pfl import models
    from fedjax_pfl.core import client_mesh

    if variant == "reduce_window_pool":
        from fedjax_pfl.models import _zoo_papers

        _zoo_papers.max_pool = nn.max_pool
    model = models.fedavg_cnn()
    x = jnp.asarray(np.random.default_rng(0).normal(size=(10, 28, 28, 1)), jnp.float32)
    y = jnp.arange(10) % 10

    def loop(p, n):
        def body(i, q):
            g = jax.grad(lambda w: jnp.mean(model.loss(model.apply(w, x), y)))(q)
            return jax.tree.map(lambda a, b: a - 0.005 * b, q, g)
        return jax.lax.fori_loop(0, n, body, p)

    p = model.init(jax.random.key(0))
    models_run = 1
    if variant == "per_core":
        models_run = jax.device_count()
        p = jax.tree.map(lambda a: jnp.stack([a] * models_run), p)

        def local(q, n):
            out = loop(jax.tree.map(lambda a: a[0], q), n)
            return jax.tree.map(lambda a: a[None], out)

        run = jax.jit(jax.shard_map(local, mesh=client_mesh(), in_specs=(P("clients"),
                                    P()), out_specs=P("clients"), check_vma=False))
    else:
        run = jax.jit(loop)
    n = jnp.int32(steps)
    jax.block_until_ready(run(p, n))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(run(p, n))
        times.append(time.perf_counter() - t0)
    return {"variant": variant, "ms_per_step": min(times) / (steps * models_run) * 1e3,
            "models_in_parallel": models_run, "steps": steps, "repeats": repeats,
            "cores": cores}


def report(path: str) -> str:
    from throughput import read_jsonl

    rows = read_jsonl(path)
    base = {r["run_id"]: r["ms_per_step"] for r in rows if r["variant"] == "cores"}
    lines = ["| variant | ms per model-step | vs `cores` | git | date |",
             "|---|---|---|---|---|"]
    for r in rows:
        ref = base.get(r["run_id"])
        ratio = f"{ref / r['ms_per_step']:.2f}x" if ref else ""
        lines.append(f"| {r['variant']} | {r['ms_per_step']:.2f} | {ratio} | "
                     f"{r['git_sha']} | {r['date']} |")
    return "\n".join(lines)


def main(argv=None):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from throughput import _meta, parse_or_report, write_jsonl

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parse_or_report(p, argv, report)
    if args is None:
        return []
    if args.child:
        print(json.dumps(measure(args.child, args.steps, args.repeats)))
        return []
    meta = _meta()
    meta["run_id"] = meta["date"]
    records = []
    for v in args.variants:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", v, "--steps",
               str(args.steps), "--repeats", str(args.repeats)]
        if v == "one_core":
            cmd = ["taskset", "-c", str(min(os.sched_getaffinity(0)))] + cmd
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rec = dict(meta, **json.loads(out.strip().splitlines()[-1]))
        records.append(rec)
        print(f"{v:>20}: {rec['ms_per_step']:.2f} ms per model-step "
              f"({rec['models_in_parallel']} model(s) at once)")
    write_jsonl(args.out, records)
    return records


if __name__ == "__main__":
    main()
