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
# # 04 Privacy: DP-FedAvg, FedFDP, epsilon and the privacy monitor
#
# Sample-level differential privacy for every client: each local step clips
# every example's gradient to norm `C` and adds `N(0, sigma^2 C^2)` noise
# (DP-SGD with Poisson batches of rate `q`). `algorithms.dp_fedavg` is FedAvg
# with such clients; `algorithms.fedfdp` (Ling et al.) adds fairness weights
# `1 + lam (loss - F_hat)` and a private loss release. Epsilon is computed on
# the host by `dp_accounting` (never inside jit); `privacy.Monitor` adds it to
# every history row and can stop a run at a budget.
#
# `FEDJAX_PFL_NOTEBOOK_SMOKE=1`: tiny settings; `FEDJAX_PFL_NOTEBOOK_OUT=dir`:
# save the figures there.

# %%
# %matplotlib inline
import os

import jax

import fedjax_pfl as fp
from fedjax_pfl import algorithms, data, models, plots, privacy

SMOKE = os.environ.get("FEDJAX_PFL_NOTEBOOK_SMOKE") == "1"
OUT = os.environ.get("FEDJAX_PFL_NOTEBOOK_OUT")


def png(name):
    """Where to save a figure (None: only display it)."""
    return None if OUT is None else os.path.join(OUT, name)


if SMOKE:
    NUM_CLIENTS, MAX_SIZE, ROUNDS, EVAL_EVERY = 10, 60, 2, 1
else:
    NUM_CLIENTS, MAX_SIZE, ROUNDS, EVAL_EVERY = 50, 500, 300, 10
DELTA, Q, STEPS = 1e-5, 0.05, 1

# %% [markdown]
# ## Epsilon before training: the accountant alone
#
# `privacy.dp_sgd_event(q, sigma, rounds, local_steps)` describes a client's
# whole run (every round counted, no amplification claimed from cohort
# sampling); `privacy.epsilon` converts it at `delta` (RDP by default, PLD on
# request). This needs no model and no data.

# %%
grid = [1, 10, 25, 50, 100, 200, 300] if not SMOKE else [1, 10]
sigmas = (1.0, 1.5, 2.0)
rows = [{"round": t, **{f"sigma = {s:g}/epsilon": privacy.epsilon(
    privacy.dp_sgd_event(Q, s, t, STEPS), DELTA) for s in sigmas}} for t in grid]
print({k: round(v, 3) for k, v in rows[-1].items()})
plots.training_curves(rows, [f"sigma = {s:g}/epsilon" for s in sigmas],
                      labels={f"sigma = {s:g}/epsilon": f"sigma = {s:g}"
                              for s in sigmas},
                      title=f"DP-SGD epsilon at delta = {DELTA:g} "
                      f"(q = {Q}, {STEPS} step per round, RDP)",
                      path=png("04_epsilon.png"))

# %% [markdown]
# ## DP-FedAvg with a privacy budget
#
# The monitor adds `privacy/epsilon` to every row; with `target_epsilon` the
# run stops before the evaluation chunk whose end would exceed the budget.
# `simulate` reports an epsilon only for an accounted mechanism: with the
# FedFDP paper's normaliser (`normalize="realized"`, the realised batch size,
# which depends on the data) `privacy.Monitor.of` refuses and says why.

# %%
fed = data.fedprox_synthetic(1.0, 1.0, num_clients=NUM_CLIENTS, max_size=MAX_SIZE,
                             seed=0)
model = models.logistic_regression((60,), 10)
SIGMA, CLIP, TARGET = 1.0, 1.0, 4.0
dp_alg = algorithms.dp_fedavg(model, clip=CLIP, noise_multiplier=SIGMA,
                              sampling_rate=Q, num_local_steps=STEPS, client_lr=0.5,
                              cohort_size=min(10, NUM_CLIENTS))
# The algorithm declares the mechanism it runs; the monitor accounts exactly that.
print(dp_alg.privacy(fed).description)
monitor = privacy.Monitor.of(dp_alg, fed, DELTA, target_epsilon=TARGET)
key = jax.random.key(0)
dp_res = fp.simulate(dp_alg, fed, num_rounds=ROUNDS, eval_every=EVAL_EVERY, key=key,
                     splits=("test",), privacy=monitor, progress=False)
last = dp_res.history[-1]
print(f"ran {dp_res.rounds_run} of {ROUNDS} rounds (stopped by the budget: "
      f"{dp_res.privacy_stopped}); epsilon {last['privacy/epsilon']:.3f}, "
      f"test accuracy {last['global/test/accuracy/mean']:.3f} (mean weighted by "
      "test examples)")
plots.training_curves(dp_res, [["global/test/accuracy/mean"], ["privacy/epsilon"]],
                      labels={"global/test/accuracy/mean": "DP-FedAvg global model",
                              "privacy/epsilon": f"epsilon (target {TARGET:g})"},
                      ylabels=["test accuracy", f"epsilon at delta = {DELTA:g}"],
                      title=f"DP-FedAvg, sigma = {SIGMA:g}, C = {CLIP:g}, q = {Q}",
                      path=png("04_dp_fedavg.png"))

# %% [markdown]
# ## FedFDP: fairness weights under the same guarantee
#
# FedFDP (the paper's setting: all clients every round, one local step at
# lr = 1, C = 0.1, sigma = 2) reweights every example by
# `1 + lam (loss - F_hat)`, so clients the model
# serves badly pull harder; its epsilon composes the gradient steps with one
# noisy loss release per round (`privacy.fedfdp_event`), whatever `lam` is.
# `lam = 0` is DP-FedSGD with the same clipping and noise: the fair comparison.
# `lam` may be traced, so the comparison is one `fp.sweep` program. (With these
# settings on this synthetic problem the two runs end up nearly the same:
# numbers of the full run in docs/plots.md.)

# %%
fdp_rounds = ROUNDS // 3 if not SMOKE else ROUNDS
lams = {"lam": [0.0, 1.0]}


def make_fedfdp(lam):
    return algorithms.fedfdp(model, lam=lam, cohort="full", num_local_steps=1,
                             client_lr=1.0)


states, hist = fp.sweep(make_fedfdp, lams, fed, num_rounds=fdp_rounds, key=key,
                        splits=("test",))
eps = privacy.epsilon(privacy.fedfdp_event(0.05, 2.0, fdp_rounds, 5.0), DELTA)
for i, lam in enumerate(lams["lam"]):
    print(f"lam {lam:g}: test accuracy {hist['global/test/accuracy/mean'][i, -1]:.3f}"
          f" (mean weighted by test examples), std across clients "
          f"{hist['global/test/accuracy/std'][i, -1]:.3f}, Psi(loss) "
          f"{hist['global/test/loss/psi'][i, -1]:.4f}")
print(f"epsilon of either run after {fdp_rounds} rounds: {eps:.2f} at delta "
      f"{DELTA:g}")
per_client = plots.sweep_per_client(make_fedfdp, lams, states, fed, key=key)
plots.client_accuracy_distribution(
    {f"FedFDP lam = {lam:g}": per_client["global"][i]
     for i, lam in enumerate(lams["lam"])},
    title=f"FedFDP after {fdp_rounds} rounds (epsilon {eps:.2f}): per-client "
    "test accuracy", path=png("04_fedfdp_clients.png"))
