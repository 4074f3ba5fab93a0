"""Convolution gradients inside a client loop vs unrolled, native vs ours.

The gradient of the Ditto FMNIST CNN on ``--clients`` batches of ``--batch``
examples, as one jitted program, two ways: ``lax.map`` over the batches (a
``while`` loop, as the CPU default strategy ``map`` runs clients) and a Python loop
unrolled into straight-line code. Each with the native ``lax`` convolution and with
``models.conv_general_dilated`` (the zoo's). XLA:CPU runs the native gradient
convolutions several times slower inside a loop body (jax-ml/jax#12868).

    python benchmarks/conv_loop.py --out docs/results/conv_loop_cpu.jsonl
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp

from fedjax_pfl import models

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import _meta, _timed, parse_or_report, read_jsonl, write_jsonl  # noqa: E402


class _CNN(nn.Module):  # models.DittoFMNISTCNN with a choice of convolution
    conv: object

    @nn.compact
    def __call__(self, x):
        conv = functools.partial(nn.Conv, conv_general_dilated=self.conv)
        x = x.reshape(x.shape[0], 28, 28, 1)
        x = nn.max_pool(nn.relu(conv(32, (5, 5), padding="SAME")(x)), (2, 2), (2, 2))
        x = nn.max_pool(nn.relu(conv(64, (5, 5), padding="SAME")(x)), (2, 2), (2, 2))
        x = nn.relu(nn.Dense(1024)(x.reshape(x.shape[0], -1)))
        return nn.Dense(10)(x)


def report(paths) -> str:
    rows = ["| clients x batch | convolution | lax.map s | unrolled s "
            "| map / unrolled |",
            "|---|---|---|---|---|"]
    for path in paths:
        for r in read_jsonl(path):
            rows.append(f"| {r['clients']} x {r['batch']} | {r['conv']} | "
                        f"{r['map_s']:.4f} | {r['unrolled_s']:.4f} | "
                        f"**{r['map_s'] / r['unrolled_s']:.2f}** |")
    return "\n".join(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    args = parse_or_report(p, argv, report, multiple=True)
    if args is None:
        return []
    meta = _meta()
    x = jax.random.normal(jax.random.key(1), (args.clients, args.batch, 784))
    y = jax.random.randint(jax.random.key(2), (args.clients, args.batch), 0, 10)
    records, grads = [], {}
    for name, conv in (("lax", jax.lax.conv_general_dilated),
                       ("fedjax_pfl", models.conv_general_dilated)):
        net = _CNN(conv)
        params = net.init(jax.random.key(0), x[0])
        grad = jax.grad(lambda p_, xi, yi, net=net: models.cross_entropy(
            net.apply(p_, xi), yi).mean())
        mapped = jax.jit(lambda p_, x_, y_, grad=grad: jax.lax.map(
            lambda a: grad(p_, *a), (x_, y_)))
        unrolled = jax.jit(lambda p_, x_, y_, grad=grad: jax.tree.map(
            lambda *g: jnp.stack(g), *[grad(p_, x_[i], y_[i])
                                       for i in range(args.clients)]))
        g_map, _, map_s = _timed(lambda f=mapped: f(params, x, y), args.repeats)
        g_unr, _, unr_s = _timed(lambda f=unrolled: f(params, x, y), args.repeats)
        grads[name] = g_map
        diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                   zip(jax.tree.leaves(g_map), jax.tree.leaves(g_unr)))
        rec = dict(meta, benchmark="conv_loop", clients=args.clients, batch=args.batch,
                   conv=name, map_s=map_s, unrolled_s=unr_s, max_abs_diff=diff)
        records.append(rec)
        print(f"{name:>11}: lax.map {map_s:.4f} s, unrolled {unr_s:.4f} s, "
              f"ratio {map_s / unr_s:.2f}, max |map - unrolled| {diff:.1e}")
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in
               zip(jax.tree.leaves(grads["lax"]), jax.tree.leaves(grads["fedjax_pfl"])))
    for r in records:
        r["max_abs_diff_lax_vs_ours"] = diff
    print(f"max |lax - ours| gradient: {diff:.1e}")
    write_jsonl(args.out, records)
    return records


if __name__ == "__main__":
    main()
