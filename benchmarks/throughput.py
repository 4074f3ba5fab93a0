"""Engine round vs a Python loop over clients (the fedjax-style baseline).

Same workload, same run: every client of a full cohort takes ``--steps`` local SGD
steps of batch ``--batch`` from the global model, then the server averages. The
engine runs it as one jitted round with each client-parallel strategy; the
baseline calls one jitted per-client update (the same ``local_train`` kernel) in
a Python loop and accumulates the weighted deltas with a jitted add.

Prints a table and writes one JSON record per configuration (``--out``).

    python benchmarks/throughput.py --models logreg mlp cnn --clients 100 1000
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fedjax_pfl
from fedjax_pfl import algorithms, models
from fedjax_pfl.core import EngineConfig, KeyTag, execution, run_rounds
from fedjax_pfl.core._local import local_train
from fedjax_pfl.data import from_client_arrays

MODELS = {
    "logreg": lambda: models.logistic_regression((784,), 10),
    "mlp": lambda: models.mlp((784,), 10, hidden=(200, 200)),
    "cnn": lambda: models.ditto_fmnist_cnn(),
}


def make_data(num_clients: int, per_client: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    clients = [(rng.normal(size=(per_client, 784)).astype(np.float32),
                rng.integers(0, 10, per_client)) for _ in range(num_clients)]
    return from_client_arrays(clients)


def _timed(fn, repeats):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())  # first call: compile + run
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return out, first, float(np.median(times))


def engine_round(model, data, args, strategy, map_batch, scan_rounds=0):
    """One jitted round; with ``scan_rounds = R > 0``, R rounds in one
    ``lax.scan`` as ``simulate`` runs them (time reported per round)."""
    alg = algorithms.fedavg(
        model, client_lr=0.05, num_local_steps=args.steps, batch_size=args.batch,
        cohort="full", cohort_size=data.num_clients)
    engine = EngineConfig(strategy, map_batch, unroll=args.unroll)
    state = alg.init(jax.random.key(0), data)
    key = jax.random.key(1)
    if scan_rounds:
        step = jax.jit(lambda s, d, k: run_rounds(alg, s, d, k, scan_rounds)[0])
    else:
        step = jax.jit(lambda s, d, k: alg.round_step(s, d, k)[0])
    with execution(engine):  # every trace of ``step`` under this engine
        t0 = time.perf_counter()
        step.lower(state, data, key).compile()
        compile_s = time.perf_counter() - t0
        new, first, t = _timed(lambda: step(state, data, key), args.repeats)
    return new.server.params, compile_s, t / max(scan_rounds, 1)


def loop_round(model, data, args):
    """The baseline: Python loop over clients, one jitted update per client."""
    params = model.init(jax.random.key(0))
    unroll = args.unroll if args.unroll is not None else (
        jax.default_backend() == "cpu" and args.steps <= 32)

    # the data is an argument: captured, it would be embedded in the program as a
    # constant (800 MB of HLO at 2,000 clients; the engine rounds take it as one too)
    @jax.jit
    def client_update(w, train, cid, key):
        w_k, _ = local_train(model, w, train, cid, key, optimizer=optax.sgd(0.05),
                             num_steps=args.steps, batch_size=args.batch,
                             unroll=unroll)
        n = train.counts[cid].astype(jnp.float32)
        return jax.tree.map(lambda a, b: n * (a - b), w_k, w), n

    add = jax.jit(lambda acc, d: jax.tree.map(jnp.add, acc, d))
    finish = jax.jit(lambda w, acc, n: jax.tree.map(lambda a, b: a + b / n, w, acc))
    rkey = jax.random.fold_in(jax.random.fold_in(jax.random.key(1), 0), KeyTag.CLIENT)
    keys = [jax.random.fold_in(rkey, k) for k in np.asarray(data.key_ids)]
    cids = [jnp.int32(c) for c in range(data.num_clients)]

    def run():
        acc, total = None, 0.0
        for cid, k in zip(cids, keys):
            d, n = client_update(params, data.train, cid, k)
            acc = d if acc is None else add(acc, d)
            total += n
        return finish(params, acc, total)

    t0 = time.perf_counter()
    client_update.lower(params, data.train, cids[0], keys[0]).compile()
    compile_s = time.perf_counter() - t0
    out, first, t = _timed(run, args.repeats)
    return out, compile_s, t


def _git_sha() -> str:
    """HEAD's short sha, with ``-dirty`` when the package or the benchmarks
    differ from it (uncommitted code; records and docs do not count)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.environ.get("FEDJAX_PFL_GIT_SHA"):
        # a copy of the tree sent elsewhere (a lent GPU machine), whose .git, if
        # any, need not be the sender's: the sender names the commit
        # (benchmarks/gpu_jobs.sh)
        return os.environ["FEDJAX_PFL_GIT_SHA"]
    try:
        sha = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"],
                                      cwd=root, stderr=subprocess.DEVNULL,
                                      text=True).strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "fedjax_pfl",
                                "benchmarks"], cwd=root, stderr=subprocess.DEVNULL,
                               check=False)
        return sha + ("-dirty" if dirty.returncode == 1 else "")
    except Exception:
        return "unknown"


# the commit whose code this process imported: a record written hours later,
# after further commits, still names the code that produced it
_GIT_SHA = _git_sha()


def _meta():
    sha = _GIT_SHA
    dev = jax.devices()[0]
    return {"jax": jax.__version__, "backend": jax.default_backend(),
            "device_kind": dev.device_kind, "num_devices": jax.device_count(),
            "cpu_count": os.cpu_count(), "machine": platform.machine(),
            "git_sha": sha, "date": datetime.datetime.now().isoformat(timespec="seconds"),
            # the XLA flags the process runs with (fedjax_pfl adds one on the CPU
            # at import: fedjax_pfl/_xla_cpu.py) and what the package did
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "xla_cpu_setting": fedjax_pfl.xla_cpu_setting}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` where
    that is missing)."""
    try:
        with open("/proc/cpuinfo") as fh:
            return next((ln.split(":", 1)[1].strip() for ln in fh
                         if ln.startswith("model name")), platform.processor())
    except OSError:
        return platform.processor()


def across_seeds(values) -> str:
    """``mean +- std`` (ddof 1) of one number per seed; just the value for one."""
    v = np.asarray(values, float)
    return f"{v[0]:.3f}" if len(v) == 1 else f"{v.mean():.3f} +- {v.std(ddof=1):.3f}"


def settings_hash(settings: dict, length: int) -> str:
    """The first ``length`` hex digits of the sha256 of ``settings`` as sorted
    JSON: a stable name for a run's settings (checkpoint folders, caches)."""
    text = json.dumps(settings, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def read_jsonl(path: str) -> list[dict]:
    """The records of a JSON-lines file (blank lines skipped), as ``write_jsonl``
    writes them."""
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def write_jsonl(path: str | None, records) -> None:
    """Appends one JSON line per record to ``path`` (nothing if ``None``)."""
    if path:
        with open(path, "a") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)


def add_checkpoint_args(p, layout: str) -> None:
    """``--checkpoint-dir`` (each run in ``DIR/<layout>``), ``--checkpoint-every``
    and ``--resume``, for benchmarks whose runs go through ``simulate``."""
    p.add_argument("--checkpoint-dir", default=None,
                   help=f"checkpoint each run into DIR/{layout}")
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="rounds between checkpoints (a multiple of --eval-every)")
    p.add_argument("--resume", action="store_true",
                   help="continue each run from its newest checkpoint")


def parse_or_report(p: argparse.ArgumentParser, argv, report, *, multiple=False):
    """Adds ``--out`` / ``--report`` to a benchmark's parser and parses ``argv``.
    With ``--report JSONL`` prints ``report(path)`` (``report(paths)`` when
    ``multiple``) and returns ``None``; else returns the parsed arguments."""
    p.add_argument("--out", default=None, help="append JSON records to this file")
    p.add_argument("--report", nargs="+" if multiple else None, default=None,
                   metavar="JSONL", help="print a markdown table of these records "
                   "and exit")
    args = p.parse_args(argv)
    if args.report:
        print(report(args.report))
        return None
    # add_checkpoint_args' flags, refused before any data is loaded
    if ((getattr(args, "resume", False) or getattr(args, "checkpoint_every", None))
            and not args.checkpoint_dir):
        p.error("--resume and --checkpoint-every need --checkpoint-dir")
    return args


def report(paths) -> str:
    """Markdown table of JSON records written by ``--out``."""
    lines = ["| model | clients | local steps | variant | compile s | round s | "
             "rounds/s | client-steps/s | vs loop |", "|---|---|---|---|---|---|---|---|---|"]
    for path in paths:
        for r in read_jsonl(path):
            lines.append(
                f"| {r['model']} | {r['clients']} | {r['steps']} | {r['variant']} | "
                f"{r['compile_s']:.2f} | {r['round_s']:.4f} | "
                f"{r['rounds_per_s']:.2f} | {r['client_steps_per_s']:.0f} | "
                f"**{r['speedup_vs_loop']:.2f}** |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["logreg", "mlp", "cnn"],
                   choices=sorted(MODELS))
    p.add_argument("--clients", nargs="+", type=int, default=[100, 1000])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--per-client", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--strategies", nargs="+",
                   default=["vmap", "map:1", "map:10", "map:100"],
                   help="engine strategies, 'vmap' or 'map:B'")
    p.add_argument("--cnn-steps", type=int, default=1,
                   help="local steps for the CNN (it is ~100x the MLP's cost)")
    p.add_argument("--unroll", type=lambda s: {"true": True, "false": False}.get(
        s.lower(), None), default=None, help="true/false; default: engine default")
    p.add_argument("--scan-rounds", type=int, default=4,
                   help="also time the default strategy with this many rounds per "
                        "lax.scan, as simulate runs them (0: skip)")
    args = parse_or_report(p, argv, report, multiple=True)
    if args is None:
        return []
    meta = _meta()
    records = []
    print(f"backend={meta['backend']} device={meta['device_kind']} jax={meta['jax']}")
    print(f"{'model':<7}{'clients':>8}{'variant':>14}{'compile s':>11}"
          f"{'round s':>10}{'rounds/s':>10}{'client-steps/s':>16}{'vs loop':>9}")
    for name in args.models:
        model = MODELS[name]()
        for c in args.clients:
            run_args = argparse.Namespace(**vars(args))
            if name == "cnn":
                run_args.steps = args.cnn_steps
            data = make_data(c, args.per_client)
            base, base_compile, base_t = loop_round(model, data, run_args)
            results = [("loop", base_compile, base_t, 0.0)]
            for s in args.strategies:
                strategy, _, b = s.partition(":")
                if strategy == "map" and int(b) > c:
                    continue
                params, comp, t = engine_round(model, data, run_args, strategy,
                                               int(b) if b else None)
                err = max(float(jnp.max(jnp.abs(a - b_)))
                          for a, b_ in zip(jax.tree.leaves(params),
                                           jax.tree.leaves(base)))
                results.append((s, comp, t, err))
            if args.scan_rounds:
                strategy, b = EngineConfig().strategy, EngineConfig().map_batch_size
                _, comp, t = engine_round(model, data, run_args, strategy, b,
                                          args.scan_rounds)
                label = f"scan{args.scan_rounds}:{strategy}" + (f":{b}" if b else "")
                results.append((label, comp, t, None))
            for variant, comp, t, err in results:
                steps_per_s = c * run_args.steps / t
                rec = dict(meta, model=name, clients=c, steps=run_args.steps,
                           batch=args.batch, variant=variant, compile_s=comp,
                           round_s=t, rounds_per_s=1 / t,
                           client_steps_per_s=steps_per_s, speedup_vs_loop=base_t / t,
                           max_abs_diff_vs_loop=err)
                records.append(rec)
                print(f"{name:<7}{c:>8}{variant:>14}{comp:>11.2f}{t:>10.4f}"
                      f"{1 / t:>10.2f}{steps_per_s:>16.0f}{base_t / t:>9.2f}")
                sys.stdout.flush()
            write_jsonl(args.out, records[-len(results):])  # each config as it ends
    return records


if __name__ == "__main__":
    main()
