"""The flat ragged container, its validation and in-jit batch sampling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl import data as fdata


def _clients(sizes, dim=3, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(n, dim)).astype(np.float32),
             rng.integers(0, 5, n)) for n in sizes]


def test_flat_storage_is_o_total_examples():
    sizes = [31, 1378, 40, 55]
    d = fdata.from_client_arrays(_clients(sizes))
    assert d.train.num_examples == sum(sizes)
    assert d.train.max_count == 1378 and d.train.min_count == 31
    np.testing.assert_array_equal(d.train.offsets, np.cumsum([0] + sizes[:-1]))
    assert d.nbytes() < d.padded_nbytes() / 2
    x2, _y2 = d.train.client(2)
    np.testing.assert_array_equal(x2, _clients(sizes)[2][0])
    np.testing.assert_array_equal(np.asarray(d.train.client_of_row)[31:33], [1, 1])


@pytest.mark.parametrize("bad, match", [
    ([(np.zeros((0, 3)), np.zeros(0))], "no examples"),
    ([(np.zeros((2, 3)), np.zeros(3))], "same number of rows"),
    ([(np.zeros((2, 3)), np.zeros(2)), (np.zeros((2, 4)), np.zeros(2))], "shapes"),
    ([(np.full((2, 3), np.nan), np.zeros(2))], "NaN"),
    ([], "at least one client"),
])
def test_invalid_data_rejected(bad, match):
    with pytest.raises(ValueError, match=match):
        fdata.from_client_arrays(bad)


def test_val_test_client_count_must_match():
    with pytest.raises(ValueError, match="test"):
        fdata.from_client_arrays(_clients([3, 4]), test=_clients([3]))


def test_with_replacement_rows_stay_inside_client():
    d = fdata.from_client_arrays(_clients([5, 20, 7]))
    rows, mask = fdata.client_batch_indices(d.train, jnp.int32(1), jax.random.key(0),
                                            num_steps=50, batch_size=8)
    rows = np.asarray(rows)
    assert rows.min() >= 5 and rows.max() < 25 and mask.shape == (50, 8)
    assert len(np.unique(rows)) == 20  # 400 draws cover all 20 rows


def test_epoch_sampling_is_without_replacement():
    d = fdata.from_client_arrays(_clients([12, 30, 7]))
    rows, _ = jax.jit(lambda k: fdata.client_batch_indices(
        d.train, jnp.int32(1), k, num_steps=6, batch_size=10, sampling="epoch"))(
        jax.random.key(3))
    flat = np.asarray(rows).reshape(-1) - 12
    for e in range(2):
        np.testing.assert_array_equal(np.sort(flat[30 * e:30 * (e + 1)]),
                                      np.arange(30))
    small, _ = fdata.client_batch_indices(d.train, jnp.int32(2), jax.random.key(3),
                                          num_steps=2, batch_size=10,
                                          sampling="epoch")
    flat = np.asarray(small).reshape(-1) - 42
    np.testing.assert_array_equal(np.sort(flat[:7]), np.arange(7))
    np.testing.assert_array_equal(np.sort(flat[7:14]), np.arange(7))


def test_full_batch_masks_padding():
    d = fdata.from_client_arrays(_clients([3, 6]))
    rows, mask = fdata.client_batch_indices(d.train, jnp.int32(0), jax.random.key(0),
                                            num_steps=1, batch_size=1,
                                            sampling="full_batch")
    np.testing.assert_array_equal(mask[0], [1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(rows[0])[:3], [0, 1, 2])


def test_split_clients_fractions_and_determinism():
    cl = _clients([100, 50])
    a = fdata.split_clients(cl, (0.72, 0.08, 0.2), seed=1)
    b = fdata.split_clients(cl, (0.72, 0.08, 0.2), seed=1)
    np.testing.assert_array_equal(a.train.counts, [72, 36])
    np.testing.assert_array_equal(a.val.counts, [8, 4])
    np.testing.assert_array_equal(a.test.counts, [20, 10])
    np.testing.assert_array_equal(a.train.x, b.train.x)
    with pytest.raises(ValueError, match="fractions"):
        fdata.split_clients(cl, (0.5, 0.6, 0.1))


def test_fedprox_synthetic_shapes_and_power_law():
    d = fdata.fedprox_synthetic(1.0, 1.0, num_clients=30, seed=0)
    assert d.num_clients == 30 and d.train.x.shape[1] == 60
    counts = np.asarray(d.train.counts) + np.asarray(d.test.counts)
    assert counts.min() >= 50 and counts.max() > 5 * np.median(counts)
    assert set(np.unique(d.train.y)) <= set(range(10))
    same = fdata.fedprox_synthetic(1.0, 1.0, num_clients=30, seed=0)
    np.testing.assert_array_equal(d.train.x, same.train.x)


def test_point_estimation_and_regression_problems():
    pe = fdata.point_estimation_problem(num_clients=16, num_malicious=8, n=30,
                                        tau=0.1, tau_a=0.5, seed=0)
    np.testing.assert_allclose(
        pe.w_hat, np.asarray(pe.data.train.y).reshape(16, 30).mean(1), rtol=1e-5)
    assert pe.malicious.sum() == 8
    lr = fdata.linear_regression_problem(num_clients=4, n=20, dim=3, beta=7.0)
    x, _ = lr.data.train.client(0)
    np.testing.assert_allclose(x.T @ x, 7.0 * np.eye(3), atol=1e-4)
