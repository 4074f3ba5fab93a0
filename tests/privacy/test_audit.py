"""The empirical audit: Clopper-Pearson and the epsilon lower bound, then
canary audits of local DP-SGD (``privacy.dp_local_train``) and client-level
DP-FedAvg (``privacy.client_level_dp`` under ``algorithms.fedavg``), each
compared with the accountant: the honest mechanism stays below its epsilon,
the same mechanism with the noise or the clipping switched off goes above."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedjax_pfl import aggregators, algorithms, models, privacy
from fedjax_pfl import data as fdata
from fedjax_pfl.core import EngineConfig, execution

DELTA = 1e-5
RUNS = 4000  # per world: 2000 choose the threshold, 2000 give the bound

# ------------------------------------------------------------------ statistics


@pytest.mark.parametrize("k,n,alpha", [(0, 10, 0.05), (3, 10, 0.05), (10, 10, 0.05),
                                       (17, 2000, 0.05), (999, 1000, 0.01),
                                       (50, 100, 0.2)])
def test_clopper_pearson_matches_scipy_exact_interval(k, n, alpha):
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=1 - alpha,
                                             method="exact")
    lo, hi = privacy.clopper_pearson(k, n, alpha)
    assert lo == pytest.approx(ci.low, rel=1e-9, abs=1e-12)
    assert hi == pytest.approx(ci.high, rel=1e-9, abs=1e-12)


def test_identical_scores_give_zero():
    s = np.random.default_rng(0).normal(size=3000)
    for threshold in (None, 0.0, -1.0, 2.0):
        r = privacy.epsilon_lower_bound(s, s, DELTA, threshold=threshold)
        assert r.epsilon == 0.0 and r.tpr == r.fpr


def test_separated_scores_give_the_closed_form():
    """Every "in" score above every "out" score: on the held-out halves TPR = 1
    and FPR = 0, so TPR_lo = (alpha/2)^(1/n), FPR_hi = 1 - (alpha/2)^(1/n)."""
    rng = np.random.default_rng(1)
    eps = {}
    for n, alpha in ((200, 0.05), (4000, 0.05), (4000, 0.01)):
        out = rng.normal(size=n)
        r = privacy.epsilon_lower_bound(out, out + 100.0, DELTA, alpha=alpha)
        lo = (alpha / 2) ** (1 / (n // 2))
        assert r.tpr == 1.0 and r.fpr == 0.0 and r.trials_in == n // 2
        assert r.epsilon == pytest.approx(np.log((lo - DELTA) / (1 - lo)), rel=1e-9)
        eps[n, alpha] = r.epsilon
    # more runs show more; more confidence shows less
    assert eps[200, 0.05] < eps[4000, 0.01] < eps[4000, 0.05]
    assert eps[4000, 0.05] > 6.0


def test_the_threshold_is_chosen_on_the_first_halves_only():
    """First halves perfectly separated, second halves the same scores: the
    chosen threshold separates the first halves (TPR = 1 there) but the bound
    comes from the second, where the worlds agree, so it is 0. A bound computed
    on the selection half would be about 6.3."""
    rng = np.random.default_rng(2)
    n = 2000
    shared = rng.normal(size=n)
    out = np.concatenate([rng.uniform(-2, -1, n), shared])
    in_ = np.concatenate([rng.uniform(1, 2, n), shared])
    r = privacy.epsilon_lower_bound(out, in_, DELTA)
    assert -2 <= r.threshold < 1 and r.trials_out == r.trials_in == n
    assert r.epsilon == 0.0 and r.tpr == r.fpr
    on_selection = privacy.epsilon_lower_bound(out[:n], in_[:n], DELTA,
                                               threshold=r.threshold)
    assert on_selection.epsilon > 6.0
    # odd lengths: the first len // 2 runs choose, the rest count
    r = privacy.epsilon_lower_bound(out[:7], in_[:9], DELTA)
    assert (r.trials_out, r.trials_in) == (4, 5)


def test_a_fixed_threshold_uses_every_run():
    out, in_ = np.arange(10.0), np.arange(10.0) + 3
    r = privacy.epsilon_lower_bound(out, in_, 0.0, threshold=6.5, alpha=0.1)
    assert (r.trials_out, r.trials_in, r.tpr, r.fpr) == (10, 10, 0.6, 0.3)
    assert r.tpr_lo == privacy.clopper_pearson(6, 10, 0.1)[0]
    assert r.fpr_hi == privacy.clopper_pearson(3, 10, 0.1)[1]
    expect = max(0.0, np.log(r.tpr_lo / r.fpr_hi),
                 np.log((1 - r.fpr_hi) / (1 - r.tpr_lo)))
    assert r.epsilon == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("kwargs,name", [
    (dict(successes=-1, trials=10), "successes"),
    (dict(successes=11, trials=10), "successes"),
    (dict(successes=1.5, trials=10), "successes"),
    (dict(successes=0, trials=0), "trials"),
    (dict(successes=0, trials=True), "trials"),
    (dict(successes=1, trials=10, alpha=0.0), "alpha"),
    (dict(successes=1, trials=10, alpha=1.0), "alpha"),
])
def test_clopper_pearson_refuses_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        privacy.clopper_pearson(**kwargs)


GOOD = np.arange(4.0)


@pytest.mark.parametrize("args,kwargs,name", [
    ((GOOD[:1], GOOD, DELTA), {}, "scores_out"),
    ((GOOD, np.ones((2, 2)), DELTA), {}, "scores_in"),
    ((np.array([0.0, np.nan]), GOOD, DELTA), {}, "scores_out"),
    ((GOOD, [0.0, np.inf], DELTA), {}, "scores_in"),
    ((["a", "b"], GOOD, DELTA), {}, "scores_out"),
    ((GOOD, [[0.0], [1.0, 2.0]], DELTA), {}, "scores_in"),
    ((GOOD, GOOD, 1.0), {}, "delta"),
    ((GOOD, GOOD, -0.1), {}, "delta"),
    ((GOOD, GOOD, DELTA), {"alpha": 0.0}, "alpha"),
    ((GOOD, GOOD, DELTA), {"alpha": 1.5}, "alpha"),
    ((GOOD, GOOD, DELTA), {"threshold": np.nan}, "threshold"),
    ((GOOD, GOOD, DELTA), {"threshold": [0.0]}, "threshold"),
])
def test_epsilon_lower_bound_refuses_bad_arguments(args, kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        privacy.epsilon_lower_bound(*args, **kwargs)


# ------------------------------------------------- audits of the real mechanisms
# A white-box canary: a linear model w -> <w, x> with the linear loss
# -y <w, x>, so every example's gradient -y x does not depend on w. The other
# records have x = 0 (zero gradient); the canary's x is CANARY e_0, far above
# the clip, so after clipping it moves w_0 by exactly the clip per use. The
# score of a run is the final w_0 (w starts at 0).

D, CANARY = 2, 100.0
MODEL = models.from_flax(
    nn.Dense(1, use_bias=False, kernel_init=nn.initializers.zeros), (D,),
    loss="squared_error")._replace(loss=lambda out, y: -out[:, 0] * y)


def _records(n, canary):
    x = np.zeros((n, D), np.float32)
    if canary:
        x[0, 0] = CANARY
    return x, np.ones((n,), np.float32)


def _mechanisms(clip, noise):
    """(clip, noise multiplier) of the honest mechanism and of two broken ones:
    no noise, and no clipping (a clip the canary never reaches, with the noise
    still sigma * clip: ``clip = inf`` would make the noise std infinite)."""
    loose = 2.0 * CANARY
    return {"honest": (clip, noise), "noise_off": (clip, 0.0),
            "clip_off": (loose, noise * clip / loose)}


def _audit(scores_fn, mechanisms, accountant_eps, seed):
    """Each mechanism's lower bound; asserts honest < accountant < broken."""
    results = {}
    for i, (name, (clip, noise)) in enumerate(mechanisms.items()):
        out, in_ = scores_fn(jnp.float32(clip), jnp.float32(noise),
                             jax.random.key(seed + i))
        results[name] = privacy.epsilon_lower_bound(np.asarray(out),
                                                    np.asarray(in_), DELTA)
    msg = (f"accountant eps {accountant_eps:.3f}; audited: " + ", ".join(
        f"{k} {r.epsilon:.3f} (t={r.threshold:.4g}, TPR {r.tpr:.4f}, FPR "
        f"{r.fpr:.4f})" for k, r in results.items()))
    print(msg)
    assert results["honest"].epsilon < accountant_eps, msg
    assert results["noise_off"].epsilon > accountant_eps, msg
    assert results["clip_off"].epsilon > accountant_eps, msg
    return results


# (a) sample-level DP-SGD of one client: Poisson rate Q, K local steps.
Q, K, SIGMA, CLIP, N_ZERO = 0.25, 10, 2.0, 1.0, 199


@jax.jit
def _local_scores(clip, noise, key):
    """``RUNS`` runs of ``dp_local_train`` per world, one program: client 0
    holds the world without the canary (N_ZERO zero records), client 1 the
    world with it (the canary + the same records: add/remove adjacency)."""
    data = fdata.from_client_arrays([_records(N_ZERO, False),
                                     _records(N_ZERO + 1, True)])
    dp = privacy.make_dp_config(clip, noise, "poisson", sampling_rate=Q,
                                max_batch_size=N_ZERO + 1, normalize="expected")
    params = MODEL.init(jax.random.key(0))

    def run(client, k):
        p, _, _ = privacy.dp_local_train(MODEL, params, data.train, client, k,
                                         lr=1.0, num_steps=K, batch_size=1,
                                         sampling="poisson", dp=dp)
        return p["kernel"][0, 0]

    clients = jnp.repeat(jnp.arange(2), RUNS)
    scores = jax.vmap(run)(clients, jax.random.split(key, 2 * RUNS))
    return scores[:RUNS], scores[RUNS:]


def test_audit_local_dp_sgd():
    eps = privacy.epsilon(privacy.dp_sgd_event(Q, SIGMA, 1, K), DELTA)
    _audit(_local_scores, _mechanisms(CLIP, SIGMA), eps, seed=10)


# (b) client-level DP-FedAvg: N clients, a uniform cohort of M, T rounds.
N, M, T, S, Z = 10, 5, 4, 1.0, 5.0


@jax.jit
def _client_scores(clip, noise, key):
    """``RUNS`` runs of ``T`` rounds of DP-FedAvg per world, one program. Every
    client holds one record: zeros, except client 0 in the world with the
    canary (replace-one adjacency: in the other world it holds zeros). Local
    training is one full-batch step with rate 1, so client 0's update is
    ``CANARY e_0`` there, clipped to ``S e_0``; every other update is 0."""
    base = fdata.from_client_arrays([_records(1, False) for _ in range(N)])
    x_in = base.train.x.at[0, 0].set(CANARY)
    alg = algorithms.fedavg(
        MODEL, client_lr=1.0, num_local_steps=1, batch_size=1,
        sampling="full_batch", cohort_size=M, cohort="uniform",
        aggregator=privacy.client_level_dp(aggregators.mean(weighted=False),
                                           clip, noise))

    def run(world, k):
        x = jnp.where(world, x_in, base.train.x)
        data = dataclasses.replace(base, train=dataclasses.replace(base.train, x=x))
        state = alg.init(jax.random.key(0), data)
        with execution(EngineConfig("vmap")):
            state, _ = jax.lax.scan(lambda s, _: alg.round_step(s, data, k), state,
                                    None, length=T)
        return state.server.params["kernel"][0, 0]

    worlds = jnp.repeat(jnp.arange(2) > 0, RUNS)
    scores = jax.vmap(run)(worlds, jax.random.split(key, 2 * RUNS))
    return scores[:RUNS], scores[RUNS:]


def test_audit_client_level_dp_fedavg():
    eps = privacy.epsilon(
        privacy.client_level_event(M, N, Z, T, sampling="fixed_size"), DELTA)
    _audit(_client_scores, _mechanisms(S, Z), eps, seed=20)
