"""Natural-partition loaders: FEMNIST writers, Vehicle sensors, CelebA celebrities and
Shakespeare speaking roles, each returned as :class:`FederatedData`.

Files are hash-checked (:mod:`._registry`) before parsing and converted client by
client into flat storage, so memory stays O(total examples) (no client is padded).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_pfl.validation import check_choice, check_number

from ._federated import FederatedData, from_client_arrays, split_clients
from ._partition_papers import _carve_val
from ._registry import (
    DATA_DIR_ENV,
    REGISTRY,
    TINY_SHAKESPEARE,
    DatasetError,
    FileSpec,
    _check,
    locate,
    read_verified,
    resolve_data_dir,
)

VAL_SPLITS = ("random", "tail")  # load_femnist's validation rows
# LEAF models/utils/language_utils.py ALL_LETTERS: the Shakespeare vocabulary.
LEAF_SHAKESPEARE_VOCAB = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
assert len(LEAF_SHAKESPEARE_VOCAB) == 80
_SPACE_ID = LEAF_SHAKESPEARE_VOCAB.index(" ")
_CHAR_TABLE = np.full(256, _SPACE_ID, np.uint8)
for _i, _c in enumerate(LEAF_SHAKESPEARE_VOCAB):
    _CHAR_TABLE[ord(_c)] = _i


def _read_json(root: Path, rel: str, verify: bool, registry) -> dict[str, Any]:
    data = read_verified(
        root, rel, decompress=rel.endswith(".gz"), verify=verify, registry=registry
    )
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DatasetError(f"{root / rel}: corrupt json ({e})") from e
    if not isinstance(obj, dict) or not isinstance(obj.get("user_data"), dict):
        raise DatasetError(f"{root / rel}: not a LEAF json file (no 'user_data')")
    return obj


def _user(obj: dict, user: str, path: str) -> tuple[list, list]:
    d = obj["user_data"].get(user)
    if d is None:
        return [], []
    if not (isinstance(d, dict) and len(d.get("x", ())) == len(d.get("y", ()))):
        raise DatasetError(f"{path}: user {user!r} has mismatched x and y")
    return d["x"], d["y"]


# ----------------------------------------------------------------------------- FEMNIST


def _femnist_pairs(
    root: Path, subdir: str, verify, registry
) -> list[tuple[str, str, str]]:
    """(writer, train file, test file) in manifest (or file) order."""
    if (root / subdir / "writers.tsv").is_file():
        text = read_verified(
            root, f"{subdir}/writers.tsv", verify=verify, registry=registry
        ).decode()
        out = []
        for row in csv.DictReader(io.StringIO(text), delimiter="\t"):
            if row.get("status") != "primary":
                continue  # duplicate_of:...: the same writer in another LEAF run
            i = int(row["file_index"])
            f = f"{subdir}/{row['source']}/{{s}}/all_data_{i}_niid_05_keep_0_{{s}}_9.json.gz"
            out.append((row["writer"], f.format(s="train"), f.format(s="test")))
        return out
    out = []
    for tr in sorted((root / subdir / "train").glob("*.json*")):
        te = tr.parent.parent / "test" / tr.name.replace("train", "test")
        rel_tr = tr.relative_to(root).as_posix()
        rel_te = te.relative_to(root).as_posix()
        users = _read_json(root, rel_tr, verify, registry)["users"]
        out += [(u, rel_tr, rel_te) for u in users]
    if not out:
        raise DatasetError(f"{root / subdir}: no writers.tsv and no train/*.json files")
    return out


def load_femnist(
    data_dir: str | os.PathLike | None = None,
    *,
    max_writers: int | None = None,
    flatten: bool = False,
    val_fraction: float = 0.0,
    val_split: str = "random",
    val_seed: int = 0,
    subdir: str = "femnist_leaf",
    verify: bool = True,
    registry: Mapping[str, FileSpec] | None = None,
) -> FederatedData:
    """FEMNIST with its natural partition: one client per writer (LEAF json).

    With ``<subdir>/writers.tsv`` the writers are its ``primary`` rows (rows marked
    ``duplicate_of:`` are the same writer in another LEAF run and are skipped):
    300 writers, 41,202 train / 4,730 test. Without it, every user of
    ``<subdir>/train/*.json[.gz]`` is a client, with its test data from the
    matching ``test/`` file (plain LEAF output; pass ``verify=False``).

    Args:
      max_writers: keep the first ``max_writers`` writers (in manifest order).
      flatten: ``x`` as ``[n, 784]`` instead of ``[n, 28, 28, 1]``.
      val_fraction: moves ``floor(val_fraction * n)`` rows of each writer's
        LEAF train list (at least one row stays) to a ``val`` split to tune on;
        ``0`` (default): no ``val`` split.
      val_split: which rows: ``random`` (default; the Ditto paper splits each
        device's data at random), drawn with ``val_seed``, or ``tail``, the
        last rows of the list (the Ditto code's hold-out). LEAF lists a
        writer's samples in blocks of digits, upper and lower case letters,
        so the tail over-represents the last block.
      val_seed: seeds the ``random`` split.

    Returns:
      train, (val) and test splits; ``x`` float32 in [0, 1] as LEAF stores it (1 is
      background), ``y`` int32 in 0..61 (digits, upper case, lower case).
    """
    check_number("val_fraction", val_fraction, lo=0.0, hi=1.0, hi_open=True,
                 scalar=True)
    check_choice("val_split", val_split, VAL_SPLITS)
    root = resolve_data_dir(data_dir)
    pairs = _femnist_pairs(root, subdir, verify, registry)
    if max_writers is not None:
        if max_writers < 1:
            raise ValueError(f"max_writers: must be >= 1, got {max_writers}")
        pairs = pairs[:max_writers]
    shape = (784,) if flatten else (28, 28, 1)
    by_file: dict[str, list[str]] = {}
    for w, tr, te in pairs:
        by_file.setdefault(tr, []).append(w)
    arrays: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    test_of = {tr: te for _, tr, te in pairs}
    for tr, writers in by_file.items():  # one file pair in memory at a time
        for split, rel in (("train", tr), ("test", test_of[tr])):
            obj = _read_json(root, rel, verify, registry)
            for w in writers:
                x, y = _user(obj, w, str(root / rel))
                if split == "train" and not y:
                    raise DatasetError(f"{root / rel}: writer {w!r} has no train data")
                arrays[(w, split)] = (
                    np.asarray(x, np.float32).reshape(-1, *shape),
                    np.asarray(y, np.int32),
                )
            del obj
    ids = [w for w, _, _ in pairs]
    train, val = [arrays[(w, "train")] for w in ids], None
    if val_fraction > 0:
        rng = (np.random.default_rng(np.random.SeedSequence([val_seed, 0x7A1]))
               if val_split == "random" else None)
        train, val = _carve_val(train, val_fraction, rng)
    return from_client_arrays(train, val, [arrays[(w, "test")] for w in ids], ids)


# ----------------------------------------------------------------------------- Vehicle


def load_vehicle(
    data_dir: str | os.PathLike | None = None,
    *,
    test_fraction: float = 0.2,
    val_fraction: float = 0.08,
    seed: int = 0,
    labels: str = "pm1",
    verify: bool = True,
    registry: Mapping[str, FileSpec] | None = None,
) -> FederatedData:
    """Vehicle sensor data (23 vehicles, 100 features) from Ditto's ``mytrain.json``.

    Only Ditto's training file is available (1,860 rows), so evaluation uses a
    seeded per-vehicle hold-out: each vehicle's rows are shuffled with ``seed``
    and split ``(1 - test - val, val, test)`` (every vehicle keeps >= 1 train
    row), by default the paper's 72/8/20. This differs from the released code,
    whose test set is the rest of each vehicle's raw data.

    Args:
      test_fraction, val_fraction: hold-out fractions, ``0 <= f`` and sum ``< 1``
        (``val_fraction=0`` gives no ``val`` split).
      labels: ``"pm1"`` keeps y in {-1, +1} (hinge loss); ``"01"`` maps -1 to 0.

    Returns:
      ``x [n, 100]`` float32, ``y [n]`` int32.
    """
    if labels not in ("pm1", "01"):
        raise ValueError(f"labels: must be 'pm1' or '01', got {labels!r}")
    if not (
        0 <= test_fraction and 0 <= val_fraction and test_fraction + val_fraction < 1
    ):
        raise ValueError(
            "test_fraction, val_fraction: need non-negative fractions summing to < 1, "
            f"got {test_fraction}, {val_fraction}"
        )
    root = resolve_data_dir(data_dir)
    rel = "vehicle_ditto/train/mytrain.json.gz"
    obj = _read_json(root, rel, verify, registry)
    users = list(obj.get("users") or sorted(obj["user_data"]))
    clients = []
    for u in users:
        x, y = _user(obj, u, str(root / rel))
        y = np.asarray(y, np.int32).reshape(-1)
        if not np.all(np.isin(y, (-1, 1))):
            raise DatasetError(
                f"{root / rel}: user {u!r} has labels outside {{-1, +1}}"
            )
        clients.append(
            (np.asarray(x, np.float32), (y + 1) // 2 if labels == "01" else y)
        )
    fr = (1.0 - test_fraction - val_fraction, val_fraction, test_fraction)
    return split_clients(clients, fr, seed=seed, client_ids=users)


# ----------------------------------------------------------------------------- CelebA


def _celeba_partition(root: Path, verify, registry):
    d = "celeba_leaf_ditto"
    tr = _read_json(
        root, f"{d}/train/all_data_niid_1_keep_25_train_8.json.gz", verify, registry
    )
    te = _read_json(
        root, f"{d}/test/all_data_niid_1_keep_25_test_8.json.gz", verify, registry
    )
    users = list(tr["users"])
    return (
        users,
        {u: _user(tr, u, "train") for u in users},
        {u: _user(te, u, "test") for u in users},
    )


def _resize(img, size: int) -> np.ndarray:
    # LEAF/Ditto: Image.open(f).resize((84, 84)).convert("RGB"), raw 0-255 values.
    return np.asarray(img.resize((size, size)).convert("RGB"))


def load_celeba(
    data_dir: str | os.PathLike | None = None,
    *,
    images_dir: str | os.PathLike | None = None,
    source: str = "auto",
    image_size: int = 84,
    dtype: Any = np.float32,
    max_clients: int | None = None,
    tfds_data_dir: str | os.PathLike | None = None,
    seed: int = 0,
    verify: bool = True,
    registry: Mapping[str, FileSpec] | None = None,
) -> FederatedData:
    """CelebA smiling/not (LEAF partition used by Ditto): one client per celebrity.

    The partition (515 celebrities, 9,060 train / 2,399 test image names) is local;
    the images are not. Sources:
      * ``"images"``: ``images_dir`` (default
        ``<data_dir>/celeba_leaf_ditto/img_align_celeba``), the unzipped
        ``img_align_celeba.zip``; exactly LEAF's images and split.
      * ``"tfds"``: a prepared TFDS ``celeb_a`` with an ``identity`` feature (no
        file names there, so each celebrity's images are matched by identity and
        split with ``seed`` into LEAF's per-user train/test sizes; any further
        images of a celebrity are left out). Reads and decodes the whole
        dataset: slow.
      * ``"auto"``: images if the folder exists, else TFDS if installed.

    Returns:
      ``x [n, image_size, image_size, 3]`` raw 0-255 values (``dtype``; uint8
      saves 4x memory), ``y [n]`` int32 smiling label.

    Raises:
      DatasetError: the partition files fail their check, or no image source.
    """
    if source not in ("auto", "images", "tfds"):
        raise ValueError(f"source: must be 'auto', 'images' or 'tfds', got {source!r}")
    root = resolve_data_dir(data_dir)
    users, train, test = _celeba_partition(root, verify, registry)
    if max_clients is not None:
        users = users[:max_clients]
    img_dir = (
        Path(images_dir)
        if images_dir
        else root / "celeba_leaf_ditto" / "img_align_celeba"
    )
    no_images = (
        f"CelebA images not found at {img_dir}: download img_align_celeba.zip from "
        "mmlab.ie.cuhk.edu.hk/projects/CelebA.html and unzip it there (or pass "
        "images_dir=), or install tensorflow-datasets with a prepared 'celeb_a'"
    )
    auto = source == "auto"
    if auto:
        source = "images" if img_dir.is_dir() else "tfds"
        if source == "tfds":
            try:
                import tensorflow_datasets  # noqa: F401
            except ImportError:
                raise DatasetError(no_images) from None
    if source == "tfds":
        try:
            return _celeba_tfds(
                users, train, test, image_size, dtype, tfds_data_dir, seed
            )
        except DatasetError as e:
            if not auto:
                raise
            raise DatasetError(f"{no_images}; TFDS failed: {e}") from e
    names = [n for u in users for n in train[u][0] + test[u][0]]
    missing = [n for n in names if not (img_dir / n).is_file()]
    if missing:
        raise DatasetError(
            f"CelebA: {len(missing)} of {len(names)} images missing under {img_dir} "
            f"(e.g. {missing[0]}); unzip img_align_celeba.zip there"
        )
    from PIL import Image  # the 'tfds' extra installs pillow

    def load(split):
        out = []
        for u in users:
            x, y = split[u]
            imgs = np.empty((len(x), image_size, image_size, 3), dtype)
            for i, n in enumerate(x):
                with Image.open(img_dir / n) as im:
                    imgs[i] = _resize(im, image_size)
            out.append((imgs, np.asarray(y, np.int32)))
        return out

    return from_client_arrays(load(train), None, load(test), users)


def _celeba_tfds(
    users, train, test, image_size, dtype, data_dir, seed
) -> FederatedData:
    from PIL import Image

    from ._loaders import tfds_source

    wanted = {int(u): u for u in users}
    got: dict[str, list] = {u: [] for u in users}
    for split in ("train", "validation", "test"):
        src = tfds_source("celeb_a", split, data_dir)
        for i in range(len(src)):
            ex = src[i]
            if "identity" not in ex:
                raise DatasetError(
                    "TFDS celeb_a has no 'identity' feature (need >= 2.0.1)"
                )
            u = wanted.get(int(np.asarray(ex["identity"]["Identity_No"])))
            if u is not None:
                img = _resize(Image.fromarray(np.asarray(ex["image"])), image_size)
                got[u].append((img, int(bool(ex["attributes"]["Smiling"]))))
    rng = np.random.default_rng(seed)
    tr, te = [], []
    for u in users:
        ex = [got[u][j] for j in rng.permutation(len(got[u]))]
        n_tr = min(len(train[u][1]), len(ex))
        if n_tr == 0:
            raise DatasetError(f"TFDS celeb_a: no images of celebrity {u}")
        n_te = len(test[u][1])
        for part, out in ((ex[:n_tr], tr), (ex[n_tr : n_tr + n_te], te)):
            x = np.asarray([e[0] for e in part], dtype).reshape(
                -1, image_size, image_size, 3
            )
            out.append((x, np.asarray([e[1] for e in part], np.int32)))
    return from_client_arrays(tr, None, te, users)


# ----------------------------------------------------------------------------- Shakespeare


def encode_chars(text: str) -> np.ndarray:
    """Ids in :data:`LEAF_SHAKESPEARE_VOCAB` (uint8); other characters map to ' '."""
    codes = np.frombuffer(text.encode("utf-32-le"), "<u4")
    return np.where(codes < 256, _CHAR_TABLE[np.minimum(codes, 255)], _SPACE_ID).astype(
        np.uint8
    )


def shakespeare_roles(text: str) -> dict[str, str]:
    """Each speaking role's lines, in order, normalised as LEAF does.

    A block starts after a blank line with a ``NAME:`` heading; the role's lines
    are joined by spaces and runs of spaces collapsed (LEAF's ``txt_to_data``).
    """
    roles: dict[str, list[str]] = {}
    for block in re.split(r"\n\s*\n", text):
        lines = block.strip("\n").split("\n")
        if not lines or not lines[0].endswith(":") or len(lines) < 2:
            continue
        roles.setdefault(lines[0][:-1].strip(), []).extend(s.strip() for s in lines[1:])
    return {r: re.sub(r"  +", " ", " ".join(ls)) for r, ls in roles.items()}


def _windows(ids: np.ndarray, seq_len: int, frac: float, x_dtype):
    """LEAF's split_data for shakespeare: first windows train, later ones test."""
    n = ids.shape[0] - seq_len
    if n < 2:
        return None
    n_tr = 1 if n == 2 else max(1, int(frac * n))
    win = np.lib.stride_tricks.sliding_window_view(ids[:-1], seq_len)
    y = ids[seq_len:]
    te = slice(n_tr + seq_len - 1, n)
    if te.start >= n:
        return None  # LEAF keeps a user only with >= 1 train and >= 1 test sample
    return (
        (win[:n_tr].astype(x_dtype), y[:n_tr].astype(np.int32)),
        (win[te].astype(x_dtype), y[te].astype(np.int32)),
    )


def load_shakespeare(
    data_dir: str | os.PathLike | None = None,
    *,
    source: str = "auto",
    seq_len: int = 80,
    train_fraction: float = 0.8,
    max_clients: int | None = None,
    x_dtype: Any = np.int32,
    download: bool = False,
    cache_dir: str | os.PathLike | None = None,
    tfds_data_dir: str | os.PathLike | None = None,
    verify: bool = True,
    registry: Mapping[str, FileSpec] | None = None,
) -> FederatedData:
    """Shakespeare next-character prediction, one client per speaking role.

    Sources (``"auto"``: LEAF if present, else the tiny text):
      * ``"leaf"``: LEAF json in ``<data_dir>/shakespeare_leaf/{train,test}/``
        (``x``: 80-char strings, ``y``: next char); not shipped, so no hash is
        known: pass ``verify=False``.
      * ``"tiny"``: ``tinyshakespeare/input.txt`` in the data dir, else in the
        download cache; ``download=True`` fetches it (karpathy/char-rnn, the
        URL TFDS uses) and checks its sha256 first.
      * ``"tfds"``: a prepared TFDS ``tiny_shakespeare``; its train, validation
        and test splits are consecutive pieces of the same ``input.txt``, so they
        are joined back and checked against that file's sha256.

    The tiny text is a subset of the complete works with no play boundaries (a
    role name used in several plays is one client). Each role's text becomes
    sliding windows of ``seq_len`` characters; as in LEAF's ``split_data``, the
    first ``max(1, int(train_fraction * n))`` windows train and test starts
    ``seq_len - 1`` windows later, and roles without a test window are dropped.

    Args:
      max_clients: keep the first roles (by first appearance / file order).
      x_dtype: ``np.uint8`` stores 4x less than the default int32.

    Returns:
      ``x [n, seq_len]`` char ids in LEAF's 80-character vocabulary
      (:data:`LEAF_SHAKESPEARE_VOCAB`; characters outside it become ' '),
      ``y [n]`` int32 id of the next character.

    Raises:
      DatasetError: the file is missing (naming where to get it), fails its
        hash check, or no role has enough text.
    """
    if source not in ("auto", "leaf", "tiny", "tfds"):
        raise ValueError(
            f"source: must be 'auto', 'leaf', 'tiny' or 'tfds', got {source!r}"
        )
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction: must be in (0, 1), got {train_fraction}")
    env = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV)
    has_leaf = (
        bool(env) and (Path(env).expanduser() / "shakespeare_leaf" / "train").is_dir()
    )
    if source == "leaf" or (source == "auto" and has_leaf):
        root = resolve_data_dir(data_dir)
        return _shakespeare_leaf(root, max_clients, x_dtype, verify, registry)
    if source == "tfds":
        text, where = _tiny_shakespeare_tfds(tfds_data_dir, verify, registry), "TFDS"
    else:
        root = locate(
            [TINY_SHAKESPEARE],
            data_dir,
            download=download,
            cache_dir=cache_dir,
            registry=registry,
        )
        where = str(root / TINY_SHAKESPEARE)
        text = read_verified(
            root, TINY_SHAKESPEARE, verify=verify, registry=registry
        ).decode("utf-8", "replace")
    ids, tr, te = [], [], []
    for role, role_text in shakespeare_roles(text).items():
        w = _windows(encode_chars(role_text), seq_len, train_fraction, x_dtype)
        if w is None:
            continue
        ids.append(role)
        tr.append(w[0])
        te.append(w[1])
        if max_clients is not None and len(ids) >= max_clients:
            break
    if not ids:
        raise DatasetError(f"{where} tiny_shakespeare: no role has enough text")
    return from_client_arrays(tr, None, te, ids)


def _tiny_shakespeare_tfds(data_dir, verify: bool, registry) -> str:
    """TFDS ``tiny_shakespeare``'s three splits joined: karpathy's input.txt."""
    from ._loaders import tfds_source

    parts = []
    for split in ("train", "validation", "test"):
        src = tfds_source("tiny_shakespeare", split, data_dir)
        for i in range(len(src)):
            t = src[i]["text"]
            t = t if isinstance(t, (bytes, str)) else np.asarray(t).item()
            parts.append(t.decode("utf-8") if isinstance(t, bytes) else t)
    text = "".join(parts)
    if verify:
        spec = (REGISTRY if registry is None else registry).get(TINY_SHAKESPEARE)
        problem = "no known hash" if spec is None else _check(text.encode(), None, spec)
        if problem:
            raise DatasetError(
                "TFDS tiny_shakespeare: its splits joined are not the expected "
                f"{TINY_SHAKESPEARE} ({problem}); pass verify=False to use it anyway"
            )
    return text


def _shakespeare_leaf(root: Path, max_clients, x_dtype, verify, registry):
    splits: dict[str, dict[str, tuple]] = {"train": {}, "test": {}}
    users: list[str] = []
    for split in ("train", "test"):
        for f in sorted((root / "shakespeare_leaf" / split).glob("*.json*")):
            rel = f.relative_to(root).as_posix()
            obj = _read_json(root, rel, verify, registry)
            for u in obj.get("users") or obj["user_data"]:
                x, y = _user(obj, u, str(f))
                xs = np.stack([encode_chars(s) for s in x]) if x else np.zeros((0, 80))
                splits[split][u] = (
                    xs.astype(x_dtype),
                    encode_chars("".join(y)).astype(np.int32),
                )
                if split == "train" and u not in users:
                    users.append(u)
    if not users:
        raise DatasetError(f"{root}/shakespeare_leaf/train: no LEAF json files")
    users = users[:max_clients] if max_clients else users
    empty = (np.zeros((0, 80), x_dtype), np.zeros((0,), np.int32))
    return from_client_arrays(
        [splits["train"][u] for u in users],
        None,
        [splits["test"].get(u, empty) for u in users],
        users,
    )
