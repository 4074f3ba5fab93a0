"""LINDT's NFL setting (Lin et al., arXiv 2020, Table 3 CIFAR/NFL) at CPU scale.

The harmful environment of the paper's Table 2: non-IID
(Mixed: 50 % / 30 % / 20 % of the clients hold 10 / 5 / 2 classes, log-normal
sizes), 10 % of the clients per round, 20 % semantic-backdoor attackers (deer ->
horse, dog -> frog, 3 poisoned samples per batch of 10 in expectation, 5 local
epochs against 1), client-level DP (clip S = 15, Gaussian noise added once to
the average, Eq. 4). Reduced: real CIFAR-10 downsampled to 16x16x3 with an MLP
instead of the 940,362-parameter CNN (about 0.43 TFLOP a round; its time on a
CPU was not measured), fewer rounds, the noise std scaled so that ||noise|| equals the
paper's 0.97 (sigma = 0.9697 / sqrt(d)), r' scaled with the number of rounds.

Methods: FedAvg (``lindt(mode='off')``), FB (top-layer finetuning of that same
run's global model), TrimmedMean, LINDT and LINDT-TM (dual model all the time,
as in the paper's tables), LINDT with detection and recovery, and APFL and
FedProx (``algorithms.apfl`` / ``fedprox``: same data, same DP through
``privacy.client_level_dp``; their attackers run as many steps as benign
clients, see docs/lindt.md). beta = local accuracy - private-model accuracy,
averaged over the benign clients (the paper's tables are consistent with
benign-only averages), private models trained with
``experiments.private_accuracy``. Reported: the mean over the last ``--tail``
evaluations.

    FEDJAX_PFL_DATA_DIR=/path/to/data python benchmarks/lindt_nfl.py \\
        --out docs/results/lindt.jsonl --plot docs/results/lindt_nfl.png
    python benchmarks/lindt_nfl.py --report docs/results/lindt.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl import algorithms, experiments, metrics, models
from fedjax_pfl.experiments import _presets_lindt as _lindt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import _meta, parse_or_report, write_jsonl

METHODS = ("fedavg", "fb", "tm", "apfl", "fedprox", "lindt", "lindt_tm",
           "lindt_detect")
NAMES = {"fedavg": "FedAvg", "fb": "FB", "tm": "TrimmedMean", "apfl": "APFL",
         "fedprox": "FedProx", "lindt": "LINDT", "lindt_tm": "LINDT-TM",
         "lindt_detect": "LINDT (detect + recover)"}
# LINDT's Table 3, CIFAR / NFL columns (central, local, beta), verbatim.
PAPER = {"fedavg": (55.63, 56.19, -17.83), "fedprox": (55.20, 55.92, -18.10),
         "tm": (55.67, 56.70, -17.32), "fb": (None, 81.17, 7.15),
         "apfl": (54.90, 80.61, 6.59), "lindt": (55.73, 81.61, 7.59),
         "lindt_tm": (56.23, 82.82, 8.80), "lindt_detect": (None, None, None)}
# the detector's inputs, recorded every round (the operating characteristic is
# computed from them: benchmarks/lindt_detector.py)
SERIES = ("nfl/delta", "nfl/w_div", "nfl/noise_norm", "server/update_norm")
COLORS = dict(zip(METHODS, ("tab:red", "tab:orange", "tab:brown", "tab:purple",
                             "tab:pink", "tab:blue", "tab:cyan", "tab:green")))


def load(args):
    """(FederatedData, malicious mask, input dim)."""
    return _lindt.lindt_data(args.data, args.num_clients, args.attack_ratio,
                             args.seed, args.scheme)


def build(method, dual, args, mal, noise_std):
    return _lindt.lindt_algorithm(
        method, dual, mal, lr=args.lr, lr_decay=args.lr_decay,
        cohort_size=args.cohort_size, steps=args.steps, clip=args.clip,
        noise_std=noise_std, trim=args.trim, eps=args.eps, r_prime=args.r_prime,
        fb_steps=args.fb_steps, fb_lr=args.fb_lr)


def run_method(method, dual, fd, mal, private_acc, args, noise_std, key):
    alg = build(method, dual, args, mal, noise_std)
    benign = jnp.asarray(~mal, jnp.float32)
    step = jax.jit(alg.round_step, donate_argnums=0)

    def ev(s, d):
        views = alg.eval_models(s, d, jax.random.fold_in(key, 7))
        return {name: metrics.evaluate_split(views[name], d.test)["accuracy"]
                for name in ("global", "personal", "fb") if name in views}

    ev = jax.jit(ev)
    deployed = {"fb": "fb", "apfl": "personal", "lindt": "personal",
                "lindt_tm": "personal", "lindt_detect": "personal"}
    state = alg.init(jax.random.fold_in(key, 1), fd)
    rows, per_round, t0 = [], [], time.perf_counter()
    counts = np.asarray(fd.test.counts, np.float64)
    for r in range(1, args.rounds + 1):
        state, m = step(state, fd, key)
        per_round.append({k: float(v) for k, v in m.items()
                          if k.startswith(("nfl/", "lindt/", "server/"))})
        if r % args.eval_every == 0 or r == args.rounds:
            acc = {k: np.asarray(v) for k, v in ev(state, fd).items()}
            row = {"round": r, "central": 100 * float(np.nansum(acc["global"] * counts)
                                                     / counts.sum())}
            views = [("", deployed.get(method, "global"))] + (
                [("fb_", "fb")] if "fb" in acc else [])
            for prefix, view in views:
                for tag, mask in (("", benign), ("_all", None)):
                    g = metrics.gain_metrics(acc[view], private_acc, mask=mask)
                    row[prefix + "local" + tag] = float(g["nfl/local_acc"])
                    row[prefix + "beta" + tag] = float(g["nfl/beta"])
            row.update(per_round[-1])
            rows.append(row)
    seconds = time.perf_counter() - t0
    return rows, per_round, seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", choices=("cifar10", "synthetic"), default="cifar10")
    p.add_argument("--scheme", default="mixed")
    p.add_argument("--num-clients", type=int, default=100)
    p.add_argument("--cohort-size", type=int, default=10)
    p.add_argument("--attack-ratio", type=float, default=0.2)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 128])
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--tail", type=int, default=3, help="evaluations averaged")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--lr-decay", type=float, default=0.995)
    p.add_argument("--steps", type=int, default=50,
                   help="local steps of APFL / FedProx (no epoch option)")
    p.add_argument("--clip", type=float, default=15.0)
    p.add_argument("--noise-std", type=float, default=None,
                   help="default: 0.9697 / sqrt(d) (the paper's noise norm)")
    p.add_argument("--eps", type=float, default=0.1)
    p.add_argument("--r-prime", type=int, default=None,
                   help="default: rounds // 2 (the paper: 250 of 500)")
    p.add_argument("--trim", type=float, default=0.1)
    p.add_argument("--fb-steps", type=int, default=100)
    p.add_argument("--fb-lr", type=float, default=0.01)
    p.add_argument("--private-rounds", type=int, default=20)
    p.add_argument("--private-steps", type=int, default=50)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=None, help="write the Delta/accuracy PNG here")
    args = parse_or_report(p, argv, report)
    if args is None:
        return None
    args.r_prime = args.rounds // 2 if args.r_prime is None else args.r_prime
    key = jax.random.key(args.seed)
    t0 = time.perf_counter()
    fd, mal, dim = load(args)
    dual = algorithms.dual_mlp((dim,), 10, tuple(args.hidden))
    d = models.num_params(dual.model.init(jax.random.key(0)))
    noise_std = _lindt.lindt_noise_std(dual, args.noise_std)
    private_acc = experiments.private_accuracy(
        dual.model, fd, jax.random.fold_in(key, 99), client_lr=args.lr,
        num_local_steps=args.private_steps, batch_size=10,
        num_rounds=args.private_rounds, eval_every=max(1, args.private_rounds // 10))
    benign = ~mal
    meta = dict(_meta(), bench="lindt_nfl", data=args.data, scheme=args.scheme,
                num_clients=args.num_clients, cohort_size=args.cohort_size,
                attack_ratio=args.attack_ratio, hidden=args.hidden, params=d,
                rounds=args.rounds, lr=args.lr, lr_decay=args.lr_decay,
                clip=args.clip, noise_std=noise_std, eps=args.eps,
                r_prime=args.r_prime, tail=args.tail, seed=args.seed,
                private_acc_benign=100 * float(np.nanmean(private_acc[benign])),
                setup_s=time.perf_counter() - t0)
    print(f"d = {d}, noise std {noise_std:.3g}, private accuracy (benign) "
          f"{meta['private_acc_benign']:.2f}")
    records, curves = [], {}
    runs = [m for m in args.methods if m != "fb"]
    if "fb" in args.methods and "fedavg" not in runs:
        runs.insert(0, "fedavg")
    for method in runs:
        rows, per_round, secs = run_method(method, dual, fd, mal, private_acc, args,
                                           noise_std, key)
        curves[method] = (rows, per_round)
        outs = [(method, rows)]
        if method == "fedavg" and "fb" in args.methods:
            outs.append(("fb", rows))
        for name, rs in outs:
            tail = rs[-args.tail:]
            pre = "fb_" if name == "fb" else ""
            rec = dict(meta, method=name, seconds=secs,
                       central=float(np.mean([r["central"] for r in tail])),
                       local=float(np.mean([r[pre + "local"] for r in tail])),
                       beta=float(np.mean([r[pre + "beta"] for r in tail])),
                       beta_all=float(np.mean([r[pre + "beta_all"] for r in tail])),
                       in_nfl=metrics.nfl_verdict([r[pre + "beta"] for r in rs],
                                                  window=args.tail)["in_nfl"],
                       detect_round=int(per_round[-1].get("nfl/detect_round", -1)),
                       delta_above_eps=int(per_round[-1].get("nfl/count", 0)),
                       history=rs, per_round={
                           k: [r[k] for r in per_round] for k in SERIES
                           if k in per_round[0]})
            records.append(rec)
            print(f"{NAMES[name]:>26}: central {rec['central']:.2f} local "
                  f"{rec['local']:.2f} beta {rec['beta']:+.2f} (all clients "
                  f"{rec['beta_all']:+.2f}) detect@{rec['detect_round']} "
                  f"{secs:.0f}s", flush=True)
    write_jsonl(args.out, records)
    if args.plot:
        plot(curves, args, meta, args.plot)
    return records


def plot(curves, args, meta, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for method, (rows, per_round) in curves.items():
        if "nfl/delta" in per_round[0]:
            a1.plot(range(1, len(per_round) + 1), [r["nfl/delta"] for r in per_round],
                    lw=0.7, color=COLORS[method], label=NAMES[method])
        a2.plot([r["round"] for r in rows], [r["local"] for r in rows],
                color=COLORS[method], label=NAMES[method])
        if "fb_local" in rows[0]:
            a2.plot([r["round"] for r in rows], [r["fb_local"] for r in rows],
                    color=COLORS["fb"], label=NAMES["fb"])
    a1.axhline(args.eps, color="k", ls="--", lw=1, label=f"eps = {args.eps}")
    det = [r.get("nfl/detect_round", -1) for r in curves.get("lindt_detect", ([], [{}]))[1][-1:]]
    if det and det[0] > 0:
        for ax in (a1, a2):
            ax.axvline(det[0], color="r", ls=":", lw=1, label="NFL detected")
    a1.set(xlabel="round", ylabel="Delta = w_div - ||noise||",
           title="server-side divergence (per round)")
    a2.axhline(meta["private_acc_benign"], color="k", lw=2, alpha=0.5,
               label="private models (beta = 0)")
    a2.set(xlabel="round", ylabel="local accuracy, benign clients (%)",
           title="deployed model on each client's test split")
    for ax in (a1, a2):
        ax.legend(fontsize=7)
    what = "CIFAR-10 16x16" if args.data == "cifar10" else "synthetic"
    fig.suptitle(f"LINDT NFL setting, {what} MLP {args.hidden} (N={args.num_clients}, "
                 f"K={args.cohort_size}, {int(100 * args.attack_ratio)}% backdoor, "
                 f"DP S={args.clip:g})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def report(path) -> str:
    with open(path) as fh:
        recs = [json.loads(line) for line in fh]
    lines = [("| method | central | local | beta (benign) | beta (all) | in NFL | "
              "detected at | paper central | paper local | paper beta |"),
             "|---|" * 1 + "---|" * 9]
    for r in recs:
        pc, pl, pb = PAPER[r["method"]]

        def f(v, sign=False):
            return "-" if v is None else (f"{v:+.2f}" if sign else f"{v:.2f}")

        central = "-" if r["method"] == "fb" else f(r["central"])
        det = r["detect_round"] if r["detect_round"] > 0 else "never"
        if r["method"] in ("apfl", "fedprox"):
            det = "n/a"
        lines.append(f"| {NAMES[r['method']]} | {central} | {f(r['local'])} | "
                     f"{f(r['beta'], True)} | {f(r['beta_all'], True)} | "
                     f"{'yes' if r['in_nfl'] else 'no'} | {det} | "
                     f"{f(pc)} | {f(pl)} | {f(pb, True)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
