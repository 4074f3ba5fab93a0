"""The default job: Ditto vs global vs local (and finetuned) models on synthetic
federated data with label-poisoning (A1) adversaries, summarized over benign
clients."""

from __future__ import annotations

import dataclasses
import time

import jax

from fedjax_pfl import algorithms, attacks, models
from fedjax_pfl.core import simulate
from fedjax_pfl.data import fedprox_synthetic
from fedjax_pfl.validation import (
    check_choice,
    check_count,
    check_int,
    check_nonnegative,
    check_number,
    check_positive,
)

from ._config import preflight

SUMMARIES = ("mean", "mean_unweighted", "std", "worst10", "best10")
# (run, evaluated model) -> row label
ROWS = (("ditto", "global", "global"), ("local", "personal", "local"),
        ("ditto", "finetuned", "finetuned"), ("ditto", "personal", "ditto"))


@dataclasses.dataclass
class DemoConfig:
    """Settings of the default run (FedProx Synthetic(1, 1), multinomial LR)."""

    alpha: float = 1.0
    beta: float = 1.0
    num_clients: int = 100
    max_size: int = 1000
    attack: str = "A1"
    ratio: float = 0.5
    lam: float = 1.0
    num_rounds: int = 200
    eval_every: int = 50
    cohort_size: int = 10
    num_local_steps: int = 20
    batch_size: int = 10
    client_lr: float = 0.05
    finetune_steps: int = 20
    seed: int = 0


def check_demo(cfg: DemoConfig) -> None:
    """``ValueError`` naming the field for any setting the demo cannot run."""
    if not isinstance(cfg, DemoConfig):
        raise ValueError(f"cfg: must be a DemoConfig, got {type(cfg).__name__}")
    for name in ("num_clients", "max_size", "num_rounds", "eval_every",
                 "cohort_size", "num_local_steps", "batch_size"):
        check_int(name, getattr(cfg, name), lo=1)
    check_count("finetune_steps", cfg.finetune_steps)
    check_count("seed", cfg.seed)
    check_nonnegative("alpha", cfg.alpha)
    check_nonnegative("beta", cfg.beta)
    check_nonnegative("lam", cfg.lam)
    check_positive("client_lr", cfg.client_lr)
    check_choice("attack", cfg.attack, attacks.ATTACKS)
    check_number("ratio", cfg.ratio, lo=0.0, hi=1.0, hi_open=True)
    if cfg.cohort_size > cfg.num_clients:
        raise ValueError(f"cohort_size: must not exceed num_clients "
                         f"({cfg.num_clients}), got {cfg.cohort_size}")
    if cfg.attack != "none" and cfg.ratio > 0 and int(
            cfg.ratio * cfg.num_clients) == 0:
        raise ValueError(f"ratio: {cfg.ratio} of {cfg.num_clients} clients makes no "
                         "client malicious; use a larger ratio, or 0")


def run_demo(cfg: DemoConfig = DemoConfig(), *, progress: bool = True) -> dict:
    """Trains Ditto (which also yields FedAvg's global model and its finetuned
    models) and local models; returns the final metrics over benign clients.
    Every setting, and both runs against the data, are checked before the first
    round of either (:func:`check_demo`, :func:`preflight`)."""
    check_demo(cfg)
    data = fedprox_synthetic(cfg.alpha, cfg.beta, num_clients=cfg.num_clients,
                             max_size=cfg.max_size, seed=cfg.seed)
    data, threat = attacks.setup_attack(data, cfg.attack, cfg.ratio, seed=cfg.seed,
                                        num_classes=10)
    model = models.logistic_regression((60,), 10)
    common = dict(client_lr=cfg.client_lr, num_local_steps=cfg.num_local_steps,
                  batch_size=cfg.batch_size, cohort_size=cfg.cohort_size,
                  cohort="size_weighted", weighted=False,  # Ditto's Alg. 2
                  attack=threat.update_attack, malicious=threat.malicious)
    runs = {
        # Ditto's global model is exactly FedAvg's (size-weighted cohorts, mean).
        "ditto": algorithms.ditto(model, lam=cfg.lam, finetune_steps=cfg.finetune_steps,
                                  finetune_lam=0.0, **common),
        "local": algorithms.ditto(model, lam=0.0, **common),
    }
    for alg in runs.values():
        preflight(alg, data, jax.random.key(cfg.seed), eval_mask=threat.benign,
                  splits=("train", "test"))
    final = {"data": {
        "clients": data.num_clients,
        "malicious": int(threat.malicious.sum()),
        "train_examples": data.train.num_examples,
        "test_examples": data.test.num_examples,
    }}
    for name, alg in runs.items():
        t0 = time.perf_counter()
        res = simulate(alg, data, num_rounds=cfg.num_rounds,
                       eval_every=cfg.eval_every, key=jax.random.key(cfg.seed),
                       eval_mask=threat.benign, progress=progress)
        final[name] = dict(res.history[-1], wall_seconds=time.perf_counter() - t0)
    return final


def format_table(final: dict, split: str = "test") -> str:
    """One row per evaluated model: accuracy summaries across benign clients."""
    header = f"{'model':<10}" + "".join(f"{s:>17}" for s in SUMMARIES)
    lines = [f"{split} accuracy across benign clients", header, "-" * len(header)]
    for run, view, label in ROWS:
        row = final.get(run, {})
        vals = [row.get(f"{view}/{split}/accuracy/{s}") for s in SUMMARIES]
        if any(v is None for v in vals):
            continue
        lines.append(f"{label:<10}" + "".join(f"{v:>17.4f}" for v in vals))
    return "\n".join(lines)
