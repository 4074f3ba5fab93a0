"""Federated data: ragged per-client splits stored flat, O(total examples) memory.

Every split keeps all clients' examples concatenated in one array, with per-client
``offsets`` and ``counts``. Nothing is padded to the largest client: a client's
example ``j`` lives at row ``offsets[c] + j``. Batches are drawn inside jit as index
arrays into the flat storage (see :func:`client_batch_indices`).
"""

from __future__ import annotations

import dataclasses
import functools
import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.validation import is_concrete

SAMPLING_MODES = ("with_replacement", "epoch", "full_batch")


def _shape_dtype(a, drop_rows: bool = False) -> str:
    """``(28, 28, 1) float32`` for an array (shape without its leading axis with
    ``drop_rows``; the dtype alone for a scalar); the type name for anything else.
    Reads shapes only: works on tracers and ``jax.ShapeDtypeStruct`` too."""
    shape, dtype = getattr(a, "shape", None), getattr(a, "dtype", None)
    if shape is None or dtype is None:
        return type(a).__name__
    shape = tuple(shape)[1:] if drop_rows else tuple(shape)
    return f"{shape} {dtype}" if shape else str(dtype)


def _size(a) -> str:
    """The leading dimension of ``a`` (``?`` when it has no shape)."""
    shape = getattr(a, "shape", None)
    return str(shape[0]) if shape else "?"


def _num_classes(ys) -> int | None:
    """``max + 1`` of integer labels that are all concrete, non-empty and
    non-negative; else None (float targets, traced or abstract arrays)."""
    for y in ys:
        if not (isinstance(y, (np.ndarray, jax.Array)) and is_concrete(y)
                and np.issubdtype(y.dtype, np.integer) and y.size):
            return None
    if min(int(jnp.min(y)) for y in ys) < 0:
        return None
    return max(int(jnp.max(y)) for y in ys) + 1


def brief_repr(obj) -> str:
    """One line for a NamedTuple of arrays: each field's shape and dtype (a field
    with its own short repr, such as :class:`FederatedData`, keeps it)."""
    fields = ", ".join(
        f"{k}={v!r}" if isinstance(v, (FederatedData, Split)) else
        f"{k}={_shape_dtype(v)}" for k, v in zip(obj._fields, obj))
    return f"{type(obj).__name__}({fields})"


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["x", "y", "offsets", "counts"],
    meta_fields=["max_count", "min_count"],
)
@dataclasses.dataclass(frozen=True)
class Split:
    """One split (train, val or test) of every client, stored flat.

    Attributes:
      x: ``[total_examples, *feature_shape]`` features of all clients, concatenated.
      y: ``[total_examples, *label_shape]`` labels.
      offsets: ``[num_clients]`` int32, first row of each client.
      counts: ``[num_clients]`` int32, number of rows of each client.
      max_count: static, the largest client (bounds full-batch and epoch indices).
      min_count: static, the smallest client.
    """

    x: Any
    y: Any
    offsets: Any
    counts: Any
    max_count: int
    min_count: int

    @property
    def num_clients(self) -> int:
        return int(self.counts.shape[0])

    @property
    def num_examples(self) -> int:
        return int(self.x.shape[0])

    @property
    def client_of_row(self) -> jax.Array:
        """``[total_examples]`` int32: the client that owns each row."""
        return jnp.repeat(
            jnp.arange(self.num_clients, dtype=jnp.int32),
            self.counts,
            total_repeat_length=self.num_examples,
        )

    def client(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copy of client ``c``'s ``(x, y)`` (for inspection, not the hot path)."""
        o, n = int(self.offsets[c]), int(self.counts[c])
        return np.asarray(self.x[o : o + n]), np.asarray(self.y[o : o + n])

    def nbytes(self) -> int:
        return sum(int(np.prod(a.shape)) * a.dtype.itemsize
                   for a in jax.tree.leaves(self))

    def __repr__(self) -> str:
        """One line: ``Split(clients=500, examples=61251, per_client=31..1378,
        x=(28, 28, 1) float32, y=int32)``; no array values are printed."""
        return (f"Split(clients={_size(self.counts)}, examples={_size(self.x)}, "
                f"per_client={self.min_count}..{self.max_count}, "
                f"x={_shape_dtype(self.x, True)}, y={_shape_dtype(self.y, True)})")


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["train", "val", "test", "key_ids"],
    meta_fields=["client_ids"],
)
@dataclasses.dataclass(frozen=True)
class FederatedData:
    """Per-client train/val/test splits; val and test may be ``None``.

    Build it with :func:`from_client_arrays` (validates shapes, dtypes and values).

    Attributes:
      train, val, test: :class:`Split` s (val/test optional).
      key_ids: ``[num_clients]`` int32 derived from each client's name; per-client
        random keys are ``fold_in(round_key, key_ids[c])``, so a client's randomness
        follows the client, not its position (permuting clients permutes results).
      client_ids: static tuple of client names.
    """

    train: Split
    val: Split | None
    test: Split | None
    key_ids: Any
    client_ids: tuple[str, ...]

    @property
    def num_clients(self) -> int:
        return self.train.num_clients

    def splits(self) -> dict[str, Split]:
        out = {"train": self.train, "val": self.val, "test": self.test}
        return {k: v for k, v in out.items() if v is not None}

    def nbytes(self) -> int:
        """Bytes of device memory held by all splits."""
        return sum(s.nbytes() for s in self.splits().values())

    def padded_nbytes(self) -> int:
        """Bytes a ``[num_clients, max_count, ...]`` padded layout would need."""
        total = 0
        for s in self.splits().values():
            row = sum(
                int(np.prod(a.shape[1:])) * a.dtype.itemsize for a in (s.x, s.y)
            )
            total += s.num_clients * s.max_count * row
        return total

    def __repr__(self) -> str:
        """One line, e.g. ``FederatedData(clients=500, train=61251 examples
        (31..1378 per client), val=None, test=11254 examples (6..252 per client),
        x=(28, 28, 1) float32, y=int32, classes=10)``: sizes, shapes and dtypes,
        no array values (``classes`` only for concrete integer labels)."""
        parts = [f"clients={len(self.client_ids)}"]
        for name in ("train", "val", "test"):
            s = getattr(self, name)
            parts.append(f"{name}=None" if s is None else
                         f"{name}={_size(s.x)} examples "
                         f"({s.min_count}..{s.max_count} per client)")
        parts += [f"x={_shape_dtype(self.train.x, True)}",
                  f"y={_shape_dtype(self.train.y, True)}"]
        classes = _num_classes([s.y for s in self.splits().values()])
        if classes is not None:
            parts.append(f"classes={classes}")
        return f"FederatedData({', '.join(parts)})"


ClientArrays = Sequence[tuple[np.ndarray, np.ndarray]]


def _build_split(
    name: str, clients: ClientArrays, num_clients: int, allow_empty: bool
) -> Split:
    if len(clients) != num_clients:
        raise ValueError(
            f"{name}: expected one (x, y) pair per client ({num_clients}), "
            f"got {len(clients)}"
        )
    xs, ys, counts = [], [], []
    feat_shape = label_shape = x_dtype = None
    for c, pair in enumerate(clients):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"{name}[{c}]: expected an (x, y) pair")
        x, y = np.asarray(pair[0]), np.asarray(pair[1])
        if x.ndim < 1 or y.ndim < 1 or x.shape[0] != y.shape[0]:
            raise ValueError(
                f"{name}[{c}]: x and y must have the same number of rows, got "
                f"x.shape={x.shape}, y.shape={y.shape}"
            )
        if x.shape[0] == 0 and not allow_empty:
            raise ValueError(
                f"{name}[{c}]: client {c} has no examples; every client needs at "
                f"least one {name} example"
            )
        if feat_shape is None:
            feat_shape, label_shape, x_dtype = x.shape[1:], y.shape[1:], x.dtype
        elif x.shape[1:] != feat_shape or y.shape[1:] != label_shape:
            raise ValueError(
                f"{name}[{c}]: feature/label shapes {x.shape[1:]}/{y.shape[1:]} differ"
                f" from client 0's {feat_shape}/{label_shape}"
            )
        if np.issubdtype(x.dtype, np.floating) and not np.all(np.isfinite(x)):
            raise ValueError(f"{name}[{c}]: x contains NaN or infinite values")
        if np.issubdtype(y.dtype, np.floating) and not np.all(np.isfinite(y)):
            raise ValueError(f"{name}[{c}]: y contains NaN or infinite values")
        xs.append(x)
        ys.append(y)
        counts.append(x.shape[0])
    counts_np = np.asarray(counts, dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(counts_np)[:-1]]).astype(np.int32)
    x_all = np.concatenate(xs).astype(_float_or_keep(x_dtype))
    y_all = np.concatenate(ys)
    if np.issubdtype(y_all.dtype, np.integer):
        y_all = y_all.astype(np.int32)
    elif np.issubdtype(y_all.dtype, np.floating):
        y_all = y_all.astype(np.float32)
    return Split(
        x=jnp.asarray(x_all),
        y=jnp.asarray(y_all),
        offsets=jnp.asarray(offsets),
        counts=jnp.asarray(counts_np),
        max_count=int(counts_np.max()),
        min_count=int(counts_np.min()),
    )


def _float_or_keep(dtype: np.dtype) -> np.dtype:
    if np.issubdtype(dtype, np.floating):
        return np.dtype(np.float32)
    return dtype


def from_client_arrays(
    train: ClientArrays,
    val: ClientArrays | None = None,
    test: ClientArrays | None = None,
    client_ids: Sequence[str] | None = None,
) -> FederatedData:
    """Builds :class:`FederatedData` from per-client ``(x, y)`` numpy pairs.

    Args:
      train: one ``(x, y)`` pair per client; every client needs >= 1 example.
      val, test: optional, same number of clients; clients may be empty there
        (their metrics are then masked out).
      client_ids: optional names, default ``"0".."C-1"``.

    Raises:
      ValueError: naming the split and client, on empty training clients,
        mismatched shapes, or NaN/inf values.
    """
    if len(train) == 0:
        raise ValueError("train: need at least one client")
    num_clients = len(train)
    ids = tuple(str(i) for i in range(num_clients)) if client_ids is None else tuple(
        str(i) for i in client_ids
    )
    if len(ids) != num_clients:
        raise ValueError(
            f"client_ids: expected {num_clients} ids, got {len(ids)}"
        )
    tr = _build_split("train", train, num_clients, allow_empty=False)
    splits = {}
    for name, arrays in (("val", val), ("test", test)):
        if arrays is None:
            splits[name] = None
            continue
        s = _build_split(name, arrays, num_clients, allow_empty=True)
        if s.x.shape[1:] != tr.x.shape[1:]:
            raise ValueError(
                f"{name}: feature shape {s.x.shape[1:]} differs from train's "
                f"{tr.x.shape[1:]}"
            )
        splits[name] = s
    if len(set(ids)) != len(ids):
        raise ValueError("client_ids: names must be unique")
    key_ids = np.asarray([zlib.crc32(i.encode()) & 0x7FFFFFFF for i in ids], np.int32)
    return FederatedData(tr, splits["val"], splits["test"], jnp.asarray(key_ids), ids)


def split_clients(
    clients: ClientArrays,
    fractions: tuple[float, float, float] = (0.72, 0.08, 0.20),
    *,
    seed: int = 0,
    client_ids: Sequence[str] | None = None,
) -> FederatedData:
    """Shuffles each client's examples and splits them into train/val/test.

    The default 72/8/20 is the Ditto paper's split. Every client keeps at least one
    training example. Deterministic for a given ``seed``.
    """
    fr = np.asarray(fractions, dtype=np.float64)
    if fr.shape != (3,) or np.any(fr < 0) or not np.isclose(fr.sum(), 1.0):
        raise ValueError(
            f"fractions: need three non-negative numbers summing to 1, got {fractions}"
        )
    rng = np.random.default_rng(seed)
    tr, va, te = [], [], []
    for c, (x, y) in enumerate(clients):
        x, y = np.asarray(x), np.asarray(y)
        n = x.shape[0]
        perm = rng.permutation(n)
        n_val = int(np.floor(fr[1] * n))
        n_test = int(np.floor(fr[2] * n))
        n_train = n - n_val - n_test
        if n_train < 1 and n > 0:
            n_train, n_test = 1, max(0, n_test - 1)
            n_val = n - n_train - n_test
        idx_tr = perm[:n_train]
        idx_va = perm[n_train : n_train + n_val]
        idx_te = perm[n_train + n_val :]
        tr.append((x[idx_tr], y[idx_tr]))
        va.append((x[idx_va], y[idx_va]))
        te.append((x[idx_te], y[idx_te]))
    return from_client_arrays(
        tr, va if fr[1] > 0 else None, te if fr[2] > 0 else None, client_ids
    )


class Batch(NamedTuple):
    """A minibatch for one client: rows gathered from a flat split."""

    x: jax.Array
    y: jax.Array
    mask: jax.Array  # [batch] float32, 1 for real rows, 0 for padding

    __repr__ = brief_repr


def client_batch_indices(
    split: Split,
    client: jax.Array,
    key: jax.Array,
    *,
    num_steps: int,
    batch_size: int,
    sampling: str = "with_replacement",
    drop_last: bool = False,
    num_passes: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Row indices ``[num_steps, B]`` into ``split`` and a ``[num_steps, B]`` mask.

    Modes:
      * ``"with_replacement"``: each row uniform over the client's examples.
      * ``"epoch"``: without replacement; pass ``e`` over the client's data is a
        fresh permutation drawn with ``fold_in(key, e)``. Without ``drop_last``
        the passes are chained (a batch that crosses the end of a pass is
        completed from the next one; a client with fewer than ``batch_size``
        examples wraps several times); with ``drop_last`` each pass gives
        ``n_k // B`` whole batches and drops its remainder (PyTorch's
        ``DataLoader(shuffle=True, drop_last=True)``; a client with fewer than
        ``B`` examples repeats some in its batch). Each round starts a new
        pass (no cursor is carried across rounds).
      * ``"full_batch"``: every step uses all the client's examples
        (``B = max_count``, padded rows masked out).

    ``num_passes`` (``'epoch'`` only) is how many permutations to draw (static);
    steps past them reuse the last one. Default: enough for ``num_steps`` steps
    of the smallest client. Callers that know how many steps each client really
    takes (an epoch budget) pass fewer: drawing a permutation costs a sort of
    ``max_count`` keys.
    """
    offset = split.offsets[client]
    count = split.counts[client]
    if sampling == "with_replacement":
        local = jax.random.randint(key, (num_steps, batch_size), 0, count)
        mask = jnp.ones((num_steps, batch_size), jnp.float32)
    elif sampling == "epoch":
        total = num_steps * batch_size
        smallest = max(split.min_count, 1)
        if num_passes is None:
            num_passes = (-(-num_steps // max(1, smallest // batch_size)) if drop_last
                          else min(-(-total // smallest), total))
        m = split.max_count
        u = jax.vmap(lambda e: jax.random.uniform(jax.random.fold_in(key, e), (m,)))(
            jnp.arange(num_passes))
        u = jnp.where(jnp.arange(m)[None, :] < count, u, 2.0)
        perms = jnp.argsort(u, axis=1)  # first `count` entries: a permutation
        if drop_last:
            per_pass = jnp.maximum(count // batch_size, 1)
            step = jnp.arange(num_steps)
            pas = jnp.minimum(step // per_pass, num_passes - 1)
            col = (step % per_pass)[:, None] * batch_size + jnp.arange(batch_size)
            local = perms[pas[:, None], col % count]  # wraps only if count < B
        else:
            pos = jnp.arange(total)
            local = perms[jnp.minimum(pos // count, num_passes - 1), pos % count]
            local = local.reshape(num_steps, batch_size)
        mask = jnp.ones((num_steps, batch_size), jnp.float32)
    elif sampling == "full_batch":
        ar = jnp.arange(split.max_count)
        local = jnp.broadcast_to(jnp.minimum(ar, count - 1),
                                 (num_steps, split.max_count))
        mask = jnp.broadcast_to((ar < count).astype(jnp.float32), local.shape)
    else:
        raise ValueError(f"sampling: must be one of {SAMPLING_MODES}, got {sampling!r}")
    return offset + local, mask


def gather_batch(split: Split, rows: jax.Array, mask: jax.Array) -> Batch:
    """Gathers rows of a split into a :class:`Batch`."""
    return Batch(split.x[rows], split.y[rows], mask)
