"""Atomic checkpoints of a ``simulate`` run, for exact resumption (orbax).

One checkpoint (an orbax step, numbered by the rounds done in the run) holds:

* ``state``: the leaves of the :class:`AlgorithmState`, one ``.npy`` file each,
  named by their position in ``jax.tree.leaves`` (typed PRNG keys stored as
  their ``key_data``; zero-size leaves not stored, rebuilt from the spec). Large
  leaves are streamed from the device in row blocks of about ``BLOCK_BYTES`` and
  read back into a donated device buffer block by block, so neither a save nor a
  restore ever holds a second full copy of the state (500 Ditto FMNIST personal
  models: 6.5 GB);
* ``meta`` (JSON): the history rows so far, the rounds done, the offset of the
  JSON-lines file, the spec of every state leaf, and the run's fingerprint.

orbax's ``CheckpointManager`` writes a step into ``<step>.orbax-checkpoint-tmp-*``
and renames it to ``<step>`` once complete, so a crash mid-write leaves the
previous checkpoint as the latest one. See docs/checkpointing.md.
"""

from __future__ import annotations

import functools
import json
import os
import warnings
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.validation import check_choice, check_dir, check_int

FORMAT = 2  # 1: orbax StandardSave of host copies; 2: streamed .npy leaves
KEEP = 2  # checkpoints kept
BLOCK_BYTES = 64 << 20  # a leaf larger than this is written and read in row blocks


class Restored(NamedTuple):
    """A restored checkpoint."""

    state: Any
    history: list[dict[str, Any]]
    rounds_done: int
    jsonl_bytes: int | None


def validate(checkpoint_dir, checkpoint_every, resume, eval_every,
             checkpoint_config=None) -> int | None:
    """Checks simulate's checkpoint arguments before any work; returns the
    interval in rounds. A ``checkpoint_dir`` that is a file, or lies under one,
    is refused here rather than when the first checkpoint is written."""
    if checkpoint_dir is None:
        if checkpoint_every is not None:
            raise ValueError("checkpoint_every: needs checkpoint_dir")
        if resume:
            raise ValueError("resume: needs checkpoint_dir")
        if checkpoint_config is not None:
            raise ValueError("checkpoint_config: needs checkpoint_dir")
        return None
    if checkpoint_config is not None:
        if not isinstance(checkpoint_config, Mapping):
            raise ValueError("checkpoint_config: must be a mapping (e.g. a dict of "
                             "hyperparameters) or None, got "
                             f"{type(checkpoint_config).__name__}")
        try:
            json.dumps(checkpoint_config, allow_nan=False, sort_keys=True)
        except (TypeError, ValueError) as e:
            raise ValueError("checkpoint_config: must be JSON-serializable (strings, "
                             f"numbers, booleans, None, lists, dicts): {e}") from None
    check_dir("checkpoint_dir", checkpoint_dir)
    check_choice("resume", resume, (True, False))
    if checkpoint_every is None:
        return eval_every
    every = check_int("checkpoint_every", checkpoint_every, lo=1)
    if every % eval_every:
        raise ValueError(
            "checkpoint_every: must be a positive multiple of eval_every "
            f"({eval_every}), got {checkpoint_every!r}")
    return every


def _leaf_spec(x) -> dict[str, Any]:
    return {"shape": [int(d) for d in np.shape(x)], "dtype": str(x.dtype)}


def _is_key(x) -> bool:
    return jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def state_spec(tree) -> list[dict[str, Any]]:
    """Shape and dtype of every leaf (arrays or ``jax.ShapeDtypeStruct``)."""
    return [_leaf_spec(x) for x in jax.tree.leaves(tree)]


def fingerprint(*, num_rounds, eval_every, run_key, start_round, template,
                privacy, config=None) -> dict[str, Any]:
    """What a resumed run must share with the run that wrote the checkpoint
    (``config``: the caller's description of its configuration, only when
    given, so that checkpoints written without one still resume)."""
    fp = {
        "format": FORMAT,
        "num_rounds": int(num_rounds),
        "eval_every": int(eval_every),
        "key": np.asarray(jax.random.key_data(run_key)).ravel().tolist(),
        "key_impl": str(jax.random.key_impl(run_key)),
        "start_round": start_round,
        "state": state_spec(template),
        "privacy": privacy,
    }
    if config is not None:
        fp["config"] = dict(config)
    return json.loads(json.dumps(fp))  # the form it takes after a round trip


def _encode(state):
    """The leaves to write (device arrays, not copied) and their spec."""
    arrays, spec = {}, []
    for i, x in enumerate(jax.tree.leaves(state)):
        entry = _leaf_spec(x)
        if _is_key(x):
            entry["key_impl"] = str(jax.random.key_impl(x))
            x = jax.random.key_data(x)
        entry.update(data_shape=[int(d) for d in np.shape(x)],
                     data_dtype=str(x.dtype))
        spec.append(entry)
        if np.size(x):
            arrays[f"{i:06d}"] = x
    return arrays, spec


def _decode(template, arrays, spec):
    treedef = jax.tree.structure(template)
    out = []
    for i, entry in enumerate(spec):
        a = arrays.get(f"{i:06d}")
        if a is None:
            a = np.zeros(entry["data_shape"], entry["data_dtype"])
        a = jnp.asarray(a)
        if "key_impl" in entry:
            a = jax.random.wrap_key_data(a, impl=entry["key_impl"])
        out.append(a)
    return jax.tree.unflatten(treedef, out)


def _block_rows(shape, dtype) -> int:
    """Rows of a leaf per block: all of them for a leaf of at most
    ``BLOCK_BYTES`` (or a scalar)."""
    if len(shape) == 0:
        return 1
    row = int(np.prod(shape[1:], dtype=np.int64)) * jnp.dtype(dtype).itemsize
    return int(min(shape[0], max(1, BLOCK_BYTES // max(row, 1))))


def _block_starts(n: int, rows: int) -> list[int]:
    """Starts of the row blocks; the last block ends at ``n`` (it may overlap
    the one before, so every block has the same shape: one compilation)."""
    return sorted({min(s, n - rows) for s in range(0, n, rows)})


@functools.partial(jax.jit, static_argnums=2)
def _read_rows(a, start, rows):
    return jax.lax.dynamic_slice_in_dim(a, start, rows)


@functools.partial(jax.jit, donate_argnums=0)
def _write_rows(a, block, start):
    return jax.lax.dynamic_update_slice_in_dim(a, block, start, 0)


def _npy_header(f, shape, dtype) -> None:
    np.lib.format.write_array_header_1_0(f, {
        "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
        "fortran_order": False, "shape": tuple(shape)})


def write_leaf(path, x) -> None:
    """Writes array ``x`` to ``path`` as ``.npy``, in row blocks of about
    ``BLOCK_BYTES`` copied from the device one at a time.

    No host view of ``x`` outlives the call: on CPU, a buffer with a live host
    view is copied instead of donated to the next round."""
    shape, dtype = tuple(np.shape(x)), jnp.dtype(x.dtype)
    rows = _block_rows(shape, dtype)
    with open(path, "wb") as f:
        _npy_header(f, shape, dtype)
        if not shape or rows == shape[0]:  # small: one host copy of the leaf
            np.ascontiguousarray(jax.device_get(x)).tofile(f)
            return
        done = 0
        for start in _block_starts(shape[0], rows):
            block = np.asarray(jax.device_get(_read_rows(x, start, rows)))
            block[done - start:].tofile(f)  # the rows not written yet
            done = start + rows


def read_leaf(path, shape, dtype) -> jax.Array:
    """Reads a leaf written by :func:`write_leaf` onto the default device, block by
    block into one donated buffer.

    Raises:
      ValueError: the file's header or size does not match ``shape``/``dtype``.
    """
    shape, dtype = tuple(shape), jnp.dtype(dtype)
    with open(path, "rb") as f:
        fmt = np.lib.format
        read_header = (fmt.read_array_header_1_0 if fmt.read_magic(f) == (1, 0)
                       else fmt.read_array_header_2_0)
        got, fortran, got_dtype = read_header(f)
        offset = f.tell()
        size = os.fstat(f.fileno()).st_size
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if (tuple(got) != shape or fortran or got_dtype.itemsize != dtype.itemsize
                or (got_dtype.kind != "V" and got_dtype != dtype)  # bfloat16: "V2"
                or size != offset + nbytes):
            raise ValueError(f"{path}: holds {got} {got_dtype} ({size - offset} "
                             f"bytes), expected {shape} {dtype}")
        rows = _block_rows(shape, dtype)
        if not shape or rows == shape[0]:
            flat = np.fromfile(f, dtype, int(np.prod(shape)))
            return jnp.asarray(flat.reshape(shape))
        out = jnp.zeros(shape, dtype)
        row = nbytes // shape[0]
        for start in _block_starts(shape[0], rows):
            f.seek(offset + start * row)
            block = np.fromfile(f, dtype, rows * (row // dtype.itemsize))
            out = _write_rows(out, block.reshape((rows, *shape[1:])), start)
            out.block_until_ready()  # one block in flight, not the whole file
        return out


@functools.cache
def _leaf_files_args():
    """orbax ``CheckpointArgs`` (save, restore) of the ``.npy`` leaf handler."""
    import dataclasses

    import orbax.checkpoint as ocp

    class LeafFilesHandler(ocp.CheckpointHandler):
        """The state's leaves, one streamed ``.npy`` file each (see module doc)."""

        def save(self, directory, args):
            if jax.process_index() == 0:
                for name, x in args.arrays.items():
                    write_leaf(os.path.join(directory, f"{name}.npy"), x)

        def restore(self, directory, args):
            return {name: read_leaf(os.path.join(directory, f"{name}.npy"), *sd)
                    for name, sd in args.spec.items()}

    @ocp.args.register_with_handler(LeafFilesHandler, for_save=True)
    @dataclasses.dataclass
    class LeafFilesSave(ocp.args.CheckpointArgs):
        arrays: dict

    @ocp.args.register_with_handler(LeafFilesHandler, for_restore=True)
    @dataclasses.dataclass
    class LeafFilesRestore(ocp.args.CheckpointArgs):
        spec: dict  # name -> (shape, dtype)

    return LeafFilesSave, LeafFilesRestore


class Checkpointer:
    """The checkpoints of one run in ``directory`` (the last ``KEEP`` kept)."""

    def __init__(self, directory):
        import orbax.checkpoint as ocp

        self._ocp = ocp
        options = ocp.CheckpointManagerOptions(
            max_to_keep=KEEP, create=True, cleanup_tmp_directories=True,
            enable_async_checkpointing=False)
        self.directory = os.path.abspath(os.fspath(directory))
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("state", "meta"))

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, rounds_done, state, history, fp, jsonl_bytes) -> None:
        """Writes one checkpoint and waits until it is committed (renamed)."""
        arrays, spec = _encode(state)
        meta = {"fingerprint": fp, "rounds_done": int(rounds_done), "spec": spec,
                "history": history, "jsonl_bytes": jsonl_bytes}
        ocp = self._ocp
        save_args, _ = _leaf_files_args()
        self.manager.save(int(rounds_done), force=True, args=ocp.args.Composite(
            state=save_args(arrays), meta=ocp.args.JsonSave(meta)))
        self.manager.wait_until_finished()

    def _read(self, step):
        ocp = self._ocp
        meta = self.manager.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore())).meta
        if meta.get("fingerprint", {}).get("format") != FORMAT:
            return meta, {}  # another format: refused by the fingerprint check
        wanted = {f"{i:06d}": (e["data_shape"], e["data_dtype"])
                  for i, e in enumerate(meta["spec"]) if np.prod(e["data_shape"]) > 0}
        arrays = {}
        if wanted:
            _, restore_args = _leaf_files_args()
            arrays = self.manager.restore(step, args=ocp.args.Composite(
                state=restore_args(wanted))).state
        return meta, arrays

    def restore(self, template, fp) -> Restored | None:
        """The newest readable checkpoint, or None if there is none.

        A newer checkpoint that cannot be read (e.g. files lost after the commit)
        is skipped with a warning and deleted. A readable checkpoint written by a
        different run (fingerprint) is refused with a ``ValueError``.
        """
        steps = self.steps()
        errors = []
        for step in reversed(steps):
            try:
                meta, arrays = self._read(step)
            except Exception as e:  # noqa: BLE001 - any unreadable checkpoint
                errors.append(f"step {step}: {type(e).__name__}: {e}")
                warnings.warn(f"checkpoint_dir: checkpoint {step} in {self.directory} "
                              f"cannot be read and is skipped ({e})", stacklevel=3)
                continue
            if meta.get("fingerprint") != fp:
                old = meta.get("fingerprint") or {}
                if old.get("format") != FORMAT:
                    raise ValueError(
                        f"checkpoint_dir: {self.directory} holds a checkpoint in "
                        f"format {old.get('format')}; this version reads format "
                        f"{FORMAT} (docs/checkpointing.md); refusing to resume. Use "
                        "the version that wrote it, or another directory.")
                diff = sorted(k for k in set(fp) | set(old) if fp.get(k) != old.get(k))
                raise ValueError(
                    f"checkpoint_dir: {self.directory} holds a checkpoint of a "
                    f"different run (differs in: {', '.join(diff)}); refusing to "
                    "resume. Use the "
                    "same key, num_rounds, eval_every, starting state, algorithm state "
                    "structure, privacy monitor and checkpoint_config, or another "
                    "directory.")
            for newer in steps[steps.index(step) + 1:]:
                self.manager.delete(newer)  # unreadable: it would block re-saving
            state = _decode(template, arrays, meta["spec"])
            return Restored(state, meta["history"], int(meta["rounds_done"]),
                            meta.get("jsonl_bytes"))
        if errors:
            raise RuntimeError(f"checkpoint_dir: no checkpoint in {self.directory} "
                               "could be read: " + "; ".join(errors))
        return None

    def require_empty(self) -> None:
        if self.steps():
            raise ValueError(
                f"checkpoint_dir: {self.directory} already holds checkpoints "
                f"(rounds {self.steps()}); pass resume=True to continue that run, or "
                "use an empty directory")

    def close(self) -> None:
        self.manager.close()
