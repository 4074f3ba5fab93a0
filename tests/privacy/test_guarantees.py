"""What an epsilon means: every DP algorithm declares its mechanism, an epsilon
is reported only for an accounted one whose event the monitor gives, and the
combinations that break the guarantee are refused before any work."""

import jax
import numpy as np
import pytest
from scipy.stats import binom

import fedjax_pfl as fp
from fedjax_pfl import aggregators, algorithms, models, privacy
from fedjax_pfl import data as fdata

MODEL = models.mlp((6,), 3, hidden=(8,))
DELTA = 1e-5
Q, SIGMA, STEPS = 0.2, 1.0, 2
DP = dict(clip=1.0, noise_multiplier=SIGMA, sampling_rate=Q, num_local_steps=STEPS,
          cohort_size=3)


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=5, dim=6, num_classes=3,
                                   min_size=10, max_size=40, fractions=(0.8, 0, 0.2),
                                   seed=3)


def _eps(mech, t):
    return privacy.epsilon(mech.event(t), DELTA)


def _run(alg, data, mon, rounds=2):
    return fp.simulate(alg, data, num_rounds=rounds, eval_every=rounds,
                       key=jax.random.key(0), progress=False, privacy=mon)


def test_dp_fedavg_declares_dp_sgd_and_simulate_reports_it(data):
    alg = algorithms.dp_fedavg(MODEL, **DP)
    mech = alg.privacy(data)
    assert mech.accounted and mech.level == "sample"
    assert mech.settings["normalize"] == "expected"  # the accounted default
    want = privacy.epsilon(privacy.dp_sgd_event(Q, SIGMA, 2, STEPS), DELTA)
    assert _eps(mech, 2) == want
    res = _run(alg, data, privacy.Monitor.of(alg, data, DELTA), rounds=2)
    assert res.history[-1]["privacy/epsilon"] == want
    # the bare event passes simulate's check too, when it is the declared one
    mon = privacy.Monitor(lambda t: privacy.dp_sgd_event(Q, SIGMA, t, STEPS), DELTA)
    mon.bind(alg, data)
    assert mon.epsilon(2) == want


def test_epsilon_of_another_mechanism_is_refused(data):
    alg = algorithms.dp_fedavg(MODEL, **DP)
    wrong = privacy.Monitor(lambda t: privacy.dp_sgd_event(Q, 2 * SIGMA, t, STEPS),
                            DELTA)
    with pytest.raises(ValueError, match="privacy: the monitor's event gives"):
        _run(alg, data, wrong)
    one_step = privacy.Monitor(lambda t: privacy.dp_sgd_event(Q, SIGMA, t, 1), DELTA)
    with pytest.raises(ValueError, match="privacy: the monitor's event"):
        _run(alg, data, one_step)
    plain = algorithms.fedavg(MODEL, cohort_size=3)
    with pytest.raises(ValueError, match="privacy: this algorithm declares no"):
        _run(plain, data, wrong)
    with pytest.raises(ValueError, match="privacy: this algorithm declares no"):
        privacy.Monitor.of(plain, data, DELTA)


@pytest.mark.parametrize("kwargs, why", [
    (dict(normalize="realized"), "normalize='realized'"),
    (dict(sampling="with_replacement", sampling_rate=None), "sampling='with_"),
    (dict(clip=np.inf), "clip=inf"),
    (dict(noise_multiplier=0.0), "noise_multiplier=0"),
])
def test_settings_without_a_proof_report_no_epsilon(data, kwargs, why):
    """The paper's realised normaliser and the comparison settings run, but
    their mechanism says why it is not accounted, and no epsilon is reported,
    not even through a bare event."""
    alg = algorithms.dp_fedavg(MODEL, **dict(DP, **kwargs))
    mech = alg.privacy(data)
    assert not mech.accounted and why in mech.reason
    with pytest.raises(ValueError, match="privacy: no epsilon .* proven bound"):
        privacy.Monitor.of(alg, data, DELTA)
    bare = privacy.Monitor(lambda t: privacy.dp_sgd_event(Q, SIGMA, t, STEPS), DELTA)
    with pytest.raises(ValueError, match="privacy: no epsilon"):
        _run(alg, data, bare)


def test_a_fixed_normaliser_is_accounted(data):
    alg = algorithms.dp_fedavg(MODEL, **dict(DP, normalize=64.0))
    assert alg.privacy(data).accounted


@pytest.mark.parametrize("agg", [aggregators.tilted_mean(1.0), aggregators.k_loss(1)],
                         ids=["tilted_mean", "k_loss"])
def test_loss_using_aggregators_are_refused_with_dp(agg):
    with pytest.raises(ValueError, match="aggregator: .*un-noised training loss"):
        algorithms.dp_fedavg(MODEL, aggregator=agg, **DP)
    dp = privacy.make_dp_config(1.0, SIGMA, "poisson", Q)
    with pytest.raises(ValueError, match="aggregator: .*un-noised training loss"):
        algorithms.ditto(MODEL, dp=dp, aggregator=agg)
    with pytest.raises(ValueError, match="aggregator: .*training losses"):
        privacy.client_level_dp(agg, 1.0, 1.0)


def test_robust_rules_on_noisy_uploads_stay_accounted(data):
    """A rule that reads only the uploads is post-processing."""
    alg = algorithms.dp_fedavg(MODEL, aggregator=aggregators.coordinate_median(), **DP)
    assert alg.privacy(data).accounted


def test_fedfdp_batch_weighting_with_noise_is_refused(data):
    with pytest.raises(ValueError, match="weighting: 'batch'"):
        algorithms.fedfdp(MODEL, weighting="batch")
    # without noise (FedFair) or without fairness (lam 0) it runs
    assert not algorithms.fedfair(MODEL, weighting="batch").privacy(data).accounted
    assert algorithms.fedfdp(MODEL, weighting="batch", lam=0.0).privacy(data).accounted


def test_fedfdp_declares_the_loss_release(data):
    alg = algorithms.fedfdp(MODEL, sampling_rate=Q, num_local_steps=STEPS)
    mech = alg.privacy(data)
    want = privacy.epsilon(privacy.fedfdp_event(Q, 2.0, 3, 5.0, STEPS), DELTA)
    assert mech.accounted and _eps(mech, 3) == want
    assert _eps(mech, 3) > privacy.epsilon(privacy.dp_sgd_event(Q, 2.0, 3, STEPS),
                                           DELTA)
    for kw, why in [(dict(fair_clip="paper"), "fair_clip='paper'"),
                    (dict(fair_clip="code"), "fair_clip='code'"),
                    (dict(normalize="realized"), "normalize='realized'"),
                    (dict(loss_noise_multiplier=0.0), "loss is released without")]:
        mech = algorithms.fedfdp(MODEL, **kw).privacy(data)
        assert not mech.accounted and why in mech.reason
    # the literal clip is harmless without fairness weights
    assert algorithms.fedfdp(MODEL, fair_clip="paper", lam=0.0).privacy(data).accounted


def test_client_level_dp_is_declared_for_uniform_cohorts_only(data):
    agg = privacy.client_level_dp(aggregators.mean(weighted=False), 1.0, 2.0)
    alg = algorithms.fedavg(MODEL, aggregator=agg, cohort_size=2)
    mech = alg.privacy(data)
    assert mech.accounted and mech.level == "client"
    want = privacy.epsilon(privacy.client_level_event(2, 5, 2.0, 6,
                                                      sampling="fixed_size"), DELTA)
    assert _eps(mech, 6) == want
    full = algorithms.fedavg(MODEL, aggregator=agg, cohort="full").privacy(data)
    assert _eps(full, 6) == privacy.epsilon(privacy.client_level_event(
        5, 5, 2.0, 6, sampling="fixed_size"), DELTA)
    mon = privacy.Monitor.of(alg, data, DELTA)
    mon.bind(alg, data)  # what simulate checks before any work
    assert mon.epsilon(6) == want
    # the Poisson approximation is not the engine's sampler: refused
    poisson = privacy.Monitor(lambda t: privacy.client_level_event(2, 5, 2.0, t),
                              DELTA)
    with pytest.raises(ValueError, match="privacy: the monitor's event"):
        _run(alg, data, poisson)
    with pytest.raises(ValueError, match="cohort: client-level DP .* 'size_weighted'"):
        algorithms.fedavg(MODEL, aggregator=agg, cohort="size_weighted")
    with pytest.raises(ValueError, match="cohort: client-level DP"):
        algorithms.ditto(MODEL, aggregator=agg, cohort="size_weighted")
    assert algorithms.ditto(MODEL, aggregator=agg, cohort_size=2).privacy(
        data).accounted
    weighted = privacy.client_level_dp(aggregators.mean(weighted=True), 1.0, 2.0)
    mech = algorithms.fedavg(MODEL, aggregator=weighted).privacy(data)
    assert not mech.accounted and "unweighted mean" in mech.reason
    robust = privacy.client_level_dp(aggregators.coordinate_median(), 1.0, 2.0)
    assert not algorithms.fedavg(MODEL, aggregator=robust).privacy(data).accounted


def test_ditto_dp_is_dp_fedavg_and_honours_local_epochs(data):
    """Ditto+DP declares DP-FedAvg's mechanism; with local_epochs each round
    runs ceil(E / q) Poisson steps, bit for bit DP-FedAvg's global model."""
    dp = privacy.make_dp_config(1.0, SIGMA, "poisson", Q)
    ditto = algorithms.ditto(MODEL, dp=dp, local_epochs=1.0, cohort_size=3)
    steps = int(np.ceil(1.0 / Q))
    mech = ditto.privacy(data)
    assert mech.accounted and mech.settings["steps_per_round"] == steps
    ref = algorithms.dp_fedavg(MODEL, **dict(DP, num_local_steps=steps))
    assert _eps(mech, 3) == _eps(ref.privacy(data), 3)
    a, b = (jax.jit(lambda s, d, alg=alg: fp.core.run_rounds(
        alg, s, d, jax.random.key(0), 2))(alg.init(jax.random.key(1), data), data)[0]
        for alg in (ditto, ref))
    for x, y in zip(jax.tree.leaves(a.server.params),
                    jax.tree.leaves(b.server.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_truncation_enters_delta(data):
    """A static Poisson cap can drop rows; the monitor adds (1 + e^eps) t
    P(truncation) to delta, with the probability of the largest client plus
    one record."""
    n = int(data.train.max_count)
    assert privacy.default_max_batch_size(Q, n) >= Q * n
    assert binom.sf(privacy.default_max_batch_size(Q, n), n + 1, Q) <= 1e-12
    alg = algorithms.dp_fedavg(MODEL, max_batch_size=4, **DP)
    mech = alg.privacy(data)
    p = binom.sf(4, n + 1, Q)
    assert mech.truncation_per_round == pytest.approx(STEPS * p, rel=1e-12)
    mon = privacy.Monitor.of(alg, data, DELTA)
    eps = mon.epsilon(3)
    assert mon.total_delta(3) == pytest.approx(DELTA + (1 + np.exp(eps)) * 3 * STEPS
                                               * p, rel=1e-12)
    assert mon.metrics(3)["privacy/delta"] == mon.total_delta(3) > 0.1


def test_mechanism_record_is_json(data):
    import json

    for alg in (algorithms.dp_fedavg(MODEL, **DP), algorithms.fedfdp(MODEL),
                algorithms.dp_fedavg(MODEL, **dict(DP, normalize="realized"))):
        rec = json.loads(json.dumps(alg.privacy(data).record()))
        assert rec["accounted"] == (rec["reason"] is None)
    ledger = privacy.Monitor.of(algorithms.dp_fedavg(MODEL, **DP), data,
                                DELTA).ledger([0, 2, 4])
    json.dumps(ledger)
    assert [e["round"] for e in ledger["evaluations"]] == [0, 2, 4]
    assert ledger["evaluations"][0]["epsilon"] == 0.0
    assert ledger["mechanism"]["level"] == "sample"
