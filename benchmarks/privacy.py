"""DP local step vs plain local step: ghost norms and nested vmap, same run.

One jitted program per variant runs ONE local step (batch of ``--batch``
examples) for every one of ``--clients`` clients, lifted by the engine's default
strategy for the backend; the baseline is the plain (non-private) SGD step in
the same run. Variants: ``plain``, ``plain_noise`` (plain + the Gaussian noise
draw, no clipping), ``ghost`` (clip + noise), ``ghost_nonoise``,
``vmap`` (nested vmap, clip + noise), ``vmap_chunk<k>``. Also checks that the
ghost and vmap clipped gradients agree (noise 0) in the same run. Memory: what
XLA's buffer assignment plans for each compiled program (``memory_analysis``:
arguments + outputs + temporaries), in MiB; the inputs and the stacked outputs of
all clients are part of it.

    python benchmarks/privacy.py --models mlp fedavg_cnn --clients 100 1000 \
        --out docs/results/privacy_cpu.jsonl
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl import models, privacy
from fedjax_pfl.core import default_strategy, lift


@functools.cache  # one module for main() and report()
def _load_throughput():
    spec = importlib.util.spec_from_file_location(
        "throughput", pathlib.Path(__file__).with_name("throughput.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MODELS = {
    "mlp": lambda: (models.mlp((784,), 10, (200, 200)), (784,)),
    "fedavg_cnn": lambda: (models.fedavg_cnn((28, 28, 1), 10), (28, 28, 1)),
    "fedavg_cnn_cifar": lambda: (models.fedavg_cnn((32, 32, 3), 10), (32, 32, 3)),
    "tiny_mlp": lambda: (models.mlp((16,), 10, (8,)), (16,)),  # smoke runs
}


def _step_fn(model, variant, clip, sigma, lr, chunk):
    def step(params, x, y, key):
        mask = jnp.ones((x.shape[0],), jnp.float32)
        if variant in ("plain", "plain_noise"):
            g = jax.grad(lambda p: models.batch_loss(model, p, x, y, mask))(params)
            if variant == "plain_noise":  # the noise draw alone, no clipping
                g = jax.tree.map(jnp.add, g, privacy.gaussian_noise(
                    key, g, sigma * clip / x.shape[0]))
        else:
            method = "ghost" if variant.startswith("ghost") else "vmap"
            z = 0.0 if variant.endswith("nonoise") else sigma
            g, _ = privacy.private_grad(
                model, params, x, y, mask, key, clip=clip, noise_multiplier=z,
                denominator=jnp.float32(x.shape[0]), method=method,
                chunk_size=chunk if variant.startswith("vmap_chunk") else None)
        return jax.tree.map(lambda p, gi: p - lr * gi, params, g)

    return step


def _timed(fn, args, repeats):
    jax.block_until_ready(fn(*args))  # first call (compiles under jit's cache)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def _planned_bytes(compiled) -> int:
    """Memory XLA's buffer assignment plans for a compiled program: arguments +
    outputs + the temporaries' arena (minus aliased buffers). Not
    ``peak_memory_in_bytes``: XLA:CPU reports arguments + outputs there only."""
    m = compiled.memory_analysis()
    return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
            - m.alias_size_in_bytes)


def report(paths) -> str:
    """Markdown table of the JSON records written by ``--out``."""
    rows = ["| model | clients | variant | compile s | step s | vs plain "
            "| planned MiB |",
            "|---|---|---|---|---|---|---|"]
    read_jsonl = _load_throughput().read_jsonl
    for path in paths:
        for r in read_jsonl(path):
            if "planned_mib" in r:  # records from before the memory column: skip
                rows.append(
                    f"| {r['model']} | {r['clients']} | {r['variant']} | "
                    f"{r['compile_s']:.2f} | {r['step_s']:.4f} | "
                    f"**{r['vs_plain']:.2f}** | {r['planned_mib']:.0f} |")
    return "\n".join(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["mlp", "fedavg_cnn"],
                   choices=sorted(MODELS))
    p.add_argument("--clients", nargs="+", type=int, default=[100])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--variants", nargs="+",
                   default=["plain", "ghost", "ghost_nonoise", "vmap", "vmap_chunk16"])
    p.add_argument("--clip", type=float, default=0.1)
    p.add_argument("--sigma", type=float, default=2.0)
    p.add_argument("--repeats", type=int, default=3)
    tp = _load_throughput()
    args = tp.parse_or_report(p, argv, report, multiple=True)
    if args is None:
        return []
    meta = tp._meta()
    strategy, b = default_strategy()
    records = []
    print(f"backend={meta['backend']} jax={meta['jax']} strategy={strategy}:{b}")
    print(f"{'model':>11}{'clients':>8}{'variant':>15}{'compile s':>11}{'step s':>10}"
          f"{'vs plain':>10}{'MiB':>8}")
    for name, clients in ((n, c) for n in args.models for c in args.clients):
        model, shape = MODELS[name]()
        params = jax.jit(model.init)(jax.random.key(0))
        kx, ky = jax.random.split(jax.random.key(1))
        xs = jax.random.normal(kx, (clients, args.batch, *shape))
        ys = jax.random.randint(ky, (clients, args.batch), 0, 10)
        keys = jax.random.split(jax.random.key(2), clients)
        # ghost == nested vmap in this run (noise 0, one client)
        check = jax.jit(lambda m, p_, x, y, model=model: privacy.clipped_grad(
            model, p_, x, y, jnp.ones(args.batch), clip=args.clip,
            denominator=1.0, method=m)[0], static_argnums=0)
        diff = max(float(jnp.max(jnp.abs(a - c))) for a, c in zip(
            jax.tree.leaves(check("ghost", params, xs[0], ys[0])),
            jax.tree.leaves(check("vmap", params, xs[0], ys[0]))))
        plain_s = None
        for variant in args.variants:
            chunk = int(variant[10:]) if variant.startswith("vmap_chunk") else None
            step = _step_fn(model, variant, args.clip, args.sigma, 0.1, chunk)
            # params are an argument (a captured constant gets constant-folded)
            run = jax.jit(lambda p_, xs_, ys_, ks_, step=step: lift(
                lambda x, y, k: step(p_, x, y, k), strategy, b)(xs_, ys_, ks_))
            t0 = time.perf_counter()
            compiled = run.lower(params, xs, ys, keys).compile()
            compile_s = time.perf_counter() - t0
            planned_mib = _planned_bytes(compiled) / 2**20
            step_s = _timed(run, (params, xs, ys, keys), args.repeats)
            plain_s = step_s if variant == "plain" else plain_s
            ratio = step_s / plain_s if plain_s else float("nan")
            rec = {"benchmark": "privacy", "model": name, "clients": clients,
                   "batch": args.batch, "variant": variant, "compile_s": compile_s,
                   "step_s": step_s, "vs_plain": ratio, "planned_mib": planned_mib,
                   "ghost_vs_vmap_max_abs_diff": diff,
                   "strategy": f"{strategy}:{b}", **meta}
            records.append(rec)
            tp.write_jsonl(args.out, [rec])
            print(f"{name:>11}{clients:>8}{variant:>15}{compile_s:>11.2f}"
                  f"{step_s:>10.4f}{ratio:>10.2f}{planned_mib:>8.0f}")
        print(f"{name}: max |ghost - vmap| clipped grad = {diff:.2e}")
    return records


if __name__ == "__main__":
    main()
