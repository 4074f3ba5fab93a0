"""The default job: global, local and finetuned models on synthetic federated data."""

from __future__ import annotations

import dataclasses
import time

import jax

from fedjax_pfl import algorithms, models
from fedjax_pfl.core import simulate
from fedjax_pfl.data import fedprox_synthetic

SUMMARIES = ("mean", "mean_unweighted", "std", "worst10", "best10")


@dataclasses.dataclass
class DemoConfig:
    """Settings of the default run (FedProx Synthetic(1, 1), multinomial LR)."""

    alpha: float = 1.0
    beta: float = 1.0
    num_clients: int = 100
    max_size: int = 1000
    num_rounds: int = 200
    eval_every: int = 50
    cohort_size: int = 10
    num_local_steps: int = 20
    batch_size: int = 10
    client_lr: float = 0.05
    finetune_steps: int = 20
    seed: int = 0


def run_demo(cfg: DemoConfig = DemoConfig(), *, progress: bool = True) -> dict:
    """Trains FedAvg (global + finetuned) and local models; returns final metrics."""
    data = fedprox_synthetic(cfg.alpha, cfg.beta, num_clients=cfg.num_clients,
                             max_size=cfg.max_size, seed=cfg.seed)
    model = models.logistic_regression((60,), 10)
    common = dict(client_lr=cfg.client_lr, num_local_steps=cfg.num_local_steps,
                  batch_size=cfg.batch_size, cohort_size=cfg.cohort_size)
    runs = {
        "fedavg": algorithms.fedavg(model, finetune_steps=cfg.finetune_steps,
                                    **common),
        "local": algorithms.local_only(model, **common),
    }
    final = {"data": {
        "clients": data.num_clients,
        "train_examples": data.train.num_examples,
        "test_examples": data.test.num_examples,
    }}
    for name, alg in runs.items():
        t0 = time.perf_counter()
        res = simulate(alg, data, num_rounds=cfg.num_rounds,
                       eval_every=cfg.eval_every, key=jax.random.key(cfg.seed),
                       progress=progress)
        final[name] = dict(res.history[-1], wall_seconds=time.perf_counter() - t0)
    return final


def format_table(final: dict, split: str = "test") -> str:
    """One row per evaluated model: accuracy summaries across clients."""
    rows = []
    for run, label in (("fedavg", "global"), ("local", "personal"),
                       ("fedavg", "finetuned")):
        row = final.get(run, {})
        name = {"personal": "local"}.get(label, label)
        vals = [row.get(f"{label}/{split}/accuracy/{s}") for s in SUMMARIES]
        if all(v is None for v in vals):
            continue
        rows.append((name, vals))
    header = f"{'model':<10}" + "".join(f"{s:>17}" for s in SUMMARIES)
    lines = [f"{split} accuracy across clients", header, "-" * len(header)]
    for name, vals in rows:
        lines.append(f"{name:<10}" + "".join(f"{v:>17.4f}" for v in vals))
    return "\n".join(lines)
