"""The Ditto paper's Table 2 (personalization baselines) on FEMNIST, CPU scale.

Li et al., "Ditto", ICML 2021, Table 2: benign devices' mean test accuracy (std
across benign devices) of global (FedAvg), local, plain finetuning, L2SGD, EWC,
SKL, Per-FedAvg (HF), mapper, APFL and Ditto, clean and under A1 (label
poisoning) with 50 % malicious devices. Data: the 300-writer LEAF FEMNIST subset
in ``$FEDJAX_PFL_DATA_DIR/femnist_leaf`` (the paper's own 205-writer sample is
not available). Every method shares the Ditto code's harness: size-weighted
sampling of ``--cohort-size`` clients, an unweighted mean of the updates, lr
0.1 and batch 32 (the paper's FEMNIST values), ``--local-steps`` local
iterations. One Ditto run gives ``global`` (its global trajectory is exactly
FedAvg's), Ditto's ``personal`` models, and, from the same final ``w*``, plain
finetuning, EWC and SKL (their training IS FedAvg's; they differ only in the
finetuning at evaluation, several penalty strengths each). Scale reductions and
substitutions are listed in docs/results/baselines.md. Writes JSON lines.

    FEDJAX_PFL_DATA_DIR=/path/to/data python benchmarks/ditto_table2.py \
        --attack none --rounds 300 --out docs/results/baselines_table2.jsonl

Long runs: ``--checkpoint-dir DIR --checkpoint-every N --resume`` checkpoints
each method's rounds in ``DIR/<method>`` (with a hyperparameter other than the
default: ``DIR/ditto_lam<lam>``, ``DIR/apfl_alpha0=0.01_adaptive`` etc.; a
checkpoint cannot tell configurations apart) and, on a rerun, skips the rows
``--out`` already holds for the same settings (each finetuning row is written
as soon as it is evaluated).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time

import jax
import numpy as np

from fedjax_pfl import algorithms, attacks, data, metrics, models
from fedjax_pfl.core import AlgorithmState, EngineConfig, execution, simulate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ditto_fmnist import by_participation, run_participation
from throughput import (
    _meta,
    across_seeds,
    add_checkpoint_args,
    parse_or_report,
    read_jsonl,
    write_jsonl,
)

METHODS = ("ditto", "local", "l2sgd", "per_fedavg", "mapper", "apfl")
ROWS = ("global", "local", "plain finetuning", "L2SGD", "EWC", "SKL",
        "Per-FedAvg (HF)", "mapper", "APFL", "Ditto")
# rows recorded beside a method's, to explain it; listed under "every
# configuration run", not in the main table
DIAGNOSTIC = {"mapper": (("mapper: its global model", "global", None),
                         ("mapper: the interpolation, not finetuned", "interpolated",
                          None))}
PAPER = {  # Table 2, FEMNIST columns: (clean, A1 50 %)
    "global": ("0.804 (.11)", "0.727 (.12)"), "local": ("0.628 (.15)", "0.627 (.14)"),
    "plain finetuning": ("0.815 (.09)", "0.734 (.12)"),
    "L2SGD": ("0.817 (.10)", "0.732 (.15)"), "EWC": ("0.810 (.11)", "0.756 (.12)"),
    "SKL": ("0.820 (.10)", "0.752 (.12)"),
    "Per-FedAvg (HF)": ("0.827 (.09)", "0.604 (.14)"),
    "mapper": ("0.792 (.12)", "0.726 (.13)"), "APFL": ("0.811 (.11)", "0.750 (.11)"),
    "Ditto": ("0.836 (.10)", "0.767 (.10)"),
}


def make_model(name: str):
    if name == "cnn":
        return models.ditto_femnist_cnn()
    return models.mlp((784,), 62, hidden=(200, 200))


def class_shares(fed) -> dict:
    """Each split's shares of digits, upper and lower case letters (labels
    0-9, 10-35, 36-61): how representative the validation rows are."""
    out = {}
    for name, split in fed.splits().items():
        y = np.asarray(split.y)
        out[name] = [round(float(np.mean(m)), 4)
                     for m in (y < 10, (y >= 10) & (y < 36), y >= 36)]
    return out


def _setting(rec) -> str:
    """The record's column: ``clean`` or e.g. ``A1 50%``."""
    return "clean" if rec["attack"] == "none" else f"{rec['attack']} {rec['ratio']:.0%}"


def _group_acc(group):
    """The accuracy of a ``by_participation`` group of one row (each row's
    groups carry its one model view, e.g. ``global`` or ``personal``, beside
    the group's bounds and size)."""
    (acc,) = [v for k, v in group.items()
              if k not in ("min_rounds", "max_rounds", "clients")]
    return acc


def summary(ev, view):
    """Benign test accuracy (mean, std across devices, worst 10 %), and the
    validation mean the hyperparameters are chosen on when a val split exists."""
    k = f"{view}/test/accuracy"
    out = {"mean": float(ev[f"{k}/mean"]), "std": float(ev[f"{k}/std"]),
           "worst10": float(ev[f"{k}/worst10"])}
    if f"{view}/val/accuracy/mean" in ev:
        out["val_mean"] = float(ev[f"{view}/val/accuracy/mean"])
    return out


def took_part(ev, view, fed, benign, counts) -> dict:
    """Test accuracy of the benign writers that took part in at least one
    round (``counts > 0``): the summary without the writers whose personal
    model never trained."""
    mask = (np.asarray(benign) > 0) & (counts > 0)
    s = metrics.summarize(ev[f"{view}/test/accuracy/per_client"], fed.test.counts,
                          mask.astype(np.float32))
    return {"writers": int(mask.sum()), **{k: float(s[k]) for k in
                                           ("mean", "std", "worst10")}}


def mixing_weights(state, benign) -> dict:
    """APFL's final mixing weights ``alpha_k`` for the benign and the
    malicious writers: how many sit at exactly 0 (the personal model is then
    the global model), the median and the 90th percentile."""
    alpha, good = np.asarray(state.clients.alpha), np.asarray(benign) > 0
    return {name: {"writers": int(m.sum()), "zero": int((alpha[m] == 0).sum()),
                   "median": float(np.median(alpha[m])),
                   "q90": float(np.quantile(alpha[m], 0.9))}
            for name, m in (("benign", good), ("malicious", ~good)) if m.any()}


def splits_of(fed):
    return ("val", "test") if fed.val is not None else ("test",)


def ditto_run(lam: float) -> str:
    """The name of Ditto's run with ``lam``, and its checkpoint folder in
    ``--checkpoint-dir``: ``ditto`` for the default lambda = 1 (every earlier
    checkpoint), ``ditto_lam<lam>`` for the others."""
    return "ditto" if lam == 1.0 else f"ditto_lam{lam:g}"


def run_folder(run: str, config: str | None, defaults: dict) -> str:
    """The checkpoint folder of ``run`` trained with the hyperparameter
    labelled ``config``: the run's name for its default (``defaults``), else
    the name and the label. A checkpoint's fingerprint cannot see
    hyperparameters, so each configuration needs its own folder (Ditto's
    lambdas have theirs through :func:`ditto_run`)."""
    if run not in defaults or config == defaults[run]:
        return run
    return f"{run}_" + re.sub(r"[^0-9A-Za-z.=]+", "_", config)


def finetune_configs(args):
    """The (row, lambda) pairs evaluated from ``w*``: plain finetuning, then
    every lambda of ``--ewc-lams`` and ``--skl-lams``."""
    return ([("plain finetuning", 0.0)] + [("EWC", lam) for lam in args.ewc_lams]
            + [("SKL", lam) for lam in args.skl_lams])


def finetune_label(lam, args) -> str:
    """A finetuning row's hyperparameter label; the length is named only when
    it is not the default ``--finetune-steps`` (so epoch runs never share a
    label with step runs)."""
    length = (f", {args.finetune_epochs:g} epochs" if args.finetune_epochs
              else "")
    return f"lam={lam:g}{length}"


def finetune_rows(model, state, fed, key, benign, common, args, engine, configs):
    """Plain finetuning, EWC and SKL from the final ``w*`` of the Ditto run, one
    row per ``(row, lambda)`` of ``configs``, evaluated under ``engine``: yields
    each row as soon as it is evaluated."""
    ft = dict(finetune_steps=args.finetune_steps,
              finetune_epochs=args.finetune_epochs, weighted=False)
    stateless = AlgorithmState(state.server, (), state.round)
    make = {"plain finetuning": algorithms.ewc, "EWC": algorithms.ewc,
            "SKL": algorithms.skl}
    for row, lam in configs:
        alg = make[row](model, lam=lam, **common, **ft)
        t0 = time.perf_counter()
        with execution(engine):
            ev = jax.jit(lambda s, d, alg=alg: metrics.evaluate(
                {"personal": alg.eval_models(s, d, key)["personal"]}, d,
                splits=splits_of(d), mask=benign))(stateless, fed)
        yield {"row": row, "config": finetune_label(lam, args),
               **summary(ev, "personal"), "eval_wall_s": time.perf_counter() - t0}


SAME_RUN = ("benchmark", "attack", "ratio", "rounds", "model", "clients",
            "cohort_size", "local_steps", "finetune_steps", "finetune_epochs",
            "input", "val_fraction", "val_split", "seed")


def val_split_of(rec) -> str:
    """A record's validation rows: records written before ``val_split``
    existed held out each writer's tail."""
    return rec.get("val_split", "tail")


def recorded(path, tag) -> set:
    """The ``(row, config)`` pairs that ``path`` already holds for a run with
    ``tag``'s settings (what ``--resume`` skips)."""
    if not path or not os.path.exists(path):
        return set()
    recs = read_jsonl(path)
    return {(r["row"], r.get("config")) for r in recs
            if all((val_split_of(r) if k == "val_split" else r.get(k)) == tag.get(k)
                   for k in SAME_RUN)}


def _config(r) -> str:
    """The record's hyperparameter label (records written before ``config``
    existed carry a bare ``lam``)."""
    if "config" in r:
        return r["config"] or "-"
    lam = r.get("lam")
    if lam is None:
        return "-"
    name = {"Per-FedAvg (HF)": "beta", "APFL": "alpha"}.get(r["row"], "lam")
    return f"{name}={lam:g}" + (" fixed" if r["row"] == "APFL" else "")


def _fmt(runs):
    """Test accuracy across seeds, then the std across devices averaged over
    seeds: ``mean (.dd)`` or ``mean +- std (.dd)``."""
    dev = np.mean([r["std"] for r in runs])
    return f"{across_seeds([r['mean'] for r in runs])} ({dev:.2f})"


def report(path: str) -> str:
    """Markdown table: each method at its best configuration, next to the
    paper's numbers. The configuration is chosen by the benign devices' mean
    VALIDATION accuracy (averaged over seeds) when the records have it; records
    without a val split (older runs) are chosen on test and say so."""
    recs = read_jsonl(path)
    splits = sorted({val_split_of(r) for r in recs if r.get("val_fraction")})
    if len(splits) > 1:
        raise ValueError(f"{path}: records with different validation rows "
                         f"({', '.join(splits)}); report them from separate files")
    runs, rounds = {}, {}
    for r in recs:  # one record per seed: a row written twice counts once
        runs.setdefault((r["row"], r["attack"], _config(r)), {})[r["seed"]] = r
        rounds[r["attack"]] = r["rounds"]
    runs = {k: list(by_seed.values()) for k, by_seed in runs.items()}
    best = {}
    for (row, attack, cfg), rs in runs.items():
        on = "val_mean" if all("val_mean" in r for r in rs) else "mean"
        score = (on == "val_mean", float(np.mean([r[on] for r in rs])))
        if (row, attack) not in best or score > best[(row, attack)][0]:
            best[(row, attack)] = (score, cfg, rs)
    header = ("| method | clean: ours | clean: paper | A1 50 %: ours | A1 50 %: paper "
              "| chosen hyperparameter (clean / A1) | seeds |")
    lines = [header, "|---|---|---|---|---|---|---|"]
    for row in ROWS:
        cells, hps, seeds = [], [], []
        for i, attack in enumerate(("none", "A1")):
            b = best.get((row, attack))
            cells += ["" if b is None else _fmt(b[2]), PAPER[row][i]]
            hps.append("" if b is None else b[1] + (
                "" if b[0][0] else " (on test)"))
            seeds.append("" if b is None else str(len(b[2])))
        lines.append(f"| {row} | " + " | ".join(cells) + f" | {' / '.join(hps)} | "
                     f"{' / '.join(seeds)} |")
    lines.append("")
    lines.append("Rounds: " + ", ".join(f"{a}: {n}" for a, n in sorted(rounds.items())))
    intro = ("Every configuration run (benign devices: validation mean where a val "
             "split exists; test: sample-weighted mean, std across devices, mean "
             "of the worst 10 %; +- across seeds):")
    lines += ["", intro, "",
              "| setting | method | hyperparameter | seeds | val mean | test mean | "
              "std | worst 10 % |", "|---|---|---|---|---|---|---|---|"]
    order = {row: i for i, row in enumerate(
        ROWS + tuple(d[0] for rows in DIAGNOSTIC.values() for d in rows))}
    for (row, attack, cfg), rs in sorted(
            runs.items(), key=lambda kv: (kv[0][1] != "none", order[kv[0][0]],
                                          kv[0][2])):
        r0 = rs[0]
        setting = _setting(r0)
        val = across_seeds([r["val_mean"] for r in rs]) if "val_mean" in r0 else ""
        worst = np.mean([r["worst10"] for r in rs])
        dev = np.mean([r["std"] for r in rs])
        lines.append(f"| {setting} | {row} | {cfg} | {len(rs)} | {val} | "
                     f"{across_seeds([r['mean'] for r in rs])} | {dev:.3f} | "
                     f"{worst:.3f} |")
    took = [r for r in recs if "took_part" in r]
    if took:
        lines += ["", ("Benign writers that took part in at least one round (test: "
                       "sample-weighted mean, std across writers, worst 10 %):"), "",
                  ("| setting | method | hyperparameter | seed | writers | test mean | "
                   "std | worst 10 % |"), "|---|---|---|---|---|---|---|---|"]
        for r in took:
            t = r["took_part"]
            lines.append(f"| {_setting(r)} | {r['row']} | {_config(r)} | {r['seed']} | "
                         f"{t['writers']} | {t['mean']:.3f} | {t['std']:.3f} | "
                         f"{t['worst10']:.3f} |")
    part = [(r, g) for r in recs for g in r.get("by_participation", ())
            if _group_acc(g) is not None]
    if part:
        lines += ["", ("Benign writers' test accuracy by the rounds they took part "
                       "in (unweighted mean over writers; per seed):"), "",
                  ("| setting | method | hyperparameter | seed | took part in (rounds) "
                   "| writers | test accuracy |"), "|---|---|---|---|---|---|---|"]
        for r, g in part:
            lines.append(f"| {_setting(r)} | {r['row']} | {_config(r)} | {r['seed']} | "
                         f"{g['min_rounds']}-{g['max_rounds']} | {g['clients']} | "
                         f"{_group_acc(g):.3f} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--attack", default="none", choices=("none", "A1"))
    p.add_argument("--ratio", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    p.add_argument("--num-clients", type=int, default=None,
                   help="first N writers (default: all 300)")
    p.add_argument("--cohort-size", type=int, default=10)
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--finetune-steps", type=int, default=50)
    p.add_argument("--finetune-epochs", type=float, default=None,
                   help="finetune plain/EWC/SKL for this many epochs per writer "
                   "(ceil(E n_k / 32) steps; the paper's 50) instead of "
                   "--finetune-steps")
    p.add_argument("--lam", type=float, nargs="+", default=[1.0],
                   help="Ditto's lambda; several values train one Ditto run each "
                        "(the paper's best lambda: the report picks one on "
                        "validation); the global model and w* come from the first")
    p.add_argument("--l2sgd-lam", type=float, default=1.0)
    p.add_argument("--ewc-lams", type=float, nargs="+", default=[10.0, 100.0])
    p.add_argument("--skl-lams", type=float, nargs="+", default=[0.1, 1.0])
    p.add_argument("--skip-finetune", action="store_true",
                   help="no plain finetuning / EWC / SKL rows (e.g. a Ditto lambda "
                        "sweep, or re-evaluating a finished run's checkpoint)")
    p.add_argument("--apfl-alpha", type=float, default=0.5)
    p.add_argument("--apfl-adaptive", action="store_true",
                   help="adapt alpha per client from --apfl-alpha (the paper); "
                   "default: fixed (the Ditto code)")
    p.add_argument("--pfa-beta", type=float, default=0.01)
    p.add_argument("--strategy", default=None, help="vmap or map (default: engine's)")
    p.add_argument("--input", default="inverted", choices=("inverted", "raw"),
                   help="pixels as 1 - LEAF's value (default; local SGD at lr 0.1 "
                   "does not learn from the raw ~0.96-mean inputs with the MLP) or raw")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="share of each writer's train rows held out to choose "
                   "hyperparameters on (--val-split); 0: none (then chosen on test)")
    p.add_argument("--val-split", choices=data.VAL_SPLITS, default="random",
                   help="which rows of each writer's train list are held out: "
                   "random (the paper's split, drawn with --seed) or tail (the "
                   "Ditto code's last rows; LEAF lists writers' samples in class "
                   "blocks, so the tail is not representative)")
    p.add_argument("--seed", type=int, default=0)
    add_checkpoint_args(p, "<method>; with --resume the rows already in --out "
                        "for these settings are skipped")
    args = parse_or_report(p, argv, report)
    if args is None:
        return []
    if args.finetune_epochs is not None and args.finetune_epochs <= 0:
        p.error(f"--finetune-epochs: must be > 0, got {args.finetune_epochs}")
    if len(set(args.lam)) != len(args.lam) or min(args.lam) < 0:
        p.error(f"--lam: distinct values >= 0, got {args.lam}")
    if args.checkpoint_every and args.checkpoint_every > args.rounds:
        p.error(f"--checkpoint-every: at most --rounds ({args.rounds}), got "
                f"{args.checkpoint_every}")

    fed = data.load_femnist(max_writers=args.num_clients,
                            flatten=args.model == "mlp", val_fraction=args.val_fraction,
                            val_split=args.val_split, val_seed=args.seed)
    if args.input == "inverted":  # ink 1, background 0 (LEAF stores 1 - ink)
        fed = dataclasses.replace(fed, **{
            k: dataclasses.replace(s, x=1.0 - s.x) for k, s in fed.splits().items()})
    shares = class_shares(fed)  # before the attack poisons any label
    ratio = args.ratio if args.attack != "none" else 0.0
    fed, threat = attacks.setup_attack(fed, args.attack, ratio, seed=args.seed,
                                       num_classes=62)
    benign = threat.benign
    model = make_model(args.model)
    common = dict(client_lr=0.1, num_local_steps=args.local_steps, batch_size=32,
                  cohort_size=args.cohort_size, cohort="size_weighted",
                  attack=threat.update_attack, malicious=threat.malicious)
    no_attack = {k: v for k, v in common.items() if k not in ("attack", "malicious")}
    ft = dict(finetune_steps=args.finetune_steps)
    engine = EngineConfig(args.strategy)
    # the methods that finetune at evaluation (Per-FedAvg, mapper; EWC, SKL in
    # finetune_rows) run with unroll=1: their local and finetuning loops are
    # compiled as loops, not unrolled
    ft_engine = EngineConfig(args.strategy, unroll=1)
    engines = {"per_fedavg": ft_engine, "mapper": ft_engine}
    algs = {  # weighted=False: the Ditto code's unweighted mean (L2SGD's only one)
        **{ditto_run(lam): algorithms.ditto(model, lam=lam, weighted=False, **common)
           for lam in args.lam},
        "local": algorithms.local_only(model, **{k: v for k, v in no_attack.items()}),
        "l2sgd": algorithms.l2sgd(model, lam=args.l2sgd_lam, **common),
        "per_fedavg": algorithms.per_fedavg(
            model, alpha=0.1, beta=args.pfa_beta, weighted=False,
            **{k: v for k, v in common.items() if k != "client_lr"}, **ft),
        "mapper": algorithms.mapper(model, weighted=False, **common, **ft),
        "apfl": algorithms.apfl(model, alpha=args.apfl_alpha,
                                adaptive_alpha=args.apfl_adaptive, weighted=False,
                                **common),
    }
    apfl_cfg = (f"alpha0={args.apfl_alpha:g} adaptive" if args.apfl_adaptive else
                f"alpha={args.apfl_alpha:g} fixed")
    # the hyperparameter labels of the defaults (their runs keep the plain
    # folder names of the checkpoints written before folders carried labels)
    default_cfg = {"l2sgd": f"lam={p.get_default('l2sgd_lam'):g}",
                   "per_fedavg": f"beta={p.get_default('pfa_beta'):g}",
                   "apfl": f"alpha={p.get_default('apfl_alpha'):g} fixed"}
    views = {**{ditto_run(lam): (("global", "global", None),
                                 ("Ditto", "personal", f"lam={lam:g}"))
                for lam in args.lam},
             "local": (("local", "personal", None),),
             "l2sgd": (("L2SGD", "personal", f"lam={args.l2sgd_lam:g}"),),
             "per_fedavg": (("Per-FedAvg (HF)", "personal", f"beta={args.pfa_beta:g}"),),
             # the row the table reports (the finetuned interpolation), then
             # the two models it starts from, to tell where mapper loses
             "mapper": (("mapper", "personal", None), *DIAGNOSTIC["mapper"]),
             "apfl": (("APFL", "personal", apfl_cfg),)}
    tag = {"benchmark": "ditto_table2", "attack": args.attack, "ratio": ratio,
           "rounds": args.rounds, "model": args.model, "clients": fed.num_clients,
           "cohort_size": args.cohort_size, "local_steps": args.local_steps,
           "finetune_steps": args.finetune_steps,
           "finetune_epochs": args.finetune_epochs, "input": args.input,
           "val_fraction": args.val_fraction, "val_split": args.val_split,
           "class_shares": shares, "config_args": vars(args),
           "seed": args.seed, **_meta()}
    print(f"FEMNIST: {fed.num_clients} writers, {fed.train.num_examples} train / "
          f"{fed.test.num_examples} test rows; attack {args.attack} {ratio:.0%} "
          f"({int(threat.malicious.sum())} malicious); model {args.model}")
    records = []

    def emit(rec):
        rec = {**tag, **rec}
        records.append(rec)
        done.add((rec["row"], rec.get("config")))  # global: once for all lambdas
        write_jsonl(args.out, [rec])
        print(f"  {rec['row']:>17} ({rec.get('config')}): mean {rec['mean']:.3f} "
              f"std {rec['std']:.3f}")

    done = recorded(args.out, tag) if args.resume else set()
    eval_key = jax.random.key(args.seed + 1)
    lam_runs = [ditto_run(lam) for lam in args.lam]
    runs = [r for m in args.methods for r in (lam_runs if m == "ditto" else [m])]
    # how many rounds each writer took part in: the same draws for every method
    counts = run_participation(fed, jax.random.key(args.seed), args.cohort_size,
                               args.rounds)
    for run in runs:
        todo = [(row, view, config) for row, view, config in views[run]
                if (row, config) not in done]
        # the finetuning rows start from w*, which every lambda's run shares
        ft_todo = [(row, lam) for row, lam in finetune_configs(args)
                   if run == lam_runs[0] and not args.skip_finetune
                   and (row, finetune_label(lam, args)) not in done]
        if not todo and not ft_todo:
            print(f"{run}: every row already in {args.out}")
            continue
        alg, run_engine = algs[run], engines.get(run, engine)
        method = "ditto" if run in lam_runs else run
        ckdir = args.checkpoint_dir and os.path.join(
            args.checkpoint_dir, run_folder(run, views[run][-1][2], default_cfg))
        t0 = time.perf_counter()
        # rounds exactly as a plain loop of round_step (the same keys); the
        # validation evaluations at the checkpoints are the run's trajectory,
        # except for the methods that finetune every writer at evaluation
        # (Per-FedAvg, mapper): theirs would cost more than the rounds between
        # checkpoints, so they record the training metrics only (the final
        # evaluation below is the same either way)
        res = simulate(alg, fed, num_rounds=args.rounds,
                       eval_every=args.checkpoint_every or args.rounds,
                       key=jax.random.key(args.seed), eval_mask=benign,
                       splits=() if run in engines else splits_of(fed)[:1],
                       progress=False, engine=run_engine,
                       checkpoint_dir=ckdir, checkpoint_every=args.checkpoint_every,
                       resume=args.resume,
                       jsonl_path=ckdir and os.path.join(ckdir, "history.jsonl"))
        state, train_wall = res.state, time.perf_counter() - t0
        resumed = res.resumed_from is not None
        if todo:
            wanted = {view for _, view, _ in todo}
            with execution(run_engine):
                ev = jax.jit(lambda s, d, alg=alg, wanted=wanted: metrics.evaluate(
                    {k: v for k, v in alg.eval_models(s, d, eval_key).items()
                     if k in wanted}, d, splits=splits_of(d), mask=benign,
                    per_client=True))(state, fed)
            wall = time.perf_counter() - t0
            for row, view, config in todo:
                # the benign writers' test accuracy by the rounds they took part
                # in, and over those that took part at least once
                emit({"row": row, "run": method, "config": config, **summary(ev, view),
                      "by_participation": by_participation(ev, counts, benign,
                                                           views=(view,)),
                      "took_part": took_part(ev, view, fed, benign, counts),
                      "train_loss_chunk_mean": float(res.history[-1]["train/loss"]),
                      **({"alpha": mixing_weights(state, benign)} if run == "apfl"
                         else {}),
                      "train_wall_s": train_wall, "wall_s": wall,
                      "resumed": resumed})
        if ft_todo:
            for r in finetune_rows(model, state, fed, eval_key, benign, common, args,
                                   ft_engine, ft_todo):
                emit({"run": "ditto_w_star", "train_wall_s": train_wall,
                      "resumed": resumed, **r})
        print(f"{run}: {args.rounds} rounds in {train_wall:.0f} s, + evaluation "
              f"{time.perf_counter() - t0 - train_wall:.0f} s", flush=True)
    return records


if __name__ == "__main__":
    main()
