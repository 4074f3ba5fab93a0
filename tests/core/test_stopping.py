"""simulate's early stopping (``stop_when``, ``Plateau``): the rule on histories,
a stopped run equals the prefix of a full one, the stop is checkpointed and a
resumed run stops at the same round, and bad criteria are refused before work."""

import json
import os

import jax
import pytest
from helpers import small_ditto

import fedjax_pfl as fp

RUN = dict(num_rounds=12, eval_every=2, key=jax.random.key(5), progress=False)
ACC = "global/test/accuracy/mean"


def rows(*pairs, metric="m"):
    return [{"round": r, metric: v} for r, v in pairs]


@pytest.mark.parametrize("history,rule,stops", [
    # not before `patience` rounds have passed since the first evaluation
    (rows((0, .1), (2, .1)), fp.Plateau("m", patience=4), False),
    # 4 rounds without a gain over the best before them
    (rows((0, .1), (2, .5), (4, .5), (6, .5)), fp.Plateau("m", patience=4), True),
    (rows((0, .1), (2, .5), (4, .5), (6, .51)), fp.Plateau("m", patience=4), False),
    (rows((0, .1), (2, .5), (4, .5), (6, .51)),
     fp.Plateau("m", patience=4, min_delta=0.02), True),
    # a worse recent value is no gain
    (rows((0, .1), (2, .5), (4, .3), (6, .4)), fp.Plateau("m", patience=4), True),
    # lower is better
    (rows((0, 2.), (2, 1.), (4, 1.), (6, .9)), fp.Plateau("m", 4, mode="min"), False),
    (rows((0, 2.), (2, 1.), (4, 1.), (6, 1.)), fp.Plateau("m", 4, mode="min"), True),
])
def test_plateau_rule(history, rule, stops):
    assert rule(history) is stops


def test_plateau_waits_for_every_metric():
    h = [{"round": r, "a": a, "b": b}
         for r, a, b in ((0, .1, .1), (2, .5, .5), (4, .5, .6), (6, .5, .7))]
    assert fp.Plateau("a", patience=4)(h)
    assert not fp.Plateau(("a", "b"), patience=4)(h)


@pytest.fixture(scope="module")
def setup():
    return small_ditto()


@pytest.fixture(scope="module")
def data(setup):
    return setup[0]


@pytest.fixture(scope="module")
def alg(setup):
    return setup[1]


@pytest.fixture(scope="module")
def full(alg, data):
    return fp.simulate(alg, data, **RUN)


def without_seconds(history):
    return [{k: v for k, v in r.items() if k not in ("seconds", "stopped")}
            for r in history]


def test_a_stopped_run_is_the_prefix_of_the_full_run(alg, data, full):
    # min_delta 1: no accuracy gain can count, so the rule holds at round 4
    rule = fp.Plateau(ACC, patience=4, min_delta=1.0)
    res = fp.simulate(alg, data, stop_when=rule, **RUN)
    assert [r["round"] for r in res.history] == [0, 2, 4]
    assert res.stopped_early and not res.privacy_stopped and res.rounds_run == 4
    assert res.history[-1]["stopped"] is True
    assert not any("stopped" in r for r in res.history[:-1])
    assert without_seconds(res.history) == without_seconds(full.history[:3])
    assert not full.stopped_early and "stopped" not in full.history[-1]


def test_any_callable_stops_and_the_last_evaluation_is_never_a_stop(alg, data, full):
    calls = []

    def rule(history):
        calls.append(history[-1]["round"])
        return history[-1]["round"] >= 6

    res = fp.simulate(alg, data, stop_when=rule, **RUN)
    assert calls == [0, 2, 4, 6] and res.history[-1]["round"] == 6
    calls.clear()
    res = fp.simulate(alg, data, stop_when=lambda h: calls.append(1) or False, **RUN)
    assert len(calls) == len(full.history) - 1  # not asked after the last one
    assert not res.stopped_early


def test_the_stop_is_checkpointed_and_a_resumed_run_stops_at_the_same_round(
        tmp_path, alg, data):
    ck, jl = tmp_path / "ck", tmp_path / "h.jsonl"
    rule = fp.Plateau(ACC, patience=6, min_delta=1.0)  # holds at round 6
    kw = dict(RUN, checkpoint_dir=str(ck), checkpoint_every=4, jsonl_path=str(jl),
              stop_when=rule)
    ref = fp.simulate(alg, data, stop_when=rule, **RUN)
    assert ref.history[-1]["round"] == 6

    def crash(state, row):
        if row["round"] == 4:
            raise RuntimeError("crash")

    with pytest.raises(RuntimeError):
        fp.simulate(alg, data, callback=crash, **kw)
    res = fp.simulate(alg, data, resume=True, **kw)
    assert without_seconds(res.history) == without_seconds(ref.history)
    assert res.stopped_early
    assert sorted(int(n) for n in os.listdir(ck) if n.isdigit()) == [4, 6]
    written = [json.loads(line) for line in jl.read_text().splitlines()]
    assert [r["round"] for r in written] == [0, 2, 4, 6] and written[-1]["stopped"]
    # resuming a stopped run runs nothing more
    seen = []
    again = fp.simulate(alg, data, resume=True,
                        callback=lambda s, row: seen.append(row), **kw)
    assert seen == [] and again.history[-1]["round"] == 6


@pytest.mark.parametrize("stop_when,match", [
    ("plateau", "stop_when: must be callable"),
    (fp.Plateau("global/val/accuracy/mean", patience=4), r"history has no \["),
    (fp.Plateau(ACC, patience=0), "Plateau.patience"),
    (fp.Plateau(ACC, patience=4, min_delta=-1.0), "Plateau.min_delta"),
    (fp.Plateau(ACC, patience=4, mode="best"), "Plateau.mode"),
    (fp.Plateau((), patience=4), "Plateau.metrics"),
])
def test_bad_criteria_are_refused_before_any_work(tmp_path, alg, data, stop_when,
                                                  match):
    jl = tmp_path / "h.jsonl"
    with pytest.raises(ValueError, match=match):
        fp.simulate(alg, data, stop_when=stop_when, jsonl_path=str(jl),
                    callback=lambda s, r: pytest.fail("work started"), **RUN)
    assert not jl.exists()
