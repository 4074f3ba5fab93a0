"""XLA sharp edge: a weighted sum over the leading (client) axis written as
``jnp.sum(w * u, 0)`` vs the same contraction as ``jnp.tensordot`` (what the
aggregators use). Same run, same inputs; prints a table, optional JSON records.

    python benchmarks/reductions.py --clients 20 1000 --shape 784 200
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np


def _time(fn, *args, repeats=5):
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", nargs="+", type=int, default=[20, 1000])
    p.add_argument("--shape", nargs="+", type=int, default=[784, 200])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    by_sum = jax.jit(lambda w, u: jnp.sum(
        w.reshape((-1,) + (1,) * (u.ndim - 1)) * u, axis=0))
    by_dot = jax.jit(lambda w, u: jnp.tensordot(w, u, axes=1))
    records = []
    print(f"backend={jax.default_backend()} jax={jax.__version__}")
    print(f"{'clients':>8}{'sum s':>12}{'tensordot s':>14}{'ratio':>9}")
    for c in args.clients:
        u = jax.random.normal(jax.random.key(0), (c, *args.shape))
        w = jnp.arange(c, dtype=jnp.float32)
        np.testing.assert_allclose(by_sum(w, u), by_dot(w, u), rtol=1e-3, atol=1e-2)
        ts, td = (_time(f, w, u, repeats=args.repeats) for f in (by_sum, by_dot))
        rec = {"clients": c, "shape": args.shape, "sum_s": ts, "tensordot_s": td,
               "ratio": ts / td, "backend": jax.default_backend(),
               "jax": jax.__version__}
        records.append(rec)
        print(f"{c:>8}{ts:>12.5f}{td:>14.5f}{ts / td:>9.1f}")
    if args.out:
        with open(args.out, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)
    return records


if __name__ == "__main__":
    main()
