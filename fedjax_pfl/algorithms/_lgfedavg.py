"""LG-FedAvg: personal lower layers (local representations), a global head.

Reference: Paul Pu Liang, Terrance Liu, Liu Ziyin, et al., "Think Locally, Act
Globally: Federated Learning with Local and Global Representations",
arXiv:2001.01523, 2020 (Algorithm 1; NeurIPS 2019 Workshop on Federated
Learning). Decisions: docs/extending.md ("LG-FedAvg").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl import toolkit as tk
from fedjax_pfl.aggregators import Aggregator
from fedjax_pfl.models import Model


def client_update(model: Model, cfg: tk.LocalConfig, needs_losses: bool,
                  server: tk.ServerState, local, cid, key, data) -> tk.ClientResult:
    """LG-FedAvg for ONE client: local training of every layer, the client's
    own lower layers ``local`` with the global head ``server.params``
    (stream ``key``); upload the head's change. The new lower layers are the
    client's state; the weight is ``n_k``."""
    w = server.params
    params = tk.merge_params(local, w)
    params_k, loss = tk.run_local(model, params, data, cid, key, cfg)
    local_k, head_k = tk.split_params(params_k, tuple(w))
    metrics = {"loss": loss}
    if needs_losses:  # loss-based aggregators: the round-start personal model
        metrics["round_start_loss"] = tk.client_loss(model, params, data.train, cid)
    return tk.ClientResult(local_k, optax.tree.sub(head_k, w),
                           data.train.counts[cid].astype(jnp.float32), metrics)


def lg_fedavg(
    model: Model,
    *,
    head_layers: str | tuple[str, ...] | None = None,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    local_epochs: float | None = None,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
    drop_last: bool = False,
    local_optimizer=None,
    server_optimizer: optax.GradientTransformation | None = None,
    aggregator: Aggregator | None = None,
    weighted: bool = True,
    attack=None,
    malicious=None,
) -> tk.Algorithm:
    """LG-FedAvg (Liang et al. 2020, Algorithm 1).

    The parameters are split by layer into a global head (``head_layers``,
    shared) and lower layers that every client keeps to itself (its local
    representation). Each selected client trains all its layers, own lower
    layers and the round's global head, for ``num_local_steps`` (or
    ``local_epochs``), keeps the lower layers and uploads ``head_k - head``.
    The server aggregates (default: mean weighted by training-set size, as
    PFLlib; the authors' code takes the unweighted mean: ``weighted=False``)
    and applies ``server_optimizer`` (default ``sgd(1.0)``: the average head).
    Lower layers start at ``w^0``'s; unselected clients keep theirs.
    Evaluated: ``personal`` (own lower layers + global head).

    Args:
      model: a model whose parameters are a dict of layers.
      head_layers: the global layers (names among the model's top-level layers,
        e.g. ``('Dense_1',)``); default the last layer. Every layer shares
        everything (FedAvg); ``()`` makes it local training.
      client_lr, num_local_steps, local_epochs, batch_size, cohort_size, cohort,
        sampling, drop_last, local_optimizer, server_optimizer, aggregator,
        weighted: as in :func:`fedjax_pfl.algorithms.fedavg`.
      attack, malicious: an update attack on the head uploads of the clients
        flagged in the ``[num_clients]`` bool mask (applied by the engine).

    Raises:
      ValueError: for invalid arguments (the message names the argument).
    """
    head = tk.check_layers(model, head_layers, name="head_layers")
    cfg = tk.make_local_config(client_lr, num_local_steps, batch_size, sampling,
                               local_epochs, drop_last=drop_last,
                               optimizer=local_optimizer)
    return tk.layer_split_algorithm(
        model, head, 1, functools.partial(client_update, model, cfg), cfg,
        aggregator=aggregator, weighted=weighted, server_optimizer=server_optimizer,
        cohort_size=cohort_size, cohort=cohort, attack=attack,
        malicious=malicious)
