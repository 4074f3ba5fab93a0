"""Ditto with DP: the global update is DP-FedAvg's, the personal models stay
local (Ditto paper §3.2: same epsilon as private global training)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pfl as fp
from fedjax_pfl import algorithms, models, privacy
from fedjax_pfl import data as fdata

MODEL = models.mlp((6,), 3, hidden=(8,))
LOCAL = {"client_lr": 0.2, "num_local_steps": 2, "batch_size": 4, "cohort_size": 3,
         "unroll": 1, "cohort": "size_weighted", "weighted": False}


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=5, dim=6, num_classes=3,
                                   min_size=10, max_size=40, fractions=(0.8, 0, 0.2),
                                   seed=3)


def _run(alg, data, rounds=2):
    state = alg.init(jax.random.key(1), data)
    return jax.jit(lambda s, d: fp.core.run_rounds(
        alg, s, d, jax.random.key(0), rounds))(state, data)


def _assert_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_global_model_is_dp_fedavgs_and_personal_models_stay_noise_free(data):
    dp = dict(clip=0.5, noise_multiplier=1.0, sampling_rate=0.3)
    ref, _ = _run(algorithms.dp_fedavg(MODEL, **dp, **LOCAL), data)
    cfg = privacy.make_dp_config(dp["clip"], dp["noise_multiplier"], "poisson",
                                 dp["sampling_rate"])
    st, m = _run(algorithms.ditto(MODEL, lam=1.0, dp=cfg, **LOCAL), data)
    _assert_equal(ref.server.params, st.server.params)  # the released trajectory
    assert 0 < float(m["train/dp/clipped_fraction"]) <= 1
    # v_k is anchored at the round-start w^t and trains without noise: after one
    # round (same w^0, same cohort, same keys) it equals non-private Ditto's
    one_dp, _ = _run(algorithms.ditto(MODEL, lam=1.0, dp=cfg, **LOCAL), data, 1)
    one, _ = _run(algorithms.ditto(MODEL, lam=1.0, **LOCAL), data, 1)
    _assert_equal(one.clients.personal, one_dp.clients.personal)
    assert _max_diff(one.server.params, one_dp.server.params) > 0  # noise is there


def _max_diff(a, b):
    return max(float(jnp.max(jnp.abs(x - y)))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_no_clip_no_noise_equals_plain_ditto(data):
    cfg = privacy.make_dp_config(jnp.inf, 0.0, "with_replacement")
    plain, _ = _run(algorithms.ditto(MODEL, lam=0.5, **LOCAL), data)
    dp, _ = _run(algorithms.ditto(MODEL, lam=0.5, dp=cfg, **LOCAL), data)
    _assert_equal(plain.server.params, dp.server.params)
    _assert_equal(plain.clients.personal, dp.clients.personal)


def test_shared_batches_with_dp_rejected():
    cfg = privacy.make_dp_config(1.0, 1.0, "poisson", 0.1)
    with pytest.raises(ValueError, match="batches"):
        algorithms.ditto(MODEL, dp=cfg, batches="shared")
