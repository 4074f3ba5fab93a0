"""The batch ladder of Poisson batches (``EngineConfig(batch_ladder=...)``):
its rungs, the rung a batch runs at, the same numbers with and without it, and
when the engine uses it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pfl as fp
from fedjax_pfl import algorithms, models, privacy
from fedjax_pfl import data as fdata
from fedjax_pfl.core import EngineConfig, execution

MODEL = models.mlp((6,), 3, hidden=(8,))


@pytest.fixture(scope="module")
def data():
    # clients of 150-900 rows: at q = 0.1 the cap (from the largest) is about
    # 130 rows and the smallest client's batch about 15
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=4, dim=6, num_classes=3,
                                   min_size=150, max_size=900, fractions=(0.8, 0, 0.2),
                                   seed=3)


@pytest.mark.parametrize("cap", [64, 65, 100, 655, 6550, 10 ** 6])
def test_rungs(cap):
    rungs = privacy.batch_ladder(cap)
    assert rungs[-1] == cap and list(rungs) == sorted(set(rungs))
    assert 2 <= len(rungs) <= privacy.LADDER_MAX_RUNGS
    assert rungs[0] >= privacy.LADDER_MIN_ROWS
    ratios = np.asarray(rungs[1:]) / np.asarray(rungs[:-1])
    assert np.all(ratios <= 2 ** 0.5 + 0.05) and np.all(ratios >= 1.3)


@pytest.mark.parametrize("cap", [1, 31, 63])
def test_small_caps_have_one_rung(cap):
    assert privacy.batch_ladder(cap) == (cap,)


def test_bad_cap_is_refused():
    with pytest.raises(ValueError, match="max_batch_size"):
        privacy.batch_ladder(0)


def _rows_used(n_sampled, cap, dp, engine):
    """The number of rows ``on_sampled_rows`` hands its function."""
    rows = jnp.arange(cap, dtype=jnp.int32)
    mask = (jnp.arange(cap) < n_sampled).astype(jnp.float32)
    with execution(engine):
        # the function also checks that every sampled row is among those it gets
        out = jax.jit(lambda r, m: privacy.on_sampled_rows(
            lambda rr, mm: jnp.stack([jnp.float32(rr.shape[0]), jnp.sum(mm)]),
            r, m, dp))(rows, mask)
    assert float(out[1]) == n_sampled
    return int(out[0])


@pytest.mark.parametrize("n", [0, 1, 58, 59, 300, 464, 465, 655])
def test_smallest_rung_that_holds_the_batch(n):
    dp = privacy.make_dp_config(1.0, 1.0, "poisson", 0.05)
    rungs = privacy.batch_ladder(655)
    expect = min(r for r in rungs if r >= n)
    assert _rows_used(n, 655, dp, EngineConfig("unroll")) == expect
    # off: the whole cap; and never for batches whose sampled rows need not
    # come first (fixed-size modes)
    assert _rows_used(n, 655, dp, EngineConfig("unroll", batch_ladder=False)) == 655
    fixed = privacy.make_dp_config(1.0, 1.0, "with_replacement")
    assert _rows_used(n, 655, fixed, EngineConfig("unroll")) == 655


def test_engine_default():
    assert EngineConfig("unroll").uses_batch_ladder
    assert EngineConfig("map", 1).uses_batch_ladder
    assert not EngineConfig("map", 4).uses_batch_ladder
    assert not EngineConfig("vmap").uses_batch_ladder
    assert EngineConfig("vmap", batch_ladder=True).uses_batch_ladder
    assert not EngineConfig("unroll", batch_ladder=False).uses_batch_ladder
    with pytest.raises(ValueError, match="batch_ladder"):
        EngineConfig(batch_ladder="yes")


def _fedfdp(lam=0.5, num_local_steps=2):
    return algorithms.fedfdp(MODEL, lam=lam, clip=0.5, sampling_rate=0.1,
                             client_lr=0.2, num_local_steps=num_local_steps,
                             cohort_size=4, cohort="full")


@pytest.mark.parametrize("strategy", ["unroll", "map"])
def test_same_numbers_with_and_without(data, strategy):
    """FedFDP (fair weights, DP-SGD steps and the private loss release all on
    Poisson batches): two rounds with the ladder equal those without it, up to
    float rounding; the batch sizes and truncations are the same."""
    alg = _fedfdp()
    state = alg.init(jax.random.key(1), data)
    outs = {}
    for on in (True, False):
        engine = EngineConfig(strategy, 1 if strategy == "map" else None,
                              batch_ladder=on)
        run = jax.jit(lambda s, d, e=engine: fp.core.run_rounds(
            alg, s, d, jax.random.key(0), 2, engine=e))
        text = str(jax.make_jaxpr(run)(state, data))
        assert ("cond[" in text) == on  # the ladder's switch is in the program
        outs[on] = run(state, data)
    (a, ma), (b, mb) = outs[True], outs[False]
    for x, y in zip(jax.tree.leaves(a.server), jax.tree.leaves(b.server), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
    for k in ("train/dp/batch_size", "train/dp/truncated"):
        assert float(ma[k]) == float(mb[k])
    assert float(mb["train/dp/batch_size"]) > 5  # real batches, not empty ones


def test_sweep_turns_it_off(data):
    """``sweep`` vmaps its runs, which may draw different batches: the ladder
    is off while it traces (unless forced)."""
    seen = []

    def make(lam):
        seen.append(fp.core.current_engine().uses_batch_ladder)
        return _fedfdp(lam, num_local_steps=1)

    for engine, expect in ((EngineConfig("unroll"), False),
                           (EngineConfig("unroll", batch_ladder=True), True)):
        seen.clear()
        fp.core.sweep(make, {"lam": jnp.array([0.0, 0.5])}, data, num_rounds=1,
                      key=jax.random.key(0), engine=engine)
        assert seen and set(seen) == {expect}
