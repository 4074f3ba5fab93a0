"""Input validation at the API boundary: one module, used by every subpackage.

Every check raises ``ValueError`` whose message starts with the argument's name
and says what is allowed, before any work starts. Numeric checks are skipped for
traced values (inside ``jit``/``vmap``/``grad``), so hyperparameters that users
sweep (learning rates, lambda, clip norms, noise) may be arrays; wrong types
(strings, booleans, ``None``) are refused everywhere. Integer checks
(:func:`check_int`, :func:`check_count`) are for static counts and shapes, so
they refuse traced values with a message saying so; :func:`check_mask` checks
only the shape of a traced mask. :func:`check_dir` and :func:`check_file`
refuse output paths that cannot be written (a folder that is a file, a file
under a file) before a run starts.

This module sits at the bottom of the package (it imports only numpy and jax),
so ``data`` and ``models`` use it as well as the algorithms.
"""

from __future__ import annotations

import os
from collections.abc import Collection

import numpy as np

try:  # public through jax 0.10; kept importable on later versions
    from jax.core import Tracer as _Tracer
except ImportError:  # pragma: no cover
    from jax._src.core import Tracer as _Tracer

__all__ = [
    "is_concrete", "check_number", "check_positive", "check_nonnegative",
    "check_probability", "check_int", "check_count", "check_choice", "check_mask",
    "check_dir", "check_file", "check_clip",
]


def is_concrete(x) -> bool:
    """Whether ``x`` is a concrete value (not traced inside jit/vmap/grad)."""
    return not isinstance(x, _Tracer)


def _numeric(name: str, value, *, integer: bool) -> np.ndarray | None:
    """``value`` as a float64/int array, or None when traced; refuses non-numbers."""
    if not is_concrete(value):
        return None
    kind = "an integer" if integer else "a number"
    if value is None or isinstance(value, (bool, np.bool_, str, bytes)):
        raise ValueError(f"{name}: must be {kind}, got {value!r} "
                         f"({type(value).__name__})")
    try:
        arr = np.asarray(value)
    except Exception as e:  # pragma: no cover - exotic objects
        raise ValueError(f"{name}: must be {kind}, got {value!r}") from e
    if arr.dtype.kind not in ("iuf" if not integer else "iu"):
        if integer and arr.dtype.kind == "f":
            raise ValueError(f"{name}: must be an integer, got {value!r}")
        raise ValueError(f"{name}: must be {kind}, got {value!r} "
                         f"({type(value).__name__})")
    return arr


def check_number(name: str, value, *, lo: float = -np.inf, hi: float = np.inf,
                 lo_open: bool = False, hi_open: bool = False,
                 scalar: bool = False) -> None:
    """``ValueError`` unless every entry of ``value`` is a finite number in the
    interval from ``lo`` to ``hi`` (open ends with ``lo_open``/``hi_open``).
    ``scalar`` also requires a 0-d value. Traced values are not checked."""
    arr = _numeric(name, value, integer=False)
    if arr is None:
        return
    if scalar and arr.ndim != 0:
        raise ValueError(f"{name}: must be a scalar, got shape {arr.shape}")
    arr = arr.astype(np.float64)
    bad = (not np.all(np.isfinite(arr))
           or np.any(arr <= lo if lo_open else arr < lo)
           or np.any(arr >= hi if hi_open else arr > hi))
    if bad:
        left = "(" if lo_open or not np.isfinite(lo) else "["
        right = ")" if hi_open or not np.isfinite(hi) else "]"
        raise ValueError(f"{name}: must be a finite number in {left}{lo}, {hi}{right}"
                         f", got {value!r}")


def check_positive(name: str, value, *, integer: bool = False) -> None:
    """``ValueError`` unless ``value > 0`` and finite (every entry); ``integer``
    requires a scalar integer. Traced values are not checked."""
    if integer:
        check_int(name, value, lo=1)
        return
    arr = _numeric(name, value, integer=False)
    if arr is not None and (not np.all(np.isfinite(arr.astype(np.float64)))
                            or np.any(arr <= 0)):
        raise ValueError(f"{name}: must be positive and finite, got {value!r}")


def check_nonnegative(name: str, value) -> None:
    """``ValueError`` unless every entry of ``value`` is finite and ``>= 0``
    (traced values are not checked)."""
    arr = _numeric(name, value, integer=False)
    if arr is not None and (not np.all(np.isfinite(arr.astype(np.float64)))
                            or np.any(arr < 0)):
        raise ValueError(f"{name}: must be non-negative and finite, got {value!r}")


def check_clip(name: str, value) -> None:
    """``ValueError`` unless every entry of ``value`` is a positive number or
    ``inf`` (a clipping bound, ``inf`` meaning no clipping); NaN is refused.
    Traced values are not checked."""
    arr = _numeric(name, value, integer=False)
    if arr is not None and (np.any(np.isnan(arr.astype(np.float64)))
                            or np.any(arr <= 0)):
        raise ValueError(f"{name}: must be positive (inf: no clipping), got "
                         f"{value!r}")


def check_probability(name: str, value, *, allow_zero: bool = False) -> None:
    """``ValueError`` unless ``value`` is a scalar in (0, 1] ([0, 1] with
    ``allow_zero``); traced values are not checked."""
    arr = _numeric(name, value, integer=False)
    if arr is None:
        return
    lo_ok = (lambda v: v >= 0.0) if allow_zero else (lambda v: v > 0.0)
    if arr.ndim != 0 or not (np.isfinite(arr) and lo_ok(float(arr))
                             and float(arr) <= 1.0):
        rng = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{name}: must be a probability in {rng}, got {value!r}")


def check_int(name: str, value, *, lo: int | None = None, hi: int | None = None,
              allow_none: bool = False) -> int | None:
    """``ValueError`` unless ``value`` is an integer (a Python/NumPy integer or a
    concrete 0-d integer array; not a bool, not traced: counts are static) with
    ``lo <= value <= hi``; returns it as an ``int``."""
    if value is None and allow_none:
        return None
    rng = (f" >= {lo}" if hi is None else f" in [{lo}, {hi}]") if lo is not None \
        else ("" if hi is None else f" <= {hi}")
    none = " (or None)" if allow_none else ""
    if not is_concrete(value):
        raise ValueError(f"{name}: must be a static integer{rng}{none} (it sets a "
                         f"count or a shape), got a traced value")
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if not ok and hasattr(value, "dtype") and hasattr(value, "shape"):
        ok = value.shape == () and np.dtype(value.dtype).kind in "iu"
    if ok and ((lo is not None and value < lo) or (hi is not None and value > hi)):
        ok = False
    if not ok:
        raise ValueError(f"{name}: must be an integer{rng}{none}, got {value!r}")
    return int(value)


def check_count(name: str, value) -> int:
    """A non-negative integer count (rounds, steps, compositions)."""
    return check_int(name, value, lo=0)


def check_choice(name: str, value, choices: Collection) -> None:
    """``ValueError`` unless ``value`` is one of ``choices`` (a bool never
    stands for 0 or 1)."""
    def is_bool(x):
        return isinstance(x, (bool, np.bool_))

    try:
        ok = bool(any(value == c and is_bool(value) == is_bool(c) for c in choices))
    except (TypeError, ValueError):  # e.g. an array compared with a string
        ok = False
    if not ok:
        raise ValueError(f"{name}: must be one of {tuple(choices)}, got {value!r}")


def check_mask(name: str, mask, length: int) -> np.ndarray | None:
    """A ``[length]`` client mask: booleans, or numbers that are all 0 or 1
    (e.g. a float ``benign`` mask). Returns it as a NumPy bool array; a traced
    mask has only its shape checked (and ``None`` is returned)."""
    if mask is None or isinstance(mask, (str, bytes, bool)):
        raise ValueError(f"{name}: must be a ({length},) boolean mask (one flag per "
                         f"client), got {mask!r}")
    if not is_concrete(mask):
        if tuple(mask.shape) != (length,):
            raise ValueError(f"{name}: must have shape ({length},) (one flag per "
                             f"client), got shape {tuple(mask.shape)}")
        return None
    arr = np.asarray(mask)
    if arr.shape != (length,):
        raise ValueError(f"{name}: must have shape ({length},) (one flag per "
                         f"client), got shape {arr.shape}")
    if arr.dtype.kind == "b":
        return arr
    if arr.dtype.kind not in "iuf" or not np.all((arr == 0) | (arr == 1)):
        raise ValueError(f"{name}: must be a boolean mask (or 0/1 values), got "
                         f"dtype {arr.dtype} with values {np.unique(arr)[:5]}")
    return arr.astype(bool)


def _existing_ancestor(path) -> str:
    """The longest prefix of ``path`` (absolute) that exists."""
    p = os.path.abspath(os.fspath(path))
    while not os.path.exists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def _check_path(name: str, path) -> None:
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes) \
            or not os.fspath(path):
        raise ValueError(f"{name}: must be a non-empty path (str or os.PathLike), "
                         f"got {path!r}")


def check_dir(name: str, path) -> None:
    """``ValueError`` when ``path`` exists and is not a folder (or a parent of
    it is a file), so a run does not fail when it first writes there. ``None``
    (no folder) passes."""
    if path is None:
        return
    _check_path(name, path)
    p = _existing_ancestor(path)
    if os.path.exists(p) and not os.path.isdir(p):
        raise ValueError(f"{name}: {os.fspath(path)!r} must be a folder, but "
                         f"{p!r} is a file")


def check_file(name: str, path) -> None:
    """``ValueError`` when the file ``path`` cannot be written because it is a
    folder, or a parent of it is a file. ``None`` (no file) passes."""
    if path is None:
        return
    _check_path(name, path)
    p = _existing_ancestor(path)
    full = os.path.abspath(os.fspath(path))
    if p == full and os.path.isdir(p):
        raise ValueError(f"{name}: {os.fspath(path)!r} must be a file, but it is a "
                         f"folder")
    if p != full and not os.path.isdir(p):
        raise ValueError(f"{name}: cannot write {os.fspath(path)!r}: {p!r} is a "
                         f"file, not a folder")
