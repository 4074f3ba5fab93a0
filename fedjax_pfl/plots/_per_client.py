"""Per-client values of a finished run, evaluated exactly as the drivers do.

:func:`fedjax_pfl.simulate` and :func:`fedjax_pfl.sweep` keep only summaries
(mean, std, worst10, ...) in their histories; these helpers recompute the
per-client array behind them from the final state(s), with the same evaluation
key, so e.g. the test-size-weighted mean of the result equals the history's
``'{model}/{split}/{metric}/mean'`` of the last row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl.core import Algorithm, AlgorithmState, evaluate_state


def _kwargs(data, split: str, metric: str) -> dict:
    if getattr(data, split, None) is None:
        raise ValueError(f"split: data has no {split!r} split")
    if metric not in ("accuracy", "loss"):
        raise ValueError(f"metric: must be 'accuracy' or 'loss', got {metric!r}")
    return {"splits": (split,), "metrics": (metric,), "per_client": True}


def _unpack(out: Mapping[str, Any], split: str, metric: str) -> dict[str, np.ndarray]:
    tail = f"/{split}/{metric}/per_client"
    return {k[: -len(tail)]: np.asarray(v) for k, v in out.items() if k.endswith(tail)}


def per_client_metric(
    algorithm: Algorithm,
    state: AlgorithmState,
    data,
    *,
    key: jax.Array,
    split: str = "test",
    metric: str = "accuracy",
) -> dict[str, np.ndarray]:
    """Per-client ``metric`` on ``split`` of every model ``eval_models`` returns.

    Args:
      algorithm: the algorithm that was run.
      state: its final state (``SimulationResult.state``).
      data: the :class:`fedjax_pfl.data.FederatedData` it ran on.
      key: the ``key`` given to :func:`fedjax_pfl.simulate` (evaluation-time
        randomness such as finetuning is derived from it as simulate does).
      split, metric: what to evaluate (``'accuracy'`` or ``'loss'``).

    Returns:
      model name (``'global'``, ``'personal'``, ...) -> ``[num_clients]`` NumPy
      array; NaN for clients with no example in ``split``.
    """
    kwargs = _kwargs(data, split, metric)
    out = jax.jit(lambda s, d, k: evaluate_state(algorithm, s, d, key=k, **kwargs))(
        state, data, key)
    return _unpack(out, split, metric)


def sweep_per_client(
    make_algorithm: Callable[..., Algorithm],
    hparams: Mapping[str, Any],
    states: AlgorithmState,
    data,
    *,
    key: jax.Array,
    split: str = "test",
    metric: str = "accuracy",
) -> dict[str, np.ndarray]:
    """:func:`per_client_metric` for the final states of :func:`fedjax_pfl.sweep`.

    Args:
      make_algorithm, hparams, data, key: exactly as given to ``sweep``.
      states: the states ``sweep`` returned (leading axis ``S``).
      split, metric: as in :func:`per_client_metric`.

    Returns:
      model name -> ``[S, num_clients]`` array (feed ``[name]`` to
      :func:`lambda_sweep`'s ``per_client``); one vmapped program.
    """
    kwargs = _kwargs(data, split, metric)
    values = {k: jnp.asarray(v, jnp.float32) for k, v in hparams.items()}
    sizes = {v.shape for v in values.values()}
    if not values or len(sizes) != 1 or len(next(iter(sizes))) != 1:
        shapes = {k: v.shape for k, v in values.items()}
        raise ValueError(f"hparams: must be name -> 1-D arrays of one length, as "
                         f"given to sweep, got shapes {shapes}")

    def one(hp, s, d):
        return evaluate_state(make_algorithm(**hp), s, d, key=key, **kwargs)

    out = jax.jit(jax.vmap(one, in_axes=(0, 0, None)))(values, states, data)
    return _unpack(out, split, metric)
