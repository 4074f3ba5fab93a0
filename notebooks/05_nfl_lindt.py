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
# # 05 Negative federated learning: measure it, detect it, recover with LINDT
#
# Lin et al. (LINDT, arXiv 2020) call a federation *negative* (NFL) when the
# model it deploys keeps doing worse on the clients than the private models
# they could train alone: the gain `beta = mean_i (V_i^G - V_i^P)` stays
# below 0. Measuring `beta` needs tests on every client; the server can instead
# watch the weight divergence `Delta = (1/K) sum_k ||w_k - w|| - ||noise||` of
# each round and flag NFL once `Delta > eps` in more than `r'` rounds. LINDT's
# recovery gives every client a persistent local model that reads the global
# model's layers through attaching modules and is never uploaded.
#
# Here the harmful environment is synthetic: very non-IID Synthetic(1, 1)
# clients, 20 % label-poisoning attackers and client-level DP (clip + Gaussian
# noise on the average, the paper's Eq. 4).
#
# `FEDJAX_PFL_NOTEBOOK_SMOKE=1`: tiny settings; `FEDJAX_PFL_NOTEBOOK_OUT=dir`:
# save the figures there.

# %%
# %matplotlib inline
import os

import jax
import numpy as np

import fedjax_pfl as fp
from fedjax_pfl import algorithms, attacks, data, experiments, metrics, plots

SMOKE = os.environ.get("FEDJAX_PFL_NOTEBOOK_SMOKE") == "1"
OUT = os.environ.get("FEDJAX_PFL_NOTEBOOK_OUT")


def png(name):
    """Where to save a figure (None: only display it)."""
    return None if OUT is None else os.path.join(OUT, name)


if SMOKE:  # one run only (LINDT: FedAvg until detection, then the dual model)
    NUM_CLIENTS, MAX_SIZE, ROUNDS, LOCAL_STEPS, R_PRIME = 10, 60, 3, 2, 1
    MODES = {"LINDT (detect, then recover)": "detect"}
else:
    NUM_CLIENTS, MAX_SIZE, ROUNDS, LOCAL_STEPS, R_PRIME = 50, 400, 150, 10, 30
    MODES = {"FedAvg": "off", "LINDT (detect, then recover)": "detect"}
EPS, CLIP, NOISE_STD = 0.1, 5.0, 0.01

# %% [markdown]
# ## The harmful environment and the private reference models
#
# `experiments.private_accuracy` trains every client's private model alone (in the
# same engine) and returns each client's test accuracy `V_i^P`, taken at the
# client's best evaluation (its default: an optimistic reference).

# %%
clean = data.fedprox_synthetic(1.0, 1.0, num_clients=NUM_CLIENTS, max_size=MAX_SIZE,
                               seed=0)
fed, threat = attacks.setup_attack(clean, "A1", 0.2, num_classes=10, seed=0)
dual = algorithms.dual_mlp((60,), 10, hidden=(32,))
key = jax.random.key(0)
private_acc = experiments.private_accuracy(
    dual.model, fed, jax.random.key(1), client_lr=0.05, batch_size=10,
    num_local_steps=LOCAL_STEPS, num_rounds=1 if SMOKE else 20,
    eval_every=1 if SMOKE else 5)
benign = threat.benign > 0
print(f"private models: test accuracy {np.nanmean(private_acc[benign]):.3f} "
      "(unweighted mean over benign clients)")

# %% [markdown]
# ## FedAvg (detector on, no recovery) vs LINDT
#
# `algorithms.lindt(mode='off')` is FedAvg with the paper's DP and the NFL
# detector; `mode='detect'` runs FedAvg until the detector fires, then switches
# every client to the dual model. Every round's metrics carry `nfl/delta` and
# `nfl/detected`; `metrics.gain_callback` adds `nfl/beta` (in percentage points,
# an unweighted mean over the benign clients) to every history row. We evaluate
# every round to see `Delta` round by round.

# %%
runs, histories = {}, {}
for name, mode in MODES.items():
    alg = algorithms.lindt(dual, mode=mode, client_lr=0.05,
                           num_local_steps=LOCAL_STEPS, batch_size=10,
                           cohort_size=min(10, NUM_CLIENTS), clip=CLIP,
                           noise_std=NOISE_STD, malicious=threat.malicious,
                           eps=EPS, r_prime=R_PRIME)
    res = fp.simulate(alg, fed, num_rounds=ROUNDS, eval_every=1, key=key,
                      splits=("test",), eval_mask=threat.benign, progress=False,
                      callback=metrics.gain_callback(alg, fed, private_acc,
                                                     mask=threat.benign))
    runs[name], histories[name] = (alg, res), res.history
    last = res.history[-1]
    rounds = [r["round"] for r in res.history if r.get("nfl/detected")]
    print(f"{name}: beta {last['nfl/beta']:+.2f} points, deployed accuracy "
          f"{last['nfl/local_acc']:.1f} % (unweighted means over benign clients), "
          "NFL detected at round "
          f"{rounds[0] if rounds else None}")

# %% [markdown]
# ## Delta, the detection round, and beta
#
# The paper (App. C.6) notes that switching recovery on does not bring Delta
# down: Delta measures the harm done to the federation (non-IID data,
# attackers, noise), not the quality of the personal models; beta is what
# recovery improves. Compare the two runs' Delta over the last third of the
# rounds:

# %%
tail = ROUNDS - ROUNDS // 3
for name, rows in histories.items():
    deltas = [r["nfl/delta"] for r in rows if r["round"] > tail and "nfl/delta" in r]
    print(f"{name}: mean Delta over rounds {tail + 1}..{ROUNDS}: "
          f"{np.mean(deltas):.3f}")

# %%
plots.nfl_curves(histories["LINDT (detect, then recover)"], epsilon=EPS,
                 title="LINDT with detection: Delta per round and beta "
                 "(benign clients, percentage points)", path=png("05_nfl.png"))

# %%
gains = [{"round": rows[0]["round"], **{name: row["nfl/beta"] for name, row in
                                        zip(histories, rows, strict=True)}}
         for rows in zip(*histories.values(), strict=True)]
plots.training_curves(gains, list(histories),
                      ylabels="beta = deployed - private accuracy\n"
                      "(points, unweighted mean)",
                      title="gain over the private models, benign clients",
                      path=png("05_beta.png"))

# %% [markdown]
# ## Client by client: `beta_i = V_i^G - V_i^P`
#
# The deployed model is FedAvg's global model and LINDT's local head
# (`personal`). Left of 0: the client would have been better off alone.

# %%
deployed = {"FedAvg": "global", "LINDT (detect, then recover)": "personal"}
client_gain = {}
for name, (alg, res) in runs.items():
    acc = plots.per_client_metric(alg, res.state, fed, key=key)[deployed[name]]
    client_gain[name] = 100 * np.asarray(metrics.client_gain(acc, private_acc))
plots.client_accuracy_distribution(
    client_gain, mask=threat.benign, kind="both",
    xlabel="beta_i = deployed - private test accuracy (points)",
    title=f"per-client gain after {ROUNDS} rounds (benign clients)",
    path=png("05_client_gain.png"))
