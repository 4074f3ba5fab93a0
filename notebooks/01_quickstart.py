# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 Quickstart: Ditto vs FedAvg on synthetic federated data
#
# One shared model (FedAvg, McMahan et al. 2017) against one personal model per
# client (Ditto, Li et al. 2021) on FedProx's Synthetic(1, 1) problem: 60
# features, 10 classes, and every client has its own softmax-regression truth, so
# one global model cannot fit everyone.
#
# Set `FEDJAX_PFL_NOTEBOOK_SMOKE=1` for a seconds-long run with tiny settings
# (what the tests do) and `FEDJAX_PFL_NOTEBOOK_OUT=dir` to also save the figures
# as PNGs.

# %%
# %matplotlib inline
import os

import jax
import numpy as np

import fedjax_pfl as fp
from fedjax_pfl import algorithms, data, models, plots

SMOKE = os.environ.get("FEDJAX_PFL_NOTEBOOK_SMOKE") == "1"
OUT = os.environ.get("FEDJAX_PFL_NOTEBOOK_OUT")


def png(name):
    """Where to save a figure (None: only display it)."""
    return None if OUT is None else os.path.join(OUT, name)


if SMOKE:
    NUM_CLIENTS, MAX_SIZE, ROUNDS, EVAL_EVERY, LOCAL_STEPS = 10, 60, 2, 1, 2
else:
    NUM_CLIENTS, MAX_SIZE, ROUNDS, EVAL_EVERY, LOCAL_STEPS = 100, 1000, 200, 20, 20

# %% [markdown]
# ## Data and model
#
# `fedprox_synthetic` draws ragged clients (log-normal sizes); they are stored
# flat with offsets, never padded. Every client has a train and a test split.

# %%
fed = data.fedprox_synthetic(1.0, 1.0, num_clients=NUM_CLIENTS, max_size=MAX_SIZE,
                             seed=0)
model = models.logistic_regression((60,), 10)
sizes = np.asarray(fed.train.counts)
print(f"{fed.num_clients} clients, {fed.train.num_examples} training examples, "
      f"client sizes {sizes.min()}..{sizes.max()}")

# %% [markdown]
# ## Two algorithms, same local work
#
# Both sample 10 clients per round; each runs 20 local SGD steps on batches of
# 10 (2 in the smoke run). FedAvg deploys its global model on every client.
# Ditto trains the same global model and, on every sampled client, a personal
# model `v_k` pulled towards it by `lam/2 ||v_k - w||^2`.

# %%
common = {"client_lr": 0.05, "num_local_steps": LOCAL_STEPS, "batch_size": 10,
              "cohort_size": min(10, NUM_CLIENTS)}
runs = {
    "FedAvg": algorithms.fedavg(model, **common),
    # Ditto's Algorithm 2 setting: clients sampled by size, an unweighted mean
    "Ditto": algorithms.ditto(model, lam=1.0, cohort="size_weighted",
                              weighted=False, **common),
}
# How the rounds execute is the driver's business, not the algorithms':
# unroll=False runs the local steps in a lax.scan, which compiles much faster
# than the CPU default (unrolled steps, faster for conv nets); same results up
# to float rounding.
engine = fp.EngineConfig(unroll=False)
key = jax.random.key(0)
results = {name: fp.simulate(alg, fed, num_rounds=ROUNDS, eval_every=EVAL_EVERY,
                             key=key, splits=("test",), progress=False,
                             engine=engine)
           for name, alg in runs.items()}
for name, res in results.items():
    last = res.history[-1]
    view = "personal" if name == "Ditto" else "global"
    print(f"{name:7s} {view:8s} test accuracy: mean weighted by test examples "
          f"{last[f'{view}/test/accuracy/mean']:.3f}, worst 10 % "
          f"{last[f'{view}/test/accuracy/worst10']:.3f}, std "
          f"{last[f'{view}/test/accuracy/std']:.3f}")

# %% [markdown]
# ## Training curves
#
# `simulate` returns one history row per evaluation: for every model it
# evaluates, split and metric, the mean over clients weighted by their numbers
# of test examples (`.../mean`), the unweighted mean (`.../mean_unweighted`),
# the std across clients (unweighted) and the unweighted means of the worst /
# best 10 % of clients. Merging the two runs' rows lets one figure compare
# them.

# %%
merged = [
    {"round": a["round"],
     "FedAvg global": a["global/test/accuracy/mean"],
     "Ditto personal": b["personal/test/accuracy/mean"],
     "FedAvg global, worst 10 %": a["global/test/accuracy/worst10"],
     "Ditto personal, worst 10 %": b["personal/test/accuracy/worst10"]}
    for a, b in zip(results["FedAvg"].history, results["Ditto"].history, strict=True)
]
plots.training_curves(
    merged,
    [["FedAvg global", "Ditto personal"],
     ["FedAvg global, worst 10 %", "Ditto personal, worst 10 %"]],
    ylabels=["test accuracy\n(mean weighted by test examples)",
             "test accuracy\n(worst 10 % of clients, unweighted mean)"],
    title="FedAvg's global model vs Ditto's personal models",
    path=png("01_training_curves.png"))

# %% [markdown]
# ## Who gains? The per-client accuracy distribution
#
# The history keeps only summaries; `plots.per_client_metric` re-evaluates the
# final state exactly as `simulate` did (same key) and returns one value per
# client. A CDF further to the right is better for more clients. Every client
# counts once here (the legends give unweighted means), whereas the history's
# `mean` weights the clients by their test examples: the two differ when the
# large clients fare better or worse than the small ones.

# %%
per_client = {
    "FedAvg global": plots.per_client_metric(runs["FedAvg"], results["FedAvg"].state,
                                             fed, key=key)["global"],
    "Ditto personal": plots.per_client_metric(runs["Ditto"], results["Ditto"].state,
                                              fed, key=key)["personal"],
}
print({k: round(float(np.nanmean(v)), 3) for k, v in per_client.items()},
      "(unweighted means)")
plots.client_accuracy_distribution(
    per_client, kind="both", title=f"final test accuracy of the {fed.num_clients} "
    f"clients after {ROUNDS} rounds", path=png("01_client_accuracy.png"))
