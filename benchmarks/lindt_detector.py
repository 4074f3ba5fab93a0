"""LINDT's NFL detector against a normal federation: its operating characteristic.

The detector (LINDT, Alg. 2) counts the rounds in which ``Delta = W_div -
||noise||`` exceeds ``eps`` and flags negative federated learning once the count
passes ``r'``. Its false-alarm rate is the share of NORMAL federations (IID data,
no attackers, the same DP and participation: the paper's "normal FL") that it
flags; its detection rate the share of NFL federations (Mixed non-IID, 20 %
backdoor attackers) that it flags, and the delay the round of the flag.

This script reads the per-round detector inputs that ``benchmarks/lindt_nfl.py``
records (``per_round``: Delta, W_div, ||noise||, the aggregate's norm) for FedAvg
with the detector watching, groups the runs by environment, and reports:

* the paper's rule (``eps`` and ``r'`` of the runs): flagged runs and the round;
* the rule's operating characteristic over a grid of ``eps`` (``r'`` fixed):
  detection rate on NFL runs and false-alarm rate on normal runs;
* the same for two scale-free statistics, ``Delta / ||aggregate||`` (how far
  the clients' models sit from the new global model, in units of the global
  model's own step) and ``Delta / mean ||u_k||`` (in units of the clients' own
  steps: Delta grows with how far clients move, whether or not they disagree),
  with their thresholds swept the same way;
* a window rule: flag in the first round after ``r'`` in which the median of
  Delta over the last 50 rounds exceeds the threshold (where Delta has
  settled, not how often it was ever above the threshold).

    # the runs: FedAvg only, both environments, seeds 0-2, at the paper's noise
    # norm (the default) and at --noise-std 0.0089; with the paper's schedule
    # (--rounds 500 --eval-every 25 --lr 0.1 --lr-decay 0.992), seeds 0-1
    for s in 0 1 2; do
      python benchmarks/lindt_nfl.py --methods fedavg --rounds 200 --hidden 128 64 \\
          --seed $s --out docs/results/lindt_detector.jsonl
      python benchmarks/lindt_nfl.py --methods fedavg --rounds 200 --hidden 128 64 \\
          --scheme iid --attack-ratio 0 --seed $s \\
          --out docs/results/lindt_detector.jsonl
    done
    python benchmarks/lindt_detector.py docs/results/lindt_detector.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np


def is_nfl(r) -> bool:
    """The harmful environment: non-IID data or attackers (else normal FL)."""
    return r["scheme"] != "iid" or r["attack_ratio"] > 0


def environment(r) -> str:
    skew = (f", class sigma {r['class_sigma']:g}" if r.get("class_sigma")
            else "")
    return (f"{'NFL' if is_nfl(r) else 'normal'} ({r['scheme']}{skew}, "
            f"{100 * r['attack_ratio']:.0f} % attackers, noise std "
            f"{r['noise_std']:.3g})")


WINDOW = 50


def setting(r) -> tuple:
    """What the runs compared in one table share: model, noise, rounds, lr
    schedule and gradient bound (records from before a key existed lack it:
    the MLP, no bound)."""
    return (r.get("model") or "mlp", r["noise_std"], r["rounds"], r["lr"],
            r["lr_decay"], r.get("grad_clip") or 0.0)


def flag_round(stat, eps, r_prime) -> int | None:
    """The 1-based round in which ``count(stat > eps)`` first exceeds ``r'``."""
    count = np.cumsum(np.asarray(stat) > eps)
    hit = np.nonzero(count > r_prime)[0]
    return int(hit[0]) + 1 if hit.size else None


def window_flag_round(stat, eps, r_prime, window=WINDOW) -> int | None:
    """The first round after ``r'`` in which the median of the statistic over
    the last ``window`` rounds exceeds ``eps``: a rule that looks at where the
    statistic has settled rather than at how often it was ever above ``eps``."""
    stat = np.asarray(stat)
    for r in range(max(r_prime + 1, window), len(stat) + 1):
        if np.median(stat[r - window:r]) > eps:
            return r
    return None


def statistics(r) -> dict[str, np.ndarray]:
    """Per-round series of one run: Delta, Delta scaled two ways and, where the
    clients' step sizes are recorded (from 2026-11-28 on), the mean step and
    the cohort's alignment ``||aggregate|| / mean ||u_k||`` (1 when every
    client moves the same way, about ``1 / sqrt(K)`` for K unrelated
    directions)."""
    pr = r["per_round"]
    delta = np.asarray(pr["nfl/delta"])
    agg = np.maximum(np.asarray(pr["server/update_norm"]), 1e-12)
    out = {"Delta": delta, "Delta / ||aggregate||": delta / agg}
    if "nfl/client_update_norm" in pr:
        step = np.maximum(np.asarray(pr["nfl/client_update_norm"]), 1e-12)
        out["Delta / mean ||u_k||"] = delta / step
        out["mean ||u_k||"] = step
        out["alignment: ||aggregate|| / mean ||u_k||"] = agg / step
    return out


def settled(envs, stats) -> list[str]:
    """Each statistic's median over the last ``WINDOW`` rounds, per run
    (``stats``: ``statistics`` of each run, by ``id``)."""
    runs = [(env, r) for env, rs in sorted(envs.items()) for r in rs]
    names = list(dict.fromkeys(n for _, r in runs for n in stats[id(r)]))
    # no "|" inside a table cell
    label = [n.replace("||aggregate||", "aggregate norm").replace(
        "mean ||u_k||", "mean client step") for n in names]
    out = [f"\nMedians over the last {WINDOW} rounds, per run\n",
           "| environment | seed | " + " | ".join(label) + " |",
           "|---|---|" + "---|" * len(names)]
    for env, r in runs:
        st = stats[id(r)]
        cells = [f"{np.median(st[n][-WINDOW:]):.3g}" if n in st else "-"
                 for n in names]
        out.append(f"| {env.split(', noise std')[0]}) | {r['seed']} | "
                   + " | ".join(cells) + " |")
    return out


# (title, statistic, rule)
RULES = (("Delta, the paper's count rule", "Delta", flag_round),
         ("Delta / ||aggregate||, the count rule", "Delta / ||aggregate||",
          flag_round),
         ("Delta / mean ||u_k|| (the clients' own step), the count rule",
          "Delta / mean ||u_k||", flag_round),
         (f"Delta, window rule (median of the last {WINDOW} rounds, after r')",
          "Delta", window_flag_round))


def report(records, grid=None) -> str:
    runs = defaultdict(list)
    for r in records:
        if r.get("method") == "fedavg" and "per_round" in r:
            runs[(setting(r), environment(r))].append(r)
    if not runs:
        return "no FedAvg records with per-round detector inputs"
    out = []
    for sett in sorted({k[0] for k in runs}):
        envs = {e: rs for (n, e), rs in runs.items() if n == sett}
        model, noise, rounds, lr, decay, clip = sett
        bound = f", gradient norm bound {clip:g}" if clip else ""
        out.append(f"## {model}, noise std {noise:.3g}, {rounds} rounds, lr {lr:g} "
                   f"decaying {decay:g} a round{bound}\n")
        out.append("| environment | seeds | beta, last evals (benign) | rounds with "
                   f"Delta > eps | median Delta, last {WINDOW} rounds | flagged at "
                   "(paper's rule) |")
        out.append("|---|---|---|---|---|---|")
        for env, rs in sorted(envs.items()):
            eps, rp = rs[0]["eps"], rs[0]["r_prime"]
            flags = [flag_round(r["per_round"]["nfl/delta"], eps, rp) for r in rs]
            above = [int(np.sum(np.asarray(r["per_round"]["nfl/delta"]) > eps))
                     for r in rs]
            med = [float(np.median(r["per_round"]["nfl/delta"][-WINDOW:]))
                   for r in rs]
            out.append(
                f"| {env} | {len(rs)} | "
                + ", ".join(f"{r['beta']:+.2f}" for r in rs) + " | "
                + ", ".join(f"{a}/{len(r['per_round']['nfl/delta'])}"
                            for a, r in zip(above, rs)) + " | "
                + ", ".join(f"{m:.3g}" for m in med) + " | "
                + ", ".join(str(f) if f else "never" for f in flags) + " |")
        stats = {id(r): statistics(r) for rs in envs.values() for r in rs}
        out.extend(settled(envs, stats))
        nfl = [r for rs in envs.values() for r in rs if is_nfl(r)]
        normal = [r for rs in envs.values() for r in rs if not is_nfl(r)]
        if not (nfl and normal):
            out.append("\n(no pair of NFL and normal runs at this noise: no "
                       "operating characteristic)\n")
            continue
        rp = nfl[0]["r_prime"]
        for name, stat, rule in RULES:
            if not all(stat in stats[id(r)] for r in nfl + normal):
                continue  # a series older records lack
            vals = np.concatenate([stats[id(r)][stat] for r in nfl + normal])
            thresholds = grid or np.quantile(vals, np.linspace(0.05, 0.95, 10))
            out.append(f"\n{name}, r' = {rp}: detection (NFL runs flagged) and "
                       "false alarms (normal runs flagged) per threshold\n")
            out.append("| threshold | detection | false alarms | mean flag round "
                       "(NFL) |")
            out.append("|---|---|---|---|")
            for t in thresholds:
                fn = [rule(stats[id(r)][stat], t, rp) for r in nfl]
                fa = [rule(stats[id(r)][stat], t, rp) for r in normal]
                det = [f for f in fn if f]
                out.append(f"| {t:.4g} | {len(det)}/{len(nfl)} | "
                           f"{sum(f is not None for f in fa)}/{len(normal)} | "
                           f"{np.mean(det) if det else float('nan'):.0f} |")
        out.append("")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("jsonl", help="records of benchmarks/lindt_nfl.py")
    p.add_argument("--thresholds", type=float, nargs="+", default=None,
                   help="thresholds to sweep (default: deciles of the pooled "
                        "statistic)")
    args = p.parse_args(argv)
    with open(args.jsonl) as fh:
        records = [json.loads(line) for line in fh if line.strip()]
    text = report(records, args.thresholds)
    print(text)
    return text


if __name__ == "__main__":
    main()
