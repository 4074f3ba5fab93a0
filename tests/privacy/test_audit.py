"""The empirical audit: Clopper-Pearson and the epsilon lower bound, then
canary audits of local DP-SGD (``privacy.dp_local_train``) and client-level
DP-FedAvg (``privacy.client_level_dp`` under ``algorithms.fedavg``), each
compared with the accountant: the honest mechanism stays below its epsilon,
the same mechanism with the noise or the clipping switched off goes above."""

import importlib.util
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedjax_pfl import privacy

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
# The canaries and runs are the audit benchmark's (benchmarks/privacy_audit.py):
# a linear model w -> <w, x> with the linear loss -y <w, x>, so every example's
# gradient -y x does not depend on w; the other records have x = 0 (zero
# gradient) and the canary's x is 100 e_0, far above the clip, so after
# clipping it moves w_0 by exactly the clip per use. A run's score is its final
# w_0 (w starts at 0).

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def _bench():
    spec = importlib.util.spec_from_file_location("privacy_audit",
                                                  BENCH / "privacy_audit.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["privacy_audit"] = mod
    spec.loader.exec_module(mod)
    return mod


def _audit(audit, noise, seed):
    """Each mechanism's lower bound from ``RUNS`` runs per world; asserts
    honest < accountant < broken (noise off; clipping off: a clip the canary
    never reaches, with the noise still sigma * clip)."""
    bench = _bench()
    cfg = bench.CONFIGS[audit]
    scores_fn = bench.SCORES[audit](cfg, RUNS)
    accountant_eps = bench.accountant_epsilon(audit, cfg, noise, DELTA)
    results = {}
    for i, name in enumerate(bench.MECHANISMS):
        clip, z = bench.mechanism(name, cfg["clip"], noise, cfg["canary_norm"])
        out, in_ = scores_fn(jnp.float32(clip), jnp.float32(z),
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


def test_audit_local_dp_sgd():
    """Sample-level DP-SGD of one client (Poisson q 0.25, 10 steps, sigma 2):
    ``privacy.dp_local_train`` on 199 zero records with and without the canary
    (add/remove)."""
    _audit("local_dp_sgd", 2.0, seed=10)


def test_audit_client_level_dp_fedavg():
    """Client-level DP-FedAvg (10 clients, a uniform cohort of 5, 4 rounds,
    z 5): the canary client holds the canary or a zero record (replace-one)."""
    _audit("client_dp_fedavg", 5.0, seed=20)
