"""Loaders on tiny generated files (always) and on the real data (FEDJAX_PFL_DATA_DIR)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import lzma
import os
import pickle
import sys
import tarfile
import types
from pathlib import Path

import numpy as np
import pytest

from fedjax_pfl import data as D
from fedjax_pfl.data import _loaders, _registry
from fedjax_pfl.data._registry import CIFAR_ARCHIVE, CIFAR_BATCH_DIR, FileSpec

REAL = os.environ.get("FEDJAX_PFL_DATA_DIR")
real = pytest.mark.skipif(not REAL, reason="FEDJAX_PFL_DATA_DIR not set")


def _spec(path: Path) -> FileSpec:
    data = path.read_bytes()
    return FileSpec(hashlib.sha256(data).hexdigest(), len(data), "sha256")


def _registry_of(root: Path) -> dict[str, FileSpec]:
    return {
        p.relative_to(root).as_posix(): _spec(p) for p in root.rglob("*") if p.is_file()
    }


def _idx(arr: np.ndarray) -> bytes:
    head = bytes([0, 0, 0x08, arr.ndim]) + b"".join(
        int(s).to_bytes(4, "big") for s in arr.shape
    )
    return gzip.compress(head + arr.astype(np.uint8).tobytes())


def _write_idx_dataset(root: Path, subdir: str = "mnist", n_train=5, n_test=3):
    rng = np.random.default_rng(0)
    arrays = (
        rng.integers(0, 256, (n_train, 28, 28)),
        rng.integers(0, 10, n_train),
        rng.integers(0, 256, (n_test, 28, 28)),
        rng.integers(0, 10, n_test),
    )
    names = (
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    )
    (root / subdir).mkdir(parents=True, exist_ok=True)
    for a, n in zip(arrays, names):
        (root / subdir / n).write_bytes(_idx(a))
    return arrays


def _gz_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(obj).encode()))


# ---------------------------------------------------------------- IDX + hash checks


def test_mnist_tiny_roundtrip(tmp_path):
    arrays = _write_idx_dataset(tmp_path)
    reg = _registry_of(tmp_path)
    out = D.load_mnist(tmp_path, registry=reg)
    for got, want in zip(out, arrays):
        np.testing.assert_array_equal(got, want)
    assert out[0].dtype == np.uint8 and out[1].dtype == np.int32
    xf = D.load_mnist(tmp_path, as_float=True, verify=False)[0]
    assert xf.dtype == np.float32 and xf.max() <= 1.0
    np.testing.assert_allclose(xf * 255, arrays[0], atol=1e-4)


def test_unknown_file_needs_verify_false(tmp_path):
    _write_idx_dataset(tmp_path)
    with pytest.raises(D.DatasetError, match="verify=False"):
        D.load_mnist(tmp_path, registry={})


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_damaged_file_raises_and_names_it(tmp_path, damage):
    _write_idx_dataset(tmp_path)
    reg = _registry_of(tmp_path)
    f = tmp_path / "mnist" / "train-images-idx3-ubyte.gz"
    data = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        f.write_bytes(data[:-12] + bytes([data[-12] ^ 1]) + data[-11:])
    else:
        f.unlink()
    with pytest.raises(D.DatasetError, match="train-images-idx3-ubyte.gz") as e:
        D.load_mnist(tmp_path, registry=reg, cache_dir=tmp_path / "nocache")
    assert "mnist" in str(e.value)  # says where to obtain it
    if damage == "truncate":  # even unverified, a truncated gzip is a clear error
        with pytest.raises(D.DatasetError, match="truncated"):
            D.load_mnist(tmp_path, verify=False)


def test_real_registry_rejects_fake_content(tmp_path):
    _write_idx_dataset(tmp_path)  # right names, wrong bytes
    with pytest.raises(D.DatasetError, match="not the expected version"):
        D.load_mnist(tmp_path)


def test_parse_idx_rejects_bad_payload():
    with pytest.raises(D.DatasetError, match="magic"):
        D.parse_idx(b"\x01\x02\x08\x01")
    good = gzip.decompress(_idx(np.zeros((2, 3))))
    assert D.parse_idx(good).shape == (2, 3)
    with pytest.raises(D.DatasetError, match="payload"):
        D.parse_idx(good[:-1])


def test_download_via_file_url(tmp_path, monkeypatch):
    src = tmp_path / "mirror"
    arrays = _write_idx_dataset(src)
    reg = _registry_of(src)
    for rel in reg:
        monkeypatch.setitem(_registry.DOWNLOAD_URLS, rel, (src / rel).as_uri())
    cache = tmp_path / "cache"
    with pytest.raises(D.DatasetError, match="download=True|obtain|Obtain"):
        D.load_mnist(tmp_path / "empty", cache_dir=cache, registry=reg)
    out = D.load_mnist(tmp_path / "empty", download=True, cache_dir=cache, registry=reg)
    np.testing.assert_array_equal(out[0], arrays[0])
    assert (cache / "mnist" / "t10k-labels-idx1-ubyte.gz").is_file()
    # A download that fails its hash is rejected and nothing is kept.
    bad = dict(reg)
    rel = "mnist/train-labels-idx1-ubyte.gz"
    bad[rel] = FileSpec("0" * 64, None, "sha256")
    cache2 = tmp_path / "cache2"
    with pytest.raises(D.DatasetError, match="rejected"):
        D.load_mnist(tmp_path / "empty", download=True, cache_dir=cache2, registry=bad)
    assert not (cache2 / rel).exists()
    assert not list((cache2 / "mnist").glob("*.part"))


# ---------------------------------------------------------------- CIFAR + unpickler


def _cifar_tiny(root: Path, n=4):
    rng = np.random.default_rng(1)
    d = root / CIFAR_BATCH_DIR
    d.mkdir(parents=True)
    xs, ys = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        x = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        y = [int(v) for v in rng.integers(0, 10, n)]
        batch = {
            b"batch_label": b"tiny",
            b"labels": y,
            b"data": x,
            b"filenames": [b"a.png"] * n,
        }
        (d / name).write_bytes(pickle.dumps(batch, protocol=2))
        xs.append(x.reshape(n, 3, 32, 32).transpose(0, 2, 3, 1))
        ys.append(np.asarray(y))
    return np.concatenate(xs[:5]), np.concatenate(ys[:5]), xs[5], ys[5]


def test_cifar_pickle_batches(tmp_path):
    want = _cifar_tiny(tmp_path)
    got = D.load_cifar10(tmp_path, registry=_registry_of(tmp_path))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    chw = D.load_cifar10(tmp_path, channels_last=False, verify=False)[0]
    assert chw.shape == (20, 3, 32, 32)


def test_cifar_npy_layout(tmp_path):
    rng = np.random.default_rng(2)
    (tmp_path / "cifar10").mkdir()
    want = []
    for s, n in (("train", 6), ("test", 2)):
        x = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        y = rng.integers(0, 10, n).astype(np.uint8)
        buf = io.BytesIO()
        np.save(buf, x)
        (tmp_path / f"cifar10/{s}_x.npy.xz").write_bytes(lzma.compress(buf.getvalue()))
        np.save(tmp_path / f"cifar10/{s}_y.npy", y)
        want += [x.transpose(0, 2, 3, 1), y]
    got = D.load_cifar10(tmp_path, registry=_registry_of(tmp_path))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    xz = tmp_path / "cifar10/test_x.npy.xz"
    xz.write_bytes(xz.read_bytes()[:-20])
    with pytest.raises(D.DatasetError, match="test_x"):
        D.load_cifar10(tmp_path, layout="npy", verify=False)


def test_cifar_download_archive(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    want = _cifar_tiny(mirror)
    reg = _registry_of(mirror)
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(mirror / CIFAR_BATCH_DIR, arcname="cifar-10-batches-py")
    reg[CIFAR_ARCHIVE] = _spec(archive)
    monkeypatch.setitem(_registry.DOWNLOAD_URLS, CIFAR_ARCHIVE, archive.as_uri())
    got = D.load_cifar10(
        tmp_path / "empty", download=True, cache_dir=tmp_path / "c", registry=reg
    )
    np.testing.assert_array_equal(got[0], want[0])


class _Evil:
    def __reduce__(self):
        return (os.mkdir, (_Evil.target,))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_restricted_unpickler_refuses_code(tmp_path, protocol):
    _Evil.target = str(tmp_path / "pwned")
    payload = pickle.dumps({b"data": _Evil()}, protocol=protocol)
    with pytest.raises(D.DatasetError, match="refus"):
        D.safe_unpickle(payload)
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(pickle.UnpicklingError):
        D.RestrictedUnpickler(io.BytesIO(payload)).load()
    obj = np.array([object()], dtype=object)
    with pytest.raises(D.DatasetError):
        D.safe_unpickle(pickle.dumps(obj, protocol=protocol))


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_restricted_unpickler_reads_numeric_arrays(protocol):
    a = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    f = np.asfortranarray(np.linspace(0, 1, 6).reshape(2, 3))
    out = D.safe_unpickle(pickle.dumps({b"a": a, b"f": f, b"l": [1, b"x"]}, protocol))
    np.testing.assert_array_equal(out[b"a"], a)
    np.testing.assert_array_equal(out[b"f"], f)
    assert out[b"l"] == [1, b"x"]


# ---------------------------------------------------------------- natural partitions


def _leaf_user(rng, n, dim=784):
    return {
        "x": rng.random((n, dim)).round(3).tolist(),
        "y": rng.integers(0, 62, n).tolist(),
    }


def _femnist_tiny(root: Path):
    rng = np.random.default_rng(3)
    base = root / "femnist_leaf" / "runA"
    users = {"w1": 5, "w2": 3, "w3": 4}
    for split, frac in (("train", 1), ("test", 2)):
        obj = {"users": list(users), "num_samples": [], "user_data": {}}
        for u, n in users.items():
            obj["user_data"][u] = _leaf_user(rng, n // frac)
        _gz_json(base / split / f"all_data_0_niid_05_keep_0_{split}_9.json.gz", obj)
    rows = [
        "writer\tsource\tcommit\tfile_index\tn_train\tn_test\tstatus",
        "w1\trunA\tc\t0\t5\t2\tprimary",
        "w2\trunA\tc\t0\t3\t1\tprimary",
        "w3\trunA\tc\t0\t4\t2\tduplicate_of:runB/1",
    ]
    (root / "femnist_leaf" / "writers.tsv").write_text("\n".join(rows) + "\n")


def test_femnist_tiny_manifest(tmp_path):
    _femnist_tiny(tmp_path)
    fd = D.load_femnist(tmp_path, registry=_registry_of(tmp_path))
    assert fd.client_ids == ("w1", "w2")  # duplicate_of rows skipped
    assert [int(c) for c in fd.train.counts] == [5, 3]
    assert [int(c) for c in fd.test.counts] == [2, 1]
    assert fd.train.x.shape[1:] == (28, 28, 1) and fd.val is None
    flat = D.load_femnist(tmp_path, verify=False, flatten=True, max_writers=1)
    assert flat.num_clients == 1 and flat.train.x.shape == (5, 784)


def test_femnist_without_manifest(tmp_path):
    _femnist_tiny(tmp_path)
    (tmp_path / "femnist_leaf" / "writers.tsv").unlink()
    fd = D.load_femnist(tmp_path, subdir="femnist_leaf/runA", verify=False)
    assert fd.client_ids == ("w1", "w2", "w3")


def _vehicle_tiny(root: Path, sizes=(8, 12, 20)):
    rng = np.random.default_rng(4)
    users = [f"f_{i:05d}" for i in range(len(sizes))]
    data = {
        u: {
            "x": rng.normal(size=(n, 100)).tolist(),
            "y": rng.choice([-1, 1], (n, 1)).tolist(),
        }
        for u, n in zip(users, sizes)
    }
    _gz_json(
        root / "vehicle_ditto/train/mytrain.json.gz",
        {"users": users, "num_samples": list(sizes), "user_data": data},
    )


def test_vehicle_holdout_is_seeded(tmp_path):
    _vehicle_tiny(tmp_path)
    reg = _registry_of(tmp_path)
    a = D.load_vehicle(tmp_path, test_fraction=0.25, seed=1, registry=reg)
    b = D.load_vehicle(tmp_path, test_fraction=0.25, seed=1, registry=reg)
    c = D.load_vehicle(tmp_path, test_fraction=0.25, seed=2, registry=reg)
    assert a.num_clients == 3 and a.train.x.shape[1:] == (100,)
    assert a.train.num_examples + a.test.num_examples == 40
    np.testing.assert_array_equal(a.test.x, b.test.x)
    assert not np.array_equal(a.test.x, c.test.x)
    assert set(np.unique(a.train.y).tolist()) <= {-1, 1}
    z = D.load_vehicle(tmp_path, labels="01", verify=False, test_fraction=0.0)
    assert z.test is None and set(np.unique(z.train.y).tolist()) <= {0, 1}
    with pytest.raises(ValueError, match="test_fraction"):
        D.load_vehicle(tmp_path, test_fraction=1.0, verify=False)


def _celeba_tiny(root: Path):
    from PIL import Image

    rng = np.random.default_rng(5)
    d = root / "celeba_leaf_ditto"
    img_dir = d / "img_align_celeba"
    img_dir.mkdir(parents=True)
    parts = {"train": {"10": 3, "20": 2}, "test": {"10": 1, "20": 1}}
    k = 0
    for split, users in parts.items():
        obj = {
            "users": list(users),
            "num_samples": list(users.values()),
            "user_data": {},
        }
        for u, n in users.items():
            names = [f"{k + i:06d}.jpg" for i in range(n)]
            k += n
            for nm in names:
                Image.fromarray(
                    rng.integers(0, 256, (218, 178, 3), dtype=np.uint8)
                ).save(img_dir / nm, "JPEG")
            obj["user_data"][u] = {"x": names, "y": [int(i % 2) for i in range(n)]}
        _gz_json(d / split / f"all_data_niid_1_keep_25_{split}_8.json.gz", obj)
    return img_dir


def test_celeba_tiny_images(tmp_path):
    pytest.importorskip("PIL")
    img_dir = _celeba_tiny(tmp_path)
    reg = {k: v for k, v in _registry_of(tmp_path).items() if k.endswith(".gz")}
    fd = D.load_celeba(tmp_path, registry=reg)
    assert fd.client_ids == ("10", "20")
    assert fd.train.x.shape == (5, 84, 84, 3) and fd.test.num_examples == 2
    assert float(fd.train.x.max()) > 1.0  # raw 0-255 values, as in LEAF/Ditto
    u8 = D.load_celeba(tmp_path, verify=False, dtype=np.uint8, image_size=16)
    assert u8.train.x.dtype == np.uint8 and u8.train.x.shape[1:] == (16, 16, 3)
    next(img_dir.iterdir()).unlink()
    with pytest.raises(D.DatasetError, match="missing"):
        D.load_celeba(tmp_path, verify=False)


def test_celeba_without_images_is_clear(tmp_path, monkeypatch):
    pytest.importorskip("PIL")
    img_dir = _celeba_tiny(tmp_path)
    for f in img_dir.iterdir():
        f.unlink()
    img_dir.rmdir()
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # not installed
    with pytest.raises(D.DatasetError, match="img_align_celeba"):
        D.load_celeba(tmp_path, verify=False)


_PLAY = """First Citizen:
Before we proceed any further, hear me speak.
Speak, speak, speak you all; I cost $5 to hear.

All:
Resolved.

First Citizen:
You are all resolved rather to die than to famish?   Yes, to famish.

Second Citizen:
One word, good citizens, one word more, and we shall all go home in peace and quiet.
"""


def test_shakespeare_roles_and_windows(tmp_path):
    assert len(D.LEAF_SHAKESPEARE_VOCAB) == 80
    roles = D.shakespeare_roles(_PLAY)
    assert list(roles) == ["First Citizen", "All", "Second Citizen"]
    assert "  " not in roles["First Citizen"]
    ids = D.encode_chars(roles["First Citizen"])
    space = D.LEAF_SHAKESPEARE_VOCAB.index(" ")
    assert ids[roles["First Citizen"].index("$")] == space
    np.testing.assert_array_equal(D.encode_chars("a\u00e9\u2014?"), [53, 1, 1, 24])
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare/input.txt").write_text(_PLAY)
    fd = D.load_shakespeare(tmp_path, seq_len=10, registry=_registry_of(tmp_path))
    assert fd.client_ids == ("First Citizen", "Second Citizen")  # "All" is too short
    x, y = fd.train.client(0)
    n = ids.shape[0] - 10
    n_tr = max(1, int(0.8 * n))
    assert x.shape == (n_tr, 10) and x.dtype == np.int32
    np.testing.assert_array_equal(x[3], ids[3:13])
    assert y[3] == ids[13]
    xt, _yt = fd.test.client(0)
    assert xt.shape[0] == n - (n_tr + 9)  # LEAF: test starts seq_len - 1 later
    np.testing.assert_array_equal(xt[0], ids[n_tr + 9 : n_tr + 19])
    one = D.load_shakespeare(
        tmp_path, seq_len=10, max_clients=1, verify=False, x_dtype=np.uint8
    )
    assert one.num_clients == 1 and one.train.x.dtype == np.uint8


def test_shakespeare_leaf_json(tmp_path):
    s = "To be, or not to be, that is the question: Whether 'tis nobler in the mind"
    s = (s + " to suffer")[:80]
    for split in ("train", "test"):
        _gz_json(
            tmp_path / f"shakespeare_leaf/{split}/all_data.json.gz",
            {
                "users": ["HAMLET"],
                "num_samples": [2],
                "user_data": {"HAMLET": {"x": [s, s[1:] + "x"], "y": ["x", " "]}},
            },
        )
    with pytest.raises(D.DatasetError, match="verify=False"):
        D.load_shakespeare(tmp_path)
    fd = D.load_shakespeare(tmp_path, verify=False)
    assert fd.train.x.shape == (2, 80)
    np.testing.assert_array_equal(fd.train.x[0], D.encode_chars(s))


# ---------------------------------------------------------------- TFDS, status


def test_tfds_arrays_with_fake_module(monkeypatch):
    calls = {}

    def data_source(name, split, data_dir, download):
        calls[split] = (name, data_dir, download)
        n = 3 if split == "train" else 2
        return [
            {"image": np.full((4, 4, 1), i, np.uint8), "label": i} for i in range(n)
        ]

    monkeypatch.setitem(
        sys.modules,
        "tensorflow_datasets",
        types.SimpleNamespace(data_source=data_source),
    )
    x, y, xt, _yt = D.load_tfds_arrays("mnist", data_dir="/tfds")
    assert x.shape == (3, 4, 4, 1) and list(y) == [0, 1, 2] and xt.shape[0] == 2
    assert calls["train"] == ("mnist", "/tfds", False)


def test_tfds_missing_is_clear(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(D.DatasetError, match="tensorflow_datasets"):
        D.load_tfds_arrays("mnist")


def test_tfds_real_if_installed(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    with pytest.raises(D.DatasetError, match="not found"):
        D.tfds_source("mnist", "train", tmp_path)


def test_status_and_memory(tmp_path):
    _write_idx_dataset(tmp_path)
    reg = _registry_of(tmp_path)
    rows = {r["name"]: r for r in D.dataset_status(tmp_path, registry=reg)}
    assert rows["mnist"]["status"] == "ok" and rows["mnist"]["verified"] == 4
    assert rows["femnist"]["status"] == "missing" and rows["femnist"]["obtain"]
    (tmp_path / "mnist/t10k-labels-idx1-ubyte.gz").write_bytes(b"junk")
    rows = D.dataset_status(tmp_path, registry=reg)
    assert {r["name"]: r["status"] for r in rows}["mnist"] == "corrupt"
    text = D.format_dataset_status(rows)
    assert "mnist" in text and "corrupt" in text and "t10k-labels" in text
    fd = D.from_client_arrays(
        [(np.zeros((1, 2)), np.zeros(1, int)), (np.zeros((9, 2)), np.zeros(9, int))]
    )
    m = D.memory_summary(fd)
    assert m["num_clients"] == 2 and m["padded_nbytes"] > m["nbytes"] - 100
    assert m["padding_factor"] == pytest.approx(18 * 12 / (10 * 12))


def test_data_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.delenv(D.DATA_DIR_ENV, raising=False)
    with pytest.raises(D.DatasetError, match=D.DATA_DIR_ENV):
        D.load_vehicle()
    _vehicle_tiny(tmp_path)
    monkeypatch.setenv(D.DATA_DIR_ENV, str(tmp_path))
    assert D.load_vehicle(verify=False).num_clients == 3


# ---------------------------------------------------------------- real files


@real
def test_real_femnist_counts():
    fd = D.load_femnist()
    assert fd.num_clients == 300
    assert fd.train.num_examples == 41_202 and fd.test.num_examples == 4_730
    assert int(fd.train.y.max()) <= 61 and float(fd.train.x.max()) <= 1.0
    assert D.memory_summary(fd)["padding_factor"] > 1.0


@real
def test_real_vehicle_counts():
    fd = D.load_vehicle(test_fraction=0.2, seed=0)
    assert fd.num_clients == 23 and fd.train.x.shape[1:] == (100,)
    assert fd.train.num_examples + fd.test.num_examples == 1_860


@real
@pytest.mark.parametrize("loader", [D.load_mnist, D.load_fashion_mnist])
def test_real_idx(loader):
    x, y, xt, yt = loader()
    assert x.shape == (60_000, 28, 28) and xt.shape == (10_000, 28, 28)
    mnist_test = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    want = [1000] * 10 if loader is D.load_fashion_mnist else mnist_test
    assert np.bincount(yt).tolist() == want
    assert y.min() == 0 and y.max() == 9


@real
def test_real_cifar_test_split():
    # The cheaper half of the npy layout (the full train xz takes ~10 s).
    root = Path(REAL)
    x = _loaders._load_npy(root, "cifar10/test_x.npy.xz", True, None)
    y = _loaders._load_npy(root, "cifar10/test_y.npy", True, None)
    assert x.shape == (9_966, 3, 32, 32) and x.dtype == np.uint8
    assert np.bincount(y).tolist() == [1000] * 7 + [999, 967, 1000]


@real
def test_real_shakespeare_substitute():
    fd = D.load_shakespeare(max_clients=5)
    assert fd.num_clients == 5 and fd.train.x.shape[1] == 80
    assert int(fd.train.x.max()) < 80 and fd.client_ids[0] == "First Citizen"


@real
def test_real_celeba_partition_without_images(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    if (Path(REAL) / "celeba_leaf_ditto/img_align_celeba").is_dir():
        pytest.skip("CelebA images present")
    with pytest.raises(D.DatasetError, match="img_align_celeba"):
        D.load_celeba()


@real
def test_real_file_damaged_copy(tmp_path):
    src = Path(REAL) / "vehicle_ditto/train/mytrain.json.gz"
    dst = tmp_path / "vehicle_ditto/train/mytrain.json.gz"
    dst.parent.mkdir(parents=True)
    dst.write_bytes(src.read_bytes()[:-100])
    with pytest.raises(D.DatasetError, match="mytrain.json.gz.*Obtain vehicle"):
        D.load_vehicle(tmp_path)


@real
def test_real_status_quick():
    rows = {r["name"]: r for r in D.dataset_status(verify=False)}
    for name in (
        "mnist",
        "fashion_mnist",
        "cifar10",
        "femnist",
        "vehicle",
        "shakespeare",
    ):
        assert rows[name]["status"] == "ok", rows[name]
    assert rows["femnist"]["expected"] == 121
