"""LINDT: NFL detection on the server and dual-model recovery on the clients.

Reference: Hong Lin, Lidan Shou, Ke Chen, Gang Chen, Sai Wu, "LINDT: Tackling
Negative Federated Learning with Local Adaptation" (arXiv 2020), Alg. 2
(App. B.2), Eq. 4 (DP aggregation), Eq. 5-7 (detection), Eq. 8-10 (dual model),
§5.3 and App. C.7 (stopping strategies). Paper: the LINDT paper; every decision
the paper leaves open: docs/lindt.md.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_pfl.aggregators import Aggregator, mean
from fedjax_pfl.core import (
    Algorithm,
    AlgorithmState,
    ClientResult,
    KeyTag,
    LocalConfig,
    ModelView,
    client_keys,
    client_steps,
    make_local_config,
    resolve_unroll,
    run_local,
    run_steps,
    tree_broadcast,
)
from fedjax_pfl.data import client_batch_indices, gather_batch
from fedjax_pfl.metrics import (
    EPS,
    R_PRIME,
    STOP_STREAK,
    DetectorState,
    detector_init,
    detector_update,
    divergence_from_updates,
    mean_update_norm,
)
from fedjax_pfl.models import batch_loss
from fedjax_pfl.privacy import clip_updates, gaussian_noise
from fedjax_pfl.toolkit import (
    check_cohort,
    check_malicious,
    lift_clients,
    round_step,
)
from fedjax_pfl.validation import (
    check_choice,
    check_clip,
    check_int,
    check_nonnegative,
    check_positive,
    is_concrete,
)

from ._lindt_model import SCORE_VARIANTS, DualModel, dual_apply, local_head_model

MODES = ("always", "detect", "off")
STOP_STRATEGIES = ("never", "all_trained_once", "delta_below")
V_INITS = ("random", "copy_global")


class LindtServerState(NamedTuple):
    """Attributes: ``params`` (w), ``agg_state``, ``detector``
    (:class:`~fedjax_pfl.metrics.DetectorState`), ``dual_on`` (clients train and
    evaluate the dual model), ``stopped`` (a stopping strategy ended dual
    training for good), ``round`` (rounds done, for the lr decay)."""

    params: object
    agg_state: object
    detector: DetectorState
    dual_on: jax.Array
    stopped: jax.Array
    round: jax.Array


class LindtClientState(NamedTuple):
    """Attributes: ``local`` (the persistent local model v_i, never uploaded;
    ``()`` with ``mode='off'``), ``has_local`` (v_i has been trained)."""

    local: object
    has_local: jax.Array


class LindtConfig(NamedTuple):
    """A LINDT run's client-side settings (see :func:`lindt`): the dual model,
    the local :class:`LocalConfig`, the lr decay, whether the dual model is in
    play (``mode != 'off'``), ``v_init``, the score variant, ``stop_gradient``,
    ``grad_clip``, the ``[N]`` malicious mask (or None) and its step
    multiplier."""

    dual: DualModel
    cfg: LocalConfig
    lr_decay: float | jax.Array
    use_dual: bool
    v_init: str
    score_variant: str
    stop_gradient: bool
    grad_clip: float | None
    malicious: jax.Array | None
    malicious_multiplier: int


def _clip_grads(g, grad_clip):
    if grad_clip is None:
        return g
    norm = optax.tree.norm(g)
    return jax.tree.map(lambda a: a * jnp.minimum(1.0, grad_clip / jnp.maximum(
        norm, 1e-12)).astype(a.dtype), g)


def _sgd(p, g, lr):  # optax.sgd's arithmetic (FedAvg bit for bit)
    return jax.tree.map(lambda a, b: a + b * (-lr), p, g)


def plain_step(lc: LindtConfig, lr, p, v, b):
    """One SGD step of the global copy alone (the dual model off); ``v`` is
    carried unchanged. Returns ``(p, v, loss, 0, zero scores)``."""
    loss, g = jax.value_and_grad(
        lambda q: batch_loss(lc.dual.model, q, b.x, b.y, b.mask))(p)
    zeros = jnp.zeros((len(lc.dual.layers) - 1,))
    return (_sgd(p, _clip_grads(g, lc.grad_clip), lr), v, loss,
            jnp.zeros((), loss.dtype), zeros)


def joint_step(lc: LindtConfig, lr, p, v, b):
    """One SGD step of the dual model (Eq. 8-10): the global copy ``p`` and
    the local model ``v`` on ``L(global) + L(dual)``. Returns ``(p, v, global
    loss, dual loss, per-tap scores)``."""
    model = lc.dual.model

    def objective(pw, pv):
        g, out, s = dual_apply(lc.dual, pw, pv, b.x, variant=lc.score_variant,
                               stop_gradient=lc.stop_gradient)
        den = jnp.maximum(jnp.sum(b.mask), 1.0)
        lg = jnp.sum(model.loss(g, b.y) * b.mask) / den
        ll = jnp.sum(model.loss(out, b.y) * b.mask) / den
        return lg + ll, (lg, ll, jnp.sum(s * b.mask, axis=1) / den)

    (_, (lg, ll, s)), (gw, gv) = jax.value_and_grad(
        objective, argnums=(0, 1), has_aux=True)(p, v)
    gw, gv = _clip_grads((gw, gv), lc.grad_clip)
    return _sgd(p, gw, lr), _sgd(v, gv, lr), lg, ll, s


def lindt_client(lc: LindtConfig, server: LindtServerState, cstate: LindtClientState,
                 cid, key, data) -> ClientResult:
    """LINDT's kernel for ONE client (Alg. 2, client side): local steps from
    ``w`` at the decayed lr (a malicious client takes ``malicious_multiplier``
    times as many), joint with its local model while the dual model is on
    (:func:`joint_step`, else :func:`plain_step`); uploads ``w_k - w``."""
    cfg, w = lc.cfg, server.params
    lr = cfg.lr * lc.lr_decay ** server.round.astype(jnp.float32)
    num_steps, active = client_steps(cfg, data.train, cid)
    if lc.malicious is not None and lc.malicious_multiplier > 1:
        active = (jnp.int32(num_steps) if active is None else active) * jnp.where(
            lc.malicious[cid], lc.malicious_multiplier, 1)
        num_steps = num_steps * lc.malicious_multiplier
    rows, masks = client_batch_indices(data.train, cid, key, num_steps=num_steps,
                                       batch_size=cfg.batch_size,
                                       sampling=cfg.sampling, drop_last=cfg.drop_last)
    v0 = cstate.local
    if lc.use_dual and lc.v_init == "copy_global":
        v0 = jax.tree.map(lambda a, b: jnp.where(cstate.has_local, a, b), v0, w)

    def step(carry, inputs):
        b = gather_batch(data.train, *inputs)
        if lc.use_dual:
            out = jax.lax.cond(server.dual_on, functools.partial(joint_step, lc, lr),
                               functools.partial(plain_step, lc, lr), *carry, b)
        else:
            out = plain_step(lc, lr, *carry, b)
        return out[:2], out[2:]

    (w_k, v), (loss_sum, lloss_sum, score_sum), cnt = run_steps(
        step, (w, v0), (rows, masks), unroll=resolve_unroll(cfg.unroll, num_steps),
        active_steps=active)
    cnt = jnp.maximum(jnp.asarray(cnt, jnp.float32), 1.0)
    metrics = {"loss": loss_sum / cnt, "local_loss": lloss_sum / cnt}
    for t, name in enumerate(lc.dual.names):
        metrics[f"score_{name}"] = score_sum[t] / cnt
    new_state = cstate
    if lc.use_dual:
        local = jax.tree.map(lambda a, b: jnp.where(server.dual_on, a, b), v,
                             cstate.local)
        new_state = LindtClientState(local, cstate.has_local | server.dual_on)
    return ClientResult(new_state, jax.tree.map(jnp.subtract, w_k, w),
                        data.train.counts[cid].astype(jnp.float32), metrics)


def lindt_server(aggregator: Aggregator, clip, noise_std, no_noise: bool, eps,
                 r_prime, server: LindtServerState, updates, weights, mask, metrics,
                 key):
    """LINDT's server step: the cohort's clipped uploads aggregated, plus
    Gaussian noise (Eq. 4), then the detector's statistic
    ``Delta = W_div - ||noise||`` (Eq. 5-7) and its update."""
    clipped, _ = clip_updates(updates, clip)
    agg, agg_state = aggregator.aggregate(server.agg_state, clipped, weights, mask,
                                          key)
    if no_noise:  # a concrete sigma = 0: skip the draw (and its compile time)
        noise = jax.tree.map(jnp.zeros_like, agg)
    else:
        noise = gaussian_noise(jax.random.fold_in(key, KeyTag.LINDT_NOISE), agg,
                               noise_std)
    change = jax.tree.map(jnp.add, agg, noise)
    w_div = divergence_from_updates(updates, change, mask)
    noise_norm = optax.tree.norm(noise)
    delta = w_div - noise_norm
    det = detector_update(server.detector, delta, server.round + 1, eps=eps,
                          r_prime=r_prime)
    new = server._replace(params=jax.tree.map(jnp.add, server.params, change),
                          agg_state=agg_state, detector=det, round=server.round + 1)
    return new, {"nfl/delta": delta, "nfl/w_div": w_div,
                 "nfl/noise_norm": noise_norm, "nfl/count": det.count,
                 "nfl/client_update_norm": mean_update_norm(updates, mask),
                 "nfl/detected": det.detected, "nfl/detect_round": det.detect_round,
                 "server/update_norm": optax.tree.norm(agg)}


def stopping_rule(stop: str, has_local: jax.Array, detector: DetectorState,
                  stop_streak: int) -> jax.Array:
    """Whether a stopping strategy (§5.3, App. C.7) ends dual training now:
    ``never``; ``all_trained_once`` (every client has trained its local
    model); ``delta_below`` (the detector's statistic stayed below its
    threshold ``stop_streak`` rounds running)."""
    if stop == "all_trained_once":
        return jnp.all(has_local)
    if stop == "delta_below":
        return detector.below >= stop_streak
    return jnp.zeros((), bool)


def transitions(mode: str, stop: str, stop_streak: int,
                state: AlgorithmState) -> AlgorithmState:
    """The end-of-round switches: the dual model turns on at detection
    (``mode='detect'``; always on with ``'always'``, never with ``'off'``) and
    off for good when :func:`stopping_rule` fires while it is on."""
    s = state.server
    on = s.dual_on | (s.detector.detected if mode == "detect" else False)
    crit = stopping_rule(stop, state.clients.has_local, s.detector, stop_streak)
    stopped = s.stopped | (s.dual_on & crit)
    on = on & ~stopped & (mode != "off")
    return state._replace(server=s._replace(dual_on=on, stopped=stopped))


def lindt(
    dual: DualModel,
    *,
    mode: str = "always",
    client_lr: float | jax.Array = 0.1,
    lr_decay: float | jax.Array = 1.0,
    num_local_steps: int = 10,
    local_epochs: float | None = None,
    batch_size: int = 32,
    sampling: str = "with_replacement",
    cohort_size: int = 10,
    cohort: str = "uniform",
    aggregator: Aggregator | None = None,
    clip: float | jax.Array = float("inf"),
    noise_std: float | jax.Array = 0.0,
    malicious=None,
    malicious_multiplier: int = 1,
    attack=None,
    eps: float | jax.Array = EPS,
    r_prime: int | jax.Array = R_PRIME,
    stop: str = "never",
    stop_streak: int = STOP_STREAK,
    score_variant: str = "paper",
    stop_gradient: bool = False,
    v_init: str = "random",
    grad_clip: float | None = None,
    finetune_top_steps: int = 0,
    finetune_top_lr: float | jax.Array | None = None,
    finetune_top_layers: int = 1,
) -> Algorithm:
    """LINDT (Alg. 2): FedAvg with DP, the NFL detector, and the dual model.

    Round ``r`` (1-based): every sampled client copies ``w``; if the dual model
    is on it trains ``(w_i, v_i)`` on ``CE(G(x)) + CE(L(x))`` (Eq. 10; one joint
    gradient, both models step with the same lr), else plain SGD on ``CE(G(x))``
    (FedAvg); it uploads ``u_i = w_i - w``. The server computes
    ``w <- w + agg(Clip(u_i, clip)) + N(0, noise_std^2 I)`` (Eq. 4), then
    ``Delta = (1/K) sum ||w_i - w|| - ||noise||`` and the detector (Alg. 2
    s10-s15; ``metrics/_nfl.py``).

    Args:
      dual: the layered model (``dual_mlp``, ``dual_lindt_cnn``).
      mode: ``always`` (dual model from round 1: the paper's tables),
        ``detect`` (FedAvg until NFL is flagged, then dual from the next round),
        ``off`` (never: FedAvg with the detector, the NFL baseline).
      client_lr, lr_decay: step ``client_lr * lr_decay**(r - 1)`` in round ``r``
        (global round clock; the paper: 0.1 and 0.992 on CIFAR). Traceable.
      num_local_steps, local_epochs, batch_size, sampling: local training (see
        ``fedavg``; the paper: 1 epoch of batches of 10).
      cohort_size, cohort: K clients per round.
      aggregator: rule over the clipped uploads (default unweighted mean, the
        paper's footnote 2; ``aggregators.trimmed_mean`` gives LINDT-TM).
      clip, noise_std: the DP of Eq. 4, S and sigma (paper 15 and 0.001; noise
        std per coordinate, NOT scaled by S or 1/K). Traceable.
      malicious, malicious_multiplier: ``[N]`` bool mask of attackers, who run
        ``malicious_multiplier`` times the local steps (paper: 5 epochs against
        1). Their data poisoning is in the data (``attacks.semantic_backdoor``).
      attack: an :class:`fedjax_pfl.attacks.UpdateAttack` that the engine
        applies to the malicious clients' uploads (model poisoning on top of
        the data poisoning; default none, the paper's setting).
      eps, r_prime: detection thresholds (``Delta > eps`` counted; NFL when the
        count exceeds ``r_prime``). Traceable.
      stop: ``never``; ``all_trained_once`` (§5.3 strategy 1: once every
        client has trained the dual model); ``delta_below`` (App. C.7: after
        ``stop_streak`` consecutive rounds with ``Delta < eps``). After a stop
        clients run FedAvg and evaluate with the global model.
      score_variant: ``paper`` (Eq. 8) or ``cosine`` (not the paper).
      stop_gradient: block the local loss's gradient into ``w`` (default: the
        joint gradient of Eq. 10).
      v_init: local models start from a ``random`` init (own key per client,
        the global model's initializer) or a ``copy_global`` of ``w`` when first
        trained.
      grad_clip: optional max norm of the joint gradient over ``(w, v)`` per
        step (PyTorch ``clip_grad_norm_`` on all parameters; paper: 5).
      finetune_top_steps, finetune_top_lr, finetune_top_layers: with steps > 0
        an ``fb`` view: every client finetunes the top layer of ``w`` (FB
        baseline; lr default ``client_lr``), or its top ``finetune_top_layers``
        layers (``finetune_top``).

    Evaluated models: ``global`` (w) and, unless ``mode='off'``, ``personal``:
    the dual model's local head with the current ``w`` for clients that have a
    local model while the dual model is on, else the global model.
    """
    check_choice("mode", mode, MODES)
    check_choice("stop", stop, STOP_STRATEGIES)
    check_choice("v_init", v_init, V_INITS)
    check_choice("score_variant", score_variant, SCORE_VARIANTS)
    cfg = make_local_config(client_lr, num_local_steps, batch_size, sampling,
                       local_epochs)
    check_cohort(cohort_size, cohort)
    check_positive("lr_decay", lr_decay)
    check_clip("clip", clip)
    check_nonnegative("noise_std", noise_std)
    check_positive("eps", eps)
    check_nonnegative("r_prime", r_prime)
    check_int("malicious_multiplier", malicious_multiplier, lo=1)
    check_int("stop_streak", stop_streak, lo=1)
    check_int("finetune_top_steps", finetune_top_steps, lo=0)
    check_int("finetune_top_layers", finetune_top_layers, lo=1, hi=len(dual.layers))
    check_choice("stop_gradient", stop_gradient, (True, False))
    if grad_clip is not None:
        check_positive("grad_clip", grad_clip)
    if finetune_top_lr is not None:
        check_positive("finetune_top_lr", finetune_top_lr)
    aggregator = aggregator or mean(weighted=False)
    model = dual.model
    mal = None if malicious is None else jnp.asarray(malicious, bool)
    use_dual = mode != "off"
    no_noise = is_concrete(noise_std) and np.all(np.asarray(noise_std) == 0)

    def init(key, data):
        check_malicious(malicious, data.num_clients)
        w = model.init(key)
        n = data.num_clients
        if not use_dual:
            local = ()
        elif v_init == "random":
            local = jax.vmap(model.init)(client_keys(
                jax.random.fold_in(key, KeyTag.LINDT_LOCAL), data.key_ids))
        else:
            local = tree_broadcast(w, n)
        server = LindtServerState(w, aggregator.init(w), detector_init(),
                                  jnp.asarray(mode == "always"), jnp.zeros((), bool),
                                  jnp.zeros((), jnp.int32))
        return AlgorithmState(server, LindtClientState(local, jnp.zeros((n,), bool)),
                              jnp.zeros((), jnp.int32))

    lc = LindtConfig(dual, cfg, lr_decay, use_dual, v_init, score_variant,
                     stop_gradient, grad_clip, mal, malicious_multiplier)
    server_fn = functools.partial(lindt_server, aggregator, clip, noise_std,
                                  no_noise, eps, r_prime)
    inner = round_step(functools.partial(lindt_client, lc), server_fn,
                       cohort_size=cohort_size, cohort=cohort, attack=attack,
                       malicious=malicious)

    def lindt_round(state, data, key):
        check_malicious(malicious, data.num_clients)
        state, metrics = inner(state, data, key)
        state = transitions(mode, stop, stop_streak, state)
        metrics["lindt/dual_on"] = state.server.dual_on
        metrics["lindt/stopped"] = state.server.stopped
        return state, metrics

    def eval_models(state, data, key):
        w = state.server.params
        out = {"global": ModelView(model, w, False)}
        if use_dual:
            use_local = state.clients.has_local & state.server.dual_on
            out["personal"] = ModelView(
                local_head_model(dual, w, variant=score_variant),
                (state.clients.local, use_local), True)
        if finetune_top_steps:
            out["fb"] = ModelView(model, finetune_top(
                dual, w, data, jax.random.fold_in(key, KeyTag.LINDT_FB),
                steps=finetune_top_steps,
                lr=client_lr if finetune_top_lr is None else finetune_top_lr,
                batch_size=cfg.batch_size, sampling=cfg.sampling,
                layers=finetune_top_layers), True)
        return out

    return Algorithm(init, lindt_round, eval_models)


# FB trains the top layer on cached lower-layer features when they take at most
# this many bytes (all training rows), else through the whole model every step
FEATURE_CACHE_BYTES = 2**30


def _chain(layers):
    """``(params, x) -> out``: ``layers`` applied in turn."""
    def f(p, x):
        for layer in layers:
            x = layer(p, x)
        return x
    return f


def _lower(dual: DualModel, top: int = 1):
    """Every layer of ``dual`` but the last ``top``, as one function."""
    return _chain(dual.layers[:len(dual.layers) - top])


def _upper(dual: DualModel, top: int = 1):
    """The last ``top`` layers of ``dual``, as one function."""
    return _chain(dual.layers[len(dual.layers) - top:])


class _Reads(dict):
    """A parameter dict that notes each top-level key read from it."""

    def __init__(self, params, seen: set):
        super().__init__(params)
        self.seen = seen

    def __getitem__(self, k):
        self.seen.add(k)
        return super().__getitem__(k)


def _upper_keys(dual: DualModel, params, h, top: int) -> frozenset:
    """The top-level keys of ``params`` that the last ``top`` layers read
    (``dual.top`` for the last one), found by tracing them once on ``h`` (their
    input, or its shape)."""
    if top == 1:
        return frozenset({dual.top})
    seen: set = set()
    jax.eval_shape(lambda p, x: _upper(dual, top)(_Reads(p, seen), x), params, h)
    return frozenset(seen)


def _features(dual: DualModel, params, x, chunk: int = 512, top: int = 1):
    """The output of every layer below the last ``top`` for every row of ``x``,
    ``chunk`` rows at a time."""
    lower = functools.partial(_lower(dual, top), params)
    whole = x.shape[0] - x.shape[0] % chunk
    parts = []
    if whole:
        h = jax.lax.map(lower, x[:whole].reshape(-1, chunk, *x.shape[1:]))
        parts.append(h.reshape(whole, *h.shape[2:]))
    if whole < x.shape[0]:
        parts.append(lower(x[whole:]))
    return jnp.concatenate(parts)


def finetune_top(dual: DualModel, params, data, key, *, steps: int, lr,
                 batch_size: int, sampling: str = "with_replacement",
                 feature_cache_bytes: int | None = None, layers: int = 1):
    """FB (Wang et al. 2019, as in LINDT §5.1): every client finetunes only the top
    layer (``dual.top``) of ``params`` for ``steps`` SGD steps on its training
    data; with ``layers = k`` the top ``k`` layers of ``dual.layers`` (``M``: the
    whole model; an ablation, the paper finetunes one). Returns the stacked
    ``[N, ...]`` finetuned parameters.

    The layers below are frozen, so their output for each training row is
    computed once and the top layers train on it (the same minibatches, the
    same steps) when those features take at most ``feature_cache_bytes``
    (default ``FEATURE_CACHE_BYTES``) and the model has no regularizer; else
    every step runs the whole model with the lower layers' updates set to zero
    (and always for the whole model: nothing below it to cache).
    Both give the same parameters up to float rounding (tested)."""
    check_int("layers", layers, lo=1, hi=len(dual.layers))
    ids = jnp.arange(data.num_clients, dtype=jnp.int32)
    keys = client_keys(key, data.key_ids)
    cfg = make_local_config(lr, steps, batch_size, sampling)
    limit = FEATURE_CACHE_BYTES if feature_cache_bytes is None else feature_cache_bytes
    shape = jax.eval_shape(_lower(dual, layers), params, data.train.x)
    trained_keys = _upper_keys(dual, params, shape, layers)
    if (layers < len(dual.layers) and dual.model.regularizer is None
            and shape.size * shape.dtype.itemsize <= limit):
        feats = dataclasses.replace(
            data, train=dataclasses.replace(
                data.train, x=_features(dual, params, data.train.x, top=layers)))
        # the top layers as a model of their own (local training never calls init)
        top = dual.model._replace(init=None, apply=_upper(dual, layers))

        def one(cid, k):
            trained = run_local(top, {k_: params[k_] for k_ in trained_keys}, feats,
                                cid, k, cfg, optimizer=optax.sgd(lr))[0]
            return {**params, **trained}
    else:
        labels = {k: ("train" if k in trained_keys else "freeze") for k in params}
        opt = optax.multi_transform({"train": optax.sgd(lr),
                                     "freeze": optax.set_to_zero()}, labels)

        def one(cid, k):
            return run_local(dual.model, params, data, cid, k, cfg, optimizer=opt)[0]

    return lift_clients(one)(ids, keys)
