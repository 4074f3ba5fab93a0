"""Argument checks shared by the factories (on top of the engine's own).

``core.make_local_config`` takes ``isinstance(x, int)`` for its counts, so a
bool (``num_local_steps=True``) passes it, and leaves ``unroll`` unchecked;
:func:`local_config` checks them first, so every factory refuses them by name
(tests/algorithms/test_contract.py).
"""

from __future__ import annotations

import numpy as np

from fedjax_pfl.core import LocalConfig, make_local_config
from fedjax_pfl.validation import check_int, check_number


def check_unroll(unroll) -> None:
    """``unroll``: ``None`` (the backend's default), a bool (``lax.scan``'s
    meaning: ``True`` fully unrolled) or an integer ``>= 1``."""
    if unroll is not None and not isinstance(unroll, (bool, np.bool_)):
        check_int("unroll", unroll, lo=1)


def local_config(client_lr, num_local_steps, batch_size, sampling, unroll,
                 epochs=None, **kwargs) -> LocalConfig:
    """:func:`fedjax_pfl.core.make_local_config` with ``num_local_steps`` and
    ``batch_size`` checked as integers (a bool is not a count) and ``unroll``
    checked."""
    check_int("num_local_steps", num_local_steps, lo=1)
    check_int("batch_size", batch_size, lo=1)
    check_unroll(unroll)
    return make_local_config(client_lr, num_local_steps, batch_size, sampling,
                             unroll, epochs, **kwargs)


def check_grid(name: str, grid, *, lo: float = 0.0,
               hi: float = np.inf) -> tuple[float, ...]:
    """A non-empty sequence of finite numbers in ``[lo, hi]``, as floats."""
    if isinstance(grid, (str, bytes)) or np.ndim(grid) != 1 or len(grid) == 0:
        raise ValueError(f"{name}: must be a non-empty sequence of numbers in "
                         f"[{lo}, {hi}], got {grid!r}")
    for g in grid:
        check_number(name, g, lo=lo, hi=hi, scalar=True)
    return tuple(float(g) for g in grid)
