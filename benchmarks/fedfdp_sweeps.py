"""FedFDP's lambda sweep (paper Fig. 4) and clip-bound sweep (Fig. 5), vmapped.

The FedFDP paper's lambda and clip sweeps (Ling et al., arXiv 2402.16028) at CPU scale:
the FedFDP partition of MNIST (10
clients, Dirichlet 0.1, 75/25), one Poisson(q) step per round, q = 0.05,
sigma = 2, sigma_loss = 5; every value of the swept hyperparameter runs as one
``fedjax_pfl.sweep`` (the whole simulation vmapped over the values, one program).
``--sweep lam`` varies the fairness strength at C = 0.1; ``--sweep clip`` varies
C at lambda = 0.1; ``--sweep loss_clip_floor`` varies the lower bound of the
adaptive loss bound (0: the paper's update, which drifts to 0). ``--fair-clip``
picks the reading of the fair clip for negative or small weights. All values
share the noise multipliers, hence the epsilon. The
model is an MLP by default (a vmapped CNN is slow on CPU; ``--model cnn`` for
the paper's FedAvgCNN).

    FEDJAX_PFL_DATA_DIR=/path/to/data python benchmarks/fedfdp_sweeps.py \
        --sweep lam --values 0 0.01 0.1 1 10 --out docs/results/fedfdp_sweeps.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np

import fedjax_pfl as fp
from fedjax_pfl import models, privacy
from fedjax_pfl.experiments import _presets

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from throughput import _meta, parse_or_report, read_jsonl, write_jsonl  # noqa: E402

DELTA = _presets.FEDFDP_DELTA
MODELS = {  # by the data's image shape (28x28x1, or 32x32x3 for CIFAR-10)
    "mlp": lambda shape=(28, 28, 1): models.mlp(shape, 10, hidden=(200,)),
    "cnn": lambda shape=(28, 28, 1): models.fedavg_cnn(shape, 10),
}
SWEEPS = ("lam", "clip", "loss_clip_floor")


def _nonnegative(text: str) -> float:
    value = float(text)
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def add_fedfdp_options(p: argparse.ArgumentParser) -> None:
    """FedFDP's options beyond the paper's settings (fedfdp_tables has them
    too): the floor of the adaptive loss bound and the fair clip's reading."""
    p.add_argument("--loss-clip-floor", type=_nonnegative, default=0.0,
                   help="floor of FedFDP's adaptive loss bound (0: the paper's "
                        "update, which drifts to 0)")
    p.add_argument("--fair-clip", default="sign_preserving",
                   choices=["sign_preserving", "paper", "code"],
                   help="FedFDP's fair clip for negative or small weights (paper "
                        "and code: not accounted with lambda > 0)")


def report(paths) -> str:
    rows = ["| model | rounds | normaliser | fair clip | epsilon | swept | value | "
            "lambda | C | loss-bound floor | test acc % | Psi (test loss) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for path in paths:
        for r in read_jsonl(path):
            norm = r.get("normalize", "realized")  # older records: the paper's
            accounted = r.get("accounted", norm == "expected")
            eps = f"{r['epsilon']:.3f}" + ("" if accounted else ", not a bound")
            rows.append(
                f"| {r['model']} | {r['rounds']} | {norm} | "
                f"{r.get('fair_clip', 'sign_preserving')} | {eps} | "
                f"{r['sweep']} | {r['value']:g} | {r['lam']:g} | {r['clip']:g} | "
                f"{r.get('loss_clip_floor', 0.0):g} | "
                f"{100 * r['accuracy']:.2f} | {r['psi']:.4g} |")
    return "\n".join(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweep", choices=SWEEPS, default="lam")
    p.add_argument("--values", nargs="+", type=float, default=[0, 0.01, 0.1, 1, 10])
    p.add_argument("--model", choices=sorted(MODELS), default="mlp")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--q", type=float, default=0.05)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--lam", type=float, default=0.1, help="fixed lambda (clip sweep)")
    p.add_argument("--clip", type=float, default=0.1, help="fixed C (lambda sweep)")
    add_fedfdp_options(p)
    p.add_argument("--sigma", type=float, default=2.0)
    p.add_argument("--sigma-loss", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--normalize", default="expected", choices=["expected", "realized"],
                   help="DP-SGD normaliser: q n_k (accounted) or the realised batch "
                        "size (the paper's; not accounted; the records made before "
                        "2026-11-24 used it)")
    p.add_argument("--max-examples", type=int, default=None, help="smoke runs only")
    args = parse_or_report(p, argv, report, multiple=True)
    if args is None:
        return []
    if args.rounds < 1 or args.eval_every < 1:
        p.error("--rounds and --eval-every must be positive")
    low = 1e-12 if args.sweep == "clip" else 0.0
    if any(not np.isfinite(v) or v < low for v in args.values):
        p.error(f"--values: {args.sweep} values must be finite and >= {low}")
    fed = _presets.fedfdp_data("mnist", args.seed, max_examples=args.max_examples)
    model = MODELS[args.model]()
    eps = privacy.epsilon(privacy.fedfdp_event(args.q, args.sigma, args.rounds,
                                               args.sigma_loss, 1), DELTA)
    print(f"{fed.num_clients} clients; epsilon after {args.rounds} rounds: {eps:.3f}")

    def make(value):
        kw = {"lam": args.lam, "clip": args.clip,
              "loss_clip_floor": args.loss_clip_floor, args.sweep: value}
        return _presets.fedfdp_algorithm(
            "fedfdp", model, q=args.q, lr=args.lr, sigma=args.sigma,
            sigma_loss=args.sigma_loss, num_clients=fed.num_clients,
            normalize=args.normalize, fair_clip=args.fair_clip, **kw)

    # a reading of the fair clip that a negative weight can unbound is not
    # accounted (nor is the realised normaliser): its epsilon is not a bound
    accounted = [make(float(v)).privacy(fed).accounted for v in args.values]

    t0 = time.perf_counter()
    _, hist = fp.sweep(make, {"value": np.asarray(args.values, np.float32)}, fed,
                       num_rounds=args.rounds, eval_every=args.eval_every,
                       key=jax.random.key(args.seed), splits=("test",))
    wall = time.perf_counter() - t0
    meta, records = _meta(), []
    for i, v in enumerate(args.values):
        rec = dict(meta, benchmark="fedfdp_sweeps", model=args.model,
                   rounds=args.rounds, delta=DELTA, sweep=args.sweep,
                   normalize=args.normalize, epsilon=eps, accounted=accounted[i],
                   fair_clip=args.fair_clip,
                   value=v, lam=v if args.sweep == "lam" else args.lam,
                   clip=v if args.sweep == "clip" else args.clip,
                   loss_clip_floor=(v if args.sweep == "loss_clip_floor"
                                    else args.loss_clip_floor), q=args.q,
                   sigma=args.sigma, sigma_loss=args.sigma_loss, lr=args.lr,
                   seed=args.seed, wall_s=wall,
                   accuracy=float(hist["global/test/accuracy/mean"][i][-1]),
                   psi=float(hist["global/test/loss/psi"][i][-1]),
                   accuracy_curve=np.asarray(hist["global/test/accuracy/mean"][i]
                                             ).tolist(),
                   eval_rounds=np.asarray(hist["round"]).tolist())
        records.append(rec)
        print(f"{args.sweep} = {v:g}: test accuracy {100 * rec['accuracy']:.2f} %, "
              f"Psi {rec['psi']:.4g}")
    print(f"wall {wall:.0f} s (compile + {len(args.values)} vmapped runs)")
    write_jsonl(args.out, records)
    return records


if __name__ == "__main__":
    main()
