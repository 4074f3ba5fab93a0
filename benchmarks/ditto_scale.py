"""Personal state at scale: where time and memory go in Ditto's FMNIST setting.

The paper setting (Li et al. 2021, Table 1): 500 clients, the Ditto FMNIST CNN
(3.27M parameters), ``ditto(lam=1, client_lr=0.05, batch_size=16,
num_local_steps=2, cohort_size=10, cohort='size_weighted', weighted=False)``:
500 stacked personal models, 6.5 GB. Each phase runs in its own process, so its
peak RSS (``VmHWM``) is its own:

* ``round``: one jitted training round with the state donated, as ``simulate``
  runs it on CPU: compile apart, median over ``--rounds`` rounds; whether the
  personal models stay in place (same buffer address after every round) and how
  far the RSS rises above the state during the rounds.
* ``eval``: one evaluation as ``simulate`` runs it (``global`` and ``personal``
  views on ``--splits``, jitted): compile apart, median over ``--evals``; the
  forward FLOPs it needs (XLA's cost analysis of the model per example x the rows
  evaluated) and the GFLOP/s achieved. Variant ``before``: the evaluation of
  commit 868252e (personal models through ``lax.map(batch_size=8)``: vmapped
  convolutions, and a full copy of the stacked models as 500 % 8 != 0), kept
  here as the baseline; skipped when memory is short.
* ``checkpoint``: one checkpoint written and restored (``simulate``'s
  ``Checkpointer``): seconds, bytes, peak RSS. Variant ``before``: a host copy
  of the state saved with orbax's ``StandardSave`` (the format-1 checkpoints of
  868252e), at ``--before-clients`` clients (at 500 it needs more than 24 GB).
* ``simulate``: ``simulate`` of ``--sim-rounds`` rounds evaluating every
  ``--eval-every`` on the test split (as the ``ditto-fmnist`` preset does),
  without and with checkpoints; ``preset``: ``fedjax-pfl run ditto-fmnist`` itself
  (real data only). Wall time, the last chunk's seconds per round (rounds plus
  evaluation, no compilation), checkpoint seconds, peak RSS.

Writes one JSON line per phase and variant (``--out``); ``--report`` prints the
tables. ``--synthetic`` replaces Fashion-MNIST with random data of the same
shapes (smoke tests); ``--in-process`` runs the phases in this process.

    FEDJAX_PFL_DATA_DIR=... flock /tmp/bench.lock python benchmarks/ditto_scale.py \\
        --out docs/results/ditto_scale_cpu.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl import algorithms, data, models
from fedjax_pfl.core import _checkpoint, evaluate_state, simulate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import _meta, cpu_model, parse_or_report, read_jsonl, write_jsonl

PHASES = ("round", "eval", "checkpoint", "simulate")
VARIANTS = {"round": ("after",), "eval": ("after", "before"),
            "checkpoint": ("after", "before"),
            "simulate": ("no_checkpoint", "checkpoint", "preset")}
MODELS = {"cnn": models.ditto_fmnist_cnn,
          "logreg": lambda: models.logistic_regression((784,), 10)}
GB = 1 << 30  # sizes are reported in GiB (fields *_gb)


# ---------------------------------------------------------------- measuring


def _status(field: str) -> int:
    """A ``/proc/self/status`` field in bytes (0 where there is none)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss() -> int:
    return _status("VmRSS")


def peak_rss() -> int:
    """Peak RSS since the process started or the last :func:`reset_peak`."""
    import resource

    return _status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak() -> bool:
    """Resets the peak RSS to the current RSS (Linux ``clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def mem_available() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def machine() -> dict:
    cpu = cpu_model()
    with open("/proc/meminfo") as fh:
        total = int(fh.readline().split()[1]) * 1024
    return {"cpu_model": cpu, "mem_total_gb": total / GB,
            "affinity_cpus": len(os.sched_getaffinity(0))}


# ----------------------------------------------------------------- workload


def synthetic(num_clients: int, seed: int):
    """Random 784-feature, 10-class clients of FMNIST-like sizes (smoke tests)."""
    rng = np.random.default_rng(seed)
    split = {}
    for name, lo, hi in (("train", 28, 120), ("val", 3, 14), ("test", 7, 24)):
        split[name] = [(rng.normal(size=(n, 784)).astype(np.float32),
                        rng.integers(0, 10, n))
                       for n in rng.integers(lo, hi, num_clients)]
    return data.from_client_arrays(split["train"], split["val"], split["test"])


def build(args, num_clients=None):
    """The data and the Ditto algorithm of the paper setting."""
    n = num_clients or args.num_clients
    if args.synthetic:
        fed = synthetic(n, args.seed)
    else:
        x_tr, y_tr, x_te, y_te = data.load_fashion_mnist()
        fed = data.ditto_fmnist(x_tr, y_tr, x_te, y_te, val_fraction=0.1,
                                shuffle_seed=args.seed, num_clients=n)
    model = MODELS[args.model]()
    alg = algorithms.ditto(model, lam=1.0, client_lr=0.05, batch_size=16,
                           num_local_steps=2, cohort_size=min(10, n),
                           cohort="size_weighted", weighted=False)
    return fed, model, alg


def state_bytes(state) -> int:
    return sum(int(x.nbytes) for x in jax.tree.leaves(state))


def _timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), times


def _big_leaf(tree):
    return max(jax.tree.leaves(tree), key=lambda x: x.size)


# ------------------------------------------------------------------- phases


def phase_round(args, variant):
    fed, _, alg = build(args)
    key = jax.random.key(args.seed)
    state = alg.init(key, fed)
    jax.block_until_ready(state)
    base = rss()
    step = jax.jit(alg.round_step, donate_argnums=0)
    t0 = time.perf_counter()
    compiled = step.lower(state, fed, key).compile()
    compile_s = time.perf_counter() - t0
    state, _ = compiled(state, fed, key)  # warm-up
    jax.block_until_ready(state)
    reset_peak()
    times, in_place, after = [], True, []
    for _ in range(args.rounds):
        ptr = _big_leaf(state.clients).unsafe_buffer_pointer()
        t0 = time.perf_counter()
        state, _ = compiled(state, fed, key)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t0)
        in_place &= _big_leaf(state.clients).unsafe_buffer_pointer() == ptr
        after.append(rss())
    return {"round_s": float(np.median(times)), "round_times_s": times,
            "compile_s": compile_s, "state_gb": state_bytes(state) / GB,
            "rss_before_rounds_gb": base / GB,
            "peak_rss_rounds_gb": peak_rss() / GB,
            "rss_rise_over_rounds_gb": (peak_rss() - base) / GB,
            "personal_in_place": bool(in_place)}


def flops_per_example(model, split) -> float:
    """XLA's cost analysis of one forward pass, per example (batch of 64)."""
    params = model.init(jax.random.key(0))
    x = jnp.zeros((64, *split.x.shape[1:]), split.x.dtype)
    cost = jax.jit(model.apply).lower(params, x).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"]) / 64


def rows_computed(split, variant, row_chunk=64, chunk=512) -> dict:
    """Rows each path runs the model on, padding included (personal, shared)."""
    counts = np.asarray(split.counts)
    b = max(1, min(int(split.max_count), row_chunk))
    if variant == "before":
        personal = int(np.sum(-(-counts // b) * b))
        shared = int(-(-counts.sum() // chunk) * chunk)
    else:
        t = min(b, 8)
        personal = int(np.sum(counts // b * b + -(-(counts % b) // t) * t))
        shared = int(counts.sum())
    return {"personal": personal, "shared": shared}


def phase_eval(args, variant):
    fed, model, alg = build(args)
    key = jax.random.key(args.seed)
    state = alg.init(key, fed)
    jax.block_until_ready(state)
    need = 2.3 * state_bytes(state) + 2 * GB
    if variant == "before" and mem_available() < need - rss():
        return {"skipped": f"needs about {need / GB:.1f} GB, "
                f"{mem_available() / GB:.1f} GB available"}
    from fedjax_pfl.core import _eval

    current = _eval.evaluate_split
    if variant == "before":
        _eval.evaluate_split = evaluate_split_before
    try:
        return _eval_timed(args, variant, fed, model, alg, key, state)
    finally:
        _eval.evaluate_split = current


def _eval_timed(args, variant, fed, model, alg, key, state):
    splits = tuple(args.splits)
    views = ("global", "personal")
    ev = jax.jit(lambda s, d: evaluate_state(alg, s, d, key=key, views=views,
                                             splits=splits))
    reset_peak()
    t0 = time.perf_counter()
    compiled = ev.lower(state, fed).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(state, fed))  # warm-up
    eval_s, times = _timed(lambda: compiled(state, fed), args.evals)
    fpe = flops_per_example(model, fed.test)
    rows = sum(getattr(fed, s).num_examples for s in splits)
    computed = sum(sum(rows_computed(getattr(fed, s), variant).values())
                   for s in splits)
    out = compiled(state, fed)
    return {"eval_s": eval_s, "eval_times_s": times, "compile_s": compile_s,
            "splits": list(splits), "views": list(views), "rows_per_view": rows,
            "flops_per_example": fpe, "gflop_needed": fpe * rows * len(views) / 1e9,
            "gflop_computed": fpe * computed / 1e9,
            "gflop_per_s": fpe * rows * len(views) / 1e9 / eval_s,
            "state_gb": state_bytes(state) / GB, "peak_rss_gb": peak_rss() / GB,
            "personal_test_accuracy": float(out["personal/test/accuracy/mean"])
            if "personal/test/accuracy/mean" in out else None}


def _leaf_sums(state):
    return [float(jnp.sum(jnp.asarray(x, jnp.float32))) for x in
            jax.tree.leaves(jax.tree.map(
                lambda a: jax.random.key_data(a) if jnp.issubdtype(
                    a.dtype, jax.dtypes.prng_key) else a, state))]


def phase_checkpoint(args, variant):
    clients = args.before_clients if variant == "before" else args.num_clients
    fed, _, alg = build(args, clients)
    key = jax.random.key(args.seed)
    state = alg.init(key, fed)
    jax.block_until_ready(state)
    sums = _leaf_sums(state)
    directory = tempfile.mkdtemp(prefix="ditto_scale_ck_", dir=args.tmp)
    try:
        if variant == "before":
            return dict(_checkpoint_before(state, directory), clients=clients,
                        state_gb=state_bytes(state) / GB)
        template = jax.eval_shape(lambda k: alg.init(k, fed), key)
        fp = _checkpoint.fingerprint(num_rounds=1, eval_every=1, run_key=key,
                                     start_round=None, template=template,
                                     privacy=None)
        ck = _checkpoint.Checkpointer(directory)
        base = rss()
        reset_peak()
        t0 = time.perf_counter()
        ck.save(1, state, [], fp, None)
        save_s = time.perf_counter() - t0
        save_peak = peak_rss()
        size = _du(directory)
        gb = state_bytes(state) / GB
        del state
        reset_peak()
        t0 = time.perf_counter()
        restored = ck.restore(template, fp).state
        jax.block_until_ready(restored)
        restore_s = time.perf_counter() - t0
        ck.close()
        return {"clients": clients, "state_gb": gb, "save_s": save_s,
                "restore_s": restore_s, "bytes_on_disk_gb": size / GB,
                "rss_before_save_gb": base / GB, "peak_rss_save_gb": save_peak / GB,
                "save_rise_gb": (save_peak - base) / GB,
                "peak_rss_restore_gb": peak_rss() / GB,
                "restored_sums_equal": _leaf_sums(restored) == sums}
    finally:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


def _checkpoint_before(state, directory):
    """868252e's checkpoint: host copies of the leaves, orbax StandardSave."""
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=2, create=True,
                                           enable_async_checkpointing=False)
    manager = ocp.CheckpointManager(directory, options=options,
                                    item_names=("state",))
    leaves = [jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
              else x for x in jax.tree.leaves(state)]
    base = rss()
    reset_peak()
    t0 = time.perf_counter()
    arrays = {f"{i:06d}": np.array(jax.device_get(x), copy=True)
              for i, x in enumerate(leaves) if x.size}
    manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(arrays)))
    manager.wait_until_finished()
    save_s = time.perf_counter() - t0
    save_peak = peak_rss()
    del arrays
    abstract = {f"{i:06d}": jax.ShapeDtypeStruct(x.shape, x.dtype)
                for i, x in enumerate(leaves) if x.size}
    del state, leaves
    reset_peak()
    t0 = time.perf_counter()
    restored = manager.restore(1, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract))).state
    restored = {k: jnp.asarray(np.asarray(v)) for k, v in restored.items()}
    jax.block_until_ready(restored)
    restore_s = time.perf_counter() - t0
    manager.close()
    return {"save_s": save_s, "restore_s": restore_s,
            "bytes_on_disk_gb": _du(directory) / GB, "rss_before_save_gb": base / GB,
            "peak_rss_save_gb": save_peak / GB, "save_rise_gb": (save_peak - base) / GB,
            "peak_rss_restore_gb": peak_rss() / GB}


def _du(path) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path)
               for f in fs)


def phase_simulate(args, variant):
    saves = []
    save = _checkpoint.Checkpointer.save

    def timed_save(self, *a, **k):
        t0 = time.perf_counter()
        save(self, *a, **k)
        saves.append(time.perf_counter() - t0)

    _checkpoint.Checkpointer.save = timed_save
    directory = tempfile.mkdtemp(prefix="ditto_scale_sim_", dir=args.tmp)
    try:
        t0 = time.perf_counter()
        if variant == "preset":
            if args.synthetic:
                return {"skipped": "the preset needs Fashion-MNIST"}
            from fedjax_pfl.experiments import run_preset

            res = run_preset("ditto-fmnist", {"rounds": args.sim_rounds,
                                              "eval_every": args.eval_every,
                                              "seed": args.seed},
                             out=os.path.join(directory, "run"), progress=False)
            history = res["history"]
        else:
            fed, _, alg = build(args)
            ck = os.path.join(directory, "ck") if variant == "checkpoint" else None
            history = simulate(alg, fed, num_rounds=args.sim_rounds,
                               eval_every=args.eval_every, key=jax.random.key(args.seed),
                               splits=("test",), progress=False,
                               checkpoint_dir=ck).history
        wall = time.perf_counter() - t0
        last = history[-1]
        n = last["round"] - history[-2]["round"]
        return {"wall_s": wall, "rounds": args.sim_rounds, "eval_every": args.eval_every,
                "last_chunk_s_per_round": last["seconds"] / n,
                "last_chunk_rounds": n, "checkpoint_save_s": saves,
                "peak_rss_gb": peak_rss() / GB,
                "personal_test_accuracy": last.get("personal/test/accuracy/mean")}
    finally:
        import shutil

        _checkpoint.Checkpointer.save = save
        shutil.rmtree(directory, ignore_errors=True)


PHASE_FNS = {"round": phase_round, "eval": phase_eval, "checkpoint": phase_checkpoint,
             "simulate": phase_simulate}


# -------------------------------------------- the evaluation of commit 868252e


def evaluate_split_before(view, split, *, chunk_size=512, row_chunk=64):
    """``metrics.evaluate_split`` as of commit 868252e (the baseline)."""
    from fedjax_pfl.core._eval import _per_example

    model = view.model
    counts = split.counts
    num_clients = split.num_clients
    if not view.per_client:
        n = split.num_examples
        pad = (-n) % chunk_size
        x = jnp.pad(split.x, [(0, pad)] + [(0, 0)] * (split.x.ndim - 1))
        y = jnp.pad(split.y, [(0, pad)] + [(0, 0)] * (split.y.ndim - 1))
        xc = x.reshape((-1, chunk_size) + x.shape[1:])
        yc = y.reshape((-1, chunk_size) + y.shape[1:])
        loss, score = jax.lax.map(
            lambda xy: _per_example(model, view.params, *xy), (xc, yc))
        loss, score = loss.reshape(-1)[:n], score.reshape(-1)[:n]
        owner = split.client_of_row
        loss_sum = jax.ops.segment_sum(loss, owner, num_clients)
        score_sum = jax.ops.segment_sum(score, owner, num_clients)
    else:
        b = max(1, min(split.max_count, row_chunk))
        ar = jnp.arange(b)

        def one(params, offset, count):
            def body(j, acc):
                idx = j * b + ar
                rows = offset + jnp.minimum(idx, jnp.maximum(count - 1, 0))
                mask = (idx < count).astype(jnp.float32)
                loss, score = _per_example(model, params, split.x[rows], split.y[rows])
                return acc[0] + jnp.sum(loss * mask), acc[1] + jnp.sum(score * mask)

            zero = jnp.zeros((), jnp.float32)
            return jax.lax.fori_loop(0, (count + b - 1) // b, body, (zero, zero))

        loss_sum, score_sum = jax.lax.map(
            lambda a: one(*a), (view.params, split.offsets, counts),
            batch_size=max(1, min(num_clients, chunk_size // b)))
    denom = counts.astype(jnp.float32)
    safe = jnp.where(denom > 0, denom, jnp.nan)
    return {"loss": loss_sum / safe, "accuracy": score_sum / safe, "count": counts}


# ------------------------------------------------------------------- driver


def _config(args) -> dict:
    return {k: v for k, v in vars(args).items()
            if k not in ("out", "report", "phase_only", "variant_only", "record_to")}


def run_phase(args, phase, variant) -> dict:
    """One phase in a fresh process (or in this one with ``--in-process``)."""
    if args.in_process:
        return PHASE_FNS[phase](args, variant)
    with tempfile.NamedTemporaryFile("r", suffix=".json", dir=args.tmp) as fh:
        argv = [sys.executable, os.path.abspath(__file__), "--phase-only", phase,
                "--variant-only", variant, "--record-to", fh.name]
        for k, v in _config(args).items():
            flag = "--" + k.replace("_", "-")
            if isinstance(v, bool):
                argv += [flag] if v else []
            elif isinstance(v, list):
                argv += [flag, *map(str, v)]
            elif v is not None:
                argv += [flag, str(v)]
        proc = subprocess.run(argv, check=False, capture_output=True, text=True)
        if proc.returncode:
            return {"failed": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
        return json.loads(open(fh.name).read() or "{}")


def report(path: str) -> str:
    """Markdown tables of a ``--out`` file (the last record of each phase and
    variant)."""
    recs = {}
    for r in read_jsonl(path):
        splits = tuple(r.get("splits") or ()) if r["phase"] == "eval" else ()
        recs[(r["phase"], r["variant"], splits)] = r
    if not recs:
        return "(no records)"
    any_r = next(iter(recs.values()))
    shas = ", ".join(sorted({r["git_sha"] for r in recs.values()}))
    dates = sorted(r["date"] for r in recs.values())
    lines = [f"{any_r['cpu_model']}, {any_r['affinity_cpus']} CPUs, jax {any_r['jax']}, "
             f"{any_r['backend']}, git {shas}, {dates[0]} to {dates[-1]}; "
             f"{any_r['num_clients']} clients, model {any_r['model']}"
             + (" (synthetic data)" if any_r["synthetic"] else "")
             + "; GB = GiB (2^30 bytes)", "",
             ("| phase | variant | seconds | compile s | GFLOP (needed / run) | GFLOP/s "
              "| peak RSS GB | notes |"), "|---|---|---|---|---|---|---|---|"]

    def f(v, fmt=".2f"):
        return "" if v is None else format(v, fmt)

    for (phase, variant, _), r in sorted(recs.items(), key=lambda kv: (
            PHASES.index(kv[0][0]), len(kv[0][2]), VARIANTS[kv[0][0]].index(kv[0][1]))):
        if "skipped" in r or "failed" in r:
            lines.append(f"| {phase} | {variant} | | | | | | "
                         f"{r.get('skipped') or r['failed'][:80]} |")
            continue
        if phase == "round":
            lines.append(
                f"| round | {variant} | {f(r['round_s'], '.3f')} (median of "
                f"{len(r['round_times_s'])}) | {f(r['compile_s'], '.1f')} | | | "
                f"{f(r['peak_rss_rounds_gb'])} | state {f(r['state_gb'])} GB; rise over "
                f"the rounds {f(r['rss_rise_over_rounds_gb'])} GB; personal models "
                f"{'updated in place' if r['personal_in_place'] else 'MOVED'} |")
        elif phase == "eval":
            lines.append(
                f"| eval ({'+'.join(r['splits'])}) | {variant} | {f(r['eval_s'])} | "
                f"{f(r['compile_s'], '.1f')} | {f(r['gflop_needed'], '.0f')} / "
                f"{f(r['gflop_computed'], '.0f')} | {f(r['gflop_per_s'], '.0f')} | "
                f"{f(r['peak_rss_gb'])} | {r['rows_per_view']} rows x "
                f"{len(r['views'])} views |")
        elif phase == "checkpoint":
            lines.append(
                f"| checkpoint write | {variant} | {f(r['save_s'])} | | | | "
                f"{f(r['peak_rss_save_gb'])} | {r['clients']} clients, state "
                f"{f(r['state_gb'])} GB, +{f(r['save_rise_gb'])} GB while saving, "
                f"{f(r['bytes_on_disk_gb'])} GB on disk |")
            lines.append(
                f"| checkpoint restore | {variant} | {f(r['restore_s'])} | | | | "
                f"{f(r['peak_rss_restore_gb'])} | |")
        else:
            ck = r["checkpoint_save_s"]
            lines.append(
                f"| simulate {r['rounds']} rounds, eval every {r['eval_every']} | "
                f"{variant} | {f(r['wall_s'], '.1f')} | | | | {f(r['peak_rss_gb'])} | "
                f"{f(r['last_chunk_s_per_round'], '.3f')} s a round in the last "
                f"{r['last_chunk_rounds']} rounds, evaluation included"
                + (f"; checkpoints {', '.join(f(s, '.1f') for s in ck)} s" if ck else "")
                + " |")
    rd = recs.get(("round", "after", ()), {})
    for splits in sorted({k[2] for k in recs if k[0] == "eval"}, key=len):
        ev = {v: recs.get(("eval", v, splits), {}).get("eval_s") for v in VARIANTS["eval"]}
        if "round_s" in rd and ev["after"] is not None:
            lines += ["", f"Per round at eval_every=50, evaluating {'+'.join(splits)} "
                      f"(median round + one evaluation / 50): "
                      f"**{rd['round_s'] + ev['after'] / 50:.3f} s**" + (
                          f" (before: {rd['round_s'] + ev['before'] / 50:.3f} s)"
                          if ev["before"] is not None else "")]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--phases", nargs="+", default=list(PHASES), choices=PHASES)
    p.add_argument("--variants", nargs="+", default=None,
                   help="variants to run (default: all of each phase)")
    p.add_argument("--num-clients", type=int, default=500)
    p.add_argument("--model", default="cnn", choices=sorted(MODELS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=10, help="timed training rounds")
    p.add_argument("--evals", type=int, default=3, help="timed evaluations")
    p.add_argument("--splits", nargs="+", default=["test"],
                   help="splits an evaluation covers (the preset: test)")
    p.add_argument("--before-clients", type=int, default=100,
                   help="clients of the 'before' checkpoint (500 need > 24 GB)")
    p.add_argument("--sim-rounds", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--synthetic", action="store_true",
                   help="random data of FMNIST's shapes instead of Fashion-MNIST")
    p.add_argument("--in-process", action="store_true",
                   help="run every phase in this process (peaks then accumulate)")
    p.add_argument("--tmp", default=None, help="directory for checkpoints")
    p.add_argument("--phase-only", default=None, help=argparse.SUPPRESS)
    p.add_argument("--variant-only", default=None, help=argparse.SUPPRESS)
    p.add_argument("--record-to", default=None, help=argparse.SUPPRESS)
    args = parse_or_report(p, argv, report)
    if args is None:
        return []
    for name in ("num_clients", "rounds", "evals", "before_clients", "sim_rounds",
                 "eval_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"{name}: must be a positive integer, got "
                             f"{getattr(args, name)}")
    if args.phase_only:  # a child process: one phase, its record to a file
        rec = PHASE_FNS[args.phase_only](args, args.variant_only)
        with open(args.record_to, "w") as fh:
            json.dump(rec, fh)
        return [rec]
    meta = dict(_meta(), **machine(), config=_config(args), **_config(args))
    records = []
    for phase in args.phases:
        for variant in VARIANTS[phase]:
            if args.variants and variant not in args.variants:
                continue
            t0 = time.perf_counter()
            rec = dict(meta, phase=phase, variant=variant,
                       **run_phase(args, phase, variant))
            rec["phase_wall_s"] = time.perf_counter() - t0
            records.append(rec)
            write_jsonl(args.out, [rec])
            brief = {k: v for k, v in rec.items() if k not in meta and not
                     isinstance(v, list)}
            print(json.dumps(brief), flush=True)
    return records


if __name__ == "__main__":
    main()
