"""Ditto: personalized models regularized toward the global model.

Reference: Tian Li, Shengyuan Hu, Ahmad Beirami, Virginia Smith, "Ditto: Fair and
Robust Federated Learning Through Personalization", ICML 2021 (Algorithms 1-2,
§3.2 finetuning solver, §4 and App. D.2 per-device lambda). Paper: Li et al., ICML 2021;
decisions where paper and code differ: docs/ditto.md.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_pfl.aggregators import Aggregator
from fedjax_pfl.core import (
    Algorithm,
    AlgorithmState,
    ClientResult,
    KeyTag,
    LocalConfig,
    ModelView,
    client_loss,
    make_local_config,
    prox_penalty,
    resolve_unroll,
    run_local,
    tree_broadcast,
)
from fedjax_pfl.data import client_batch_indices, gather_batch
from fedjax_pfl.models import Model, batch_loss
from fedjax_pfl.privacy import DPConfig
from fedjax_pfl.toolkit import (
    check_cohort,
    check_malicious,
    client_dp_mechanism,
    finetune_views,
    global_solver,
    lift_clients,
    make_finetune_config,
    round_step,
)
from fedjax_pfl.validation import (
    check_choice,
    check_int,
    check_nonnegative,
    check_number,
    check_positive,
    is_concrete,
)

from ._checks import check_grid
from ._dp import check_dp_aggregator, dp_client_update, dp_mechanism

LAM_SELECTION = ("fixed", "paper", "greedy_step")
BATCHES = ("independent", "shared")
WEAK_GRID, STRONG_GRID = (0.1, 1.0, 2.0), (0.05, 0.1, 0.2)  # paper §4 / App. D.2


class DittoClientState(NamedTuple):
    """One client's persistent Ditto state.

    Attributes:
      personal: the personalized parameters ``v_k`` (start at ``w^0``).
      lam: the ``lambda_k`` in use: the fixed value, the client's entry of a
        per-client vector, or the last one selected on validation data.
    """

    personal: object
    lam: jax.Array


def _lam_grid(lam_selection, lam_grid, strong_attack, fallback_lam):
    """``(grid, fallback)`` of the lambda selection (``None``s when fixed);
    given values are checked even when the selection is fixed."""
    grid = None if lam_grid is None else check_grid("lam_grid", lam_grid)
    if fallback_lam is not None:
        check_number("fallback_lam", fallback_lam, lo=0.0, scalar=True)
    if lam_selection == "fixed":
        return None, None
    grid = grid or (STRONG_GRID if strong_attack and lam_selection == "paper"
                    else WEAK_GRID)
    fallback = float(fallback_lam if fallback_lam is not None else (
        0.1 if strong_attack else 1.0))
    return grid, fallback


class LamSelection(NamedTuple):
    """How every client picks its lambda each round (see :func:`ditto`).

    Attributes:
      mode: ``'fixed'`` (the client's ``lam``), ``'paper'`` (§4 / App. D.2:
        the best of ``grid`` on validation data, :func:`select_lambda`) or
        ``'greedy_step'`` (the authors' code, :func:`greedy_step_lambda`).
      grid, fallback: candidates, and the lambda of clients with fewer than
        ``min_val_examples`` validation examples (``None`` when fixed).
      min_val_examples: the small-validation threshold.
      metric: ``'loss'`` (minimized) or ``'accuracy'`` (maximized).
    """

    mode: str
    grid: tuple[float, ...] | None
    fallback: float | None
    min_val_examples: int
    metric: str


def personal_step(model: Model, pcfg: LocalConfig, v, lam_k, w, cid, key, data):
    """Ditto's personal update of ONE client (Alg. 1, line 7): ``pcfg``'s SGD
    steps on ``F_k(v) + lam_k/2 ||v - w||^2`` from ``v``, anchored at the
    round-start global model ``w``. Returns ``(v, mean minibatch loss)``."""
    return run_local(model, v, data, cid, key, pcfg, penalty=prox_penalty(lam_k, w))


def validation_score(model: Model, metric: str, params, cid, data) -> jax.Array:
    """Client ``cid``'s validation score of ``params``; lower is better."""
    if metric == "loss":
        return client_loss(model, params, data.val, cid)
    return -client_loss(model, params, data.val, cid, metric=True)


def select_lambda(model: Model, pcfg: LocalConfig, sel: LamSelection, v, w, cid,
                  key, data):
    """The paper's per-device lambda (§4, App. D.2) for ONE client: train ``v``
    with every lambda of ``sel.grid`` on the same minibatches, keep the
    candidate with the best validation score; a client with fewer than
    ``sel.min_val_examples`` validation examples keeps ``sel.fallback``'s.
    Returns ``(v, lambda, loss)``. The candidates are lifted by the engine's
    strategy."""
    grid, fallback = sel.grid, sel.fallback
    extra = () if fallback in grid else (fallback,)
    cands = jnp.asarray(grid + extra, jnp.float32)
    vs, losses = lift_clients(
        lambda lam_c: personal_step(model, pcfg, v, lam_c, w, cid, key, data))(cands)
    scores = lift_clients(lambda p: validation_score(model, sel.metric, p, cid,
                                                     data))(vs)[:len(grid)]
    best = jnp.argmin(jnp.where(jnp.isnan(scores), jnp.inf, scores))
    few_val = data.val.counts[cid] < sel.min_val_examples
    i = jnp.where(few_val, (grid + extra).index(fallback), best)
    return jax.tree.map(lambda a: a[i], vs), cands[i], losses[i]


def greedy_step_lambda(model: Model, pcfg: LocalConfig, sel: LamSelection, v, lam,
                       w, cid, key, data):
    """The authors' code's dynamic lambda for ONE client: at every personal
    step, the grid's candidate step with the lowest validation loss (one
    gradient and ``len(grid)`` validation passes a step; the small-validation
    rule keeps the candidate nearest ``sel.fallback``). Returns
    ``(v, lambda, mean loss)``."""
    cands = jnp.asarray(sel.grid, jnp.float32)
    few_val = data.val.counts[cid] < sel.min_val_examples
    rows, mask = client_batch_indices(
        data.train, cid, key, num_steps=pcfg.num_steps,
        batch_size=pcfg.batch_size, sampling=pcfg.sampling)

    def step(carry, inputs):
        v, _ = carry
        b = gather_batch(data.train, *inputs)
        loss, g = jax.value_and_grad(
            lambda p: batch_loss(model, p, b.x, b.y, b.mask))(v)

        def candidate(lam_c):
            return jax.tree.map(lambda p, gp, wp: p - pcfg.lr * (
                gp + lam_c * (p - wp)), v, g, w)

        vs = jax.vmap(candidate)(cands)
        scores = jax.vmap(lambda p: client_loss(model, p, data.val, cid))(vs)
        fb = jnp.argmin(jnp.abs(cands - sel.fallback))
        i = jnp.where(few_val, fb, jnp.argmin(jnp.where(
            jnp.isnan(scores), jnp.inf, scores)))
        return (jax.tree.map(lambda a: a[i], vs), cands[i]), loss

    (v, lam), losses = jax.lax.scan(
        step, (v, lam), (rows, mask),
        unroll=resolve_unroll(pcfg.unroll, pcfg.num_steps))
    return v, lam, jnp.mean(losses)


def personal_update(model: Model, pcfg: LocalConfig, sel: LamSelection,
                    state: DittoClientState, w, cid, key, data):
    """ONE client's ``v_k`` update with its lambda (fixed, or selected by
    ``sel``). Returns ``(DittoClientState, personal loss)``."""
    if sel.mode == "fixed":
        v, loss = personal_step(model, pcfg, state.personal, state.lam, w, cid, key,
                                data)
        return DittoClientState(v, state.lam), loss
    if sel.mode == "greedy_step":
        v, lam, loss = greedy_step_lambda(model, pcfg, sel, state.personal,
                                          state.lam, w, cid, key, data)
    else:
        v, lam, loss = select_lambda(model, pcfg, sel, state.personal, w, cid, key,
                                     data)
    return DittoClientState(v, lam), loss


def ditto_client(model: Model, pcfg: LocalConfig, sel: LamSelection, batches: str,
                 global_update, server, client_state: DittoClientState, cid, key,
                 data, *, cohort_size) -> ClientResult:
    """Ditto's kernel for ONE client: the global solver's update from
    ``server.params`` (``global_update``, FedAvg's or DP-FedAvg's, with its
    upload), then :func:`personal_update` on its own minibatch stream
    (``fold_in(key, KeyTag.PERSONAL)``), or on the same minibatches with
    ``batches='shared'``."""
    res = global_update(server, cid, key, data, cohort_size)
    pkey = key if batches == "shared" else jax.random.fold_in(key, KeyTag.PERSONAL)
    new_state, ploss = personal_update(model, pcfg, sel, client_state,
                                       server.params, cid, pkey, data)
    metrics = dict(res.metrics, personal_loss=ploss, lam=new_state.lam)
    return res._replace(client_state=new_state, metrics=metrics)


def ditto(
    model: Model,
    *,
    lam: float | jax.Array = 1.0,
    client_lr: float | jax.Array = 0.1,
    personal_lr: float | jax.Array | None = None,
    num_local_steps: int = 10,
    personal_steps: int | None = None,
    local_epochs: float | None = None,
    personal_epochs: float | None = None,
    batch_size: int = 32,
    cohort_size: int = 10,
    cohort: str = "uniform",
    sampling: str = "with_replacement",
    drop_last: bool = False,
    local_optimizer=None,
    batches: str = "independent",
    lam_selection: str = "fixed",
    lam_grid: tuple[float, ...] | None = None,
    strong_attack: bool = False,
    min_val_examples: int = 4,
    fallback_lam: float | None = None,
    selection_metric: str = "loss",
    aggregator: Aggregator | None = None,
    weighted: bool = True,
    server_optimizer: optax.GradientTransformation | None = None,
    attack=None,
    malicious=None,
    dp: DPConfig | None = None,
    finetune_steps: int | tuple[int, ...] = 0,
    finetune_lr: float | jax.Array | None = None,
    finetune_lam: float | jax.Array | None = None,
) -> Algorithm:
    """Ditto's joint solver (Algorithm 1 with FedAvg as the global solver, Alg. 2).

    Every selected client k, given the round-start global model ``w^t``:

    1. runs FedAvg's local update from ``w^t`` (``num_local_steps`` SGD steps at
       ``client_lr``) and uploads ``w_k - w^t`` (attacked if malicious); the
       server aggregates with ``aggregator`` (any rule: Ditto + robust
       aggregation) and applies ``server_optimizer`` (default: ``w + mean``);
    2. takes ``personal_steps`` SGD steps on its persistent ``v_k``:
       ``v_k <- v_k - personal_lr (grad F_k(v_k) + lam_k (v_k - w^t))``.

    ``v_k`` never feeds back into ``w``, so the global trajectory is exactly
    FedAvg's. Unselected clients keep their ``v_k``; every ``v_k`` starts at
    ``w^0``. Evaluated models: ``global`` (``w``) and ``personal`` (``v_k``), and
    ``finetuned`` with ``finetune_steps > 0`` (Ditto's finetuning solver: every
    client minimizes ``F_k(v) + finetune_lam/2 ||v - w||^2`` from ``v = w``).

    Args:
      model: the model.
      lam: lambda, a scalar or a ``[num_clients]`` vector (one per client), either
        possibly traced (``fedjax_pfl.sweep`` over it runs many lambdas in one
        program). Ignored for the clients' choice when ``lam_selection`` selects.
      client_lr, personal_lr: step sizes of the global copy and of ``v_k``
        (``personal_lr`` defaults to ``client_lr``, as in the authors' code).
      num_local_steps, personal_steps: local iterations r and s (``s`` defaults to
        ``r``, as in the code).
      local_epochs, personal_epochs: count r and s in epochs instead (client k
        takes ``ceil(E n_k / batch_size)`` steps; ``personal_epochs`` defaults to
        ``local_epochs``); the paper does not say which it means, the code uses
        iterations.
      batch_size, sampling: minibatches (see ``local_train``).
      drop_last: PyTorch-style epochs (``floor(n_k / batch_size)`` whole batches
        per pass; see :class:`fedjax_pfl.core.LocalConfig`).
      local_optimizer: ``lr -> optax.GradientTransformation`` for both local
        updates (default ``optax.sgd``).
      cohort_size, cohort: clients per round and how they are drawn (the
        paper's Alg. 2 and code: ``cohort='size_weighted'`` with
        ``weighted=False``, as the Ditto presets set).
      batches: ``independent`` minibatch streams for the two updates (the paper
        says nothing more), or ``shared`` (the code: both updates use the same
        minibatch at each step; needs ``personal_steps == num_local_steps``). The
        order of the two updates does not change any number: ``v_k`` is anchored
        at the round-start ``w^t``, never at the evolving local copy.
      lam_selection: ``fixed``; ``paper``: every round each selected client
        trains its ``v_k`` with every lambda of the grid (same minibatches) and
        keeps the one with the best validation ``selection_metric``; clients with
        fewer than ``min_val_examples`` validation examples use ``fallback_lam``;
        ``greedy_step``: the authors' code's ``dynamic_lam``: at every personal
        step, the grid's candidate step with the lowest validation loss.
      lam_grid: candidates; default {0.05, 0.1, 0.2} for strong attacks
        (``strong_attack=True``: A3, or more than half malicious) and
        {0.1, 1, 2} otherwise (the paper's rule; the code always uses the
        latter).
      min_val_examples, fallback_lam: the paper's small-validation rule
        (fallback default 0.1 for strong attacks, 1 otherwise).
      selection_metric: ``loss`` (minimized) or ``accuracy`` (maximized).
      aggregator, weighted, server_optimizer: the global solver (see ``fedavg``).
      attack, malicious: update attack and ``[num_clients]`` malicious mask.
      dp: a :class:`fedjax_pfl.privacy.DPConfig` (``privacy.make_dp_config``):
        the global update becomes local DP-SGD, exactly as in
        ``algorithms.dp_fedavg`` (Poisson batches when ``dp.sampling_rate`` is
        set), while ``v_k`` stays on the device and trains without noise. The
        released global trajectory is DP-FedAvg's, so Ditto+DP has DP-FedAvg's
        epsilon (the paper's §3.2), declared as ``Algorithm.privacy``
        (``privacy.Monitor.of(alg, data, delta)``). A loss-using
        ``aggregator`` (TERM, k-loss) is refused with ``dp``. Without ``dp``, a
        ``privacy.client_level_dp`` aggregator declares client-level DP
        (``cohort`` must then be ``'uniform'`` or ``'full'``).
      finetune_steps, finetune_lr, finetune_lam: the finetuning solver's
        evaluation (``finetune_lam`` defaults to ``lam`` when it is a scalar); a
        tuple of step counts reports one ``finetuned_<count>`` view each, along
        one minibatch stream, to pick the best count as in the paper's Fig. 6.
    """
    if personal_lr is not None:
        check_positive("personal_lr", personal_lr)
    check_int("personal_steps", personal_steps, lo=1, allow_none=True)
    if personal_epochs is not None:
        check_positive("personal_epochs", personal_epochs)
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling,
                       local_epochs, drop_last=drop_last, optimizer=local_optimizer)
    pcfg = make_local_config(
        client_lr if personal_lr is None else personal_lr,
        num_local_steps if personal_steps is None else personal_steps,
        batch_size, sampling,
        local_epochs if personal_epochs is None else personal_epochs,
        drop_last=drop_last, optimizer=local_optimizer)
    check_cohort(cohort_size, cohort)
    check_nonnegative("lam", lam)
    lam_ndim = np.ndim(lam) if is_concrete(lam) else jnp.ndim(lam)
    if lam_ndim > 1:
        raise ValueError(f"lam: must be a scalar or a [num_clients] vector, got "
                         f"shape {jnp.shape(lam)}")
    check_choice("batches", batches, BATCHES)
    if batches == "shared" and dp is not None:
        raise ValueError("batches: 'shared' minibatches cannot be used with dp "
                         "(the private update draws its own Poisson batches)")
    if batches == "shared" and (pcfg.num_steps, pcfg.epochs) != (cfg.num_steps,
                                                                  cfg.epochs):
        raise ValueError(
            f"personal_steps: batches='shared' needs the same personal and global "
            f"steps/epochs, got {pcfg.num_steps}/{pcfg.epochs} vs "
            f"{cfg.num_steps}/{cfg.epochs}")
    check_choice("lam_selection", lam_selection, LAM_SELECTION)
    if lam_selection == "greedy_step" and pcfg.epochs is not None:
        raise ValueError("personal_epochs: lam_selection='greedy_step' counts "
                         "personal steps, not epochs")
    check_choice("selection_metric", selection_metric, ("loss", "accuracy"))
    check_int("min_val_examples", min_val_examples, lo=0)
    check_choice("strong_attack", strong_attack, (True, False))
    grid, fallback = _lam_grid(lam_selection, lam_grid, strong_attack, fallback_lam)
    if finetune_lam is None:
        finetune_lam = lam if lam_ndim == 0 else 0.0
    ft_cfg = make_finetune_config(cfg, finetune_steps, finetune_lr, finetune_lam)
    solver = global_solver(model, cfg, aggregator=aggregator, weighted=weighted,
                           server_optimizer=server_optimizer,
                           attack=attack, malicious=malicious)
    if dp is None:
        global_update = solver.client_update
        mechanism = client_dp_mechanism(solver.aggregator, cohort_size, cohort)
    else:
        check_dp_aggregator(aggregator)
        dp_sampling = "poisson" if dp.sampling_rate is not None else sampling
        global_update = dp_client_update(model, cfg, dp, dp_sampling, solver, attack,
                                         malicious)
        mechanism = dp_mechanism(cfg, dp, dp_sampling, "Ditto's global update "
                                 "(DP-FedAvg; personal models stay on the device)")

    def check_data(data):
        check_malicious(malicious, data.num_clients)
        if lam_ndim == 1 and jnp.shape(lam)[0] != data.num_clients:
            raise ValueError(f"lam: a per-client vector needs {data.num_clients} "
                             f"entries, got {jnp.shape(lam)[0]}")
        if grid is not None and data.val is None:
            raise ValueError(f"lam_selection: {lam_selection!r} needs a validation "
                             "split (data.val is None)")

    def init(key, data):
        check_data(data)
        server = solver.init(key)
        lams = jnp.broadcast_to(jnp.asarray(lam, jnp.float32), (data.num_clients,))
        clients = DittoClientState(tree_broadcast(server.params, data.num_clients),
                                   lams)
        return AlgorithmState(server, clients, jnp.zeros((), jnp.int32))

    sel = LamSelection(lam_selection, grid, fallback, min_val_examples,
                       selection_metric)
    step = round_step(
        functools.partial(ditto_client, model, pcfg, sel, batches, global_update),
        solver.server_fn, cohort_size=cohort_size, cohort=cohort,
        linear_weights=solver.aggregator.linear_weights, pass_cohort_size=True)

    def checked_step(state, data, key):
        check_data(data)
        return step(state, data, key)

    def eval_models(state, data, key):
        out = {"global": ModelView(model, state.server.params, False),
               "personal": ModelView(model, state.clients.personal, True)}
        out.update(finetune_views(model, state.server.params, data, key, ft_cfg))
        return out

    return Algorithm(init, checked_step, eval_models, mechanism)

