"""FedRep: a shared representation (body) and personal heads.

Reference: Liam Collins, Hamed Hassani, Aryan Mokhtari, Sanjay Shakkottai,
"Exploiting Shared Representations for Personalized Federated Learning", ICML
2021 (Algorithm 1). Decisions where the paper leaves a choice:
docs/extending.md ("FedRep").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from fedjax_pfl import toolkit as tk
from fedjax_pfl.aggregators import Aggregator
from fedjax_pfl.models import Model
from fedjax_pfl.validation import check_int, check_positive


def client_update(model: Model, head_cfg: tk.LocalConfig, body_cfg: tk.LocalConfig,
                  needs_losses: bool, server: tk.ServerState, head, cid, key,
                  data) -> tk.ClientResult:
    """FedRep for ONE client (Algorithm 1, lines 5-9): train the client's
    ``head`` with the global body ``server.params`` frozen (stream
    ``fold_in(key, KeyTag.FEDREP_HEAD)``), then the body with the new head
    frozen (stream ``key``, FedAvg's); upload the body's change. The new head
    is the client's state; the weight is ``n_k``."""
    body = server.params
    head_k, head_loss = tk.run_local(
        tk.freeze_layers(model, body), head, data, cid,
        jax.random.fold_in(key, tk.KeyTag.FEDREP_HEAD), head_cfg)
    body_k, loss = tk.run_local(tk.freeze_layers(model, head_k), body, data, cid, key,
                                body_cfg)
    metrics = {"loss": loss, "head_loss": head_loss}
    if needs_losses:  # loss-based aggregators: the round-start personal model
        metrics["round_start_loss"] = tk.client_loss(
            model, tk.merge_params(body, head), data.train, cid)
    return tk.ClientResult(head_k, optax.tree.sub(body_k, body),
                           data.train.counts[cid].astype(jnp.float32), metrics)


def fedrep(
    model: Model,
    *,
    head_layers: str | tuple[str, ...] | None = None,
    client_lr: float | jax.Array = 0.1,
    num_local_steps: int = 10,
    local_epochs: float | None = None,
    head_steps: int | None = None,
    head_epochs: float | None = None,
    head_lr: float | jax.Array | None = None,
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
    """FedRep (Collins et al. 2021, Algorithm 1).

    The parameters are split by layer into a body (the representation, shared)
    and a head (``head_layers``, one per client). Each selected client trains
    its own head for ``head_steps`` (or ``head_epochs``) with the global body
    frozen, then the body for ``num_local_steps`` (or ``local_epochs``) with
    its new head frozen, and uploads ``body_k - body``. The server aggregates
    the bodies (default: mean weighted by training-set size, as PFLlib's FedRep
    does) and applies ``server_optimizer`` (default
    ``sgd(1.0)``: the average body). Heads start at ``w^0``'s head; unselected
    clients keep theirs. Evaluated: ``personal`` (global body + own head).

    Args:
      model: a model whose parameters are a dict of layers.
      head_layers: the personal layers (names among the model's top-level
        layers, e.g. ``('Dense_1',)``); default the last layer. ``()`` shares
        everything (FedAvg); every layer makes it local training.
      client_lr, num_local_steps, local_epochs: the body's local training.
      head_steps, head_epochs, head_lr: the head's (default: the body's; the
        paper trains the head for 10 epochs and the body for 1).
      batch_size, cohort_size, cohort, sampling, drop_last, local_optimizer,
        server_optimizer, aggregator, weighted: as in
        :func:`fedjax_pfl.algorithms.fedavg`.
      attack, malicious: an update attack on the body uploads of the clients
        flagged in the ``[num_clients]`` bool mask (applied by the engine).

    Raises:
      ValueError: for invalid arguments (the message names the argument).
    """
    head = tk.check_layers(model, head_layers, name="head_layers")
    check_int("head_steps", head_steps, lo=1, allow_none=True)
    if head_epochs is not None:
        check_positive("head_epochs", head_epochs)
    if head_lr is not None:
        check_positive("head_lr", head_lr)
    cfg = tk.make_local_config(client_lr, num_local_steps, batch_size, sampling,
                               local_epochs, drop_last=drop_last,
                               optimizer=local_optimizer)
    inherit = head_steps is None and head_epochs is None
    head_cfg = tk.make_local_config(
        client_lr if head_lr is None else head_lr,
        num_local_steps if head_steps is None else head_steps, batch_size, sampling,
        local_epochs if inherit else head_epochs, drop_last=drop_last,
        optimizer=local_optimizer)
    return tk.layer_split_algorithm(
        model, head, 0, functools.partial(client_update, model, head_cfg, cfg), cfg,
        aggregator=aggregator, weighted=weighted, server_optimizer=server_optimizer,
        cohort_size=cohort_size, cohort=cohort, attack=attack,
        malicious=malicious)
