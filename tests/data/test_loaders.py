"""Loaders on tiny generated files (always) and on the real data (FEDJAX_PFL_DATA_DIR)."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import lzma
import os
import pickle
import re
import shutil
import sys
import tarfile
import types
from pathlib import Path

import numpy as np
import pytest

from fedjax_pfl import data as D
from fedjax_pfl.data import _leaf, _loaders, _registry
from fedjax_pfl.data._registry import (
    CIFAR_ARCHIVE,
    CIFAR_BATCH_DIR,
    TINY_SHAKESPEARE,
    FileSpec,
)

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


@pytest.mark.parametrize(
    "loader, subdir",
    [(D.load_mnist, "mnist"), (D.load_fashion_mnist, "fashion_mnist")],
)
def test_idx_tiny_roundtrip(tmp_path, loader, subdir):
    arrays = _write_idx_dataset(tmp_path, subdir)
    other = "mnist" if subdir == "fashion_mnist" else "fashion_mnist"
    _write_idx_dataset(tmp_path, other, n_train=2, n_test=1)  # must not be read
    reg = _registry_of(tmp_path)
    out = loader(tmp_path, registry=reg)
    for got, want in zip(out, arrays):
        np.testing.assert_array_equal(got, want)
    assert out[0].dtype == np.uint8 and out[1].dtype == np.int32
    xf = loader(tmp_path, as_float=True, verify=False)[0]
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


def _cifar_npy_tiny(root: Path):
    rng = np.random.default_rng(2)
    (root / "cifar10").mkdir(parents=True)
    want = []
    for s, n in (("train", 6), ("test", 2)):
        x = rng.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8)
        y = rng.integers(0, 10, n).astype(np.uint8)
        buf = io.BytesIO()
        np.save(buf, x)
        (root / f"cifar10/{s}_x.npy.xz").write_bytes(lzma.compress(buf.getvalue()))
        np.save(root / f"cifar10/{s}_y.npy", y)
        want += [x.transpose(0, 2, 3, 1), y]
    return want


def test_cifar_npy_layout(tmp_path):
    want = _cifar_npy_tiny(tmp_path)
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


def test_femnist_validation_is_the_tail_of_each_train_list(tmp_path):
    _femnist_tiny(tmp_path)
    full = D.load_femnist(tmp_path, registry=_registry_of(tmp_path), flatten=True)
    fd = D.load_femnist(tmp_path, registry=_registry_of(tmp_path), flatten=True,
                        val_fraction=0.4, val_split="tail")
    # floor(0.4 n) rows of each writer, from the end of its train list
    assert [int(c) for c in fd.train.counts] == [3, 2]
    assert [int(c) for c in fd.val.counts] == [2, 1]
    np.testing.assert_array_equal(fd.test.x, full.test.x)
    for c, (n_tr, n_val) in enumerate(((3, 2), (2, 1))):
        rows = np.asarray(full.train.x[full.train.offsets[c]:][:n_tr + n_val])
        np.testing.assert_array_equal(
            fd.train.x[fd.train.offsets[c]:][:n_tr], rows[:n_tr])
        np.testing.assert_array_equal(
            fd.val.x[fd.val.offsets[c]:][:n_val], rows[n_tr:])
    with pytest.raises(ValueError, match="val_fraction"):
        D.load_femnist(tmp_path, registry=_registry_of(tmp_path), val_fraction=1.0)


def test_femnist_random_validation_rows(tmp_path):
    """``val_split='random'`` (the default): the same row counts as the tail,
    rows drawn by ``val_seed``; train and val partition each writer's rows,
    both in their original order."""
    _femnist_tiny(tmp_path)
    reg = _registry_of(tmp_path)
    full = D.load_femnist(tmp_path, registry=reg, flatten=True)
    picks = set()
    for seed in range(8):
        fd = D.load_femnist(tmp_path, registry=reg, flatten=True, val_fraction=0.4,
                            val_seed=seed)
        assert [int(c) for c in fd.val.counts] == [2, 1]
        again = D.load_femnist(tmp_path, registry=reg, flatten=True,
                               val_fraction=0.4, val_seed=seed)
        np.testing.assert_array_equal(fd.val.x, again.val.x)
        for c in range(2):
            rows = [tuple(r) for r in np.asarray(full.train.client(c)[0])]
            tr = [rows.index(tuple(r)) for r in np.asarray(fd.train.client(c)[0])]
            va = [rows.index(tuple(r)) for r in np.asarray(fd.val.client(c)[0])]
            assert sorted(tr + va) == list(range(len(rows)))
            assert tr == sorted(tr) and va == sorted(va)
            picks.add((c, tuple(va)))
    assert len({p for p in picks if p[0] == 0}) > 1  # the seed moves the rows
    with pytest.raises(ValueError, match="val_split: must be one of"):
        D.load_femnist(tmp_path, registry=reg, val_fraction=0.4, val_split="last")


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
    assert a.train.num_examples + a.val.num_examples + a.test.num_examples == 40
    np.testing.assert_array_equal(a.test.x, b.test.x)
    # Default: the Ditto paper's 72/8/20 per vehicle (floor for val and test).
    d = D.load_vehicle(tmp_path, registry=reg)
    assert np.asarray(d.val.counts).tolist() == [0, 0, 1]
    assert np.asarray(d.test.counts).tolist() == [1, 2, 4]
    assert not np.array_equal(a.test.x, c.test.x)
    assert set(np.unique(a.train.y).tolist()) <= {-1, 1}
    z = D.load_vehicle(
        tmp_path, labels="01", verify=False, test_fraction=0.0, val_fraction=0.0
    )
    assert z.test is None and z.val is None and set(np.unique(z.train.y).tolist()) <= {0, 1}
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
    assert m["num_clients"] == 2 and m["examples"] == {"train": 10}
    assert m["raw_nbytes"] == 10 * (2 * 4 + 4)  # float32 x [10, 2], int32 y
    assert m["nbytes"] == m["raw_nbytes"] + 3 * 2 * 4  # offsets, counts, key ids
    assert m["overhead_factor"] == pytest.approx(144 / 120)
    assert m["padded_nbytes"] == 2 * 9 * 12  # two clients padded to 9 rows
    assert m["padding_factor"] == pytest.approx(18 * 12 / (10 * 12))


def test_data_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.delenv(D.DATA_DIR_ENV, raising=False)
    with pytest.raises(D.DatasetError, match=D.DATA_DIR_ENV):
        D.load_vehicle()
    _vehicle_tiny(tmp_path)
    monkeypatch.setenv(D.DATA_DIR_ENV, str(tmp_path))
    assert D.load_vehicle(verify=False).num_clients == 3


# ---------------------------------------------------------------- real files


@pytest.mark.slow  # ~12 s: reads all of FEMNIST; run with -m slow
@real
def test_real_femnist_counts():
    fd = D.load_femnist()
    assert fd.num_clients == 300
    assert fd.train.num_examples == 41_202 and fd.test.num_examples == 4_730
    assert int(fd.train.y.max()) <= 61 and float(fd.train.x.max()) <= 1.0
    # writers.tsv: 320 rows, 20 of them `duplicate_of:` rows that must be skipped;
    # each writer's counts are those of its primary row (its other LEAF run
    # split the same writer differently).
    with open(Path(REAL) / "femnist_leaf/writers.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert len(rows) == 320
    primary = {r["writer"]: r for r in rows if r["status"] == "primary"}
    dups = [r for r in rows if r["status"].startswith("duplicate_of:")]
    assert len(primary) == 300 and len(dups) == 20
    assert fd.client_ids == tuple(r["writer"] for r in rows if r["status"] == "primary")
    want_tr = [int(primary[w]["n_train"]) for w in fd.client_ids]
    want_te = [int(primary[w]["n_test"]) for w in fd.client_ids]
    assert np.asarray(fd.train.counts).tolist() == want_tr
    assert np.asarray(fd.test.counts).tolist() == want_te
    assert any(
        (int(d["n_train"]), int(d["n_test"]))
        != (int(primary[d["writer"]]["n_train"]), int(primary[d["writer"]]["n_test"]))
        for d in dups
    )  # so loading a duplicate row instead would change the counts above
    # Memory: flat storage, nothing padded (the largest writer is ~2x the mean).
    m = D.memory_summary(fd)
    assert m["raw_nbytes"] == (41_202 + 4_730) * (784 * 4 + 4)
    assert m["overhead_factor"] < 1.001 and m["padding_factor"] > 2.0


@real
def test_real_vehicle_counts():
    fd = D.load_vehicle(seed=0)  # 72/8/20 hold-out of Ditto's train file
    assert fd.num_clients == 23 and fd.train.x.shape[1:] == (100,)
    total = fd.train.num_examples + fd.val.num_examples + fd.test.num_examples
    assert total == 1_860
    sizes = np.asarray(fd.train.counts) + np.asarray(fd.val.counts)
    sizes = sizes + np.asarray(fd.test.counts)
    # Ditto's create_dataset.py: int(lognormal(3, 1.2)) + 5 rows, seed 666 + i.
    want = [int(np.random.RandomState(666 + i).lognormal(3, 1.2)) + 5 for i in range(23)]
    assert sizes.tolist() == want


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


# ---------------------------------------------------------------- every loader: damage


def _shakespeare_tiny(root: Path) -> None:
    (root / "tinyshakespeare").mkdir(parents=True, exist_ok=True)
    (root / TINY_SHAKESPEARE).write_text(_PLAY)


def _load_celeba(root, **kw):
    pytest.importorskip("PIL")
    return D.load_celeba(root, image_size=8, **kw)


# name -> (writer of tiny files, the file to damage, loader)
_DAMAGE_CASES = {
    "femnist_json": (
        _femnist_tiny,
        "femnist_leaf/runA/test/all_data_0_niid_05_keep_0_test_9.json.gz",
        D.load_femnist,
    ),
    "femnist_manifest": (_femnist_tiny, "femnist_leaf/writers.tsv", D.load_femnist),
    "vehicle": (_vehicle_tiny, "vehicle_ditto/train/mytrain.json.gz", D.load_vehicle),
    "celeba": (
        _celeba_tiny,
        "celeba_leaf_ditto/train/all_data_niid_1_keep_25_train_8.json.gz",
        _load_celeba,
    ),
    "shakespeare": (
        _shakespeare_tiny,
        TINY_SHAKESPEARE,
        lambda root, **kw: D.load_shakespeare(root, seq_len=10, **kw),
    ),
    "cifar_pickle": (_cifar_tiny, f"{CIFAR_BATCH_DIR}/data_batch_3", D.load_cifar10),
    "cifar_npy": (_cifar_npy_tiny, "cifar10/train_x.npy.xz", D.load_cifar10),
}


@pytest.mark.parametrize("damage", ["truncate", "flip", "wrong_hash"])
@pytest.mark.parametrize("case", sorted(_DAMAGE_CASES))
def test_damaged_file_gives_clear_error(tmp_path, case, damage):
    write, rel, load = _DAMAGE_CASES[case]
    if case == "celeba":
        pytest.importorskip("PIL")
    write(tmp_path)
    reg = _registry_of(tmp_path)
    load(tmp_path, registry=reg)  # intact: loads
    f = tmp_path / rel
    data = f.read_bytes()
    if damage == "truncate":
        f.write_bytes(data[: len(data) // 2])
    elif damage == "flip":  # same size, one bit changed
        mid = len(data) // 2
        f.write_bytes(data[:mid] + bytes([data[mid] ^ 0x10]) + data[mid + 1 :])
    else:  # intact file, registry expects other content
        reg[rel] = FileSpec(hashlib.sha256(b"other").hexdigest(), len(data), "sha256")
    with pytest.raises(D.DatasetError) as e:
        load(tmp_path, registry=reg)
    msg = str(e.value)
    assert Path(rel).name in msg  # names the file ...
    assert "not the expected version" in msg and "Obtain" in msg  # ... and its source
    if damage == "truncate" and case not in ("shakespeare", "femnist_manifest"):
        # Even unverified, a truncated container or json is refused by name.
        with pytest.raises(D.DatasetError, match=re.escape(Path(rel).name)):
            load(tmp_path, verify=False)


def test_unpickler_refuses_deep_nesting():
    depth = 100_000  # ']' pushes a list, 'a' appends; far past the recursion limit
    payload = b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."
    with pytest.raises(D.DatasetError, match="refused or corrupt"):
        D.safe_unpickle(payload)


# ---------------------------------------------------------------- TFDS sources (fake)


def _fake_tfds(monkeypatch, datasets):
    """A stand-in ``tensorflow_datasets`` whose data_source serves ``datasets``."""
    calls = []

    def data_source(name, split, data_dir, download):
        calls.append((name, split, data_dir, download))
        if (name, split) not in datasets:
            raise FileNotFoundError(f"{name}/{split} is not prepared")
        return datasets[(name, split)]

    monkeypatch.setitem(
        sys.modules, "tensorflow_datasets", types.SimpleNamespace(data_source=data_source)
    )
    return calls


def _celeb_example(identity: int, value: int):
    return {
        "image": np.full((218, 178, 3), value, np.uint8),
        "identity": {"Identity_No": np.int64(identity)},
        "attributes": {"Smiling": np.bool_(value % 2), "Male": np.bool_(True)},
        "landmarks": {"nose_x": np.int64(0)},
    }


def test_celeba_tfds_source(tmp_path, monkeypatch):
    pytest.importorskip("PIL")
    shutil.rmtree(_celeba_tiny(tmp_path))  # partition only: "10" 3/1, "20" 2/1
    # identity 10 has 6 images, 20 has 3, 7 is not in the partition.
    exs = [_celeb_example(10, v) for v in range(1, 7)]
    exs += [_celeb_example(20, v) for v in (11, 12, 13)]
    exs += [_celeb_example(7, v) for v in (21, 22)]
    order = np.random.default_rng(0).permutation(len(exs))
    exs = [exs[i] for i in order]
    calls = _fake_tfds(
        monkeypatch,
        {
            ("celeb_a", "train"): exs[:6],
            ("celeb_a", "validation"): exs[6:8],
            ("celeb_a", "test"): exs[8:],
        },
    )
    reg = {k: v for k, v in _registry_of(tmp_path).items() if k.endswith(".gz")}
    fd = D.load_celeba(tmp_path, registry=reg, image_size=8, tfds_data_dir="/t")
    assert {c[:2] for c in calls} == {
        ("celeb_a", s) for s in ("train", "validation", "test")
    }
    assert all(c[2] == "/t" and c[3] is False for c in calls)
    assert fd.client_ids == ("10", "20")
    assert np.asarray(fd.train.counts).tolist() == [3, 2]  # LEAF's sizes
    assert np.asarray(fd.test.counts).tolist() == [1, 1]  # extra images left out
    assert fd.train.x.shape[1:] == (8, 8, 3)
    for c, allowed in ((0, set(range(1, 7))), (1, {11, 12, 13})):
        xs, ys = zip(fd.train.client(c), fd.test.client(c))
        x, y = np.concatenate(xs), np.concatenate(ys)
        v = x.reshape(len(x), -1)[:, 0].astype(int)
        assert set(v) <= allowed and len(set(v)) == len(v)  # own images, no repeat
        np.testing.assert_array_equal(y, v % 2)  # label of that very image
    again = D.load_celeba(tmp_path, registry=reg, image_size=8, tfds_data_dir="/t")
    np.testing.assert_array_equal(np.asarray(again.test.x), np.asarray(fd.test.x))


def test_celeba_auto_without_images_or_prepared_tfds(tmp_path, monkeypatch):
    pytest.importorskip("PIL")
    shutil.rmtree(_celeba_tiny(tmp_path))
    _fake_tfds(monkeypatch, {})  # installed, but celeb_a was never prepared
    with pytest.raises(D.DatasetError, match="img_align_celeba.*TFDS.*celeb_a"):
        D.load_celeba(tmp_path, verify=False)
    with pytest.raises(D.DatasetError, match="celeb_a"):
        D.load_celeba(tmp_path, verify=False, source="tfds")


def _tfds_tiny_shakespeare_splits(text: str) -> dict:
    # The TFDS builder's 90/5/5 cut of input.txt, one example per split.
    i = int(len(text) * 0.9)
    train, rest = text[:i], text[i:]
    j = int(len(rest) * 0.5)
    parts = {"train": train, "validation": rest[:j], "test": rest[j:]}
    return {("tiny_shakespeare", k): [{"text": v.encode()}] for k, v in parts.items()}


def test_shakespeare_tfds_source(tmp_path, monkeypatch):
    _shakespeare_tiny(tmp_path)
    reg = _registry_of(tmp_path)
    want = D.load_shakespeare(tmp_path, seq_len=10, registry=reg)
    _fake_tfds(monkeypatch, _tfds_tiny_shakespeare_splits(_PLAY))
    got = D.load_shakespeare(source="tfds", seq_len=10, registry=reg)
    assert got.client_ids == want.client_ids
    np.testing.assert_array_equal(np.asarray(got.train.x), np.asarray(want.train.x))
    np.testing.assert_array_equal(np.asarray(got.test.y), np.asarray(want.test.y))
    _fake_tfds(monkeypatch, _tfds_tiny_shakespeare_splits(_PLAY.replace("famish", "starve")))
    with pytest.raises(D.DatasetError, match="tiny_shakespeare.*not the expected"):
        D.load_shakespeare(source="tfds", seq_len=10, registry=reg)
    assert D.load_shakespeare(source="tfds", seq_len=10, verify=False).num_clients


def test_shakespeare_download_via_file_url(tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    _shakespeare_tiny(mirror)
    reg = _registry_of(mirror)
    monkeypatch.setitem(
        _registry.DOWNLOAD_URLS, TINY_SHAKESPEARE, (mirror / TINY_SHAKESPEARE).as_uri()
    )
    empty, cache = tmp_path / "empty", tmp_path / "cache"
    with pytest.raises(D.DatasetError, match=r"input\.txt.*download=True"):
        D.load_shakespeare(empty, seq_len=10, cache_dir=cache, registry=reg)
    got = D.load_shakespeare(
        empty, seq_len=10, download=True, cache_dir=cache, registry=reg
    )
    want = D.load_shakespeare(mirror, seq_len=10, registry=reg)
    np.testing.assert_array_equal(np.asarray(got.train.x), np.asarray(want.train.x))
    assert (cache / TINY_SHAKESPEARE).is_file()
    # Found again in the cache without download=True.
    again = D.load_shakespeare(empty, seq_len=10, cache_dir=cache, registry=reg)
    assert again.client_ids == want.client_ids
    bad = {TINY_SHAKESPEARE: FileSpec("0" * 64, None, "sha256")}
    with pytest.raises(D.DatasetError, match="rejected"):
        D.load_shakespeare(
            empty, download=True, cache_dir=tmp_path / "c2", registry=bad
        )
    assert not (tmp_path / "c2" / TINY_SHAKESPEARE).exists()


def test_registry_has_download_hash_for_every_url():
    for rel in _registry.DOWNLOAD_URLS:
        spec = D.REGISTRY[rel]
        assert spec.kind in ("sha256", "gunzip-sha256") and len(spec.digest) == 64


# ---------------------------------------------------------------- status: cache, no dir


def test_status_finds_downloaded_files_in_cache(tmp_path):
    cache = tmp_path / "cache"
    _write_idx_dataset(cache, "fashion_mnist")
    reg = _registry_of(cache)
    rows = {
        r["name"]: r
        for r in D.dataset_status(tmp_path / "data", registry=reg, cache_dir=cache)
    }
    assert rows["fashion_mnist"]["status"] == "ok"
    assert rows["fashion_mnist"]["dir"].startswith(str(cache))
    assert rows["mnist"]["status"] == "missing"


def test_status_without_data_dir_is_a_listing_not_a_crash(
    tmp_path, monkeypatch, capsys
):
    from fedjax_pfl.experiments._cli import main

    monkeypatch.delenv(D.DATA_DIR_ENV, raising=False)
    monkeypatch.setenv("FEDJAX_PFL_CACHE_DIR", str(tmp_path / "nocache"))
    rows = D.dataset_status(verify=False)
    assert {r["status"] for r in rows} == {"missing"}
    assert all(D.DATA_DIR_ENV in "; ".join(r["problems"]) for r in rows)
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert "missing" in out and D.DATA_DIR_ENV in out and "obtain" in out


# ---------------------------------------------------------------- more real files


@real
def test_real_celeba_partition_counts():
    users, train, test = _leaf._celeba_partition(Path(REAL), True, None)
    assert len(users) == 515 and len(set(users)) == 515
    assert sum(len(train[u][1]) for u in users) == 9_060
    assert sum(len(test[u][1]) for u in users) == 2_399
    assert min(len(train[u][1]) for u in users) >= 1
    names = [n for u in users for n in train[u][0] + test[u][0]]
    assert len(set(names)) == len(names)  # no image in two places
    assert all(re.fullmatch(r"\d{6}\.jpg", n) for n in names)
    assert {y for u in users for y in train[u][1] + test[u][1]} == {0, 1}


@real
def test_real_celeba_with_images_if_present():
    if not (Path(REAL) / "celeba_leaf_ditto/img_align_celeba").is_dir():
        pytest.skip("CelebA images (img_align_celeba/) not in FEDJAX_PFL_DATA_DIR")
    pytest.importorskip("PIL")
    fd = D.load_celeba(max_clients=3, dtype=np.uint8)
    assert fd.num_clients == 3 and fd.train.x.shape[1:] == (84, 84, 3)


@real
def test_real_shakespeare_all_roles():
    text = (Path(REAL) / TINY_SHAKESPEARE).read_text()
    roles = D.shakespeare_roles(text)
    assert len(roles) == 299  # 309 headings; 10 ghosts/choruses have no lines
    fd = D.load_shakespeare(x_dtype=np.uint8)
    # A role is a client iff it has a test window after LEAF's seq_len - 1 gap.
    def has_test(t):
        n = len(t) - 80
        return n >= 2 and max(1, int(0.8 * n)) + 79 < n
    assert fd.client_ids == tuple(r for r, t in roles.items() if has_test(t))
    assert fd.num_clients == 183
    ids = D.encode_chars(roles[fd.client_ids[0]])
    np.testing.assert_array_equal(fd.train.client(0)[0][0], ids[:80])
    assert int(np.asarray(fd.train.y).max()) < 80
    m = D.memory_summary(fd)
    assert m["overhead_factor"] < 1.001 and m["padding_factor"] > 5
