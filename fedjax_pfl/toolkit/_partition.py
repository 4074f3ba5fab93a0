"""Splitting a model's parameters by layer: a shared part and a personal part.

Methods that share some layers and personalize others (FedRep: a shared body
and personal heads; LG-FedAvg: personal lower layers and a shared head) name
the layers by the top-level keys of the model's parameter dict (a flax
model's submodules: ``'Conv_0'``, ..., ``'Dense_1'``). A split is two dicts
with disjoint keys; :func:`freeze_layers` turns a model and a fixed part into
the model of the other part, so :func:`fedjax_pfl.core.run_local` trains only
that part: gradients are taken for it alone, and the fixed part needs no
optimizer state (``optax.masked`` would differentiate and carry every layer).

>>> head = tk.check_layers(model, None)           # ('Dense_1',): the last
>>> body, heads = tk.split_params(params, head)    # (rest, selected)
>>> tk.run_local(tk.freeze_layers(model, body), heads, data, cid, key, cfg)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from fedjax_pfl.core import Algorithm, AlgorithmState, ModelView, tree_broadcast
from fedjax_pfl.models import Model, Params

from ._round import check_malicious, round_step
from ._solver import global_solver


def layer_names(model: Model) -> tuple[str, ...]:
    """The top-level layer names of ``model``'s parameters, in the order
    ``model.init`` creates them (for a flax model: the forward order).
    Nothing is allocated (``jax.eval_shape``).

    Raises:
      ValueError: if the parameters are not a dict of layers.
    """
    names: list[str] = []

    def init(key):
        params = model.init(key)
        if not isinstance(params, Mapping):
            raise ValueError(f"model: splitting by layer needs parameters that are a "
                             f"dict of layers, got {type(params).__name__}")
        names.extend(params)
        return params

    jax.eval_shape(init, jax.random.key(0))
    return tuple(names)


def check_layers(model: Model, layers, *,
                 name: str = "head_layers") -> tuple[str, ...]:
    """Validates layer names of ``model`` (``ValueError`` naming ``name`` and
    listing the model's layers). ``None`` is the last layer; a string is one
    layer; ``()`` is no layer. Returns a tuple of names."""
    names = layer_names(model)
    if layers is None:
        return names[-1:]
    if isinstance(layers, str):
        layers = (layers,)
    if not isinstance(layers, (tuple, list)) or not all(
            isinstance(n, str) for n in layers):
        raise ValueError(f"{name}: must be a tuple of layer names among {names}, got "
                         f"{layers!r}")
    unknown = [n for n in layers if n not in names]
    if unknown or len(set(layers)) != len(layers):
        what = f"unknown layers {unknown}" if unknown else "repeated layers"
        raise ValueError(f"{name}: {what} in {tuple(layers)!r}; the model's layers "
                         f"are {names}")
    return tuple(layers)


def split_params(params: Params, layers) -> tuple[dict, dict]:
    """``(rest, selected)``: the layers of ``params`` not in ``layers`` and those
    in it (two dicts; works on stacked parameters too)."""
    return ({k: v for k, v in params.items() if k not in layers},
            {k: v for k, v in params.items() if k in layers})


def merge_params(*parts: Params) -> dict:
    """The union of disjoint layer dicts (the inverse of :func:`split_params`)."""
    out: dict = {}
    for p in parts:
        out.update(p)
    return out


def freeze_layers(model: Model, fixed: Params) -> Model:
    """``model`` as a function of its other layers, ``fixed`` held constant:
    ``apply(p, x) = model.apply(merge_params(fixed, p), x)`` (the regularizer
    likewise). Training it trains only ``p``; as a :class:`ModelView`'s model
    with stacked ``p`` it evaluates one shared ``fixed`` with per-client ``p``
    without copying ``fixed`` per client."""
    reg = model.regularizer
    return model._replace(
        init=lambda key: split_params(model.init(key), tuple(fixed))[0],
        apply=lambda p, x: model.apply(merge_params(fixed, p), x),
        regularizer=None if reg is None else (
            lambda p: reg(merge_params(fixed, p))))


def layer_split_algorithm(model: Model, layers: tuple[str, ...], shared: int,
                          client_update, cfg, *, aggregator=None, weighted=True,
                          server_optimizer=None, cohort_size, cohort,
                          attack, malicious) -> Algorithm:
    """An :class:`fedjax_pfl.core.Algorithm` whose parameters are split by
    ``layers`` (:func:`split_params`): part ``shared`` (0: the other layers,
    1: ``layers``) is a global model with FedAvg's server (its init,
    aggregation and optimizer step, :func:`global_solver`), the other part is
    every client's state (``w^0``'s part, stacked). ``client_update(needs_losses,
    server, part, cid, key, data) -> ClientResult`` is the one-client kernel
    (``needs_losses``: whether the aggregator reads ``round_start_loss``); the
    engine applies ``attack``. Evaluated: ``personal`` (the global part with
    each client's own, :func:`freeze_layers`: no per-client copy)."""

    def part(params, i):
        return split_params(params, layers)[i]

    solver = global_solver(model._replace(init=lambda key: part(model.init(key),
                                                                  shared)),
                           cfg, aggregator=aggregator, weighted=weighted,
                           server_optimizer=server_optimizer)

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        own = part(model.init(key), 1 - shared)
        return AlgorithmState(solver.init(key), tree_broadcast(own, data.num_clients),
                              jnp.zeros((), jnp.int32))

    step = round_step(functools.partial(client_update,
                                        solver.aggregator.needs_losses),
                      solver.server_fn, cohort_size=cohort_size, cohort=cohort,
                      attack=attack, malicious=malicious,
                      linear_weights=solver.aggregator.linear_weights)

    def eval_models(state, data, key):
        personal = freeze_layers(model, state.server.params)
        return {"personal": ModelView(personal, state.clients, True)}

    return Algorithm(init, step, eval_models)
