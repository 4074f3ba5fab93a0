"""Ditto's Fashion-MNIST setting (Li et al. 2021, Table 1) on local data.

500 devices with 5 classes each (the authors' recipe, exact counts), the Ditto
FMNIST CNN, lr 0.05, batch 16, 2 local iterations, 10 clients per round sampled
proportionally to their sizes, an unweighted mean of the updates. One Ditto run
gives both the ``global`` model (its trajectory is exactly FedAvg's) and the
``personal`` models; ``--runs local`` adds local training (``algorithms.local_only``:
each client trains its own model, 2 steps in each round it is selected, nothing
shared); ``--runs term`` adds the fair baseline of Table 1, TERM (FedAvg whose
server step is ``aggregators.tilted_mean(--term-t)``, t = 1 in the paper; at
t = 0 it is Ditto's global model exactly). Metrics are over benign clients
(test accuracy: sample-weighted mean, std across clients, worst 10 %). Writes
JSON lines (``--out``).

A local model never sees another client's data or uploads, so a benign client's
local model is the same under every attack. A clean local run (``--attack
none``) therefore also writes the attack columns: for each ``--derive-ratios``
it summarizes the same per-client accuracies over the benign clients of that
ratio (the malicious set depends only on the ratio and the seed, the same for
A1, A2 and A3), marked ``derived_from_clean_run``.

    FEDJAX_PFL_DATA_DIR=/path/to/data python benchmarks/ditto_fmnist.py \
        --attack A1 --ratio 0.5 --rounds 300 --eval-every 50 \
        --out docs/results/ditto_fmnist.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np

from fedjax_pfl import aggregators, algorithms, attacks, data, metrics, models
from fedjax_pfl.core import (
    EngineConfig,
    Plateau,
    execution,
    participation_counts,
    simulate,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import (  # noqa: E402
    _meta,
    across_seeds,
    add_checkpoint_args,
    parse_or_report,
    read_jsonl,
    write_jsonl,
)

VIEWS = {"ditto": ("global", "personal"), "local": ("personal",), "term": ("global",)}
BINS = ((0, 0), (1, 2), (3, 5), (6, 10), (11, 10**9))  # rounds a client took part in


def per_client_eval(alg, state, fed, key, splits, engine):
    """Per-client metrics of the final global and personal models on ``splits``."""
    def per_client(s, d):
        views = {k: v for k, v in alg.eval_models(s, d, key).items()
                 if k in ("global", "personal")}
        return metrics.evaluate(views, d, splits=splits, per_client=True)

    # state and data as arguments, never as captured constants (6.6 GB of
    # personal models for 500 clients); traced under the run's engine
    with execution(engine):
        return jax.jit(per_client)(state, fed)


def run_participation(fed, key, cohort_size, rounds) -> np.ndarray:
    """How many of the first ``rounds`` rounds each client took part in, for a
    size-weighted cohort of ``cohort_size`` and the ``key`` the run's
    ``simulate`` got."""
    return participation_counts(fed, rounds, jax.random.split(key)[1], cohort_size,
                                "size_weighted")


def by_participation(ev, counts, benign, views=("global", "personal")):
    """Per-client test accuracy (``ev``, from :func:`per_client_eval`) of the
    ``views`` (default: the global and personal models) of benign clients,
    grouped by how many rounds each client took part in (``counts``, from
    :func:`run_participation`): with 10 of 500 clients a round, a client
    trains its personal model only when selected."""
    out = []
    for lo, hi in BINS:
        sel = (counts >= lo) & (counts <= hi) & (benign > 0)
        row = {"min_rounds": lo, "max_rounds": min(hi, int(counts.max())),
               "clients": int(sel.sum())}
        for view in views:  # local training has no global model
            k = f"{view}/test/accuracy/per_client"
            if k in ev:
                acc = np.asarray(ev[k])[sel]
                row[view] = float(np.nanmean(acc)) if sel.any() else None
        out.append(row)
    return out


def derived_columns(ev, fed, args, base):
    """Records of the attack columns from a clean local run: the final local
    models' per-client metrics (``ev``) summarized over the benign clients of
    each ratio in ``args.derive_ratios`` (one record per attack, A1/A2/A3)."""
    out = []
    for ratio in args.derive_ratios:
        benign = ~attacks.malicious_clients(fed.num_clients, ratio, args.seed)
        row = {}
        for split in args.splits:
            counts = getattr(fed, split).counts
            for metric in ("accuracy", "loss"):
                k = f"personal/{split}/{metric}"
                row.update({f"{k}/{name}": float(v) for name, v in metrics.summarize(
                    ev[f"{k}/per_client"], counts, benign.astype(np.float32),
                    psi_weights=fed.train.counts).items()})
        out += [{**base, "attack": attack, "ratio": ratio, **row,
                 "derived_from_clean_run": True} for attack in ("A1", "A2", "A3")]
    return out


def load(seed: int, num_clients: int = 500):
    x_tr, y_tr, x_te, y_te = data.load_fashion_mnist()
    # the code's dynamic-lambda hold-out: the last 10 % of each train list
    return data.ditto_fmnist(x_tr, y_tr, x_te, y_te, val_fraction=0.1,
                             shuffle_seed=seed, num_clients=num_clients)


# The paper's Fashion-MNIST numbers (the 50 % columns): mean (std across benign
# devices) test accuracy. Table 9 has the fixed lambda = 1 row; Table 1 Ditto's
# dynamic lambda and the fair baseline TERM (t = 1). global and local are the
# same in both tables.
TABLE9 = {
    "global": {"none": "0.911 (.08)", "A1": "0.855 (.10)", "A2": "0.882 (.09)",
               "A3": "0.275 (.12)"},
    "local": {"none": "0.876 (.10)", "A1": "0.876 (.11)", "A2": "0.876 (.11)",
              "A3": "0.876 (.11)"},
    "Ditto": {"none": "0.946 (.06)", "A1": "0.935 (.07)", "A2": "0.930 (.07)",
              "A3": "0.740 (.12)"},
}
TABLE1 = {
    "global": TABLE9["global"], "local": TABLE9["local"],
    "Ditto": {"none": "0.943 (.06)", "A1": "0.937 (.07)", "A2": "0.930 (.08)",
              "A3": "0.873 (.11)"},
    "TERM": {"none": "0.909 (.07)", "A1": "0.637 (.13)", "A2": "0.637 (.14)",
             "A3": "0.131 (.16)"},
}


# the per-device lambda rules' names in the report
RULE = {"paper": "the paper's rule", "greedy_step": "the code's rule"}


def _sortable(key):
    """A report key with its missing entries (None: no TERM tilt) sortable."""
    return tuple(-1.0 if v is None else v for v in key)


def report(path: str) -> str:
    """Markdown tables of a ``--out`` file: the last evaluation of each run,
    averaged over seeds (mean +- std across seeds; the std across benign
    devices, the paper's fairness measure, is averaged over seeds), beside the
    paper's Table 9 (lambda = 1) and Table 1 (dynamic lambda); then the benign
    clients' accuracy by how many rounds they took part in, per seed."""
    last, groups = {}, {}
    for r in read_jsonl(path):
        key = (r["run"], r["attack"], r["ratio"], r["lam_selection"], r["lam"],
               r.get("term_t"), r["seed"])
        if "by_participation" in r:
            groups[key] = (r["round"], r["by_participation"],
                           r.get("stopped_early", False))
        elif key not in last or r["round"] >= last[key]["round"]:
            last[key] = r
    runs = {}
    for key, r in sorted(last.items(), key=lambda kv: _sortable(kv[0])):
        runs.setdefault(key[:-1], []).append(r)
    lines = ["| setting | model | seeds | rounds | benign mean acc | std across "
             "devices | worst 10 % | paper, Table 9 (lambda = 1) | paper, Table 1 "
             "(dynamic lambda) |", "|---|---|---|---|---|---|---|---|---|"]
    for (run, attack, ratio, sel, lam, t), rs in runs.items():
        setting = "clean" if attack == "none" else f"{attack} {ratio:.0%}"
        stops = [groups.get((run, attack, ratio, sel, lam, t, r["seed"]),
                            (0, 0, False))[2] for r in rs]
        rounds = ", ".join(f"{r['round']}{' (plateau)' if st else ''}"
                           for r, st in zip(rs, stops))
        for view in VIEWS[run]:
            k = f"{view}/test/accuracy"
            name = (f"TERM (t={t:g})" if run == "term" else
                    "global (FedAvg)" if view == "global" else
                    ("local" if run != "ditto" else f"Ditto (fixed, lambda={lam:g})"
                     if sel == "fixed" else f"Ditto (dynamic lambda, {RULE[sel]})"))
            if any(r.get("derived_from_clean_run") for r in rs):
                name = "local (the clean run's models, benign devices)"
            row = ("TERM" if run == "term" else "global" if view == "global"
                   else "Ditto" if run == "ditto" else "local")
            paper9 = TABLE9.get(row, {}).get(attack, "")
            paper1 = TABLE1[row].get(attack, "")
            lines.append(
                f"| {setting} | {name} | {len(rs)} | {rounds} | "
                f"{across_seeds([r[k + '/mean'] for r in rs])} | "
                f"{np.mean([r[k + '/std'] for r in rs]):.3f} | "
                f"{across_seeds([r[k + '/worst10'] for r in rs])} | "
                f"{paper9 if ratio in (0, 0.5) else ''} | "
                f"{paper1 if ratio in (0, 0.5) else ''} |")
    if groups:
        lines += ["", "| setting | run | seed | rounds | took part in (rounds) | "
                  "benign clients | global mean acc | personal mean acc |",
                  "|---|---|---|---|---|---|---|---|"]
        for (run, attack, ratio, _, _, _, seed), (rounds, rows, _) in sorted(
                groups.items(), key=lambda kv: _sortable(kv[0])):
            setting = "clean" if attack == "none" else f"{attack} {ratio:.0%}"
            for g in (g for g in rows if g["clients"]):
                acc = {v: "" if g.get(v) is None else f"{g[v]:.3f}"
                       for v in ("global", "personal")}
                lines.append(f"| {setting} | {run} | {seed} | {rounds} | "
                             f"{g['min_rounds']}-{g['max_rounds']} | {g['clients']} | "
                             f"{acc['global']} | {acc['personal']} |")
    return "\n".join(lines)


def _history_paths(ckdir, history_dir, run) -> tuple[str | None, str | None]:
    """Where a run's evaluations go as they come, and the file beside them that
    names the machine, commit, date and configuration of the process that last
    started the run: history.jsonl and meta.json in the run's checkpoint
    folder ``ckdir``, else DIR/<run>.jsonl and DIR/<run>.meta.json under
    --history-dir, else none."""
    if ckdir:
        return os.path.join(ckdir, "history.jsonl"), os.path.join(ckdir, "meta.json")
    if history_dir:
        return (os.path.join(history_dir, f"{run}.jsonl"),
                os.path.join(history_dir, f"{run}.meta.json"))
    return None, None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attack", default="none", choices=attacks.ATTACKS)
    p.add_argument("--ratio", type=float, default=0.0)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--runs", nargs="+", default=["ditto"],
                   choices=["ditto", "local", "term"])
    p.add_argument("--term-t", type=float, default=1.0,
                   help="TERM's tilt (--runs term; Table 1: t = 1)")
    p.add_argument("--lam", type=float, default=1.0)
    p.add_argument("--lam-selection", default="paper",
                   choices=["fixed", "paper", "greedy_step"])
    p.add_argument("--strategy", default=None, help="vmap or map (default: engine's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-clients", type=int, default=500,
                   help="the paper's 500 (fewer only for smoke runs)")
    p.add_argument("--splits", nargs="+", default=["test"],
                   choices=["train", "val", "test"],
                   help="splits evaluated every --eval-every rounds (the plateau "
                        "rule needs val)")
    p.add_argument("--plateau-patience", type=int, default=0,
                   help="stop once the benign clients' mean validation accuracy of "
                        "every view has not risen by more than --plateau-delta for "
                        "this many rounds (0: run all --rounds)")
    p.add_argument("--plateau-delta", type=float, default=0.002)
    p.add_argument("--derive-ratios", nargs="*", type=float, default=[0.5],
                   help="for a clean local run: also write the A1/A2/A3 columns at "
                        "these malicious ratios (the benign clients' accuracies of "
                        "the same local models)")
    add_checkpoint_args(p, "<run> (the history as it grows in DIR/<run>/history.jsonl)")
    p.add_argument("--history-dir", default=None,
                   help="without --checkpoint-dir: append each run's evaluations to "
                        "DIR/<run>.jsonl as they come, beside DIR/<run>.meta.json "
                        "(the run's machine, commit, date and configuration; a run "
                        "stopped before its end leaves its trajectory there, not in "
                        "--out)")
    p.add_argument("--snapshot", action="store_true",
                   help="with --checkpoint-dir or --history-dir: write the "
                        "evaluations that an unfinished run has made so far to --out "
                        "as records marked in_progress, without training (with the "
                        "machine, commit and date of the process that last started "
                        "the run, where its meta file is there)")
    args = parse_or_report(p, argv, report)
    if args is None:
        return []
    if args.history_dir and args.checkpoint_dir:
        p.error("--history-dir: the history goes to --checkpoint-dir's folders "
                "when that is given; give one of the two")
    if args.snapshot and not (args.checkpoint_dir or args.history_dir):
        p.error("--snapshot: needs --checkpoint-dir or --history-dir (the run's "
                "history is there)")
    if args.plateau_patience and "val" not in args.splits:
        p.error("--plateau-patience needs --splits to include val")
    if not all(0 < r < 1 for r in args.derive_ratios):
        p.error(f"--derive-ratios: each must lie in (0, 1), got {args.derive_ratios}")

    fed = load(args.seed, args.num_clients)
    fed, threat = attacks.setup_attack(fed, args.attack, args.ratio, seed=args.seed,
                                       num_classes=10)
    strong = args.attack == "A3" or args.ratio > 0.5
    model = models.ditto_fmnist_cnn()
    engine = EngineConfig(args.strategy)
    common = dict(client_lr=0.05, num_local_steps=2, batch_size=16, cohort_size=10,
                  cohort="size_weighted", weighted=False, attack=threat.update_attack,
                  malicious=threat.malicious)
    meta, records = _meta(), []
    algs = {
        "ditto": algorithms.ditto(model, lam=args.lam, lam_selection=args.lam_selection,
                                  strong_attack=strong, **common),
        "local": algorithms.local_only(model, **{
            k: v for k, v in common.items()
            if k not in ("weighted", "attack", "malicious")}),
        "term": algorithms.fedavg(model, aggregator=aggregators.tilted_mean(
            args.term_t), **common),
    }
    print(f"FMNIST: {fed.num_clients} clients, {fed.train.num_examples} train / "
          f"{fed.val.num_examples} val / {fed.test.num_examples} test rows; attack "
          f"{args.attack} {args.ratio:.0%} ({int(threat.malicious.sum())} malicious)")
    for run in args.runs:
        views = VIEWS[run]
        stop = None
        if args.plateau_patience:
            stop = Plateau(tuple(f"{v}/val/accuracy/mean" for v in views),
                           patience=args.plateau_patience, min_delta=args.plateau_delta)
        ckdir = args.checkpoint_dir and os.path.join(args.checkpoint_dir, run)
        tag = {"run": run, "attack": args.attack, "ratio": args.ratio,
               **({"term_t": args.term_t} if run == "term" else {}),
               "lam_selection": args.lam_selection if run == "ditto" else "fixed",
               "lam": args.lam if run == "ditto" else 0.0, "seed": args.seed,
               "config": {**{k: v for k, v in vars(args).items() if k != "snapshot"},
                          "model": "ditto_fmnist_cnn", **{
                   k: v for k, v in common.items() if k not in ("attack", "malicious")},
                   "strong_attack": strong, "plateau": stop and stop._asdict()}}
        history, meta_path = _history_paths(ckdir, args.history_dir, run)
        if args.snapshot:
            if not os.path.exists(history):
                print(f"{run}: no history at {history}")
                continue
            rows = read_jsonl(history)
            made = {**meta, **tag}
            if os.path.exists(meta_path):  # the run's own machine, commit and date
                with open(meta_path) as fh:
                    made = json.load(fh)
            recs = [{**made, "in_progress": True, **row} for row in rows]
            write_jsonl(args.out, recs)
            records += recs
            print(f"{run}: {len(rows)} evaluations to round {rows[-1]['round']}, "
                  "in progress")
            continue
        if history:
            os.makedirs(os.path.dirname(meta_path), exist_ok=True)
            with open(meta_path, "w") as fh:
                json.dump({**meta, **tag}, fh)
        t0 = time.perf_counter()
        res = simulate(algs[run], fed, num_rounds=args.rounds,
                       eval_every=args.eval_every, key=jax.random.key(args.seed),
                       eval_mask=threat.benign, splits=tuple(args.splits),
                       progress=True, engine=engine, stop_when=stop,
                       checkpoint_dir=ckdir, checkpoint_every=args.checkpoint_every,
                       resume=args.resume, jsonl_path=history)
        wall = time.perf_counter() - t0
        rounds = res.history[-1]["round"]
        derive = run == "local" and args.attack == "none"
        key = jax.random.key(args.seed)
        # the participation table needs test; the derived columns every split
        ev = per_client_eval(algs[run], res.state, fed, key, tuple(dict.fromkeys(
            ["test", *(args.splits if derive else ())])), engine)
        groups = by_participation(ev, run_participation(fed, key, 10, rounds),
                                  threat.benign)
        for g in (g for g in groups if g['clients']):
            print(f"  took part in {g['min_rounds']}-{g['max_rounds']} rounds: "
                  f"{g['clients']} benign clients, mean acc " + ", ".join(
                      f"{v} {g[v]:.3f}" for v in ("global", "personal")
                      if g.get(v) is not None))
        # one record per evaluation (wall_s: this process's seconds, which on a
        # resumed run cover only the rounds after resumed_from), then the
        # participation table
        recs = [{**meta, **tag, "wall_s": wall, **row} for row in res.history]
        recs.append({**meta, **tag, "round": rounds, "wall_s": wall,
                     "resumed_from": res.resumed_from,
                     "stopped_early": res.stopped_early, "by_participation": groups})
        if derive:
            recs += derived_columns(ev, fed, args,
                                    {**meta, **tag, "wall_s": wall, "round": rounds})
        write_jsonl(args.out, recs)
        records += recs
        last = res.history[-1]
        for view in views:
            k = f"{view}/test/accuracy"
            print(f"{run:>6} {view:>9}: mean {last[f'{k}/mean']:.4f} "
                  f"std {last[f'{k}/std']:.4f} worst10 {last[f'{k}/worst10']:.4f}")
        print(f"{run}: {rounds} rounds"
              f"{' (plateau)' if res.stopped_early else ''} in {wall:.0f} s")
    return records


if __name__ == "__main__":
    main()
