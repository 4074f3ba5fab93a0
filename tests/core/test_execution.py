"""Execution settings are given once, to the driver: the engine in force when
a round is traced decides how it runs (factories refusing engine/unroll,
EngineConfig's own checks and the shared hyperparameters' one default:
tests/algorithms/test_contract.py)."""

import jax
import jax.extend
import numpy as np
import pytest

import fedjax_pfl as fp
from fedjax_pfl import algorithms, models
from fedjax_pfl import data as fdata
from fedjax_pfl.core import EngineConfig, current_engine, execution

MODEL = models.mlp((6,), 3, hidden=(8,))
HP = dict(client_lr=0.1, num_local_steps=3, batch_size=4, cohort_size=4)


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=6, dim=6, num_classes=3,
                                   min_size=10, max_size=40, seed=2)


def test_execution_sets_and_restores_the_engine():
    outer, inner = EngineConfig("map", 2), EngineConfig("vmap", unroll=1)
    assert current_engine().strategy == EngineConfig().strategy
    with execution(outer) as e:
        assert e is outer and current_engine() is outer
        with execution(None):
            assert current_engine() is outer
        with pytest.raises(RuntimeError):
            with execution(inner):
                assert current_engine() is inner
                raise RuntimeError
        assert current_engine() is outer
    assert current_engine() is not outer
    for bad in ("vmap", {"strategy": "map"}):
        with pytest.raises(ValueError, match="engine"):
            with execution(bad):
                pass
    with pytest.raises(ValueError, match="engine"):
        fp.simulate(algorithms.fedavg(MODEL, **HP), None, num_rounds=1,
                    key=jax.random.key(0), engine="vmap")


def test_one_algorithm_runs_under_each_engine_given_to_simulate(data):
    """The same Algorithm object under two engines: each run uses its own (the
    bucketed vmap reports its padding; the other does not) and the numbers
    agree; a jit made for one engine is not reused for the other."""
    alg = algorithms.fedavg(MODEL, **HP)
    runs = {}
    for name, engine in {"map": EngineConfig("map", 1, unroll=1),
                         "buckets": EngineConfig("vmap", buckets=2, unroll=True),
                         "map_again": EngineConfig("map", 1, unroll=2)}.items():
        runs[name] = fp.simulate(alg, data, num_rounds=2, key=jax.random.key(0),
                                 progress=False, engine=engine)
    padded = [k for k in runs["buckets"].history[-1] if "bucket_padding" in k]
    assert padded
    assert not [k for k in runs["map"].history[-1] if "bucket_padding" in k]
    assert not [k for k in runs["map_again"].history[-1] if "bucket_padding" in k]
    for other in ("buckets", "map_again"):
        for a, b in zip(jax.tree.leaves(runs["map"].state.server.params),
                        jax.tree.leaves(runs[other].state.server.params)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _has_loop(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("scan", "while"):
            return True
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            if _has_loop(sub):
                return True
    return False


def test_the_engines_unroll_reaches_the_local_steps(data):
    """unroll=True: the local steps are straight-line code (no loop at all
    under vmap); unroll=1: a loop."""
    alg = algorithms.ditto(MODEL, lam=0.5, **HP)
    state = alg.init(jax.random.key(1), data)
    key = jax.random.key(0)
    loops = {}
    for unroll in (True, 1):
        with execution(EngineConfig("vmap", unroll=unroll)):
            jaxpr = jax.make_jaxpr(lambda s, d, k: alg.round_step(s, d, k))(
                state, data, key)
        loops[repr(unroll)] = _has_loop(jaxpr.jaxpr)
    assert loops == {"True": False, "1": True}


def test_sweep_and_evaluate_state_take_the_engine(data):
    engine = EngineConfig("map", 1, unroll=1)
    key = jax.random.key(0)
    states, hist = fp.sweep(lambda lam: algorithms.ditto(MODEL, lam=lam, **HP),
                            {"lam": np.array([0.0, 1.0])}, data, num_rounds=1,
                            key=key, engine=engine)
    one = fp.simulate(algorithms.ditto(MODEL, lam=1.0, **HP), data, num_rounds=1,
                      key=key, progress=False, engine=engine)
    np.testing.assert_allclose(hist["personal/test/accuracy/mean"][1, -1],
                               one.history[-1]["personal/test/accuracy/mean"],
                               rtol=1e-5)
    alg = algorithms.fedavg(MODEL, finetune_steps=2, **HP)
    res = fp.simulate(alg, data, num_rounds=1, key=key, progress=False,
                      engine=engine)
    ev = fp.evaluate_state(alg, res.state, data, key=key, engine=engine,
                           views=("finetuned",), splits=("test",))
    np.testing.assert_allclose(ev["finetuned/test/accuracy/mean"],
                               res.history[-1]["finetuned/test/accuracy/mean"],
                               rtol=1e-6)
