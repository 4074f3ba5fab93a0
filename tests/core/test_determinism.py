"""``EngineConfig(deterministic=True)``: bitwise the same rounds for any device
count and cohort order (docs/engine.md, "Determinism"), on 4 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from fedjax_pfl import aggregators, algorithms, core, models
from fedjax_pfl import data as fdata
from fedjax_pfl.core import EngineConfig
from fedjax_pfl.core._clients import fixed_order_sum

MODEL = models.logistic_regression((12,), 4)
ROUNDS = 2


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=12, dim=12, num_classes=4,
                                   max_size=40, min_size=9, seed=3)


def _mesh(d):
    assert jax.device_count() >= 4, "conftest sets 4 fake CPU devices"
    return core.client_mesh(jax.devices()[:d])


def _alg(name):
    kw = dict(client_lr=0.1, num_local_steps=2, batch_size=5, cohort="uniform",
              cohort_size=8)
    if name == "fedavg":  # weighted mean: summed in the client loop by default
        return algorithms.fedavg(MODEL, **kw)
    # personal states, and a robust rule: the uploads are stacked for the server
    return algorithms.ditto(MODEL, lam=0.5, aggregator=aggregators.trimmed_mean(0.2),
                            weighted=False, **kw)


def _run(name, engine, data):
    """Server state, client states and every non-``engine/`` metric of
    ``ROUNDS`` jitted rounds, on the host. With a mesh the state and data start
    whole on every device, as the rounds leave them (one compile, the program
    every later round of a run uses)."""
    alg = _alg(name)
    state = alg.init(jax.random.key(1), data)
    if engine.mesh is not None:
        whole = NamedSharding(engine.mesh, PartitionSpec())
        state, data = jax.device_put((state, data), whole)
    step = jax.jit(alg.round_step)
    history = []
    with core.execution(engine):
        for _ in range(ROUNDS):
            state, metrics = step(state, data, jax.random.key(0))
            history.append({k: v for k, v in metrics.items()
                            if not k.startswith("engine/")})
    return jax.device_get((state.server, state.clients, history))


def _bitwise_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    return all(np.array_equal(x, y) for x, y in zip(la, lb, strict=True))


@pytest.mark.parametrize("name,devices", [("fedavg", (1, 2, 4)), ("ditto", (4,))])
def test_map_is_bitwise_equal_across_devices(data, name, devices):
    """map:1 (the CPU default) unsharded == one client loop per device on 1, 2
    or 4 devices, each device's share dealt in snake order by size."""
    ref = _run(name, EngineConfig("map", 1, deterministic=True), data)
    assert ref[2][-1]["train/loss"] > 0 and int(ref[2][-1]["nonfinite_clients"]) == 0
    if name == "ditto":  # the personal states did move
        assert np.any(jax.tree.leaves(ref[1])[0] != 0)
    for d in devices:
        engine = EngineConfig("map", 1, mesh=_mesh(d), deterministic=True)
        assert _bitwise_equal(ref, _run(name, engine, data)), d


def test_vmap_is_bitwise_equal_across_orders_and_devices(data):
    """vmapped batches of 4 clients: sorted by size into 2 buckets on one
    device == in cohort order, one batch per device on 2 devices. (Each
    client's own numbers under vmap may depend on the batch size, so it is
    held fixed.)"""
    buckets = _run("fedavg", EngineConfig("vmap", buckets=2, deterministic=True),
                   data)
    sharded = _run("fedavg", EngineConfig("vmap", mesh=_mesh(2), deterministic=True),
                   data)
    assert _bitwise_equal(buckets, sharded)


def test_default_is_only_close_across_devices(data):
    """Without the option the 4-device sum is reassociated (partial sums per
    device, then a psum): the same to float rounding, not bit for bit."""
    one = _run("fedavg", EngineConfig("map", 1), data)
    four = _run("fedavg", EngineConfig("map", 1, mesh=_mesh(4)), data)
    assert not _bitwise_equal(one, four)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(four), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_fixed_order_sum_is_a_left_fold():
    x = np.random.default_rng(0).normal(size=(7, 5, 3)).astype(np.float32) * 10.0
    got = jax.jit(fixed_order_sum)({"a": jnp.asarray(x)})["a"]
    want = x[0]
    for row in x[1:]:
        want = want + row  # float32, one add at a time
    np.testing.assert_array_equal(got, want)


def test_deterministic_must_be_a_bool():
    with pytest.raises(ValueError, match="deterministic"):
        EngineConfig("map", 1, deterministic=1)
    assert "deterministic=True" in repr(EngineConfig("vmap", deterministic=True))
