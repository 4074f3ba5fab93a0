"""FedFDP's Tables 1-2 setting (Ling et al.): FedAvg, SCAFFOLD, FedProx, FedDyn,
q-FFL and FedFair (non-private), their DP versions and FedFDP (private, the same
epsilon), on MNIST / Fashion-MNIST / CIFAR-10 (the model is built for the
data's images: the FedAvgCNN has 878,538 parameters on 32x32x3).

The paper's setup (Ling et al., FedFDP, arXiv 2402.16028): the official train and test
sets pooled,
pixels normalized to [-1, 1], 10 clients by Dirichlet(0.1) label skew (seed 1,
>= 10 rows each), 75/25 train/test per client, the FedAvgCNN (582,026
parameters), every client every round, one local step of lr 1 on a Poisson batch
of rate q = 0.05; private runs clip at C = 0.1 with noise multiplier 2, FedFDP
releases its loss with C_loss = 2.5, sigma_loss = 5, lam = 0.1. The baselines'
own hyperparameters are not in the paper: FedProx mu 0.001, FedDyn alpha 1,
q-FFL q 1 (ours, ``_presets.FEDFDP_BASELINES``; ``--fedprox-mu``,
``--feddyn-alpha``, ``--qffl-q`` change them; ``--server-momentum`` gives
FedAvg, FedFair, DP-FedAvg and FedFDP a server momentum); DP-q-FFL releases its
loss as FedFDP does.

CPU-scale: the paper runs T ~ 683-880 rounds at epsilon 3.52; here
``--target-epsilon`` is smaller so that FedFDP fits ``--rounds`` rounds, and
every DP baseline gets the largest T with the SAME epsilon (DP-FedAvg,
-SCAFFOLD, -FedProx and -FedDyn spend nothing on loss releases, so they run
more rounds; DP-q-FFL releases one loss a round, as FedFDP). The non-private
runs take ``--rounds`` at ``--lr-nonprivate`` 0.1 (the paper gives no lr; at
1.0 the CNN is at chance after 40 rounds and its loss NaN by round 1,000).
``--alpha`` and ``--clients`` change the partition (the paper's Tables 4-5);
``--model mlp`` is the CPU-scale model of the sweeps.
Reported: the global model's test accuracy over all test rows (sample-weighted
mean over clients) and Psi (the training-size-weighted variance of the clients'
test losses, FedFDP eq. 6), at the last round and, as ``curve``, at every
evaluation; FedFair's and FedFDP's records add ``fair_weights``, the clients'
fairness weights at every evaluation. Writes JSON lines (``--out``).

    FEDJAX_PFL_DATA_DIR=/path/to/data python benchmarks/fedfdp_tables.py \
        --datasets mnist fmnist --rounds 150 --out docs/results/fedfdp_tables.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np
import optax

from fedjax_pfl import algorithms, privacy
from fedjax_pfl.core import EngineConfig, simulate
from fedjax_pfl.experiments import _presets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fedfdp_sweeps import MODELS, add_fedfdp_options
from throughput import (  # noqa: E402
    _meta,
    add_checkpoint_args,
    parse_or_report,
    read_jsonl,
    settings_hash,
    write_jsonl,
)

# Table 1's rows (paper order), then Table 2's (the presets' FEDFDP_* tuples)
METHODS = ("fedavg", "scaffold", "fedprox", "feddyn", "qffl", "fedfair",
           "dp_fedavg", "dp_scaffold", "dp_fedprox", "dp_feddyn", "ali_dpfl",
           "dp_qffl", "fedfdp")
PRIVATE = ("dp_fedavg", "dp_scaffold", "dp_fedprox", "dp_feddyn", "ali_dpfl",
           "dp_qffl", "fedfdp")
DELTA = _presets.FEDFDP_DELTA
# Tables 1-2 of the paper, (accuracy %, Psi): mean over 5 seeds
PAPER = {
    ("mnist", "fedavg"): ("98.67", "7.3e-3"),
    ("mnist", "scaffold"): ("98.45", "3.0e-2"),
    ("mnist", "fedprox"): ("98.70", "7.5e-3"),
    ("mnist", "feddyn"): ("98.40", "8.0e-3"),
    ("mnist", "qffl"): ("98.72", "4.7e-3"),
    ("mnist", "fedfair"): ("98.75", "3.9e-3"),
    ("mnist", "dp_fedavg"): ("93.40", "1.1e11"),
    ("mnist", "dp_scaffold"): ("93.95", "7.0e10"),
    ("mnist", "dp_fedprox"): ("90.50", "5.3e10"),
    ("mnist", "dp_feddyn"): ("91.42", "5.6e10"),
    ("mnist", "ali_dpfl"): ("90.89", "3.3e10"),
    ("mnist", "dp_qffl"): ("93.74", "7.8e10"),
    ("mnist", "fedfdp"): ("95.13", "2.3e10"),
    ("fmnist", "fedavg"): ("87.05", "3.6e-1"),
    ("fmnist", "scaffold"): ("86.77", "6.1e0"),
    ("fmnist", "fedprox"): ("87.30", "3.5e-1"),
    ("fmnist", "feddyn"): ("87.48", "6.2e-1"),
    ("fmnist", "qffl"): ("87.35", "5.1e-1"),
    ("fmnist", "fedfair"): ("87.70", "2.6e-1"),
    ("fmnist", "dp_fedavg"): ("84.15", "3.0e8"),
    ("fmnist", "dp_scaffold"): ("79.41", "3.3e9"),
    ("fmnist", "dp_fedprox"): ("83.85", "7.9e8"),
    ("fmnist", "dp_feddyn"): ("84.04", "8.8e8"),
    ("fmnist", "ali_dpfl"): ("83.65", "6.6e8"),
    ("fmnist", "dp_qffl"): ("83.13", "4.2e9"),
    ("fmnist", "fedfdp"): ("85.99", "2.8e8"),
    ("cifar10", "fedavg"): ("62.03", "1.1e0"),
    ("cifar10", "scaffold"): ("62.21", "9.9e0"),
    ("cifar10", "fedprox"): ("62.13", "1.2e0"),
    ("cifar10", "feddyn"): ("62.33", "3.2e0"),
    ("cifar10", "qffl"): ("63.33", "9.4e-1"),
    ("cifar10", "fedfair"): ("62.38", "8.5e-1"),
    ("cifar10", "dp_fedavg"): ("52.61", "6.1e9"),
    ("cifar10", "dp_scaffold"): ("53.85", "6.2e9"),
    ("cifar10", "dp_fedprox"): ("51.34", "4.4e9"),
    ("cifar10", "dp_feddyn"): ("52.14", "5.5e9"),
    ("cifar10", "ali_dpfl"): ("52.05", "3.6e9"),
    ("cifar10", "dp_qffl"): ("48.46", "4.7e9"),
    ("cifar10", "fedfdp"): ("54.21", "2.6e9"),
}


def plan_rounds(args) -> tuple[float, dict[str, int]]:
    """(epsilon, rounds per method): FedFDP's epsilon after ``--rounds`` rounds
    (or ``--target-epsilon``), and each private method's largest T within it
    (ALI-DPFL: ``--ali-rounds``, its R_s)."""
    eps, plan = _presets.fedfdp_plan(args.rounds, args.q, args.sigma, args.sigma_loss,
                                     args.target_epsilon)
    return eps, {m: args.ali_rounds if m == "ali_dpfl" else plan.get(m, args.rounds)
                 for m in METHODS}


def ali_dpfl_algorithm(args, model, num_clients: int, eps: float):
    """ALI-DPFL at the tables' settings (every client every round, clip C,
    sigma, q, the private lr): R_s = ``--ali-rounds`` and R_c the most DP-SGD
    steps within ``eps`` beside R_s loss-change releases with ``--sigma-loss``
    (none with ``--ali-estimates exact``, the authors' code, not accounted)."""
    private = args.ali_estimates == "private"
    max_steps = algorithms.ali_dpfl_max_steps(
        eps, DELTA, sampling_rate=args.q, noise_multiplier=args.sigma,
        num_rounds=args.ali_rounds,
        loss_noise_multiplier=args.sigma_loss if private else None)
    return algorithms.ali_dpfl(
        model, clip=args.clip, noise_multiplier=args.sigma, sampling_rate=args.q,
        num_rounds=args.ali_rounds, max_steps=max_steps, client_lr=args.lr,
        estimates=args.ali_estimates, loss_noise_multiplier=args.sigma_loss,
        normalize=args.normalize, cohort="full", cohort_size=num_clients), max_steps


# a baseline's own hyperparameter: its record key, FEDFDP_BASELINES' name, and
# its value in the records made before the key (FedDyn's alpha was 0.01 then)
_BASELINE_KEYS = {
    **{m: key for base, key in (("fedprox", ("fedprox_mu", "mu", 0.001)),
                                ("feddyn", ("feddyn_alpha", "alpha", 0.01)),
                                ("qffl", ("qffl_q", "qffl_q", 1.0)))
       for m in (base, "dp_" + base)},
    **{m: ("server_momentum", "server_momentum", 0.0)
       for m in ("fedavg", "fedfair", "dp_fedavg", "fedfdp")}}


def _baseline_options(args, method) -> dict:
    """The record keys of ``method``'s own hyperparameter ({} for the others)."""
    key = _BASELINE_KEYS.get(method)
    return {} if key is None else {key[0]: getattr(args, key[0])}


def _tuned(r) -> tuple[tuple[str, float, float], ...]:
    """The hyperparameters the validation report chooses among, as (name,
    value, the tables' default): lambda (FedFair, FedFDP) and the method's own
    (``_BASELINE_KEYS``)."""
    out = ((("lam", r.get("lam", 0.1), 0.1),) if r["method"] in ("fedfair", "fedfdp")
           else ())
    if r["method"] in _BASELINE_KEYS:
        key, name, before = _BASELINE_KEYS[r["method"]]
        out += ((key.replace("_", " "), r.get(key, before),
                 _presets.FEDFDP_BASELINES[name]),)
    return out


def _label(tuned) -> str:
    return ", ".join(f"{k} {v:g}" for k, v, _ in tuned)


def _variant(r, tuned=True) -> str:
    """What sets a record apart from the paper's setting, as a suffix of its
    method's name (empty for the paper's CNN, lambda 0.1, C 0.1, a non-private
    lr of 0.1 and FedFDP as published); without :func:`_tuned`'s part if not
    ``tuned``."""
    out = " [MLP]" if r.get("model", "cnn") != "cnn" else ""
    if r.get("alpha", 0.1) != 0.1:
        out += f" [alpha {r['alpha']:g}]"
    if r.get("clients", 10) != 10:
        out += f" [{r['clients']} clients]"
    if r.get("val_fraction"):
        out += f" [val {r['val_fraction']:g}]"
    if tuned:
        out += "".join(f" [{k} {v:g}]" for k, v, default in _tuned(r) if v != default)
    if r["method"] not in PRIVATE and r.get("lr", 0.1) != 0.1:
        out += f" [lr {r['lr']:g}]"
    if r["method"] in PRIVATE and r.get("clip", 0.1) != 0.1:
        out += f" [C {r['clip']:g}]"
    if r.get("ali_estimates", "private") != "private":
        out += f" [{r['ali_estimates']} estimates]"
    if r.get("loss_clip_floor"):
        out += f" [loss-bound floor {r['loss_clip_floor']:g}]"
    if r.get("fair_clip", "sign_preserving") != "sign_preserving":
        out += f" [fair clip {r['fair_clip']}]"
    return out


def report(path: str) -> str:
    last = {}
    for r in read_jsonl(path):
        last[(r["dataset"], r["method"], r["seed"], r["round"],
              r.get("normalize", "realized"), _variant(r))] = r
    lines = ["| dataset | method | rounds | normaliser | epsilon (delta 1e-5) | "
             "test acc % | Psi (test loss) | paper acc % | paper Psi | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (ds, m, _, _, _, variant), r in sorted(last.items(), key=_record_order):
        private = m in PRIVATE
        # records made before 2026-11-24 carry no normaliser: the paper's |B|
        norm = r.get("normalize", "realized") if private else "-"
        eps = "-" if not private else (
            f"{r['epsilon']:.3f}, not a bound" if norm == "realized"
            and r.get("epsilon") else f"{r['epsilon']:.3f}" if r.get("epsilon")
            else "not accounted")
        pa, pp = PAPER.get((ds, m), ("", ""))
        diverged = ("" if np.isfinite(r.get("global/test/loss/mean", 0.0))
                    else " (diverged: test loss not finite)")
        lines.append(f"| {ds} | {m}{variant} | {r['round']} | {norm} | {eps} | "
                     f"{100 * r['global/test/accuracy/mean']:.2f}{diverged} | "
                     f"{r['global/test/loss/psi']:.3g} | {pa} | {pp} | "
                     f"{r['wall_s']:.0f} |")
    return "\n".join(lines + _across_seeds(last) + _chosen_on_val(last)
                     + _curves(last) + _fair_weights(last))


def _record_order(item):
    """Sort key of a ``((dataset, method, seed, rounds, normaliser, variant),
    record)`` item: dataset, the paper's method order, variant, seed, rounds,
    normaliser."""
    (ds, m, seed, rnd, norm, variant), _ = item
    return ds, METHODS.index(m), variant, seed, rnd, norm


def _per_evaluation(last, field, point, title, column, min_points=1) -> list[str]:
    """A table with one row per record that carries at least ``min_points``
    entries of ``field`` (one per evaluation), each shown as ``point(*entry)``."""
    rows = [f"| {ds} | {m}{variant} | {seed} | "
            + ", ".join(point(*e) for e in r[field]) + " |"
            for (ds, m, seed, _, _, variant), r in sorted(last.items(), key=_record_order)
            if len(r.get(field) or ()) >= min_points]
    if not rows:
        return []
    return ["", title, "", f"| dataset | method | seed | {column} |",
            "|---|---|---|---|", *rows]


def _curves(last) -> list[str]:
    """The global model's test accuracy at every evaluation of the records
    that carry a ``curve`` (records before 2026-11-29 do not), to tell a
    plateau from a run still climbing."""
    return _per_evaluation(last, "curve", lambda rnd, acc, _: f"{rnd}: {100 * acc:.2f}",
                           "Test accuracy at every evaluation (round: %):",
                           "round: test acc %", min_points=2)


def _fair_weights(last) -> list[str]:
    """FedFair's and FedFDP's fairness weights ``1 + lam (L_k - F_hat)`` at
    every evaluation (min / mean / max over clients, each averaged over the
    rounds since the previous evaluation) of the records that carry them
    (records before 2026-11-29 do not): how far lam moves the step sizes."""
    return _per_evaluation(
        last, "fair_weights",
        lambda rnd, _, lo, mean, hi: f"{rnd}: {lo:.4f} / {mean:.4f} / {hi:.4f}",
        "Fairness weights 1 + lam (L_k - F_hat) over clients (round: min / mean / "
        "max):", "round: weights")


def _setting_order(item):
    """Sort key of a ``((dataset, method, rounds, normaliser, variant), ...)``
    item: dataset, the paper's method order, variant, rounds, normaliser."""
    (ds, m, rnd, norm, variant), _ = item
    return ds, METHODS.index(m), variant, rnd, norm


def _across_seeds(last) -> list[str]:
    """A table of the settings run with several seeds: accuracy and Psi as
    mean +- std (ddof 1) over the seeds, each seed named run/partition."""
    groups = {}
    for (ds, m, seed, rnd, norm, variant), r in last.items():
        groups.setdefault((ds, m, rnd, norm, variant), {})[
            (seed, r.get("partition_seed", seed))] = r
    multi = {k: v for k, v in groups.items() if len(v) > 1}
    if not multi:
        return []
    lines = ["", "Settings run with several seeds (mean +- std over seeds):", "",
             "| dataset | method | rounds | normaliser | seeds (run/partition) | "
             "test acc % | Psi (test loss) | paper acc % |",
             "|---|---|---|---|---|---|---|---|"]
    for (ds, m, rnd, norm, variant), rs in sorted(multi.items(), key=_setting_order):
        acc = 100 * np.array([r["global/test/accuracy/mean"] for r in rs.values()])
        psi = np.array([r["global/test/loss/psi"] for r in rs.values()])
        seeds = ", ".join(f"{s}/{p}" for s, p in sorted(rs))
        lines.append(f"| {ds} | {m}{variant} | {rnd} | "
                     f"{norm if m in PRIVATE else '-'} | {seeds} | "
                     f"{acc.mean():.2f} +- {acc.std(ddof=1):.2f} | "
                     f"{psi.mean():.3g} +- {psi.std(ddof=1):.2g} | "
                     f"{PAPER.get((ds, m), ('',))[0]} |")
    return lines


def _chosen_on_val(last) -> list[str]:
    """Hyperparameters chosen on validation data: for each setting run with
    ``--val-fraction`` at two or more values of :func:`_tuned`'s hyperparameters,
    each seed's choice is the value of the highest validation accuracy; its
    test accuracy and Psi are reported (mean +- std over seeds), beside the
    best test accuracy of the grid (what choosing on test would report)."""
    groups = {}
    for (ds, m, seed, rnd, norm, _), r in last.items():
        if r.get("val_fraction") and "global/val/accuracy/mean" in r:
            groups.setdefault((ds, m, rnd, norm, _variant(r, tuned=False)), {}) \
                .setdefault(seed, []).append(r)
    rows = []
    for (ds, m, rnd, norm, variant), by_seed in sorted(groups.items(), key=_setting_order):
        by_seed = {s: rs for s, rs in by_seed.items() if len(rs) > 1}
        if not by_seed:
            continue
        grid = sorted({_tuned(r) for rs in by_seed.values() for r in rs})
        chosen = {s: max(rs, key=lambda r: r["global/val/accuracy/mean"])
                  for s, rs in sorted(by_seed.items())}
        acc = 100 * np.array([r["global/test/accuracy/mean"] for r in chosen.values()])
        psi = np.array([r["global/test/loss/psi"] for r in chosen.values()])
        best = 100 * np.array([max(r["global/test/accuracy/mean"] for r in rs)
                               for rs in by_seed.values()])
        sd = (lambda a, f: f"{a.mean():{f}} +- {a.std(ddof=1):{f}}" if len(a) > 1
              else f"{a.mean():{f}}")
        rows.append(
            f"| {ds} | {m}{variant} | {rnd} | {'; '.join(map(_label, grid))} | "
            + "; ".join(f"{s}: {_label(_tuned(r))}" for s, r in chosen.items())
            + f" | {sd(acc, '.2f')} | {sd(psi, '.3g')} | {sd(best, '.2f')} |")
    if not rows:
        return []
    return ["", ("Hyperparameters chosen on validation data (each seed's highest "
                 "validation accuracy; test reported):"), "",
            ("| dataset | method | rounds | grid | chosen (seed: value) | "
             "test acc % | Psi (test loss) | best test acc % of the grid |"),
            "|---|---|---|---|---|---|---|---|", *rows]


# options that do not change a run's rounds (they may grow on --resume) or its
# place in the output: everything else names its checkpoint folder
_NOT_IN_TAG = ("datasets", "methods", "rounds", "target_epsilon", "eval_every",
               "checkpoint_dir", "checkpoint_every", "resume", "out", "report",
               # the same numbers up to float rounding: a run may resume either way
               "batch_ladder")


def run_tag(args, method: str | None = None) -> str:
    """``<model>-<hash>``: the model and a hash of every other setting of a run
    (partition seed, alpha, clients, lambda, clip bounds, floor, ...), so two
    runs that differ in any of them never share a checkpoint folder. ALI-DPFL's
    options count for its runs only (the other runs keep their tags)."""
    cfg = {k: v for k, v in vars(args).items() if k not in _NOT_IN_TAG
           and (method == "ali_dpfl" or not k.startswith("ali_"))}
    return f"{args.model}-{settings_hash(cfg, 8)}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=["mnist"],
                   choices=["mnist", "fmnist", "cifar10"])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--rounds", type=int, default=150,
                   help="non-private rounds, and FedFDP's T (sets the epsilon)")
    p.add_argument("--target-epsilon", type=float, default=None,
                   help="the private methods' budget (default: FedFDP's epsilon "
                        "after --rounds)")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--alpha", type=float, default=0.1,
                   help="the Dirichlet partition's concentration (the paper's "
                        "Tables 1-2: 0.1; Tables 4-5 vary it)")
    p.add_argument("--q", type=float, default=0.05)
    p.add_argument("--lr", type=float, default=1.0, help="private methods' lr")
    p.add_argument("--lr-nonprivate", type=float, default=0.1,
                   help="the non-private methods' lr (the paper gives none; the CNN "
                        "diverges at 1.0, docs/results/privacy.md)")
    p.add_argument("--clip", type=float, default=0.1)
    p.add_argument("--sigma", type=float, default=2.0)
    p.add_argument("--sigma-loss", type=float, default=5.0)
    p.add_argument("--lam", type=float, default=0.1)
    p.add_argument("--model", default="cnn", choices=sorted(MODELS),
                   help="the paper's FedAvgCNN, or the sweeps' MLP (CPU-scale)")
    add_fedfdp_options(p)
    base = _presets.FEDFDP_BASELINES
    p.add_argument("--fedprox-mu", type=float, default=base["mu"],
                   help="(DP-)FedProx's mu (the paper gives none)")
    p.add_argument("--feddyn-alpha", type=float, default=base["alpha"],
                   help="(DP-)FedDyn's alpha (the paper gives none; 1 is PFLlib's "
                        "default; records made before 2026-11-28 used 0.01)")
    p.add_argument("--qffl-q", type=float, default=base["qffl_q"],
                   help="(DP-)q-FFL's q (the paper gives none)")
    p.add_argument("--ali-rounds", type=int, default=100,
                   help="ALI-DPFL's R_s, its rounds (the paper gives none); its "
                        "R_c is the most DP-SGD steps within the budget")
    p.add_argument("--ali-estimates", default="private", choices=["private", "exact"],
                   help="ALI-DPFL's loss change for Gamma: released with noise "
                        "(accounted) or exact (the authors' code; no epsilon)")
    p.add_argument("--server-momentum", type=float, default=base["server_momentum"],
                   help="the server SGD momentum of FedAvg, FedFair, DP-FedAvg and "
                        "FedFDP (0: the paper's)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--partition-seed", type=int, default=None,
                   help="the Dirichlet partition's seed (default: --seed; the "
                        "paper keeps PFLlib's partition, seed 1, across its runs)")
    p.add_argument("--strategy", default="auto",
                   choices=["auto", "unroll", "map", "vmap"],
                   help="client-parallel strategy (auto: the backend's default; the "
                        "rows in docs/results/privacy.md ran with unroll)")
    p.add_argument("--batch-ladder", default="auto", choices=["auto", "on", "off"],
                   help="steps on the smallest of a few static batch sizes that "
                        "holds the Poisson batch (EngineConfig(batch_ladder=); auto: "
                        "on for unroll and map with one client a step; the records "
                        "before 2026-11-29 16:50 UTC ran without)")
    p.add_argument("--normalize", default="expected", choices=["expected", "realized"],
                   help="DP-SGD normaliser: q n_k (accounted) or the realised batch "
                        "size (the paper's eq. 12; not accounted, no epsilon; the "
                        "rows recorded before 2026-11-24 used it)")
    p.add_argument("--val-fraction", type=float, default=0.0,
                   help="share of each client's training rows held out for "
                   "validation (not in the paper; the test rows stay the same); "
                   "the report then picks each method's hyperparameter on it")
    p.add_argument("--max-examples", type=int, default=None, help="smoke runs only")
    add_checkpoint_args(p, "<dataset>_<method>_s<seed>_<model>-<settings hash>")
    args = parse_or_report(p, argv, report)
    if args is None:
        return []
    if not args.alpha > 0:
        p.error(f"--alpha: must be > 0, got {args.alpha}")
    if not (args.fedprox_mu >= 0 and args.feddyn_alpha > 0 and args.qffl_q >= 0
            and np.isfinite([args.fedprox_mu, args.feddyn_alpha, args.qffl_q]).all()):
        p.error("--fedprox-mu, --qffl-q: must be finite and >= 0; --feddyn-alpha: "
                f"finite and > 0; got {args.fedprox_mu}, {args.qffl_q}, "
                f"{args.feddyn_alpha}")
    if not 0 <= args.server_momentum < 1:
        p.error(f"--server-momentum: must be in [0, 1), got {args.server_momentum}")
    if not 0 <= args.val_fraction < 1:
        p.error(f"--val-fraction: must be in [0, 1), got {args.val_fraction}")
    if args.ali_rounds < 1:
        p.error(f"--ali-rounds: must be at least 1, got {args.ali_rounds}")
    if args.clients < 2:
        p.error(f"--clients: must be at least 2, got {args.clients}")
    eps, rounds = plan_rounds(args)
    print(f"epsilon {eps:.3f} at delta {DELTA}; rounds: {rounds}")
    part_seed = args.seed if args.partition_seed is None else args.partition_seed
    splits = ("val", "test") if args.val_fraction > 0 else ("test",)
    records = []
    for ds in args.datasets:
        fed = _presets.fedfdp_data(ds, part_seed, args.clients, args.max_examples,
                                   args.alpha, args.val_fraction)
        model = MODELS[args.model](tuple(np.asarray(fed.train.x).shape[1:]))
        print(f"{ds}: {fed.num_clients} clients, train sizes "
              f"{np.asarray(fed.train.counts).tolist()}")
        for m in args.methods:
            t0 = time.perf_counter()
            ali = {}
            if m == "ali_dpfl":
                alg, rc = ali_dpfl_algorithm(args, model, fed.num_clients, eps)
                ali = {"ali_rounds": args.ali_rounds, "ali_max_steps": rc,
                       "ali_estimates": args.ali_estimates}
            else:
                alg = _presets.fedfdp_algorithm(
                    m, model, q=args.q,
                    lr=args.lr if m in PRIVATE else args.lr_nonprivate,
                    lam=args.lam, clip=args.clip, sigma=args.sigma,
                    sigma_loss=args.sigma_loss, num_clients=fed.num_clients,
                    normalize=args.normalize, loss_clip_floor=args.loss_clip_floor,
                    fair_clip=args.fair_clip,
                    baselines={name: getattr(args, key)
                               for key, name, _ in _BASELINE_KEYS.values()})
            mech = alg.privacy(fed) if m in PRIVATE else None
            mon = (privacy.Monitor(mech, DELTA) if mech is not None and mech.accounted
                   else None)
            ckdir = args.checkpoint_dir and os.path.join(
                args.checkpoint_dir, f"{ds}_{m}_s{args.seed}_{run_tag(args, m)}")
            res = simulate(alg, fed, num_rounds=rounds[m],
                           eval_every=min(args.eval_every, rounds[m]),
                           key=jax.random.key(args.seed), splits=splits,
                           progress=True, privacy=mon, engine=EngineConfig(
                               None if args.strategy == "auto" else args.strategy,
                               batch_ladder={"auto": None, "on": True, "off": False}[
                                   args.batch_ladder]),
                           checkpoint_dir=ckdir, checkpoint_every=args.checkpoint_every,
                           resume=args.resume)
            last = res.history[-1]
            global_view = alg.eval_models(res.state, fed.test,
                                          jax.random.key(0))["global"]
            # FedFair's and FedFDP's weights 1 + lam (L_k - F_hat): (round, F_hat,
            # min, mean, max over clients), each the mean over the rounds since
            # the previous evaluation
            fair = [[h["round"], h["server/fhat"], h["server/fair_weight_min"],
                     h["train/fair_weight"], h["server/fair_weight_max"]]
                    for h in res.history if "server/fair_weight_min" in h]
            rec = {**_meta(), "dataset": ds, "method": m, "seed": args.seed,
                   "partition_seed": part_seed, "alpha": args.alpha,
                   "val_fraction": args.val_fraction,
                   "clients": fed.num_clients,
                   "wall_s": time.perf_counter() - t0,
                   # the budget a private row ran within; none for a non-private one
                   "target_epsilon": eps if m in PRIVATE else None,
                   "epsilon": last.get("privacy/epsilon"), "q": args.q,
                   "clip": args.clip, "sigma": args.sigma, "lam": args.lam,
                   "normalize": args.normalize, "resumed": args.resume,
                   "strategy": args.strategy, "batch_ladder": args.batch_ladder,
                   "model": args.model,  # FedFDP's own options only on its rows
                   **({"loss_clip_floor": args.loss_clip_floor,
                       "fair_clip": args.fair_clip} if m == "fedfdp" else {}),
                   **_baseline_options(args, m), **ali,
                   "not_accounted": None if mech is None else mech.reason,
                   "lr": args.lr if m in PRIVATE else args.lr_nonprivate,
                   # the global model's size (DP-FedDyn's grows, docs/results/privacy.md)
                   "global/param_norm": float(optax.tree.norm(global_view.params)),
                   **{k: v for k, v in last.items()
                      if k.startswith(("global/", "round", "train/"))},
                   # every evaluation: (round, test accuracy, Psi), for plateaus
                   "curve": [[h["round"], h["global/test/accuracy/mean"],
                              h["global/test/loss/psi"]] for h in res.history
                             if "global/test/accuracy/mean" in h],
                   **({"fair_weights": fair} if fair else {}),
                   # ALI-DPFL: (round, mean steps a round, steps spent, mu, Gamma),
                   # each metric the mean over the rounds since the previous one
                   **({"ali_curve": [[h["round"], h["ali/tau"], h["ali/steps"],
                                      h["ali/mu"], h["ali/gamma"]]
                                     for h in res.history if "ali/tau" in h]}
                      if ali else {})}
            records.append(rec)
            write_jsonl(args.out, [rec])
            print(f"{ds} {m}: T={last['round']} acc "
                  f"{last['global/test/accuracy/mean']:.4f} psi "
                  f"{last['global/test/loss/psi']:.4g} eps {rec['epsilon']} "
                  f"({rec['wall_s']:.0f} s)")
    return records


if __name__ == "__main__":
    main()
