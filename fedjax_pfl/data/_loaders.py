"""Array loaders for MNIST, Fashion-MNIST and CIFAR-10: local files, downloads, TFDS.

Each returns host numpy ``(x_train, y_train, x_test, y_test)``; partitioners turn
them into :class:`FederatedData`. Files are hash-checked by :mod:`._registry`
before they are parsed. No pickle is ever loaded with code execution: npy files use
``allow_pickle=False`` and CIFAR's python batches go through
:class:`RestrictedUnpickler`, which resolves no global except a few inert
stand-ins for numpy's array reconstruction.
"""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import pickle
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ._registry import (
    CIFAR_ARCHIVE,
    CIFAR_BATCH_DIR,
    REGISTRY,
    DatasetError,
    FileSpec,
    default_cache_dir,
    locate,
    read_verified,
)

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4"}


def parse_idx(content: bytes, name: str = "<idx>") -> np.ndarray:
    """Parses the decompressed bytes of an IDX file (LeCun's MNIST format).

    Raises:
      DatasetError: on a bad header or a payload of the wrong length.
    """
    if len(content) < 4 or content[0] != 0 or content[1] != 0:
        raise DatasetError(f"{name}: not an IDX file (bad magic number)")
    code, ndim = content[2], content[3]
    if code not in _IDX_DTYPES or ndim == 0:
        raise DatasetError(f"{name}: unsupported IDX type 0x{code:02x} / ndim {ndim}")
    header = 4 + 4 * ndim
    if len(content) < header:
        raise DatasetError(f"{name}: truncated IDX header")
    shape = tuple(
        int.from_bytes(content[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)
    )
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(content) != expected:
        raise DatasetError(
            f"{name}: IDX payload has {len(content)} bytes, header says {expected}"
        )
    return (
        np.frombuffer(content, dtype, offset=header)
        .reshape(shape)
        .astype(dtype.newbyteorder("="))
    )


def _load_idx_dataset(
    subdir: str, data_dir, download, cache_dir, verify, registry, as_float
) -> Arrays:
    names = (
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    )
    files = [f"{subdir}/{n}" for n in names]
    root = locate(
        files, data_dir, download=download, cache_dir=cache_dir, registry=registry
    )
    arrays = [
        parse_idx(
            read_verified(root, f, decompress=True, verify=verify, registry=registry),
            str(root / f),
        )
        for f in files
    ]
    x_tr, y_tr, x_te, y_te = arrays
    for x, y, f in ((x_tr, y_tr, files[0]), (x_te, y_te, files[2])):
        if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise DatasetError(
                f"{root / f}: images {x.shape} and labels {y.shape} do not match"
            )
    if as_float:
        x_tr, x_te = x_tr.astype(np.float32) / 255.0, x_te.astype(np.float32) / 255.0
    return x_tr, y_tr.astype(np.int32), x_te, y_te.astype(np.int32)


def load_mnist(
    data_dir: str | os.PathLike | None = None,
    *,
    download: bool = False,
    cache_dir: str | os.PathLike | None = None,
    as_float: bool = False,
    verify: bool = True,
    registry: Mapping[str, FileSpec] | None = None,
) -> Arrays:
    """MNIST from ``<data_dir>/mnist/*-ubyte.gz`` (original order).

    Args:
      data_dir: defaults to ``$FEDJAX_PFL_DATA_DIR``; the download cache is
        searched next.
      download: fetch missing files into ``cache_dir`` (hash-checked first).
      as_float: return images as float32 in [0, 1] instead of uint8.
      verify: check hashes (the sha256 of the decompressed IDX content).
      registry: overrides the hash registry (tests).

    Returns:
      ``x_train [60000, 28, 28]``, ``y_train [60000] int32``, ``x_test``, ``y_test``.

    Raises:
      DatasetError: a file is missing (and ``download=False``), corrupt or fails
        its hash check; nothing is returned.
    """
    return _load_idx_dataset(
        "mnist", data_dir, download, cache_dir, verify, registry, as_float
    )


def load_fashion_mnist(
    data_dir: str | os.PathLike | None = None,
    *,
    download: bool = False,
    cache_dir: str | os.PathLike | None = None,
    as_float: bool = False,
    verify: bool = True,
    registry: Mapping[str, FileSpec] | None = None,
) -> Arrays:
    """Fashion-MNIST from ``<data_dir>/fashion_mnist/``; see :func:`load_mnist`."""
    return _load_idx_dataset(
        "fashion_mnist", data_dir, download, cache_dir, verify, registry, as_float
    )


# ----------------------------------------------------------------------------- pickle


class _Ndarray:
    """Stand-in for ``numpy.ndarray`` passed to ``_reconstruct``; never called."""


class _DtypeStub:
    def __init__(self, spec, align=False, copy=False):
        if not isinstance(spec, (str, bytes)):
            raise pickle.UnpicklingError("dtype spec must be a string")
        spec = spec.decode("ascii") if isinstance(spec, bytes) else spec
        if spec not in _SAFE_DTYPES:
            raise pickle.UnpicklingError(f"dtype {spec!r} is not allowed")
        self.dtype = np.dtype(spec)

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) > 1 and state[1] in (">", b">"):
            self.dtype = self.dtype.newbyteorder(">")


class _ArrayStub:
    """Collects ``ndarray.__setstate__`` arguments; turned into an array later."""

    def __init__(self, cls=None, shape=None, typecode=None):
        self.array = None

    def __setstate__(self, state):
        if not (isinstance(state, tuple) and len(state) == 5):
            raise pickle.UnpicklingError("unexpected ndarray state")
        _, shape, dtype, fortran, raw = state
        if not isinstance(dtype, _DtypeStub) or not isinstance(raw, (bytes, bytearray)):
            raise pickle.UnpicklingError("only raw numeric arrays are allowed")
        shape = tuple(int(s) for s in shape)
        arr = np.frombuffer(bytes(raw), dtype.dtype)
        self.array = arr.reshape(shape, order="F" if fortran else "C")


def _frombuffer(buf, dtype, shape, order):
    if not isinstance(dtype, _DtypeStub) or not isinstance(buf, (bytes, bytearray)):
        raise pickle.UnpicklingError("only raw numeric arrays are allowed")
    arr = np.frombuffer(bytes(buf), dtype.dtype)
    return arr.reshape(tuple(int(s) for s in shape), order=order)


def _latin1_encode(obj, encoding="utf-8"):
    if not isinstance(obj, str) or encoding != "latin1":
        raise pickle.UnpicklingError("_codecs.encode is only allowed for latin1 str")
    return obj.encode("latin1")


_SAFE_DTYPES = frozenset(
    ["u1", "i1", "u2", "i2", "u4", "i4", "u8", "i8", "f2", "f4", "f8", "b1"]
)
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _ArrayStub,
    ("numpy._core.multiarray", "_reconstruct"): _ArrayStub,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("numpy", "ndarray"): _Ndarray,
    ("numpy", "dtype"): _DtypeStub,
    ("_codecs", "encode"): _latin1_encode,
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves no real global: no code from the file ever runs.

    Only plain containers, numbers, strings and numeric numpy arrays load; the
    numpy reconstruction names are mapped to inert stand-ins that build arrays
    with ``np.frombuffer``. Any other global raises ``pickle.UnpicklingError``.
    """

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name} from an untrusted pickle"
            ) from None


def _unstub(obj: Any) -> Any:
    if isinstance(obj, _ArrayStub):
        if obj.array is None:
            raise pickle.UnpicklingError("incomplete ndarray")
        return obj.array
    if isinstance(obj, _DtypeStub):
        raise pickle.UnpicklingError("bare dtype objects are not allowed")
    if isinstance(obj, dict):
        return {k: _unstub(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unstub(v) for v in obj)
    return obj


def safe_unpickle(data: bytes, name: str = "<pickle>") -> Any:
    """Loads ``data`` with :class:`RestrictedUnpickler` (``encoding="bytes"``).

    Raises:
      DatasetError: the pickle is malformed or names any disallowed global.
    """
    try:
        obj = RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()
        return _unstub(obj)
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        KeyError,
        RecursionError,  # absurdly nested containers
    ) as e:
        raise DatasetError(f"{name}: refused or corrupt pickle ({e})") from e


# ----------------------------------------------------------------------------- CIFAR


def _cifar_batch(
    root: Path, rel: str, verify, registry
) -> tuple[np.ndarray, np.ndarray]:
    d = safe_unpickle(
        read_verified(root, rel, verify=verify, registry=registry), str(root / rel)
    )
    try:
        x = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        y = np.asarray(d[b"labels"], dtype=np.int32)
    except (KeyError, TypeError, ValueError) as e:
        raise DatasetError(f"{root / rel}: not a CIFAR-10 batch ({e})") from e
    if x.shape[0] != y.shape[0]:
        raise DatasetError(f"{root / rel}: {x.shape[0]} images but {y.shape[0]} labels")
    return x, y


def _load_npy(root: Path, rel: str, verify, registry) -> np.ndarray:
    data = read_verified(root, rel, verify=verify, registry=registry)
    try:
        if rel.endswith(".xz"):
            data = lzma.decompress(data)
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (lzma.LZMAError, ValueError, EOFError, OSError) as e:
        raise DatasetError(f"{root / rel}: truncated or corrupt ({e})") from e


def _extract_cifar_archive(archive: Path, dest: Path) -> None:
    wanted = {
        f"cifar-10-batches-py/{Path(f).name}"
        for f in REGISTRY
        if f.startswith(CIFAR_BATCH_DIR + "/")
    }
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for m in tar.getmembers():
                if m.name in wanted and m.isfile():
                    (dest / Path(m.name).name).write_bytes(tar.extractfile(m).read())
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DatasetError(f"{archive}: corrupt archive ({e})") from e


def load_cifar10(
    data_dir: str | os.PathLike | None = None,
    *,
    layout: str = "auto",
    channels_last: bool = True,
    download: bool = False,
    cache_dir: str | os.PathLike | None = None,
    verify: bool = True,
    registry: Mapping[str, FileSpec] | None = None,
) -> Arrays:
    """CIFAR-10 as uint8 images and int32 labels.

    Layouts (``layout="auto"`` prefers ``"pickle"`` when its files are present):
      * ``"pickle"``: ``cifar10/cifar-10-batches-py/{data_batch_1..5,test_batch}``,
        the official python batches (50,000 / 10,000, original order), read with
        :class:`RestrictedUnpickler`. ``download=True`` fetches and md5-checks
        the official archive into ``cache_dir`` and extracts the batches.
      * ``"npy"``: ``cifar10/{train,test}_x.npy.xz`` and ``*_y.npy``, the
        class-sorted local reconstruction (49,873 / 9,966).

    Returns:
      ``x [n, 32, 32, 3]`` (``[n, 3, 32, 32]`` if not ``channels_last``), ``y [n]``.
    """
    if layout not in ("auto", "pickle", "npy"):
        raise ValueError(f"layout: must be 'auto', 'pickle' or 'npy', got {layout!r}")
    batches = [f"{CIFAR_BATCH_DIR}/data_batch_{i}" for i in range(1, 6)]
    batches.append(f"{CIFAR_BATCH_DIR}/test_batch")
    npys = [
        f"cifar10/{s}_{a}" for s in ("train", "test") for a in ("x.npy.xz", "y.npy")
    ]
    if layout == "auto":
        try:
            locate(batches, data_dir, cache_dir=cache_dir)
            layout = "pickle"
        except DatasetError:
            layout = "npy" if not download else "pickle"
            if layout == "npy":
                try:
                    locate(npys, data_dir, cache_dir=cache_dir)
                except DatasetError as e:
                    raise DatasetError(
                        f"CIFAR-10: neither the python batches nor the npy layout "
                        f"found ({e}); pass download=True to fetch the batches"
                    ) from e
    if layout == "npy":
        root = locate(npys, data_dir, cache_dir=cache_dir)
        x_tr, y_tr, x_te, y_te = (_load_npy(root, f, verify, registry) for f in npys)
    else:
        try:
            root = locate(batches, data_dir, cache_dir=cache_dir)
        except DatasetError:
            if not download:
                raise
            root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
            locate(
                [CIFAR_ARCHIVE], None, download=True, cache_dir=root, registry=registry
            )
            (root / CIFAR_BATCH_DIR).mkdir(parents=True, exist_ok=True)
            _extract_cifar_archive(root / CIFAR_ARCHIVE, root / CIFAR_BATCH_DIR)
        parts = [_cifar_batch(root, f, verify, registry) for f in batches]
        x_tr = np.concatenate([p[0] for p in parts[:5]])
        y_tr = np.concatenate([p[1] for p in parts[:5]])
        x_te, y_te = parts[5]
    for x, y in ((x_tr, y_tr), (x_te, y_te)):
        if x.shape[1:] != (3, 32, 32) or x.shape[0] != y.shape[0]:
            raise DatasetError(f"CIFAR-10: unexpected shapes {x.shape} / {y.shape}")
    if channels_last:
        x_tr, x_te = x_tr.transpose(0, 2, 3, 1), x_te.transpose(0, 2, 3, 1)
    return (
        np.ascontiguousarray(x_tr),
        y_tr.astype(np.int32),
        np.ascontiguousarray(x_te),
        y_te.astype(np.int32),
    )


# ----------------------------------------------------------------------------- TFDS


def _import_tfds():
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise DatasetError(
            "tensorflow_datasets is not installed: pip install 'fedjax_pfl[tfds]'"
        ) from e
    return tfds


def tfds_source(name: str, split: str, data_dir: str | os.PathLike | None = None):
    """``tfds.data_source(name, split, data_dir, download=False)`` (no TensorFlow).

    Raises:
      DatasetError: TFDS is not installed or the prepared dataset is not found.
    """
    tfds = _import_tfds()
    try:
        return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    except Exception as e:  # TFDS raises several types for a missing dataset.
        raise DatasetError(
            f"TFDS {name!r} split {split!r} not found under "
            f"{data_dir or 'the default TFDS dir'} ({e}); prepare it once with "
            "tfds.data_source(..., download=True) on a machine with internet"
        ) from e


def load_tfds_arrays(
    name: str,
    *,
    splits: tuple[str, str] = ("train", "test"),
    data_dir: str | os.PathLike | None = None,
    image_key: str = "image",
    label_key: str = "label",
) -> Arrays:
    """``(x_train, y_train, x_test, y_test)`` from a prepared TFDS dataset.

    E.g. ``load_tfds_arrays("cifar10")``, ``"mnist"`` or ``"fashion_mnist"``.
    Images keep TFDS's shapes: ``[n, 28, 28, 1]`` for (Fashion-)MNIST, where the
    IDX loaders return ``[n, 28, 28]``; ``[n, 32, 32, 3]`` for CIFAR-10, as
    :func:`load_cifar10` does.
    """
    out = []
    for split in splits:
        src = tfds_source(name, split, data_dir)
        n = len(src)
        first = src[0]
        x = np.empty(
            (n, *np.shape(first[image_key])), np.asarray(first[image_key]).dtype
        )
        y = np.empty((n,), np.int32)
        for i in range(n):
            ex = first if i == 0 else src[i]
            x[i], y[i] = ex[image_key], ex[label_key]
        out += [x, y]
    return tuple(out)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file (for adding entries to a registry)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
