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
# # 02 A lambda sweep as ONE compiled program
#
# Ditto's `lam` trades personalization (`lam = 0`: purely local models) against
# the global model (`lam -> inf`: FedAvg). Which `lam` is best depends on how
# different the clients are and how much the attackers poison the global model
# (Li et al., ICML 2021, tune it per dataset), and it differs from client to
# client. `fp.sweep` runs the whole simulation for every lambda under one
# `jax.vmap`: one compilation, one program.
#
# `FEDJAX_PFL_NOTEBOOK_SMOKE=1`: tiny settings; `FEDJAX_PFL_NOTEBOOK_OUT=dir`:
# save the figures there.

# %%
# %matplotlib inline
import os

import jax
import numpy as np

import fedjax_pfl as fp
from fedjax_pfl import algorithms, attacks, data, models, plots

SMOKE = os.environ.get("FEDJAX_PFL_NOTEBOOK_SMOKE") == "1"
OUT = os.environ.get("FEDJAX_PFL_NOTEBOOK_OUT")


def png(name):
    """Where to save a figure (None: only display it)."""
    return None if OUT is None else os.path.join(OUT, name)


if SMOKE:
    NUM_CLIENTS, MAX_SIZE, ROUNDS, EVAL_EVERY, LOCAL_STEPS = 10, 60, 2, 2, 2
    LAMS = [0.0, 0.1, 1.0]
else:
    NUM_CLIENTS, MAX_SIZE, ROUNDS, EVAL_EVERY, LOCAL_STEPS = 60, 500, 150, 25, 20
    LAMS = [0.0, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0]

# %% [markdown]
# ## Data with adversaries
#
# Synthetic(1, 1) clients; half of them are malicious and train on randomly
# relabelled data (attack A1 of the Ditto paper). All summaries are over the
# benign clients only (`eval_mask=threat.benign`).

# %%
clean = data.fedprox_synthetic(1.0, 1.0, num_clients=NUM_CLIENTS, max_size=MAX_SIZE,
                               seed=0)
fed, threat = attacks.setup_attack(clean, "A1", 0.5, num_classes=10, seed=0)
benign = threat.benign > 0
model = models.logistic_regression((60,), 10)
print(f"{fed.num_clients} clients, {int(threat.malicious.sum())} malicious")


def make(lam):
    """One Ditto per lambda; ``lam`` arrives as a traced scalar inside the sweep."""
    return algorithms.ditto(model, lam=lam, client_lr=0.05,
                            num_local_steps=LOCAL_STEPS, batch_size=10,
                            cohort_size=min(10, NUM_CLIENTS), cohort="size_weighted",
                            weighted=False, malicious=threat.malicious)


# %% [markdown]
# ## The sweep
#
# `history[key]` has shape `[len(LAMS), evaluations]`; `states` holds every
# lambda's final state with a leading axis of the same length. The engine
# (`unroll=False`: local steps in a lax.scan, much faster to compile on CPU) is
# given to `sweep`, not to the algorithm.

# %%
key = jax.random.key(0)
hparams = {"lam": LAMS}
states, history = fp.sweep(make, hparams, fed, num_rounds=ROUNDS,
                           eval_every=EVAL_EVERY, key=key, eval_mask=threat.benign,
                           splits=("test",), engine=fp.EngineConfig(unroll=False))
print("benign clients' final test accuracy (mean weighted by test examples; "
      "worst 10 % of clients)")
for lam, mean, worst in zip(LAMS, history["personal/test/accuracy/mean"][:, -1],
                            history["personal/test/accuracy/worst10"][:, -1],
                            strict=True):
    print(f"lam {lam:6.2f}: mean {mean:.3f}, worst 10 % {worst:.3f}")

# %% [markdown]
# ## Accuracy against lambda, and every benign client's own curve
#
# `plots.sweep_per_client` re-evaluates the swept final states (one vmapped
# program) to get the per-client accuracies behind the summaries. The third
# panel shows how differently the clients react to lambda. (On this very
# heterogeneous problem, with half the clients poisoning, the local models,
# lam = 0, do best on average in the full run; see docs/plots.md.)

# %%
per_client = plots.sweep_per_client(make, hparams, states, fed, key=key)
plots.lambda_sweep(LAMS, history, per_client=per_client["personal"][:, benign],
                   title="Ditto personal models under 50 % label poisoning "
                   "(benign clients)", path=png("02_lambda_sweep.png"))

# %% [markdown]
# ## Training curves of every lambda
#
# A sweep history is a dict of arrays; turned into rows it feeds
# `plots.training_curves`.

# %%
rows = [{"round": int(r), **{f"lam = {lam:g}": float(v[i, j]) for i, lam in
                             enumerate(LAMS)}}
        for j, r in enumerate(history["round"])
        for v in [history["personal/test/accuracy/mean"]]]
plots.training_curves(rows, [f"lam = {lam:g}" for lam in LAMS],
                      ylabels="benign clients' test accuracy\n"
                      "(mean weighted by test examples)",
                      title="Ditto's personal models, one line per lambda",
                      path=png("02_curves.png"))

# %% [markdown]
# ## Global vs local (lam = 0) vs the best and the largest lambda, client by client
#
# The best lambda is the one with the highest final mean weighted by test
# examples; the legends give each model's unweighted mean over the benign
# clients.

# %%
best = int(np.nanargmax(history["personal/test/accuracy/mean"][:, -1]))
shown = sorted({LAMS.index(0.0), best, len(LAMS) - 1})
plots.client_accuracy_distribution(
    {"global model": per_client["global"][best],
     **{f"Ditto, lam = {LAMS[i]:g}" + (" (best)" if i == best else ""):
        per_client["personal"][i] for i in shown}},
    mask=threat.benign, title="benign clients' final test accuracy",
    path=png("02_client_accuracy.png"))
