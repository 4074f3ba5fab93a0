"""Fed+'s Fig. 4 (Kundu et al., arXiv 2009.06303, §5.2) at CPU scale.

Test accuracy against rounds on FedProx's Synthetic data with the paper's
zeta = 1000 and beta = 10 (keys ``alpha`` and ``beta``; 30 parties) and
power-law MNIST (1000 parties of one digit), multinomial logistic regression,
K = 10 parties a round, batch 10, E = 20 local epochs, lr 0.01 / 0.03, 200 /
100 rounds: FedAvg, FedProx (mu 1), RFA and the coordinatewise median (their
global model) against FedAvg+, FedGeoMed+ and FedCoMed+ (sigma 0.01, lambda 0,
delta 0.001 / 0.1 / 0.1; each party's personal model). The settings are the
``fedplus-fig4`` preset's (``fedjax_pfl/experiments/_presets_fedplus.py``);
every evaluation is one JSON record (the preset's full configuration, the seed,
``_meta()``), with the test accuracy weighted by test samples (``weighted``,
FedProx's convention) and averaged over parties (``party_avg``), in %.
``--report`` and ``--plot`` keep apart records of different tags and data
settings (:func:`panel`: Synthetic's alpha and beta, MNIST's digits a party,
the number of parties), so FedProx's usual Synthetic(1, 1)
(``--set alpha=1 beta=1``) and the paper's setting can share one file.

    FEDJAX_PFL_DATA_DIR=/path/to/data python benchmarks/fedplus_fig4.py \\
        --datasets synthetic mnist --seeds 0 1 2 \\
        --out docs/results/fedplus_fig4.jsonl
    python benchmarks/fedplus_fig4.py --report docs/results/fedplus_fig4.jsonl
    python benchmarks/fedplus_fig4.py --plot docs/results/fedplus_fig4.jsonl \\
        --plot-out docs/img/fedplus_fig4.png
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np

import fedjax_pfl as fp
from fedjax_pfl import experiments
from fedjax_pfl.experiments import _presets_fedplus as fig4

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import _meta, parse_or_report, read_jsonl, write_jsonl

PRESET = "fedplus-fig4"
DATASETS = fig4.FIG4_DATASETS
METHODS = fig4.FIG4_METHODS
NAMES = {"fedavg": "FedAvg", "fedprox": "FedProx", "rfa": "RFA",
         "comed": "CoMed", "fedavg_plus": "FedAvg+", "fedgeomed_plus": "FedGeoMed+",
         "fedcomed_plus": "FedCoMed+"}
# The paper's average accuracy of its three Fed+ variants (§5.2).
PAPER_PLUS_MEAN = {"synthetic": 98.03, "mnist": 83.36}


def panel(r: dict) -> tuple:
    """What keeps a record's runs apart from others': its tag, dataset and data
    settings (Synthetic's alpha and beta, MNIST's digits a party; the number
    of parties). The records' ``alpha`` and ``beta`` on MNIST are inert."""
    data = ((float(r["alpha"]), float(r["beta"])) if r["dataset"] == "synthetic"
            else (int(r["digits_per_party"]),))
    return (r.get("tag", "paper"), r["dataset"], data, int(r["parties"]))


def _paper_data(ds: str) -> tuple:
    """The paper's data settings of a dataset, as in a :func:`panel` key."""
    if ds == "synthetic":
        return (fig4.FIG4_SYNTHETIC["alpha"], fig4.FIG4_SYNTHETIC["beta"])
    return (1,)


def is_paper_setting(key: tuple) -> bool:
    """Whether a :func:`panel` key has the paper's data: Synthetic with
    zeta = 1000, beta = 10 and 30 parties, or 1000 one-digit MNIST parties."""
    _, ds, data, parties = key
    return data == _paper_data(ds) and parties == fig4.FIG4_SETTINGS[ds]["parties"]


def panel_order(key: tuple) -> tuple:
    """Tag "paper" first, then the paper's data settings (the paper's alpha,
    beta or digits before the paper's number of parties), synthetic first."""
    tag, ds, data, parties = key
    return (tag != "paper", tag, data != _paper_data(ds),
            parties != fig4.FIG4_SETTINGS[ds]["parties"], DATASETS.index(ds),
            data, parties)


def title(r: dict) -> str:
    """A panel's name from one of its records."""
    if r["dataset"] == "synthetic":
        a, b = float(r["alpha"]), float(r["beta"])
        note = {_paper_data("synthetic"): " (the paper's)",
                (1.0, 1.0): " (FedProx's usual)"}.get((a, b), "")
        if np.allclose((a, b), np.sqrt(_paper_data("synthetic")), rtol=1e-4):
            note = " (the paper's read as variances)"
        return f"Synthetic({a:g}, {b:g}){note}, N = {r['parties']}"
    d = r["digits_per_party"]
    return f"MNIST, {d} digit{'s' * (d > 1)} a party, N = {r['parties']}"


def accuracies(row: dict, view: str) -> dict:
    """Test accuracy in % of one history row's ``view``: weighted by test
    samples and averaged over parties."""
    return {"weighted": 100.0 * row[f"{view}/test/accuracy/mean"],
            "party_avg": 100.0 * row[f"{view}/test/accuracy/mean_unweighted"]}


def run_one(dataset: str, method: str, seed: int, overrides: dict, meta: dict,
            tag: str = "paper", progress: bool = False) -> list[dict]:
    """One run of the preset; one record per evaluation."""
    preset = experiments.get_preset(PRESET)
    sets = {k: v for k, v in overrides.items()
            if k not in preset.keys or not _inert(preset, dataset, method, k)}
    cfg = experiments.resolve(preset, {**sets, "dataset": dataset, "method": method,
                                       "seed": seed})
    t0 = time.perf_counter()
    exp = preset.build(cfg)
    build_s = time.perf_counter() - t0
    view = fig4.fig4_view(method)
    t0 = time.perf_counter()
    res = fp.simulate(exp.algorithm, exp.data, num_rounds=exp.info["num_rounds"],
                      eval_every=cfg["eval_every"], key=jax.random.key(seed),
                      splits=("test",), progress=progress)
    wall = time.perf_counter() - t0
    records = []
    for row in res.history:
        # the resolved settings (info: the paper's lr, rounds, delta) over the keys
        rec = {**meta, "preset": PRESET, "tag": tag, **cfg, **exp.info, "view": view,
               "build_s": build_s, "wall_s": wall, **row}
        rec.update(accuracies(row, view))
        if view != "global":  # Fed+'s global model, for reference
            g = accuracies(row, "global")
            rec.update(global_weighted=g["weighted"], global_party_avg=g["party_avg"])
        records.append(rec)
    last = records[-1]
    trained = getattr(res.state.clients, "trained", None)
    if trained is not None:  # Fed+: a party never sampled is judged with w~
        last.update(trained_accuracies(exp, res.state, seed, trained))
    print(f"{dataset:>9} {NAMES[method]:>10} seed {seed}: round {last['round']} "
          f"{last['weighted']:.2f} weighted, {last['party_avg']:.2f} party-avg "
          f"[{wall:.0f} s + {build_s:.0f} s data]", flush=True)
    return records


def trained_accuracies(exp, state, seed: int, trained) -> dict:
    """Fed+'s personal models at the end, on the parties sampled at least once
    and on the others (whose personal model is still ``w~``): their number and
    test accuracy in %, weighted by test samples."""
    out = {"trained_parties": int(np.sum(trained))}
    for name, mask in (("trained", trained), ("untrained", ~trained)):
        if not np.any(mask):
            continue
        m = fp.evaluate_state(exp.algorithm, state, exp.data, key=jax.random.key(seed),
                              views=("personal",), splits=("test",),
                              mask=np.asarray(mask, np.float32))
        out[f"{name}_weighted"] = 100.0 * float(m["personal/test/accuracy/mean"])
    return out


def _inert(preset, dataset, method, key) -> bool:
    """Whether ``key`` has no effect for this dataset and method (left out, so
    that the same overrides serve every run)."""
    cond = preset.keys[key].only_if
    if cond is None:
        return False
    value = {"dataset": dataset, "method": method}.get(cond[0])
    return value is not None and value not in cond[1]


def curves(records: list[dict], key: str = "weighted",
           tag: str | None = None) -> dict:
    """``{(panel, method): (rounds, [seeds, rounds] values)}`` of the records
    (those tagged ``tag`` unless ``None``), ``panel`` as :func:`panel` gives it
    (a later record of the same panel, method, seed and round replaces an
    earlier one)."""
    runs: dict = {}
    for r in records:
        if tag is None or r.get("tag", "paper") == tag:
            runs.setdefault((panel(r), r["method"], r["seed"]), {})[
                r["round"]] = r[key]
    out: dict = {}
    order = sorted(runs.items(), key=lambda kv: (panel_order(kv[0][0]), *kv[0][1:]))
    for (pk, m, _), pts in order:
        rounds = tuple(sorted(pts))
        prev = out.setdefault((pk, m), (rounds, []))
        if prev[0] == rounds:  # seeds with other evaluation rounds are left out
            prev[1].append([pts[t] for t in rounds])
    return {k: (np.asarray(r), np.asarray(v, float)) for k, (r, v) in out.items()}


def _stat(v: np.ndarray) -> str:
    if np.all(np.isnan(v)):
        return "-"
    if len(v) == 1:
        return f"{v[0]:.2f}"
    return f"{v.mean():.2f} ± {v.std(ddof=1):.2f}"


def report(path: str) -> str:
    """Markdown tables: final test accuracy (mean ± std over seeds, ddof 1) per
    method and :func:`panel` (tag, dataset, data settings), and the best Fed+
    variant against FedProx and against the best baseline."""
    records = read_jsonl(path)
    lines = []
    for pk in sorted({panel(r) for r in records}, key=panel_order):
        lines += _table(records, pk)
    return "\n".join(lines)


def _table(records: list[dict], pk: tuple) -> list[str]:
    tag = pk[0]
    finals = {key: {m: c[1][:, -1] for (p, m), c in curves(records, key).items()
                    if p == pk} for key in ("weighted", "party_avg")}
    if not finals["weighted"]:
        return []
    runs = [r for r in records if panel(r) == pk]
    last_round = max(r["round"] for r in runs)
    finals["global_weighted"] = {
        m: np.asarray([r["global_weighted"] for r in runs if r["method"] == m
                       and r["round"] == last_round and "global_weighted" in r])
        for m in fig4.FIG4_PLUS}
    wall = {m: np.asarray([r["wall_s"] for r in runs if r["method"] == m
                           and r["round"] == last_round]) for m in METHODS}
    first = runs[0]
    lines = [f"**{title(first)}**, `{tag}` ({first['train_examples']} train / "
             f"{first['test_examples']} test "
             f"examples for seed {first['seed']}; lr {first['lr']}, E = "
             f"{first['local_epochs']} epochs, batch {first['batch']}), round "
             f"{last_round}, test accuracy % (mean ± std over seeds, ddof 1)", "",
             "| method | model | seeds | weighted by test samples | party-avg | "
             "Fed+ global model (weighted) | wall s per run |",
             "|---|---|---|---|---|---|---|"]
    for m in METHODS:
        if m not in finals["weighted"]:
            continue
        g = finals["global_weighted"].get(m, ())
        lines.append(f"| {NAMES[m]} | {fig4.fig4_view(m)} | "
                     f"{len(finals['weighted'][m])} | {_stat(finals['weighted'][m])} "
                     f"| {_stat(finals['party_avg'][m])} | "
                     f"{_stat(g) if len(g) else ''} | {wall[m].mean():.0f} |")
    lines.append("")
    for key in ("weighted", "party_avg"):
        lines += _comparison(pk, key, finals[key])
    return lines + [""] + _sampled_table(runs, last_round)


def _sampled_table(runs: list[dict], last_round: int) -> list[str]:
    """Fed+'s final personal accuracy on the parties sampled at least once and
    on the others (judged with w~)."""
    rows = []
    for m in fig4.FIG4_PLUS:
        rs = [r for r in runs if r["method"] == m and r["round"] == last_round
              and "trained_parties" in r]
        if not rs:
            continue
        cells = [_stat(np.asarray([r.get(k, np.nan) for r in rs], float))
                 for k in ("trained_parties", "trained_weighted",
                           "untrained_weighted")]
        rows.append(f"| {NAMES[m]} | {len(rs)} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["| Fed+ at the end | seeds | parties sampled at least once | "
            "their personal models | the others (w~) |", "|---|---|---|---|---|",
            *rows, ""]


def _comparison(pk: tuple, key: str, final: dict) -> list[str]:
    """The best Fed+ variant (by mean) against FedProx and the best baseline,
    in points and relative, and the mean of the three Fed+ variants (beside
    the paper's where the data are the paper's)."""
    plus = [m for m in fig4.FIG4_PLUS if m in final]
    base = [m for m in fig4.FIG4_BASELINES if m in final]
    if not plus or not base:
        return []
    best = max(plus, key=lambda m: final[m].mean())
    top = max(base, key=lambda m: final[m].mean())
    out = []
    for other in dict.fromkeys(["fedprox", top]):
        if other not in final:
            continue
        d = final[best].mean() - final[other].mean()
        out.append(f"- {key}: best Fed+ ({NAMES[best]}, {final[best].mean():.2f}) vs "
                   f"{NAMES[other]}{' (best baseline)' if other == top else ''} "
                   f"({final[other].mean():.2f}): {d:+.2f} points, "
                   f"{100 * d / final[other].mean():+.2f} % relative")
    if len(base) > 1:
        avg = np.mean([final[m].mean() for m in base])
        d = final[best].mean() - avg
        out.append(f"- {key}: best Fed+ vs the mean of the {len(base)} baselines "
                   f"({avg:.2f}): {d:+.2f} points, {100 * d / avg:+.2f} % relative")
    if len(plus) == 3:
        avg = np.mean([final[m].mean() for m in plus])
        paper = (f"paper: {PAPER_PLUS_MEAN[pk[1]]:.2f}" if is_paper_setting(pk)
                 else "not the paper's data setting")
        out.append(f"- {key}: mean of the three Fed+ variants {avg:.2f} ({paper})")
    return out


def plot(path: str, out: str, tag: str = "paper") -> list[str]:
    """One panel per dataset and data setting of the records tagged ``tag``
    (the paper's settings first): test accuracy (weighted by test samples)
    against rounds, one line per method (mean over seeds, shaded ± std)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from fedjax_pfl import plots

    records = read_jsonl(path)
    cs = curves(records, "weighted", tag)
    panels = sorted({pk for pk, _ in cs}, key=panel_order)
    colors = plots.model_colors(NAMES[m] for m in METHODS)
    fig = Figure(figsize=(5.5 * len(panels), 4.0), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, pk in zip(axes, panels):
        for m in METHODS:
            if (pk, m) not in cs:
                continue
            rounds, v = cs[(pk, m)]
            mean, std = v.mean(0), v.std(0, ddof=1) if len(v) > 1 else 0 * v[0]
            style = "-" if m in fig4.FIG4_PLUS else "--"
            ax.plot(rounds, mean, style, color=colors[NAMES[m]], lw=1.6,
                    label=f"{NAMES[m]} ({len(v)} seeds)")
            ax.fill_between(rounds, mean - std, mean + std, color=colors[NAMES[m]],
                            alpha=0.15, lw=0)
        ax.set_title(title(next(r for r in records if panel(r) == pk)))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("round")
        ax.set_ylabel("test accuracy % (weighted by test samples)")
        ax.grid(alpha=0.3)
    axes[-1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), frameon=False)
    fig.suptitle("Fed+ Fig. 4 at CPU scale: Fed+ personal models (solid) vs "
                 "baselines' global model (dashed)")
    return plots.save_figure(fig, out, formats=("png", "pdf"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="preset keys for every run (e.g. rounds=20 parties=100); "
                   "keys that do not apply to a run's dataset or method are "
                   "left out for it")
    p.add_argument("--tag", default="paper",
                   help="label of this configuration in the records (report and "
                   "plot group by it and by the data settings; the plot shows "
                   "one tag)")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--plot", default=None, metavar="JSONL",
                   help="plot these records to --plot-out and exit")
    p.add_argument("--plot-out", default="docs/img/fedplus_fig4.png")
    args = parse_or_report(p, argv, report)
    if args is None:
        return []
    if args.plot:
        print("\n".join(plot(args.plot, args.plot_out, args.tag)))
        return []
    overrides = {}
    for item in args.set:
        k, sep, v = item.partition("=")
        if not sep:
            p.error(f"--set: expected KEY=VALUE, got {item!r}")
        overrides[k.strip()] = v.strip()
    meta = _meta()
    records = []
    for seed in args.seeds:
        for ds in args.datasets:
            for method in args.methods:
                recs = run_one(ds, method, seed, overrides, meta, args.tag,
                               args.progress)
                write_jsonl(args.out, recs)
                records += recs
    return records


if __name__ == "__main__":
    main()
