"""Partitioners: the papers' recipes (exact counts), constraints, determinism."""

import gzip
import os

import numpy as np
import pytest

from fedjax_pfl import data as fdata

DATA_DIR = os.environ.get("FEDJAX_PFL_DATA_DIR")
needs_data = pytest.mark.skipif(not DATA_DIR, reason="FEDJAX_PFL_DATA_DIR unset")


def _idx_labels(name, kind):
    path = os.path.join(DATA_DIR, name, f"{kind}-labels-idx1-ubyte.gz")
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)


def _idx_images(name, kind):
    path = os.path.join(DATA_DIR, name, f"{kind}-images-idx3-ubyte.gz")
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)


def _balanced_labels(per_class, num_classes=10, seed=0):
    """Shuffled labels with ``per_class`` rows of each class."""
    y = np.repeat(np.arange(num_classes), per_class)
    return np.random.default_rng(seed).permutation(y)


def _sizes(indices):
    return np.array([len(i) for i in indices])


def _assert_same(a, b):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


# ------------------------------------------------------------------ Ditto FMNIST


def _check_ditto_fmnist_counts(y_tr, y_te):
    tr, te = fdata.ditto_fmnist_indices(y_tr, y_te)
    s_tr, s_te = _sizes(tr), _sizes(te)
    assert len(tr) == len(te) == 500
    assert s_tr.sum() == 61_251 and s_te.sum() == 11_254
    assert (s_tr.min(), int(np.median(s_tr)), s_tr.max()) == (31, 88, 1378)
    assert (s_te.min(), s_te.max()) == (7, 231)
    for u in (0, 1, 7, 499):  # user u holds classes (u + j) mod 10, j < 5
        want = sorted((u + j) % 10 for j in range(5))
        assert sorted(np.unique(y_tr[tr[u]])) == want
        assert sorted(np.unique(y_te[te[u]])) == want
        assert len(np.unique(tr[u])) == len(tr[u])  # no row twice within a user


def test_ditto_fmnist_recipe_counts_on_synthetic_labels():
    # The counts depend only on the class sizes (6000 / 1000, as in FMNIST).
    _check_ditto_fmnist_counts(_balanced_labels(6000), _balanced_labels(1000, seed=1))


@needs_data
def test_ditto_fmnist_exact_counts_on_real_labels():
    y_tr = _idx_labels("fashion_mnist", "train")
    y_te = _idx_labels("fashion_mnist", "t10k")
    _check_ditto_fmnist_counts(y_tr, y_te)
    tr, _ = fdata.ditto_fmnist_indices(y_tr, y_te)
    # Sequential per-class draws: user 0's class-0 rows are the first class-0 rows.
    first = np.where(y_tr == 0)[0]
    n0 = int(np.sum(y_tr[tr[0]] == 0))
    np.testing.assert_array_equal(tr[0][:n0], first[:n0])


@needs_data
def test_ditto_fmnist_builds_on_real_images():
    x_tr, y_tr = (f("fashion_mnist", "train") for f in (_idx_images, _idx_labels))
    x_te, y_te = (f("fashion_mnist", "t10k") for f in (_idx_images, _idx_labels))
    d = fdata.ditto_fmnist(x_tr, y_tr, x_te, y_te, val_fraction=0.1)
    assert d.num_clients == 500 and d.client_ids[0] == "f_00000"
    assert d.train.num_examples + d.val.num_examples == 61_251
    assert d.test.num_examples == 11_254
    assert d.train.x.shape[1:] == (784,) and d.train.x.dtype == np.float32
    m = fdata.memory_summary(d)
    assert m["raw_nbytes"] == (61_251 + 11_254) * (784 * 4 + 4)
    assert m["overhead_factor"] < 1.001 and m["padding_factor"] > 8
    mu = np.mean(x_tr.astype(np.float32), 0)
    sd = np.std(x_tr.astype(np.float32), 0)
    x0, _ = d.test.client(0)
    ref = (x_te[fdata.ditto_fmnist_indices(y_tr, y_te)[1][0]] - mu) / (sd + 0.001)
    np.testing.assert_allclose(x0, ref, rtol=1e-6, atol=1e-6)


def test_ditto_fmnist_end_to_end_small_features():
    y_tr, y_te = _balanced_labels(6000), _balanced_labels(1000, seed=1)
    rng = np.random.default_rng(0)
    x_tr = rng.integers(0, 256, (len(y_tr), 3), dtype=np.uint8)
    x_te = rng.integers(0, 256, (len(y_te), 3), dtype=np.uint8)
    d = fdata.ditto_fmnist(x_tr, y_tr, x_te, y_te, val_fraction=0.1)
    assert d.train.num_examples + d.val.num_examples == 61_251
    np.testing.assert_array_equal(
        np.asarray(d.val.counts), np.floor(0.1 * (np.asarray(d.train.counts)
                                                  + np.asarray(d.val.counts)))
    )
    p = fdata.ditto_fmnist(x_tr, y_tr, x_te, y_te, paper_split=True)
    total = 61_251 + 11_254
    assert p.train.num_examples + p.val.num_examples + p.test.num_examples == total
    np.testing.assert_allclose(np.mean(np.asarray(d.train.x), 0), 0.0, atol=0.1)
    # 500 clients of 31..1,378 rows: flat storage, not padded to the largest.
    m = fdata.memory_summary(d)
    assert m["raw_nbytes"] == total * (3 * 4 + 4)  # float32 x [n, 3], int32 y
    assert m["overhead_factor"] < 1.05 and m["padding_factor"] > 8


# -------------------------------------------------------------------- Dirichlet


# FedFDP's committed dataset/mnist/config.json (seed 1, alpha 0.1, 10 clients).
_FEDFDP_MNIST = {
    0: {0: 961, 2: 890, 3: 128, 4: 1, 6: 16, 7: 340},
    6: {1: 72, 4: 1, 6: 172, 7: 663},
    9: {0: 4333, 1: 1310, 2: 1, 3: 1, 4: 117, 5: 2, 6: 627, 7: 1, 8: 6819, 9: 1},
}
_FEDFDP_SIZES = [2336, 6798, 9965, 8324, 6961, 10164, 908, 9661, 1671, 13212]


@needs_data
def test_dirichlet_reproduces_fedfdp_mnist_partition():
    y = np.concatenate([_idx_labels("mnist", "train"), _idx_labels("mnist", "t10k")])
    idx = fdata.dirichlet_indices(y, 10, 0.1, min_size=10, seed=1)
    assert _sizes(idx).tolist() == _FEDFDP_SIZES
    for c, want in _FEDFDP_MNIST.items():
        labels, counts = np.unique(y[idx[c]], return_counts=True)
        assert dict(zip(labels.tolist(), counts.tolist())) == want


def test_dirichlet_minimum_size_and_coverage():
    y = _balanced_labels(300)
    for seed in range(3):
        idx = fdata.dirichlet_indices(y, 20, 0.05, min_size=25, seed=seed)
        assert _sizes(idx).min() >= 25
        allrows = np.sort(np.concatenate(idx))
        np.testing.assert_array_equal(allrows, np.arange(len(y)))
    with pytest.raises(ValueError, match="alpha"):
        fdata.dirichlet_indices(y, 10, 0.0)
    with pytest.raises(ValueError, match="min_size"):
        fdata.dirichlet_indices(y, 10, 0.1, min_size=10**6)


def test_dirichlet_federated_data_split():
    y = _balanced_labels(100)
    x = np.arange(len(y), dtype=np.float32)[:, None]
    d = fdata.dirichlet(x, y, 5, 0.5, min_size=10, seed=1)
    assert d.val is None and d.num_clients == 5
    total = np.asarray(d.train.counts) + np.asarray(d.test.counts)
    np.testing.assert_array_equal(np.asarray(d.test.counts), np.floor(0.25 * total))
    assert d.train.num_examples + d.test.num_examples == len(y)


# ------------------------------------------------------------ k classes (PFLlib)


def test_k_classes_per_client_pathological():
    y = _balanced_labels(200)
    idx = fdata.k_classes_indices(y, 10, 2, seed=1)
    for i, rows in enumerate(idx):
        m = 2 * (i // 2)  # clients 2m, 2m+1 share classes 2m, 2m+1
        assert sorted(np.unique(y[rows])) == [m, m + 1]
    np.testing.assert_array_equal(np.sort(np.concatenate(idx)), np.arange(len(y)))
    bal = fdata.k_classes_indices(y, 10, 2, balance=True)
    assert set(_sizes(bal)) == {200}
    with pytest.raises(ValueError, match="classes_per_client"):
        fdata.k_classes_indices(y, 10, 11)


# ------------------------------------------------------------------------ LINDT


def _cifar_like(seed=0, per_class=(500, 100)):
    y_tr = _balanced_labels(per_class[0], seed=seed)
    y_te = _balanced_labels(per_class[1], seed=seed + 1)
    x_tr = np.arange(len(y_tr), dtype=np.float32)[:, None]
    x_te = -np.arange(len(y_te), dtype=np.float32)[:, None]
    return x_tr, y_tr, x_te, y_te


def test_lindt_mixed_group_sizes_and_matching_distributions():
    x_tr, y_tr, x_te, y_te = _cifar_like(per_class=(5000, 1000))  # CIFAR-10 sizes
    ks = fdata.lindt_classes_per_client("mixed", 100)
    assert [int(np.sum(ks == k)) for k in (10, 5, 2)] == [50, 30, 20]
    d = fdata.lindt_cifar(x_tr, y_tr, x_te, y_te, "mixed", seed=0)
    assert d.train.num_examples == len(y_tr) and d.test.num_examples == len(y_te)
    ytr_all, yte_all = np.asarray(d.train.y), np.asarray(d.test.y)
    cut_tr = np.cumsum(np.asarray(d.train.counts))[:-1]
    cut_te = np.cumsum(np.asarray(d.test.counts))[:-1]
    n_classes = []
    for ytr, yte in zip(np.split(ytr_all, cut_tr), np.split(yte_all, cut_te)):
        n_classes.append(len(np.unique(ytr)))
        assert set(np.unique(yte)) <= set(np.unique(ytr))
        # same label distribution in train and test (5:1 of each class, up to the
        # one-row minimum per held train class and rounding)
        np.testing.assert_allclose(np.bincount(yte, minlength=10) * 5,
                                   np.bincount(ytr, minlength=10), atol=8)
    assert n_classes == ks.tolist()
    sizes = np.asarray(d.train.counts)
    assert sizes.std() > 0.5 * sizes.mean()  # log-normal, far from equal


# LINDT's Table 8 (App. C.1): std of the per-client data amount (mean 600).
_LINDT_TABLE8_STD = {"non_iid_10": 572, "non_iid_5": 811, "non_iid_2": 855,
                     "mixed": 732}


@pytest.mark.parametrize("scheme", sorted(_LINDT_TABLE8_STD))
def test_lindt_non_iid_classes_and_size_spread(scheme):
    x_tr, y_tr, x_te, y_te = _cifar_like(per_class=(5000, 1000))  # CIFAR-10 sizes
    ks = fdata.lindt_classes_per_client(scheme, 100)
    if scheme != "mixed":
        assert set(ks.tolist()) == {int(scheme.rsplit("_", 1)[1])}
    stds = []
    for seed in range(10):
        d = fdata.lindt_cifar(x_tr, y_tr, x_te, y_te, scheme, seed=seed)
        counts = np.asarray(d.train.counts) + np.asarray(d.test.counts)
        stds.append(counts.std())
        if seed:
            continue
        # every train/test row used exactly once (x holds the row index)
        np.testing.assert_array_equal(np.sort(np.asarray(d.train.x)[:, 0]),
                                      np.arange(len(y_tr)))
        np.testing.assert_array_equal(np.sort(-np.asarray(d.test.x)[:, 0]),
                                      np.arange(len(y_te)))
        cut = np.cumsum(np.asarray(d.train.counts))[:-1]
        held = [len(np.unique(y)) for y in np.split(np.asarray(d.train.y), cut)]
        assert held == ks.tolist()  # exactly k classes per client
    # log-normal sizes whose spread matches the paper's (sigma was fitted to it)
    assert abs(np.median(stds) / _LINDT_TABLE8_STD[scheme] - 1) < 0.15


def test_lindt_class_sigma_unbalances_classes_and_keeps_the_rest():
    x_tr, y_tr, x_te, y_te = _cifar_like(per_class=(5000, 1000))  # CIFAR-10 sizes
    ks = fdata.lindt_classes_per_client("mixed", 100)

    def per_client(d):
        cut = np.cumsum(np.asarray(d.train.counts))[:-1]
        cut_te = np.cumsum(np.asarray(d.test.counts))[:-1]
        return (np.split(np.asarray(d.train.y), cut),
                np.split(np.asarray(d.test.y), cut_te))

    even = fdata.lindt_cifar(x_tr, y_tr, x_te, y_te, "mixed", seed=0)
    zero = fdata.lindt_cifar(x_tr, y_tr, x_te, y_te, "mixed", class_sigma=0.0,
                             seed=0)
    np.testing.assert_array_equal(np.asarray(zero.train.x), np.asarray(even.train.x))
    skew = fdata.lindt_cifar(x_tr, y_tr, x_te, y_te, "mixed", class_sigma=2.0,
                             seed=0)
    # every row still used once, every client still holds exactly k_i classes
    np.testing.assert_array_equal(np.sort(np.asarray(skew.train.x)[:, 0]),
                                  np.arange(len(y_tr)))
    np.testing.assert_array_equal(np.sort(-np.asarray(skew.test.x)[:, 0]),
                                  np.arange(len(y_te)))
    (tr_even, _), (tr_skew, te_skew) = per_client(even), per_client(skew)
    assert [len(np.unique(y)) for y in tr_skew] == ks.tolist()

    def majority(ys):
        return np.array([np.bincount(y).max() / len(y) for y in ys])

    # the 10-class clients' majority class: about 1/10 balanced, about half
    # with log-normal(0, 2) proportions
    assert majority(tr_even)[ks == 10].mean() < 0.15
    assert majority(tr_skew)[ks == 10].mean() > 0.35
    assert np.all(majority(tr_skew)[ks == 2] >= 0.5)
    # train and test follow the same proportions (big clients: rounding aside)
    for ytr, yte in zip(tr_skew, te_skew):
        if len(ytr) > 1000:
            np.testing.assert_allclose(np.bincount(yte, minlength=10) / len(yte),
                                       np.bincount(ytr, minlength=10) / len(ytr),
                                       atol=0.03)


def test_lindt_iid_equal_sizes():
    x_tr, y_tr, x_te, y_te = _cifar_like()
    d = fdata.lindt_cifar(x_tr, y_tr, x_te, y_te, "iid", num_clients=10)
    assert set(np.asarray(d.train.counts).tolist()) == {500}
    assert set(np.asarray(d.test.counts).tolist()) == {100}
    with pytest.raises(ValueError, match="scheme"):
        fdata.lindt_cifar(x_tr, y_tr, x_te, y_te, "non_iid_3")
    with pytest.raises(ValueError, match="class_sigma: the iid scheme"):
        fdata.lindt_cifar(x_tr, y_tr, x_te, y_te, "iid", class_sigma=1.0)


# ------------------------------------------------------------------------- Fed+


def test_fedplus_mnist_negation_and_noise():
    y = _balanced_labels(40)
    x = np.full((len(y), 4), 50, np.uint8)  # 50/255 ~ 0.196 everywhere
    r = fdata.fedplus_mnist(x, y, 10, personal=False, seed=3)
    assert r.negated.sum() == 1 and r.noisy_classes.shape == (10, 0)
    for c in range(10):
        xc, _ = r.data.train.client(c)
        want = 1 - 50 / 255 if r.negated[c] else 50 / 255
        np.testing.assert_allclose(xc, want, rtol=1e-6)
    p = fdata.fedplus_mnist(x, y, 50, seed=3)
    assert p.negated.sum() == 10 and p.noisy_classes.shape == (50, 2)
    xc, yc = p.data.train.client(0)
    noisy = np.isin(yc, p.noisy_classes[0])
    base = 1 - 50 / 255 if p.negated[0] else 50 / 255
    assert np.all(np.abs(xc[~noisy] - base) < 1e-6)
    assert np.all(np.abs(xc[noisy] - base).max(1) > 1e-6)
    assert p.data.train.num_examples + p.data.test.num_examples == len(y)
    s = fdata.fedplus_mnist(x, y, 10, personal=False, negation="sign", seed=3)
    for c in range(10):
        want = -50 / 255 if s.negated[c] else 50 / 255
        np.testing.assert_allclose(s.data.train.client(c)[0], want, rtol=1e-6)
    for kw, name in (({"negation": "invert"}, "negation"),
                     ({"noise_scale": -1.0}, "noise_scale")):
        with pytest.raises(ValueError, match=name):
            fdata.fedplus_mnist(x, y, 10, **kw)


def test_fedplus_synthetic_regression_outlier():
    r = fdata.fedplus_synthetic_regression(10, dim=200, seed=0)
    assert r.data.train.x.shape == (500, 200) and r.data.train.y.shape == (500, 1)
    assert r.outlier.tolist() == [False] * 9 + [True]
    benign = r.w_true[:9]
    spread = np.linalg.norm(benign - benign.mean(0), axis=1).max()
    assert np.linalg.norm(r.w_true[9] - benign.mean(0)) > 2 * spread
    # spread="std": N(0, 5 I) has std 5, not sqrt(5), around the same draws
    s = fdata.fedplus_synthetic_regression(10, dim=200, spread="std", seed=0)
    ratio = np.std(s.w_true[:9].mean(0)) / np.std(r.w_true[:9].mean(0))
    assert 1.8 < ratio < 2.7  # sqrt(5) ~ 2.24
    with pytest.raises(ValueError, match="spread"):
        fdata.fedplus_synthetic_regression(10, spread="var")


def test_fedplus_synthetic_regression_party_mean():
    # "scalar": one shift mu_k for all of a party's coordinates; "vector": one each
    kw = dict(dim=200, samples_per_client=400, fractions=(1.0, 0.0, 0.0), seed=1)
    for mode, n_distinct in (("scalar", 1), ("vector", 200)):
        r = fdata.fedplus_synthetic_regression(10, party_mean=mode, **kw)
        cols = r.data.train.client(3)[0].mean(0)  # ~ mu_3 per coordinate
        se = 1.0 / np.sqrt(400)  # the inputs' variances are at most 1
        assert (np.ptp(cols) < 8 * se) == (n_distinct == 1)
    with pytest.raises(ValueError, match="party_mean"):
        fdata.fedplus_synthetic_regression(10, party_mean="matrix")


# ---------------------------------------------------------- FEMNIST, natural


def test_ditto_femnist_skewed_five_classes():
    y = _balanced_labels(40, num_classes=62)
    x = np.arange(len(y), dtype=np.float32)[:, None]
    d = fdata.ditto_femnist_skewed(x, y, seed=0)
    assert d.num_clients == 100
    for u in (0, 5, 61, 99):
        rows = np.concatenate([d.train.client(u)[1], d.test.client(u)[1],
                               d.val.client(u)[1]])
        assert set(np.unique(rows)) == {(u + j) % 62 for j in range(5)}
        xs = np.concatenate([d.train.client(u)[0], d.test.client(u)[0],
                             d.val.client(u)[0]])
        assert len(np.unique(xs)) == len(xs)  # no row twice within a device


def test_natural_groups_by_key():
    keys = np.array(["b", "a", "b", "c", "a", "b", "c", "c", "c"])
    x = np.arange(len(keys), dtype=np.float32)[:, None]
    y = np.zeros(len(keys), np.int64)
    d = fdata.natural(x, y, keys, fractions=(1.0, 0.0, 0.0), min_size=3)
    assert d.client_ids == ("b", "c")
    xb, _ = d.train.client(0)
    assert sorted(xb[:, 0].tolist()) == [0.0, 2.0, 5.0]


# ------------------------------------------------------------------ determinism


def _federated_equal(a, b):
    for s, t in zip(a.splits().values(), b.splits().values()):
        np.testing.assert_array_equal(np.asarray(s.x), np.asarray(t.x))
        np.testing.assert_array_equal(np.asarray(s.y), np.asarray(t.y))
        np.testing.assert_array_equal(np.asarray(s.counts), np.asarray(t.counts))


def _partitioners():
    y = _balanced_labels(60)
    x = np.random.default_rng(0).integers(0, 256, (len(y), 2), dtype=np.uint8)
    x_tr, y_tr, x_te, y_te = _cifar_like()
    y62 = _balanced_labels(20, num_classes=62)
    x62 = np.arange(len(y62), dtype=np.float32)[:, None]
    return {
        "natural": lambda s: fdata.natural(x, y, y % 7, seed=s),
        "iid": lambda s: fdata.iid(x, y, 6, seed=s),
        "k_classes": lambda s: fdata.k_classes_per_client(x, y, 10, 2, seed=s),
        "dirichlet": lambda s: fdata.dirichlet(x, y, 5, 0.3, min_size=5, seed=s),
        "ditto_fmnist": lambda s: fdata.ditto_fmnist(
            x, y, x[:200], y[:200], num_clients=20, seed=s, shuffle_seed=s),
        "femnist_skewed": lambda s: fdata.ditto_femnist_skewed(
            x62, y62, num_clients=30, seed=s),
        "lindt_mixed": lambda s: fdata.lindt_cifar(
            x_tr, y_tr, x_te, y_te, "mixed", num_clients=20, seed=s),
        "lindt_iid": lambda s: fdata.lindt_cifar(
            x_tr, y_tr, x_te, y_te, "iid", num_clients=20, seed=s),
        **{
            f"lindt_{k}": (lambda s, k=k: fdata.lindt_cifar(
                x_tr, y_tr, x_te, y_te, k, num_clients=20, seed=s))
            for k in ("non_iid_10", "non_iid_5", "non_iid_2")
        },
        "fedplus_mnist": lambda s: fdata.fedplus_mnist(x, y, 10, seed=s).data,
        "fedplus_regression": lambda s: fdata.fedplus_synthetic_regression(
            5, dim=20, seed=s).data,
    }


@pytest.mark.parametrize("name", sorted(_partitioners()))
def test_partitioners_are_deterministic(name):
    make = _partitioners()[name]
    _federated_equal(make(1), make(1))
    a, b = make(1), make(2)
    with pytest.raises(AssertionError):
        _federated_equal(a, b)


@pytest.mark.parametrize("call, match", [
    (lambda y: fdata.iid_indices(100, 0), "num_clients: must be an integer >= 1"),
    (lambda y: fdata.iid_indices(100, 2.0), "num_clients: must be an integer"),
    (lambda y: fdata.iid_indices(100, True), "num_clients: must be an integer"),
    (lambda y: fdata.iid_indices(-1, 2), "num_examples: must be an integer >= 0"),
    (lambda y: fdata.dirichlet_indices(y, 5, "0.1"), "alpha: must be a number"),
    (lambda y: fdata.dirichlet_indices(y, 5, float("nan")), "alpha: must be positive"),
    (lambda y: fdata.dirichlet_indices(y, 5, 0.1, min_size=-1), "min_size"),
    (lambda y: fdata.dirichlet_indices(y, 5, 0.1, max_tries=0), "max_tries"),
    (lambda y: fdata.dirichlet_indices(y, 5, 0.1, num_classes=2.5), "num_classes"),
    (lambda y: fdata.k_classes_indices(y, 5, "2"), "classes_per_client"),
    (lambda y: fdata.k_classes_indices(y, 5, 2, balance="yes"), "balance"),
    (lambda y: fdata.k_classes_indices(y, 5, 2, least_samples=-1.0), "least_samples"),
    (lambda y: fdata.class_subset_lognormal_indices(y, y, [2.5, 3.0]),
     "classes_per_client: need one integer"),
    (lambda y: fdata.class_subset_lognormal_indices(y, y, [2, 3], sigma=-1.0),
     "sigma: must be non-negative"),
    (lambda y: fdata.class_subset_lognormal_indices(y, y, [2, 3], sigma="1"),
     "sigma: must be a number"),
    (lambda y: fdata.class_subset_lognormal_indices(y, y, [2, 3], class_sigma=-0.5),
     "class_sigma: must be non-negative"),
    (lambda y: fdata.lindt_classes_per_client("mixed", 0), "num_clients"),
    (lambda y: fdata.lindt_classes_per_client(None), "scheme: must be one of"),
    (lambda y: fdata.fedprox_synthetic(-1.0), "alpha: must be non-negative"),
    (lambda y: fdata.fedprox_synthetic(1.0, float("nan")), "beta"),
    (lambda y: fdata.fedprox_synthetic(num_clients=3.0), "num_clients"),
    (lambda y: fdata.fedprox_synthetic(max_size=0), "max_size"),
    (lambda y: fdata.point_estimation_problem(num_clients=4, num_malicious=4),
     "num_malicious"),
    (lambda y: fdata.point_estimation_problem(sigma=-0.1), "sigma"),
    (lambda y: fdata.linear_regression_problem(dim=0), "dim"),
])
def test_wrong_types_and_values_are_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call(_balanced_labels(20))
