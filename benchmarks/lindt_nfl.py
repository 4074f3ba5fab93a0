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

``--data shakespeare`` runs the paper's SHAKE task instead: one client per
speaking role with at least 10,000 windows of 80 characters (90 / 10 train /
test), 16 % attackers whose every training label is '\\n'
(``attacks.target_backdoor``), a 2-layer LSTM of width ``--lstm-hidden`` (the
paper's 256 gives 819,920 parameters), the noise std giving the paper's LSTM
noise norm 0.9055 by default. The "normal" environment of Table 3 is
``--attack-ratio 0`` (with ``--scheme iid`` for CIFAR); ``--report`` prints one
table per setting, beside the paper's column for that data and environment,
with mean +- std over the seeds run. ``--stop`` picks LINDT's stopping strategy
(Sec. 5.3, App. C.7) and ``--attacks-until R`` makes the attackers honest after
round R (App. C.7's experiment). ``--private-cache DIR`` keeps the private
accuracies for later runs with the same settings (clear DIR when the private
training code changes). ``--checkpoint-dir DIR --checkpoint-every N --resume``
saves each method's run in ``DIR/<method>/`` every N rounds and continues it
from there, exactly (the evaluations and per-round detector series so far are
part of the checkpoint); a checkpoint written with other settings is refused.

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
from throughput import (
    _meta,
    add_checkpoint_args,
    parse_or_report,
    read_jsonl,
    settings_hash,
    write_jsonl,
)

METHODS = ("fedavg", "fb", "tm", "apfl", "fedprox", "lindt", "lindt_tm",
           "lindt_detect")
NAMES = {"fedavg": "FedAvg", "fb": "FB", "tm": "TrimmedMean", "apfl": "APFL",
         "fedprox": "FedProx", "lindt": "LINDT", "lindt_tm": "LINDT-TM",
         "lindt_detect": "LINDT (detect + recover)"}
# LINDT's Table 3 (central, local, beta), verbatim, per (data, environment);
# "normal" is no attackers (and IID for CIFAR). The paper ran no LINDT-TM there.
PAPER = {
    ("cifar10", "nfl"): {
        "fedavg": (55.63, 56.19, -17.83), "fedprox": (55.20, 55.92, -18.10),
        "tm": (55.67, 56.70, -17.32), "fb": (None, 81.17, 7.15),
        "apfl": (54.90, 80.61, 6.59), "lindt": (55.73, 81.61, 7.59),
        "lindt_tm": (56.23, 82.82, 8.80)},
    ("shakespeare", "nfl"): {
        "fedavg": (43.60, 44.26, -2.93), "fedprox": (40.20, 40.64, -6.55),
        "tm": (43.93, 45.53, -1.66), "fb": (None, 51.85, 4.66),
        "apfl": (43.87, 51.96, 4.77), "lindt": (49.17, 52.84, 5.65),
        "lindt_tm": (49.86, 53.02, 5.83)},
    ("cifar10", "normal"): {
        "fedavg": (73.00, 73.04, 29.99), "fedprox": (72.33, 72.91, 29.86),
        "tm": (71.47, 72.09, 29.04), "fb": (None, 61.19, 18.14),
        "apfl": (70.73, 70.85, 27.80), "lindt": (73.07, 73.30, 30.05)},
    ("shakespeare", "normal"): {
        "fedavg": (52.93, 53.42, 6.16), "fedprox": (52.07, 52.62, 5.36),
        "tm": (52.67, 53.19, 5.93), "fb": (None, 53.89, 6.63),
        "apfl": (52.97, 53.23, 5.97), "lindt": (53.67, 54.07, 6.81)},
}
# the defaults of --data cifar10 / synthetic (False) and shakespeare (True)
DEFAULTS = {
    False: {"scheme": "mixed", "cohort_size": 10, "attack_ratio": 0.2,
            "batch_size": 10, "lr": 0.05, "lr_decay": 0.995},
    True: {"scheme": "by_role", "cohort_size": 6, "attack_ratio": 0.16,
           "batch_size": 50, "lr": 1.47, "lr_decay": 0.992},
}
# what makes two records the same setting (the report averages their seeds)
SETTING = ("data", "model", "scheme", "class_sigma", "num_clients", "cohort_size",
           "attack_ratio", "hidden", "lstm_hidden", "params", "rounds", "lr",
           "lr_decay", "epochs", "steps", "batch_size", "clip", "noise_std", "eps",
           "r_prime", "tail", "test_cap", "fb_steps", "fb_lr", "fb_layers", "v_init",
           "stop",
           "stop_streak", "attacks_until", "grad_clip", "trim", "apfl_alpha",
           "apfl_alpha_mode")
# the detector's inputs, recorded every round (the operating characteristic is
# computed from them: benchmarks/lindt_detector.py)
SERIES = ("nfl/delta", "nfl/w_div", "nfl/noise_norm", "server/update_norm",
          "nfl/client_update_norm", "lindt/dual_on")
COLORS = dict(zip(METHODS, ("tab:red", "tab:orange", "tab:brown", "tab:purple",
                             "tab:pink", "tab:blue", "tab:cyan", "tab:green")))


def load(args, poison=True):
    """(FederatedData, malicious mask, input dim or sequence length)."""
    return _lindt.lindt_data(args.data, args.num_clients, args.attack_ratio,
                             args.seed, args.scheme, test_cap=args.test_cap,
                             poison=poison, image_size=_lindt.IMAGE_SIZE[args.model],
                             class_sigma=args.class_sigma)


def dual_model(args, dim):
    """The MLP on flattened 16x16 images, the paper's CNN on 32x32 ones, or
    the LSTM on Shakespeare windows."""
    if args.data == "shakespeare":
        return algorithms.dual_lindt_lstm(seq_len=dim, hidden=args.lstm_hidden)
    return _lindt.cifar_dual(args.model, dim, args.hidden)


def model_name(rec) -> str:
    """A record's (or the arguments') model, for headings and plots."""
    if rec.get("lstm_hidden") is not None:
        return f"LSTM 2x{rec['lstm_hidden']}"
    if _setting(rec, "model") == "cnn":
        return "CNN 32x32"
    return f"MLP {rec['hidden']}"


def build(method, dual, args, mal, noise_std):
    return _lindt.lindt_algorithm(
        method, dual, mal, lr=args.lr, lr_decay=args.lr_decay,
        cohort_size=args.cohort_size, steps=args.steps, clip=args.clip,
        noise_std=noise_std, trim=args.trim, eps=args.eps, r_prime=args.r_prime,
        fb_steps=args.fb_steps, fb_lr=args.fb_lr, fb_layers=args.fb_layers,
        local_epochs=args.epochs or None, batch_size=args.batch_size,
        v_init=args.v_init, stop=args.stop, stop_streak=args.stop_streak,
        grad_clip=args.grad_clip, apfl_alpha=args.apfl_alpha,
        apfl_adaptive=args.apfl_alpha_mode == "adaptive")


LSTM_HIDDEN = 64  # --lstm-hidden's default (part of every private cache's key)
# the settings that fix the private models (and so beta's baseline)
PRIVATE_KEYS = ("data", "scheme", "num_clients", "attack_ratio", "seed", "test_cap",
                "hidden", "lstm_hidden", "lr", "batch_size", "private_rounds",
                "private_steps")


def cached_private_accuracy(dual, fd, key, args):
    """Each client's private-model test accuracy (``experiments.
    private_accuracy``), and where it was cached: with ``--private-cache DIR``
    it is read from ``DIR/private_<hash>.npy`` (the hash of PRIVATE_KEYS'
    values) when a run with the same settings saved it, else computed and
    saved there atomically; ``None`` without a cache."""
    path = None
    if args.private_cache:
        cfg = {k: getattr(args, k) for k in PRIVATE_KEYS}
        if args.model != "mlp":  # so that the MLP's earlier caches keep their names
            cfg["model"] = args.model
        if args.class_sigma:  # likewise for the balanced allocation's caches
            cfg["class_sigma"] = args.class_sigma
        path = os.path.join(args.private_cache,
                            f"private_{settings_hash(cfg, 16)}.npy")
        if os.path.exists(path):
            return np.load(path), path
    acc = np.asarray(experiments.private_accuracy(
        dual.model, fd, jax.random.fold_in(key, 99), client_lr=args.lr,
        num_local_steps=args.private_steps, batch_size=args.batch_size,
        num_rounds=args.private_rounds, eval_every=max(1, args.private_rounds // 10)))
    if path:
        os.makedirs(args.private_cache, exist_ok=True)
        tmp = path + ".tmp.npy"
        np.save(tmp, acc)
        os.replace(tmp, path)
    return acc, path


# the arguments that do not change what a run computes (left out of its
# checkpoint's fingerprint)
NOT_RUN = ("out", "report", "plot", "methods", "checkpoint_dir", "checkpoint_every",
           "resume", "private_cache")


class Progress:
    """A method's checkpoint, ``DIR/<method>/``: the round state's leaves
    (``state_<round>.npz``; PRNG keys as their key data) and ``progress.json``
    (the round, the evaluations and per-round detector series so far, the
    seconds spent, and the fingerprint: every argument that changes the run).
    Each file is written to a temporary name and renamed, ``progress.json``
    last, so a run killed at any point resumes from the last complete
    checkpoint."""

    def __init__(self, args, method):
        self.dir = args.checkpoint_dir and os.path.join(args.checkpoint_dir, method)
        self.every = args.checkpoint_every or args.eval_every
        self.fingerprint = {"method": method, **{
            k: v for k, v in sorted(vars(args).items()) if k not in NOT_RUN}}
        self.path = self.dir and os.path.join(self.dir, "progress.json")

    def restore(self, template):
        """``None``, or ``(round, state, rows, per_round, round_s, seconds)``
        from the checkpoint; refuses one written by another configuration."""
        if not (self.path and os.path.exists(self.path)):
            return None
        with open(self.path) as fh:
            saved = json.load(fh)
        # an argument added since the checkpoint was written: its default then
        before = {k: LEGACY[k] for k in self.fingerprint.keys() - saved["fingerprint"]
                  if k in LEGACY} | saved["fingerprint"]
        if before != self.fingerprint:
            diff = sorted(k for k in {*before, *self.fingerprint}
                          if before.get(k) != self.fingerprint.get(k))
            raise SystemExit(f"--resume: the checkpoint in {self.dir} was written "
                             f"with other settings ({', '.join(diff)} differ); "
                             f"use another --checkpoint-dir")
        leaves, treedef = jax.tree_util.tree_flatten(template)
        with np.load(os.path.join(self.dir, saved["state"])) as z:
            arrays = [z[f"a{i}"] for i in range(len(leaves))]
        leaves = [jax.random.wrap_key_data(a, impl=jax.random.key_impl(t))
                  if _is_key(t) else jnp.asarray(a, t.dtype)
                  for a, t in zip(arrays, leaves)]
        return (saved["round"], jax.tree_util.tree_unflatten(treedef, leaves),
                saved["rows"], saved["per_round"], saved["round_s"], saved["seconds"])

    def save(self, r, state, rows, per_round, round_s, seconds):
        os.makedirs(self.dir, exist_ok=True)
        name = f"state_{r}.npz"
        arrays = {f"a{i}": np.asarray(jax.random.key_data(x) if _is_key(x) else x)
                  for i, x in enumerate(jax.tree_util.tree_leaves(state))}
        tmp = os.path.join(self.dir, name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, os.path.join(self.dir, name))
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"fingerprint": self.fingerprint, "round": r, "state": name,
                       "rows": rows, "per_round": per_round, "round_s": round_s,
                       "seconds": seconds}, fh)
        os.replace(tmp, self.path)
        for old in os.listdir(self.dir):  # the states no checkpoint names
            if old.startswith("state_") and old != name:
                os.remove(os.path.join(self.dir, old))


def _is_key(x) -> bool:
    return jnp.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)


def run_method(method, dual, fd, mal, private_acc, args, noise_std, key,
               clean_fd=None):
    """One method's run. With ``--attacks-until R`` (``clean_fd``: the same
    clients without the backdoor) the attackers turn honest after round ``R``:
    from round ``R + 1`` every client trains on clean data with the benign
    step count (App. C.7's experiment). With ``--checkpoint-dir`` the run is
    saved every ``--checkpoint-every`` rounds and at its end, and with
    ``--resume`` continues from its checkpoint (:class:`Progress`)."""
    alg = build(method, dual, args, mal, noise_std)
    benign = jnp.asarray(~mal, jnp.float32)
    step = jax.jit(alg.round_step, donate_argnums=0)
    if clean_fd is not None:
        honest = jax.jit(build(method, dual, args, np.zeros_like(mal), noise_std)
                         .round_step, donate_argnums=0)

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
    round_s = []  # each round's step (the float()s below wait for it)
    progress, start, before = Progress(args, method), 0, 0.0
    restored = progress.restore(state) if args.resume else None
    if restored is not None:
        start, state, rows, per_round, round_s, before = restored
        print(f"{method}: resumed from round {start}", flush=True)
    compiled = {0, len(round_s)}  # each process's first round compiles
    for r in range(start + 1, args.rounds + 1):
        t1 = time.perf_counter()
        if clean_fd is not None and r > args.attacks_until:
            state, m = honest(state, clean_fd, key)
        else:
            state, m = step(state, fd, key)
        per_round.append({k: float(v) for k, v in m.items()
                          if k.startswith(("nfl/", "lindt/", "server/"))})
        round_s.append(time.perf_counter() - t1)
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
            if method == "apfl":  # the benign clients' mean mixing weight
                row["apfl/alpha"] = float(np.average(state.clients.alpha,
                                                     weights=benign))
            rows.append(row)
            if progress.dir and (r % progress.every == 0 or r == args.rounds):
                progress.save(r, state, rows, per_round, round_s,
                              before + time.perf_counter() - t0)
    seconds = before + time.perf_counter() - t0
    # the median round, the compiling ones excluded
    timed = [t for i, t in enumerate(round_s) if i not in compiled] or round_s
    return rows, per_round, (seconds, float(np.median(timed)), start)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", choices=("cifar10", "synthetic", "shakespeare"),
                   default="cifar10")
    p.add_argument("--scheme", default=None,
                   help="CIFAR allocation (default mixed); Shakespeare: by_role")
    p.add_argument("--class-sigma", type=float, default=0.0,
                   help="CIFAR: log-normal sigma of each client's class "
                   "proportions (0: its classes balanced, the default)")
    p.add_argument("--num-clients", type=int, default=None,
                   help="default: 100 (CIFAR), every role with >= 10,000 "
                        "datapoints (Shakespeare)")
    p.add_argument("--cohort-size", type=int, default=None, help="default: 10 "
                   "(CIFAR), 6 (Shakespeare: the paper's 1 attacker + 5 benign)")
    p.add_argument("--attack-ratio", type=float, default=None,
                   help="default: 0.2 (CIFAR), 0.16 (Shakespeare)")
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
                   help="CIFAR-10: mlp on 16x16 images (--hidden), or cnn, the "
                   "paper's 940,362-parameter CNN on 32x32 images")
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 128],
                   help="MLP widths (CIFAR / synthetic)")
    p.add_argument("--lstm-hidden", type=int, default=LSTM_HIDDEN,
                   help="width of both LSTM layers (Shakespeare; the paper: 256)")
    p.add_argument("--test-cap", type=int, default=None,
                   help="keep each client's first N test windows (Shakespeare)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="default: 10 (CIFAR), 50 (Shakespeare, the paper's)")
    p.add_argument("--epochs", type=float, default=1.0,
                   help="local epochs of FedAvg / TM / LINDT (0: --steps steps)")
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--tail", type=int, default=3, help="evaluations averaged")
    p.add_argument("--lr", type=float, default=None,
                   help="default: 0.05 (CIFAR, this page's), 1.47 (Shakespeare)")
    p.add_argument("--lr-decay", type=float, default=None,
                   help="default: 0.995 (CIFAR), 0.992 (Shakespeare)")
    p.add_argument("--steps", type=int, default=50,
                   help="local steps of APFL / FedProx (no epoch option), and of "
                        "every method with --epochs 0")
    p.add_argument("--clip", type=float, default=15.0)
    p.add_argument("--noise-std", type=float, default=None,
                   help="default: 0.9697 / sqrt(d) (the paper's noise norm)")
    p.add_argument("--eps", type=float, default=0.1)
    p.add_argument("--r-prime", type=int, default=None,
                   help="default: rounds // 2 (the paper: 250 of 500)")
    p.add_argument("--trim", type=float, default=0.1,
                   help="share TrimmedMean cuts from each side of every coordinate "
                        "(TM and LINDT-TM; the paper gives none)")
    p.add_argument("--v-init", choices=("random", "copy_global"), default="random",
                   help="LINDT's local models: a fresh init (default) or a copy of "
                        "the global model at the client's first dual round")
    p.add_argument("--stop", choices=("never", "all_trained_once", "delta_below"),
                   default="never", help="LINDT's stopping strategy: never (the "
                   "paper's tables), all_trained_once (Sec. 5.3 strategy 1), "
                   "delta_below (App. C.7: --stop-streak rounds with Delta < eps)")
    p.add_argument("--stop-streak", type=int, default=metrics.STOP_STREAK)
    p.add_argument("--attacks-until", type=int, default=None,
                   help="the attackers turn honest after this round (clean data, "
                        "benign steps; App. C.7); default: never")
    p.add_argument("--grad-clip", type=float, default=None,
                   help="per-step gradient norm bound of FedAvg / FB / TM / LINDT / "
                   "LINDT-TM (the paper's models: 5); default none")
    p.add_argument("--apfl-alpha", type=float, default=0.01,
                   help="APFL's initial mixing weight in [0, 1] (the paper: 0.01)")
    p.add_argument("--apfl-alpha-mode", choices=("adaptive", "fixed"),
                   default="adaptive", help="APFL's mixing weight adapts by "
                   "gradient steps (the paper) or stays at --apfl-alpha")
    p.add_argument("--fb-steps", type=int, default=100)
    p.add_argument("--fb-lr", type=float, default=0.01)
    p.add_argument("--fb-layers", type=int, default=1,
                   help="FB finetunes this many top layers (the paper: 1; the "
                        "CNN has 5, the whole model)")
    p.add_argument("--private-rounds", type=int, default=20)
    p.add_argument("--private-steps", type=int, default=50)
    p.add_argument("--private-cache", default=None, metavar="DIR",
                   help="save the private models' accuracies in DIR and reuse them "
                        "in later runs with the same data, model and private "
                        "training (they are most of a Shakespeare run's setup)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plot", default=None, help="write the Delta/accuracy PNG here")
    add_checkpoint_args(p, "<method> (its state, evaluations and per-round series)")
    args = parse_or_report(p, argv, report)
    if args is None:
        return None
    args.r_prime = args.rounds // 2 if args.r_prime is None else args.r_prime
    for name, value in DEFAULTS[args.data == "shakespeare"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.checkpoint_every and (args.checkpoint_every < 1
                                  or args.checkpoint_every % args.eval_every):
        p.error(f"--checkpoint-every: a positive multiple of --eval-every "
                f"({args.eval_every}), got {args.checkpoint_every}")
    if args.stop_streak < 1:
        p.error(f"--stop-streak: must be >= 1, got {args.stop_streak}")
    if args.attacks_until is not None and not 0 <= args.attacks_until < args.rounds:
        p.error(f"--attacks-until: must be a round in [0, --rounds), got "
                f"{args.attacks_until}")
    if not 0 <= args.apfl_alpha <= 1:
        p.error(f"--apfl-alpha: must be in [0, 1], got {args.apfl_alpha}")
    if args.epochs < 0:
        p.error(f"--epochs: must be >= 0 (0: --steps steps), got {args.epochs}")
    if args.model == "cnn" and args.data != "cifar10":
        p.error(f"--model cnn: takes CIFAR-10 images (--data cifar10), got --data "
                f"{args.data}")
    key = jax.random.key(args.seed)
    t0 = time.perf_counter()
    fd, mal, dim = load(args)
    clean_fd = None if args.attacks_until is None else load(args, poison=False)[0]
    args.num_clients = fd.num_clients
    dual = dual_model(args, dim)
    if not 1 <= args.fb_layers <= len(dual.layers):
        p.error(f"--fb-layers: must be in [1, {len(dual.layers)}] (this model's "
                f"layers), got {args.fb_layers}")
    d = models.num_params(dual.model.init(jax.random.key(0)))
    noise_std = _lindt.lindt_noise_std(
        dual, args.noise_std, _lindt.SHAKE_NOISE_NORM if args.data == "shakespeare"
        else _lindt.PAPER_NOISE_NORM)
    private_acc, cache = cached_private_accuracy(dual, fd, key, args)
    benign = ~mal
    meta = dict(_meta(), bench="lindt_nfl", data=args.data, model=args.model,
                scheme=args.scheme, class_sigma=args.class_sigma,
                num_clients=args.num_clients, cohort_size=args.cohort_size,
                attack_ratio=args.attack_ratio, params=d, rounds=args.rounds,
                lr=args.lr, lr_decay=args.lr_decay, epochs=args.epochs,
                steps=args.steps, batch_size=args.batch_size, fb_steps=args.fb_steps,
                v_init=args.v_init, stop=args.stop, stop_streak=args.stop_streak,
                attacks_until=args.attacks_until, grad_clip=args.grad_clip,
                trim=args.trim, apfl_alpha=args.apfl_alpha,
                apfl_alpha_mode=args.apfl_alpha_mode, fb_lr=args.fb_lr,
                fb_layers=args.fb_layers,
                private_rounds=args.private_rounds, private_steps=args.private_steps,
                clip=args.clip, noise_std=noise_std, eps=args.eps,
                r_prime=args.r_prime, tail=args.tail, seed=args.seed,
                private_acc_benign=100 * float(np.nanmean(private_acc[benign])),
                private_cache=cache,
                setup_s=time.perf_counter() - t0,
                **({"lstm_hidden": args.lstm_hidden, "test_cap": args.test_cap}
                   if args.data == "shakespeare" else
                   {"hidden": None if args.model == "cnn" else args.hidden}))
    print(f"d = {d}, noise std {noise_std:.3g}, private accuracy (benign) "
          f"{meta['private_acc_benign']:.2f}")
    records, curves = [], {}
    runs = [m for m in args.methods if m != "fb"]
    if "fb" in args.methods and "fedavg" not in runs:
        runs.insert(0, "fedavg")
    for method in runs:
        rows, per_round, (secs, round_s, resumed_from) = run_method(
            method, dual, fd, mal, private_acc, args, noise_std, key, clean_fd)
        curves[method] = (rows, per_round)
        outs = [(method, rows)]
        if method == "fedavg" and "fb" in args.methods:
            outs.append(("fb", rows))
        for name, rs in outs:
            tail = rs[-args.tail:]
            pre = "fb_" if name == "fb" else ""
            rec = dict(meta, method=name, seconds=secs, round_s_median=round_s,
                       resumed_from=resumed_from,
                       central=float(np.mean([r["central"] for r in tail])),
                       local=float(np.mean([r[pre + "local"] for r in tail])),
                       beta=float(np.mean([r[pre + "beta"] for r in tail])),
                       beta_all=float(np.mean([r[pre + "beta_all"] for r in tail])),
                       in_nfl=metrics.nfl_verdict([r[pre + "beta"] for r in rs],
                                                  window=args.tail)["in_nfl"],
                       detect_round=int(per_round[-1].get("nfl/detect_round", -1)),
                       delta_above_eps=int(per_round[-1].get("nfl/count", 0)),
                       stop_round=next((i + 1 for i, q in enumerate(per_round)
                                        if q.get("lindt/stopped", 0) > 0), -1),
                       history=rs, per_round={
                           k: [r[k] for r in per_round] for k in SERIES
                           if k in per_round[0]})
            records.append(rec)
            write_jsonl(args.out, [rec])  # each method's record as it completes
            print(f"{NAMES[name]:>26}: central {rec['central']:.2f} local "
                  f"{rec['local']:.2f} beta {rec['beta']:+.2f} (all clients "
                  f"{rec['beta_all']:+.2f}) detect@{rec['detect_round']} "
                  f"{secs:.0f}s", flush=True)
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
    fig.suptitle(f"LINDT NFL setting, {args.data} {model_name(meta)} "
                 f"(N={args.num_clients}, "
                 f"K={args.cohort_size}, {int(100 * args.attack_ratio)}% backdoor, "
                 f"DP S={args.clip:g})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# settings recorded only from 2026-11-26 on; older records ran these defaults
LEGACY = {"model": "mlp", "epochs": 1.0, "steps": 50, "batch_size": 10,
          "fb_steps": 100, "fb_lr": 0.01, "fb_layers": 1, "v_init": "random",
          "stop": "never",
          "stop_streak": metrics.STOP_STREAK, "attacks_until": None,
          "class_sigma": 0.0, "grad_clip": None, "trim": 0.1, "apfl_alpha": 0.01,
          "apfl_alpha_mode": "adaptive"}


def _setting(rec, key):
    """A record's setting ``key``, or the default older records ran."""
    return rec.get(key, LEGACY.get(key))


def environment(rec) -> str:
    """``normal`` (no attackers) or ``nfl``: the paper's two halves of Table 3."""
    return "normal" if rec["attack_ratio"] == 0 else "nfl"


def _number(v, sign=False) -> str:
    return "-" if v is None else (f"{v:+.2f}" if sign else f"{v:.2f}")


def _cell(rs, key, sign=False) -> str:
    """``key`` over the seeds' records: the value, or mean +- std."""
    v = np.array([r[key] for r in rs], float)
    return _number(v.mean(), sign) + (f" +- {v.std(ddof=1):.2f}" if len(v) > 1 else "")


def _stop_text(rec) -> str:
    """The heading's note on a stopping strategy or attackers that stop."""
    out = ""
    if _setting(rec, "stop") != "never":
        out += f", stop {rec['stop']}"
        if rec["stop"] == "delta_below":
            out += f" ({rec['stop_streak']} rounds)"
    if _setting(rec, "attacks_until") is not None:
        out += f", attackers honest after round {rec['attacks_until']}"
    return out


def _apfl_text(rec) -> str:
    """The heading's note on APFL's mixing weight when not the paper's."""
    alpha, mode = _setting(rec, "apfl_alpha"), _setting(rec, "apfl_alpha_mode")
    if (alpha, mode) == (LEGACY["apfl_alpha"], LEGACY["apfl_alpha_mode"]):
        return ""
    return f", APFL alpha {alpha:g} {mode}"


def report(path) -> str:
    """One table per setting (first-appearance order); a method run with
    several seeds shows mean +- std over them and its seed count (a seed
    recorded twice counts once, with its latest record)."""
    recs = read_jsonl(path)
    groups: dict = {}
    for r in recs:
        setting = tuple(json.dumps(_setting(r, k)) for k in SETTING)
        groups.setdefault(setting, {}).setdefault(r["method"], []).append(r)
    out = []
    for methods in groups.values():
        first = next(iter(methods.values()))[0]
        data, env = first.get("data", "cifar10"), environment(first)
        # the synthetic mixture stands in for CIFAR-10 (smoke runs)
        paper = PAPER.get(("cifar10" if data == "synthetic" else data, env), {})
        if len(groups) > 1:
            fb = {k: _setting(first, k)
                  for k in ("fb_steps", "fb_lr", "fb_layers", "v_init")}
            skew = _setting(first, "class_sigma")
            out.append(f"**{data}, {env}** ({first['scheme']}"
                       + (f", class proportions log-normal sigma {skew:g}" if skew
                          else "") + ", attackers "
                       f"{first['attack_ratio']:g}, {model_name(first)}, "
                       f"{first['rounds']} rounds, "
                       f"lr {first['lr']:g} x {first['lr_decay']:g} a round, noise "
                       f"std {first['noise_std']:.3g}, FB {fb['fb_steps']} steps at "
                       f"lr {fb['fb_lr']:g}"
                       + (f" on the top {fb['fb_layers']} layers"
                          if fb["fb_layers"] != 1 else "")
                       + f", local models {fb['v_init']}"
                       + (f", gradient norm bound {gc:g}"
                          if (gc := _setting(first, "grad_clip")) else "")
                       + (f", TrimmedMean {tr:g} a side"
                          if (tr := _setting(first, "trim")) != LEGACY["trim"]
                          else "")
                       + _apfl_text(first)
                       + _stop_text(first) + ")")
        lines = [("| method | central | local | beta (benign) | beta (all) | in NFL | "
                  "detected at | paper central | paper local | paper beta |"),
                 "|---|" * 1 + "---|" * 9]
        for method, rs in methods.items():
            # a seed run twice in one setting counts once: its latest record
            rs = list({r.get("seed"): r for r in rs}.values())
            pc, pl, pb = paper.get(method, (None, None, None))
            central = "-" if method == "fb" else _cell(rs, "central")
            dets = sorted({r["detect_round"] for r in rs})
            det = ", ".join(str(d) if d > 0 else "never" for d in dets)
            stops = sorted({r.get("stop_round", -1) for r in rs})
            if _setting(rs[0], "stop") != "never":
                det += "; dual stopped at " + ", ".join(
                    str(t) if t > 0 else "never" for t in stops)
            if method in ("apfl", "fedprox"):
                det = "n/a"
            nfl = sum(bool(r["in_nfl"]) for r in rs)
            in_nfl = ("yes" if nfl else "no") if len(rs) == 1 else f"{nfl}/{len(rs)}"
            name = NAMES[method] + (f" ({len(rs)} seeds)" if len(rs) > 1 else "")
            lines.append(f"| {name} | {central} | {_cell(rs, 'local')} | "
                         f"{_cell(rs, 'beta', True)} | {_cell(rs, 'beta_all', True)} | "
                         f"{in_nfl} | {det} | {_number(pc)} | {_number(pl)} | "
                         f"{_number(pb, True)} |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


if __name__ == "__main__":
    main()
