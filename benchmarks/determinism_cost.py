"""What ``EngineConfig(deterministic=True)`` costs: steady-state FedAvg round
time with and without it, same workload, same process, rounds interleaved.

The option stacks the cohort's uploads, puts them back in cohort order, copies
them to every device and adds them in one fixed order (docs/engine.md,
"Determinism"); the default sums the weighted uploads inside the client loop
(and, over several devices, per device and then across them). Engines: ``map:1``
on one device (no mesh) and ``map:1`` with one client loop per CPU device over
``--devices`` devices. Each record also says whether the deterministic round's
server model is bitwise the same on every engine of the run and how far the
default rounds are from it.

Times are medians over ``--repeats`` interleaved calls: wall clock
(``round_s``) and the process's CPU time, every thread and device together
(``round_cpu_s``: less sensitive to other work on a shared machine; with
several devices it also counts the work each device repeats).

    python benchmarks/determinism_cost.py --out docs/results/determinism.jsonl
    python benchmarks/determinism_cost.py --report docs/results/determinism.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np

from fedjax_pfl import algorithms, models
from fedjax_pfl.core import EngineConfig, client_mesh, execution
from fedjax_pfl.data import from_client_arrays

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import _meta, cpu_model, parse_or_report, read_jsonl, write_jsonl

WORKLOADS = {
    "logreg": lambda: models.logistic_regression((784,), 10),
    "mlp": lambda: models.mlp((784,), 10, hidden=(200, 200)),
    "cnn": lambda: models.fedavg_cnn(),
}


def cpu_devices(n: int) -> int:
    """Asks JAX for ``n`` CPU devices (before it starts) and returns how many
    there are (under pytest the conftest's 4 are kept)."""
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # JAX already started
        pass
    return min(n, jax.device_count())


def make_data(num_clients: int, min_size: int, max_size: int, seed: int):
    """Random 784-feature, 10-class clients of ragged sizes."""
    rng = np.random.default_rng(seed)
    return from_client_arrays([
        (rng.normal(size=(n, 784)).astype(np.float32), rng.integers(0, 10, n))
        for n in rng.integers(min_size, max_size + 1, num_clients)])


def _engine(devices: int, deterministic: bool) -> EngineConfig:
    mesh = client_mesh(jax.devices()[:devices]) if devices > 1 else None
    return EngineConfig("map", 1, mesh=mesh, deterministic=deterministic)


def _compiled_round(model, data, args, engine):
    """The jitted round, its compile time and its inputs (with a mesh, whole
    on every device, as the rounds leave the state)."""
    alg = algorithms.fedavg(model, client_lr=0.05, num_local_steps=args.steps,
                            batch_size=args.batch, cohort="full",
                            cohort_size=data.num_clients)
    state = alg.init(jax.random.key(args.seed), data)
    if engine.mesh is not None:
        from jax.sharding import NamedSharding, PartitionSpec

        state, data = jax.device_put(
            (state, data), NamedSharding(engine.mesh, PartitionSpec()))
    key = jax.random.key(args.seed + 1)
    t0 = time.perf_counter()
    with execution(engine):  # the round is traced (lowered) under its engine
        step = jax.jit(lambda s, d, k: alg.round_step(s, d, k)).lower(
            state, data, key).compile()
    return step, time.perf_counter() - t0, (state, data, key)


def measure(workload: str, devices: int, args) -> list[dict]:
    """Default and deterministic round of one workload and engine, timed in
    alternation (``--repeats`` each after one warm-up call)."""
    model = WORKLOADS[workload]()
    data = make_data(args.clients, args.min_size, args.max_size, args.seed)
    runs = {det: _compiled_round(model, data, args, _engine(devices, det))
            for det in (False, True)}
    times = {False: [], True: []}
    cpu = {False: [], True: []}
    outs = {}
    for det, (step, _, inputs) in runs.items():
        outs[det] = jax.block_until_ready(step(*inputs))  # warm-up
    for _ in range(args.repeats):
        for det, (step, _, inputs) in runs.items():
            t0, c0 = time.perf_counter(), time.process_time()
            jax.block_until_ready(step(*inputs))
            times[det].append(time.perf_counter() - t0)
            cpu[det].append(time.process_time() - c0)
    params = {det: [np.asarray(a) for a in jax.tree.leaves(o[0].server.params)]
              for det, o in outs.items()}
    diff = max(float(np.max(np.abs(a - b))) for a, b in
               zip(params[False], params[True], strict=True))
    config = {"algorithm": "fedavg", "workload": workload, "clients": args.clients,
              "cohort": "full", "cohort_size": args.clients, "steps": args.steps,
              "batch": args.batch, "min_size": args.min_size,
              "max_size": args.max_size, "seed": args.seed, "engine": "map:1",
              "devices": devices, "repeats": args.repeats,
              "num_params": int(sum(a.size for a in params[False]))}
    base = float(np.median(times[False]))
    base_cpu = float(np.median(cpu[False]))
    records = []
    for det in (False, True):
        t, c = float(np.median(times[det])), float(np.median(cpu[det]))
        records.append(dict(config, deterministic=det, compile_s=runs[det][1],
                            round_s=t, round_s_min=float(np.min(times[det])),
                            ratio_vs_default=t / base, round_cpu_s=c,
                            cpu_ratio_vs_default=c / base_cpu,
                            max_abs_diff_vs_default=diff if det else 0.0,
                            _params=params[det]))
    return records


def report(path: str) -> str:
    """Markdown table of the records of ``--out``."""
    rows = read_jsonl(path)
    lines = ["| workload | params | clients | devices | deterministic | compile s | "
             "round s (median) | vs default | CPU s a round | vs default | "
             "bitwise across engines | git | date |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['num_params']:,} | {r['clients']} | "
            f"{r['devices']} | {r['deterministic']} | {r['compile_s']:.2f} | "
            f"{r['round_s']:.4f} | **{r['ratio_vs_default']:.3f}** | "
            f"{r['round_cpu_s']:.4f} | {r['cpu_ratio_vs_default']:.3f} | "
            f"{r.get('bitwise_across_engines', '')} | {r['git_sha']} | "
            f"{r['date']} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", nargs="+", default=["mlp", "cnn"],
                   choices=sorted(WORKLOADS))
    p.add_argument("--devices", nargs="+", type=int, default=[1, 2],
                   help="engines: 1 = map:1 without a mesh, d > 1 = map:1 with "
                        "one client loop per CPU device over d devices")
    p.add_argument("--clients", type=int, default=16,
                   help="clients, all in every round's cohort")
    p.add_argument("--steps", type=int, default=5, help="local SGD steps")
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--min-size", type=int, default=20)
    p.add_argument("--max-size", type=int, default=80)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = parse_or_report(p, argv, report)
    if args is None:
        return []
    available = cpu_devices(max(args.devices))
    for d in args.devices:
        if d < 1 or d > available:
            p.error(f"--devices: {d} is not in [1, {available}] (CPU devices)")
        if args.clients % d:
            p.error(f"--clients: {args.clients} is not a multiple of {d} devices")
    meta = dict(_meta(), cpu_model=cpu_model(),
                affinity_cpus=len(os.sched_getaffinity(0)),
                xla_flags=os.environ.get("XLA_FLAGS", ""))
    meta["run_id"] = meta["date"]
    records = []
    print(f"{'workload':>8} {'devices':>7} {'deterministic':>13} {'compile s':>9} "
          f"{'round s':>8} {'vs default':>10} {'CPU s':>8} {'vs default':>10}")
    for w in args.workloads:
        group = []
        for d in args.devices:
            for r in measure(w, d, args):
                group.append(r)
                print(f"{w:>8} {d:>7} {r['deterministic']!s:>13} "
                      f"{r['compile_s']:9.2f} {r['round_s']:8.4f} "
                      f"{r['ratio_vs_default']:10.3f} {r['round_cpu_s']:8.4f} "
                      f"{r['cpu_ratio_vs_default']:10.3f}")
        det = [r["_params"] for r in group if r["deterministic"]]
        same = all(np.array_equal(a, b) for other in det[1:]
                   for a, b in zip(det[0], other, strict=True))
        for r in group:
            del r["_params"]
            if r["deterministic"]:
                r["bitwise_across_engines"] = same
            records.append(dict(meta, **r))
        print(f"{w:>8}: deterministic server model bitwise equal on devices "
              f"{args.devices}: {same}")
    write_jsonl(args.out, records)
    return records


if __name__ == "__main__":
    main()
