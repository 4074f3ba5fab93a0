"""Argument checks shared by several factories (on top of the engine's own)."""

from __future__ import annotations

import numpy as np

from fedjax_pfl.validation import check_number


def check_grid(name: str, grid, *, lo: float = 0.0,
               hi: float = np.inf) -> tuple[float, ...]:
    """A non-empty sequence of finite numbers in ``[lo, hi]``, as floats."""
    if isinstance(grid, (str, bytes)) or np.ndim(grid) != 1 or len(grid) == 0:
        raise ValueError(f"{name}: must be a non-empty sequence of numbers in "
                         f"[{lo}, {hi}], got {grid!r}")
    for g in grid:
        check_number(name, g, lo=lo, hi=hi, scalar=True)
    return tuple(float(g) for g in grid)
