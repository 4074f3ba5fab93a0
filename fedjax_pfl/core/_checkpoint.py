"""Atomic checkpoints of a ``simulate`` run, for exact resumption (orbax).

One checkpoint (an orbax step, numbered by the rounds done in the run) holds:

* ``state``: the leaves of the :class:`AlgorithmState`, as host copies, keyed by
  their position in ``jax.tree.leaves`` (typed PRNG keys stored as their
  ``key_data``; zero-size leaves, which orbax refuses, rebuilt from the spec);
* ``meta`` (JSON): the history rows so far, the rounds done, the offset of the
  JSON-lines file, the spec of every state leaf, and the run's fingerprint.

orbax's ``CheckpointManager`` writes a step into ``<step>.orbax-checkpoint-tmp-*``
and renames it to ``<step>`` once complete, so a crash mid-write leaves the
previous checkpoint as the latest one. See docs/checkpointing.md.
"""

from __future__ import annotations

import json
import os
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

FORMAT = 1
KEEP = 2  # checkpoints kept


class Restored(NamedTuple):
    """A restored checkpoint."""

    state: Any
    history: list[dict[str, Any]]
    rounds_done: int
    jsonl_bytes: int | None


def validate(checkpoint_dir, checkpoint_every, resume, eval_every) -> int | None:
    """Checks simulate's checkpoint arguments; returns the interval in rounds."""
    if checkpoint_dir is None:
        if checkpoint_every is not None:
            raise ValueError("checkpoint_every: needs checkpoint_dir")
        if resume:
            raise ValueError("resume: needs checkpoint_dir")
        return None
    if not isinstance(checkpoint_dir, (str, os.PathLike)) or not str(checkpoint_dir):
        raise ValueError(f"checkpoint_dir: must be a path, got {checkpoint_dir!r}")
    if not isinstance(resume, bool):
        raise ValueError(f"resume: must be True or False, got {resume!r}")
    if checkpoint_every is None:
        return eval_every
    if (not isinstance(checkpoint_every, (int, np.integer)) or checkpoint_every < 1
            or checkpoint_every % eval_every):
        raise ValueError(
            "checkpoint_every: must be a positive multiple of eval_every "
            f"({eval_every}), got {checkpoint_every!r}")
    return int(checkpoint_every)


def _leaf_spec(x) -> dict[str, Any]:
    return {"shape": [int(d) for d in np.shape(x)], "dtype": str(x.dtype)}


def _is_key(x) -> bool:
    return jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def state_spec(tree) -> list[dict[str, Any]]:
    """Shape and dtype of every leaf (arrays or ``jax.ShapeDtypeStruct``)."""
    return [_leaf_spec(x) for x in jax.tree.leaves(tree)]


def fingerprint(*, num_rounds, eval_every, run_key, start_round, template,
                privacy) -> dict[str, Any]:
    """What a resumed run must share with the run that wrote the checkpoint."""
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
    return json.loads(json.dumps(fp))  # the form it takes after a round trip


def _encode(state):
    """Host copies of the leaves (taken before the state is donated)."""
    arrays, spec = {}, []
    for i, x in enumerate(jax.tree.leaves(state)):
        entry = _leaf_spec(x)
        if _is_key(x):
            entry["key_impl"] = str(jax.random.key_impl(x))
            x = jax.random.key_data(x)
        a = np.array(jax.device_get(x), copy=True)
        entry.update(data_shape=list(a.shape), data_dtype=str(a.dtype))
        spec.append(entry)
        if a.size:
            arrays[f"{i:06d}"] = a
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
        self.manager.save(int(rounds_done), force=True, args=ocp.args.Composite(
            state=ocp.args.StandardSave(arrays), meta=ocp.args.JsonSave(meta)))
        self.manager.wait_until_finished()

    def _read(self, step):
        ocp = self._ocp
        meta = self.manager.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore())).meta
        spec = meta["spec"]
        abstract = {f"{i:06d}": jax.ShapeDtypeStruct(e["data_shape"], e["data_dtype"])
                    for i, e in enumerate(spec) if np.prod(e["data_shape"]) > 0}
        arrays = {}
        if abstract:
            arrays = self.manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract))).state
        if set(arrays) != set(abstract):
            raise ValueError(f"checkpoint {step}: leaves missing")
        for name, sds in abstract.items():
            a = np.asarray(arrays[name])
            if a.shape != sds.shape or a.dtype != sds.dtype:
                raise ValueError(f"checkpoint {step}: leaf {name} has the wrong shape")
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
                diff = sorted(k for k in set(fp) | set(old) if fp.get(k) != old.get(k))
                raise ValueError(
                    f"checkpoint_dir: {self.directory} holds a checkpoint of a different "
                    f"run (differs in: {', '.join(diff)}); refusing to resume. Use the "
                    "same key, num_rounds, eval_every, starting state, algorithm state "
                    "structure and privacy monitor, or another directory.")
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
