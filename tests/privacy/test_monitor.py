"""privacy.Monitor in simulate: epsilon columns equal the accountant's, and a
target stops the run at the largest evaluation round within budget."""

import dp_accounting
import jax
import numpy as np
import pytest

import fedjax_pfl as fp
from fedjax_pfl import algorithms, models, privacy
from fedjax_pfl import data as fdata

DELTA = 1e-5


def event_fn(t):
    return privacy.dp_sgd_event(0.1, 1.0, t, 2)


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=8, max_size=40, min_size=8)


@pytest.fixture(scope="module")
def alg():
    """DP-FedAvg whose declared mechanism is ``event_fn``'s."""
    return algorithms.dp_fedavg(models.logistic_regression((60,), 10), clip=1.0,
                                noise_multiplier=1.0, sampling_rate=0.1,
                                client_lr=0.1, num_local_steps=2, cohort_size=3)


def run(alg, data, **kw):
    return fp.simulate(alg, data, key=jax.random.key(0), progress=False, **kw)


def test_target_stops_at_the_last_evaluation_within_budget(alg, data):
    target, every = 4.7, 3
    t_max = privacy.max_rounds(target, DELTA, event_fn)
    assert 3 * every < t_max < 20 and t_max % every  # a stop off the grid
    mon = privacy.Monitor(event_fn, DELTA, target_epsilon=target)
    assert mon.max_rounds() == t_max
    res = run(alg, data, num_rounds=20, eval_every=every, privacy=mon)
    stop = t_max // every * every
    rounds = [r["round"] for r in res.history]
    assert rounds == list(range(0, stop + 1, every))
    assert res.rounds_run == stop == int(res.state.round) and res.privacy_stopped
    assert [r["privacy/stopped"] for r in res.history] == [False] * (len(rounds) - 1) \
        + [True]
    eps = [r["privacy/epsilon"] for r in res.history]
    assert eps[0] == 0.0
    assert eps[1:] == [privacy.epsilon(event_fn(t), DELTA) for t in rounds[1:]]
    assert np.all(np.diff(eps) > 0)
    # delta plus the Poisson cap's truncation term (<= 1e-12 per draw)
    assert all(r["privacy/delta"] == mon.total_delta(r["round"]) for r in res.history)
    assert res.history[0]["privacy/delta"] == DELTA
    assert all(DELTA < r["privacy/delta"] < DELTA * (1 + 1e-3)
               for r in res.history[1:])
    assert eps[-1] <= target < privacy.epsilon(event_fn(stop + every), DELTA)


def test_without_target_reports_only_and_counts_the_states_rounds(alg, data):
    first = run(alg, data, num_rounds=2)
    mon = privacy.Monitor(event_fn, DELTA, accountant="pld")
    res = run(alg, data, num_rounds=4, eval_every=2, state=first.state, privacy=mon)
    assert [r["round"] for r in res.history] == [2, 4, 6]
    assert res.rounds_run == 4 and not res.privacy_stopped
    assert all("privacy/stopped" not in r for r in res.history)
    got = [r["privacy/epsilon"] for r in res.history]
    assert got == [privacy.epsilon(event_fn(t), DELTA, accountant="pld")
                   for t in (2, 4, 6)]


def test_a_first_chunk_over_budget_runs_nothing(alg, data):
    mon = privacy.Monitor(event_fn, DELTA, target_epsilon=1.0)
    assert mon.max_rounds() == 0
    res = run(alg, data, num_rounds=6, eval_every=3, privacy=mon)
    assert len(res.history) == 1 and res.history[0]["privacy/stopped"]
    assert res.rounds_run == 0 and int(res.state.round) == 0


def test_resumed_stopped_run_matches(tmp_path, alg, data):
    mon = privacy.Monitor(event_fn, DELTA, target_epsilon=4.7)
    full = run(alg, data, num_rounds=20, eval_every=3, privacy=mon)
    kw = dict(num_rounds=20, eval_every=3, privacy=mon, checkpoint_dir=str(tmp_path))

    def crash(state, row):
        if row["round"] == 6:
            raise RuntimeError("crash")

    with pytest.raises(RuntimeError, match="crash"):
        run(alg, data, callback=crash, **kw)
    res = run(alg, data, resume=True, **kw)
    strip = [[{k: v for k, v in r.items() if k != "seconds"} for r in h]
             for h in (full.history, res.history)]
    assert strip[0] == strip[1] and res.privacy_stopped and res.rounds_run == 12
    again = run(alg, data, resume=True, callback=crash, **kw)  # nothing left to run
    assert again.rounds_run == 12 and len(again.history) == len(full.history)
    other = privacy.Monitor(event_fn, DELTA, target_epsilon=5.0)
    with pytest.raises(ValueError, match="different run.*privacy"):
        run(alg, data, resume=True, **dict(kw, privacy=other))


@pytest.mark.parametrize("kwargs, match", [
    (dict(event_fn=3), "event_fn"),
    (dict(event_fn=lambda t: 0.5), "event_fn"),
    (dict(delta=0.0), "delta"),
    (dict(delta=1.0), "delta"),
    (dict(target_epsilon=-1.0), "target_epsilon"),
    (dict(target_epsilon=float("nan")), "target_epsilon"),
    (dict(accountant="moments"), "accountant"),
    (dict(orders=[0.5, 2.0]), "orders"),
])
def test_invalid_monitor_arguments(kwargs, match):
    kw = dict(event_fn=event_fn, delta=DELTA)
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        privacy.Monitor(kw.pop("event_fn"), kw.pop("delta"), **kw)


def test_invalid_monitor_calls():
    mon = privacy.Monitor(event_fn, DELTA)
    assert isinstance(event_fn(1), dp_accounting.DpEvent)
    assert mon.allows(10_000)  # no target: everything is allowed
    with pytest.raises(ValueError, match="rounds"):
        mon.epsilon(-1)
    with pytest.raises(ValueError, match="target_epsilon"):
        mon.max_rounds()


@pytest.mark.parametrize("rounds", [-1, 1.5, True, "3", None])
def test_monitor_rounds_must_be_a_count(rounds):
    mon = privacy.Monitor(event_fn, DELTA, target_epsilon=5.0)
    with pytest.raises(ValueError, match="rounds: must be an integer >= 0"):
        mon.epsilon(rounds)
    with pytest.raises(ValueError, match="rounds"):
        mon.allows(rounds)


def test_monitor_options_are_checked_by_name():
    with pytest.raises(ValueError, match="pld_discretization"):
        privacy.Monitor(event_fn, DELTA, pld_discretization=-1.0)
    with pytest.raises(ValueError, match="delta: must be a number"):
        privacy.Monitor(event_fn, "1e-5")
    with pytest.raises(ValueError, match="target_epsilon: must be a number"):
        privacy.Monitor(event_fn, DELTA, target_epsilon="8")
    mon = privacy.Monitor(event_fn, DELTA, target_epsilon=5.0)
    with pytest.raises(ValueError, match="upper: must be an integer >= 1"):
        mon.max_rounds(upper=0)
