"""LINDT's dual model: a global and a local network intertwined layer by layer.

Reference: Lin, Shou, Chen, Chen, Wu, "LINDT: Tackling Negative Federated
Learning with Local Adaptation" (arXiv 2020), §4.1, Eq. 8-10, App. B.1 (Fig. 4).
Paper: the LINDT paper; decisions: docs/lindt.md.

The global model ``G(., w)`` runs unchanged. The local model ``L(., v)`` (same
layers) reads ``x`` in layer 1; after each layer ``m = 1..M-1`` an attaching
module mixes its output with the global one, per sample:

    score_m = sigmoid(<L^m, G^m> / ||L^m||)        (Eq. 8)
    h^m     = score_m G^m + (1 - score_m) L^m       (Eq. 9, input of local layer m+1)

and the local head ``L^M`` is the personalized prediction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_pfl.models import (
    MLP,
    CharLSTM,
    LindtCIFARCNN,
    Model,
    TorchLSTM,
    as_image,
    conv_general_dilated,
    from_flax,
)

SCORE_VARIANTS = ("paper", "cosine")
GRANULARITIES = ("sample", "timestep")
NORM_EPS = 1e-12  # guard on ||L^m|| (the paper gives none)

Layer = Callable[[object, jax.Array], jax.Array]


class DualModel(NamedTuple):
    """A model split into ``M`` layers for LINDT.

    Attributes:
      model: the plain (global) :class:`Model`; both ``w`` and ``v`` have its
        parameter structure.
      layers: ``M`` functions ``(params, h) -> out``; composing them from ``x``
        equals ``model.apply``. Attaching modules sit after layers ``1..M-1``.
      names: a label per tapped layer (``M - 1`` of them), for logs.
      top: the top-level parameter key of the last layer (the "top layer" the
        FB baseline finetunes).
      granularity: ``sample`` (one score per sample over the flattened
        representation) or ``timestep`` (one per sample and step of a
        ``[B, T, ...]`` representation; the logged score is its mean over T).
    """

    model: Model
    layers: tuple[Layer, ...]
    names: tuple[str, ...]
    top: str
    granularity: str = "sample"


def attach(local: jax.Array, glob: jax.Array, *, variant: str = "paper",
           eps: float = NORM_EPS) -> tuple[jax.Array, jax.Array]:
    """The attaching module (Eq. 8-9) on a batch ``[B, ...]``.

    Returns ``(h [B, ...], score [B])``: one scalar score per sample over the
    flattened representation. ``variant='cosine'`` (NOT the paper) uses
    ``<L, G> / (||L|| ||G||)`` instead of the unbounded scalar projection.
    """
    if variant not in SCORE_VARIANTS:
        raise ValueError(f"score_variant: must be one of {SCORE_VARIANTS}, got "
                         f"{variant!r}")
    lf = local.reshape(local.shape[0], -1)
    gf = glob.reshape(glob.shape[0], -1)
    dot = jnp.sum(lf * gf, axis=1)
    den, live = _safe_norm(lf, eps)
    if variant == "cosine":
        gnorm, glive = _safe_norm(gf, eps)
        den, live = den * gnorm, live & glive
    # a sample whose representation has norm <= eps (a local layer with every
    # ReLU off) scores sigmoid(0) = 0.5 with no gradient through the score:
    # <L, G> / ||L|| has no limit at L = 0, and the norm's gradient there is
    # 0 / 0 (NaN), which would poison both models
    score = jax.nn.sigmoid(jnp.where(live, dot / den, 0.0))
    s = score.reshape((-1,) + (1,) * (local.ndim - 1)).astype(local.dtype)
    return s * glob + (1 - s) * local, score


def _safe_norm(x: jax.Array, eps: float) -> tuple[jax.Array, jax.Array]:
    """Row norms of ``[B, D]`` and where they exceed ``eps``; 1 elsewhere, so
    that the gradient is finite (and zero) at a zero row."""
    sq = jnp.sum(x * x, axis=1)
    live = sq > eps * eps
    return jnp.sqrt(jnp.where(live, sq, 1.0)), live


def dual_apply(dual: DualModel, w, v, x, *, variant: str = "paper",
               stop_gradient: bool = False):
    """The dual forward pass.

    Args:
      dual: the layered model.
      w, v: global and local parameters (same structure).
      x: a batch of inputs.
      variant: score variant (see :func:`attach`).
      stop_gradient: block the gradient of the local loss into ``w`` through
        ``G^m`` (the default, ``False``, is the paper's joint gradient).

    Returns:
      ``(global_logits, local_logits, scores [M-1, B])``.
    """
    g, h, scores = x, x, []
    last = len(dual.layers) - 1
    for m, layer in enumerate(dual.layers):
        g = layer(w, g)
        out = layer(v, h)
        if m < last:
            gm = jax.lax.stop_gradient(g) if stop_gradient else g
            if dual.granularity == "timestep" and out.ndim >= 3:
                b, t = out.shape[:2]
                h, s = attach(out.reshape(b * t, -1), gm.reshape(b * t, -1),
                              variant=variant)
                h, s = h.reshape(out.shape), s.reshape(b, t).mean(1)
            else:
                h, s = attach(out, gm, variant=variant)
            scores.append(s)
    return g, out, jnp.stack(scores) if scores else jnp.zeros((0, x.shape[0]))


def local_head_model(dual: DualModel, w, *, variant: str = "paper") -> Model:
    """A :class:`Model` with params ``(v, use_local)`` that predicts with the
    local head given the global ``w`` (``use_local`` False: the global model's
    prediction, for clients without a trained local model)."""
    base = dual.model

    def apply(params, x):
        v, use_local = params
        g, out, _ = dual_apply(dual, w, v, x, variant=variant)
        return jnp.where(use_local, out, g)

    return Model(lambda key: (base.init(key), jnp.ones((), bool)), apply, base.loss,
                 base.metric, None)


def _dense(p, x):
    return x @ p["kernel"] + p["bias"]


def _conv(p, x):
    y = conv_general_dilated(x, p["kernel"], (1, 1), "VALID",
                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + p["bias"]


def _pool(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1),
                                 (1, 2, 2, 1), "VALID")


def dual_mlp(input_shape: tuple[int, ...], num_outputs: int,
             hidden: Sequence[int] = (200, 200)) -> DualModel:
    """The zoo's ReLU MLP (``models.mlp``) as ``M = len(hidden) + 1`` layers,
    tapped after every hidden ReLU."""
    hidden = tuple(hidden)
    if not hidden:
        raise ValueError("hidden: the dual model needs at least one hidden layer")
    model = from_flax(MLP(hidden, num_outputs), input_shape)

    def layer(i, last):
        def f(p, h):
            if i == 0:
                h = h.reshape(h.shape[0], -1)
            out = _dense(p[f"Dense_{i}"], h)
            return out if last else jax.nn.relu(out)
        return f

    n = len(hidden)
    layers = tuple(layer(i, i == n) for i in range(n + 1))
    return DualModel(model, layers, tuple(f"dense{i}" for i in range(n)),
                     f"Dense_{n}")


def dual_lindt_cnn(num_classes: int = 10) -> DualModel:
    """LINDT's CIFAR CNN (``models.lindt_cifar_cnn``, 940,362 parameters) as
    ``M = 5`` layers, tapped after conv1+ReLU+pool, conv2+ReLU+pool, fc1+ReLU and
    fc2+ReLU (our choice, as the paper names no tap points: docs/lindt.md,
    decision 1; dropout off, as in the zoo's factory)."""
    model = from_flax(LindtCIFARCNN(num_classes), (32, 32, 3))

    def conv1(p, x):
        return _pool(jax.nn.relu(_conv(p["Conv_0"], as_image(x, (32, 32, 3)))))

    def conv2(p, h):
        return _pool(jax.nn.relu(_conv(p["Conv_1"], h)))

    def fc1(p, h):
        return jax.nn.relu(_dense(p["Dense_0"], h.reshape(h.shape[0], -1)))

    def fc2(p, h):
        return jax.nn.relu(_dense(p["Dense_1"], h))

    def fc3(p, h):
        return _dense(p["Dense_2"], h)

    return DualModel(model, (conv1, conv2, fc1, fc2, fc3),
                     ("conv1", "conv2", "fc1", "fc2"), "Dense_2")



def dual_lindt_lstm(seq_len: int = 80, vocab_size: int = 80, *,
                    tap_embedding: bool = False,
                    granularity: str = "sample", hidden: int = 256) -> DualModel:
    """LINDT's Shakespeare LSTM (``models.lindt_shakespeare_lstm``, 819,920
    parameters, last-step logits) as layers embedding -> LSTM1 -> LSTM2 -> dense.
    ``hidden`` narrows both LSTM layers (the paper's is 256; smaller widths are
    CPU-scale reductions).

    Taps (the paper names none; docs/lindt.md, decision 1): after LSTM1 and
    LSTM2 (the full ``[B, T, 256]`` sequences), and also after the embedding with
    ``tap_embedding``. ``granularity='sample'`` scores each sample over its
    flattened sequence (the paper's wording); ``'timestep'`` scores every
    (sample, timestep) over the hidden vector.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity: must be one of {GRANULARITIES}, got "
                         f"{granularity!r}")
    if not isinstance(hidden, int) or hidden < 1:
        raise ValueError(f"hidden: must be a positive integer, got {hidden!r}")
    module = CharLSTM(vocab_size, hidden=hidden)
    model = from_flax(module, (seq_len,), "cross_entropy")

    def embed(p, x):
        return p["Embed_0"]["embedding"][x.astype(jnp.int32)]

    def lstm(i):
        def f(p, h):
            return TorchLSTM(module.hidden).apply({"params": p[f"TorchLSTM_{i}"]}, h)
        return f

    def embed_lstm1(p, x):
        return lstm(0)(p, embed(p, x))

    def head(p, h):
        return _dense(p["Dense_0"], h[:, -1])

    first = (embed, lstm(0)) if tap_embedding else (embed_lstm1,)
    names = (("embed",) if tap_embedding else ()) + ("lstm1", "lstm2")
    return DualModel(model, (*first, lstm(1), head), names, "Dense_0", granularity)
