"""The papers' models with their exact parameter counts.

* :func:`ditto_femnist_cnn`: Ditto FEMNIST CNN, 784 or 28x28x1, 222,078.
* :func:`ditto_celeba_cnn`: Ditto CelebA CNN (batch-stat BN), 84x84x3, 31,202.
* :func:`ditto_vehicle_svm`: Ditto Vehicle linear SVM, 100 features, 101.
* :func:`fedavg_cnn`: PFLlib/FedFDP ``FedAvgCNN``, 28x28x1 / 32x32x3,
  582,026 / 878,538.
* :func:`lindt_cifar_cnn`: LINDT CIFAR-10 CNN, 32x32x3, 940,362.
* :func:`lindt_shakespeare_lstm`: LINDT Shakespeare LSTM, 80 tokens, 819,920.

Layout: images are NHWC (``[B, H, W, C]``), as flax convolutions expect. Loaders
that return NCHW (CIFAR-10 arrives ``[n, 3, 32, 32]``) need :func:`nchw_to_nhwc`
once, on the host, before building :class:`FederatedData`. Flattened inputs
(``[B, H*W*C]``, in HWC order) are reshaped by the CNNs. Flattening before the
dense layers is HWC order, not PyTorch's CHW: parameter counts and function
classes are the same, weights ported from PyTorch would need a permutation.

Initialization follows each source: TF1 defaults (Glorot-uniform kernels, zero
biases) for Ditto's TF models; PyTorch defaults (``U(-1/sqrt(fan_in),
1/sqrt(fan_in))`` kernels and biases) for PFLlib's and LINDT's PyTorch models.

Dropout (Ditto FEMNIST, LINDT) is off in the factories: :class:`Model.apply` is
``(params, x) -> outputs`` with no random key. The modules take
``dropout=True`` and ``train=True`` for use with
``module.apply(..., rngs={'dropout': key})`` outside the Model interface.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ._conv import Conv, max_pool
from ._model import Model, from_flax

_glorot = nn.initializers.glorot_uniform()


def _torch_uniform(fan_in: int):
    """PyTorch's default Linear/Conv init: ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def _torch_dense(x, features: int, name: str | None = None):
    fan_in = x.shape[-1]
    init = _torch_uniform(fan_in)
    return nn.Dense(features, kernel_init=init, bias_init=init, name=name)(x)


def _torch_conv(x, features: int, kernel: int, padding: str = "VALID"):
    fan_in = x.shape[-1] * kernel * kernel
    init = _torch_uniform(fan_in)
    return Conv(
        features, (kernel, kernel), padding=padding, kernel_init=init, bias_init=init
    )(x)


def as_image(x, shape: tuple[int, int, int]):
    """``[B, H, W, C]`` from NHWC or flattened (HWC order) inputs."""
    if x.ndim == 4:
        return x
    return x.reshape(x.shape[0], *shape)


def nchw_to_nhwc(x):
    """``[n, C, H, W] -> [n, H, W, C]`` (NumPy in, NumPy out; JAX in, JAX out)."""
    if x.ndim != 4:
        raise ValueError(f"x: need a 4-D NCHW array, got shape {x.shape}")
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(np.transpose(x, (0, 2, 3, 1)))
    return jnp.transpose(x, (0, 2, 3, 1))


# ------------------------------------------------------------------------ Ditto


class DittoFEMNISTCNN(nn.Module):
    """Ditto's FEMNIST CNN (Li et al., ICML 2021): 222,078 parameters.

    conv5x5x16 same, ReLU, maxpool 2 -> conv5x5x32 same, ReLU, maxpool 2 ->
    [dropout keep 0.75] -> dense 128 ReLU -> [dropout keep 0.5] -> dense 62.
    The TF code applies dropout also at evaluation; here it is off unless
    ``dropout=True`` and ``train=True`` (then pass ``rngs={'dropout': key}``).
    """

    num_classes: int = 62
    dropout: bool = False

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = as_image(x, (28, 28, 1))
        drop = not (self.dropout and train)
        x = nn.relu(Conv(16, (5, 5), padding="SAME", kernel_init=_glorot)(x))
        x = max_pool(x, (2, 2), (2, 2))
        x = nn.relu(Conv(32, (5, 5), padding="SAME", kernel_init=_glorot)(x))
        x = max_pool(x, (2, 2), (2, 2))
        x = nn.Dropout(0.25, deterministic=drop)(x)
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(128, kernel_init=_glorot)(x))
        x = nn.Dropout(0.5, deterministic=drop)(x)
        return nn.Dense(self.num_classes, kernel_init=_glorot)(x)


class BatchStatNorm(nn.Module):
    """Batch normalization that always uses the current batch's statistics.

    TF1 ``batch_normalization(training=True)`` as Ditto's CelebA CNN uses it:
    ``scale * (x - mean) / sqrt(var + eps) + bias`` with the mean and (biased)
    variance over every axis but the last. No running averages, so ``apply``
    stays a pure ``(params, x) -> y`` function. Caveat: an example's output
    depends on the rest of its batch (padded rows included), so per-example
    losses are not independent (matters for per-example DP clipping).
    """

    epsilon: float = 1e-3

    @nn.compact
    def __call__(self, x):
        c = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (c,))
        bias = self.param("bias", nn.initializers.zeros, (c,))
        axes = tuple(range(x.ndim - 1))
        mean = jnp.mean(x, axes)
        var = jnp.mean(jnp.square(x - mean), axes)
        return (x - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias


class DittoCelebACNN(nn.Module):
    """Ditto's CelebA CNN (Li et al., ICML 2021): 31,202 trainable parameters.

    4 x [conv3x3x32 same -> batch-stat BN -> maxpool 2 same -> ReLU] ->
    flatten (6*6*32) -> dense 2. Inputs 84x84x3, raw 0..255 in the Ditto code.
    """

    num_classes: int = 2

    @nn.compact
    def __call__(self, x):
        x = as_image(x, (84, 84, 3))
        for _ in range(4):
            x = Conv(32, (3, 3), padding="SAME", kernel_init=_glorot)(x)
            x = BatchStatNorm()(x)
            x = max_pool(x, (2, 2), (2, 2), padding="SAME")
            x = nn.relu(x)
        x = x.reshape(x.shape[0], -1)
        return nn.Dense(self.num_classes, kernel_init=_glorot)(x)


class LinearSVM(nn.Module):
    """``s = x . w + b`` (zero-initialized, as in Ditto's Vehicle SVM); ``[B]``."""

    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        z = nn.initializers.zeros
        return nn.Dense(1, kernel_init=z, bias_init=z, name="linear")(x)[:, 0]


def ditto_femnist_cnn(num_classes: int = 62) -> Model:
    """Ditto's FEMNIST CNN (dropout off) on ``[B, 784]`` or ``[B, 28, 28, 1]``."""
    return from_flax(DittoFEMNISTCNN(num_classes), (28, 28, 1))


def ditto_celeba_cnn(num_classes: int = 2) -> Model:
    """Ditto's CelebA CNN on ``[B, 84, 84, 3]`` (BatchNorm on batch statistics)."""
    return from_flax(DittoCelebACNN(num_classes), (84, 84, 3))


def ditto_vehicle_svm(input_dim: int = 100, l2: float = 0.01) -> Model:
    """Ditto's Vehicle linear SVM: ``mean(max(0, 1 - y s)) + l2 ||w||^2``.

    Labels in {-1, +1}; the penalty (kernel only, not the bias) is the Model's
    ``regularizer``; the metric is ``sign(s) == y``.
    """

    def regularizer(params):
        return l2 * jnp.sum(jnp.square(params["linear"]["kernel"]))

    return from_flax(LinearSVM(), (input_dim,), "hinge", regularizer)


# ------------------------------------------------------------- PFLlib / FedFDP


class FedAvgCNN(nn.Module):
    """PFLlib's ``FedAvgCNN`` as used by FedFDP (Ling et al., FedFDP, arXiv 2402.16028).

    conv5x5x32 valid, ReLU, maxpool 2 -> conv5x5x64 valid, ReLU, maxpool 2 ->
    dense 512 ReLU -> dense 10. 582,026 parameters on 28x28x1, 878,538 on 32x32x3.
    """

    image_shape: tuple[int, int, int] = (28, 28, 1)
    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        x = as_image(x, self.image_shape)
        x = max_pool(nn.relu(_torch_conv(x, 32, 5)), (2, 2), (2, 2))
        x = max_pool(nn.relu(_torch_conv(x, 64, 5)), (2, 2), (2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(_torch_dense(x, 512))
        return _torch_dense(x, self.num_classes)


def fedavg_cnn(
    input_shape: tuple[int, int, int] = (28, 28, 1), num_classes: int = 10
) -> Model:
    """PFLlib/FedFDP ``FedAvgCNN``; ``input_shape`` is NHWC ``(28, 28, 1)`` for
    (F)MNIST or ``(32, 32, 3)`` for CIFAR-10."""
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 3:
        raise ValueError(f"input_shape: need (H, W, C), got {input_shape!r}")
    return from_flax(FedAvgCNN(shape, num_classes), shape)


# ------------------------------------------------------------------------ LINDT


class LindtCIFARCNN(nn.Module):
    """LINDT's CIFAR-10 CNN (the LINDT paper): 940,362 parameters.

    conv5x5x32 valid, ReLU, maxpool 2 -> conv5x5x64 valid, ReLU, maxpool 2 ->
    dense 512 ReLU -> dense 128 ReLU -> dense 10. The paper's dropout 0.5 (after
    the hidden dense layers; placement not stated) is off unless ``dropout=True``
    and ``train=True``.
    """

    num_classes: int = 10
    dropout: bool = False

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = as_image(x, (32, 32, 3))
        drop = not (self.dropout and train)
        x = max_pool(nn.relu(_torch_conv(x, 32, 5)), (2, 2), (2, 2))
        x = max_pool(nn.relu(_torch_conv(x, 64, 5)), (2, 2), (2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.Dropout(0.5, deterministic=drop)(nn.relu(_torch_dense(x, 512)))
        x = nn.Dropout(0.5, deterministic=drop)(nn.relu(_torch_dense(x, 128)))
        return _torch_dense(x, self.num_classes)


class TorchLSTM(nn.Module):
    """One LSTM layer with PyTorch's parametrization (two bias vectors).

    Gates ``(i, f, g, o)``; ``W_ih [in, 4H]``, ``W_hh [H, 4H]``, ``b_ih``,
    ``b_hh [4H]``, all ``U(-1/sqrt(H), 1/sqrt(H))``; zero initial state.
    ``[B, T, in] -> [B, T, H]``.
    """

    hidden: int

    @nn.compact
    def __call__(self, x):
        h = self.hidden
        init = _torch_uniform(h)
        w_ih = self.param("w_ih", init, (x.shape[-1], 4 * h))
        w_hh = self.param("w_hh", init, (h, 4 * h))
        b = self.param("b_ih", init, (4 * h,)) + self.param("b_hh", init, (4 * h,))
        x_proj = jnp.einsum("bti,ig->tbg", x, w_ih) + b  # time-major

        def step(carry, xp):
            hid, cell = carry
            gates = xp + hid @ w_hh
            i, f, g, o = jnp.split(gates, 4, axis=-1)
            cell = jax.nn.sigmoid(f) * cell + jax.nn.sigmoid(i) * jnp.tanh(g)
            hid = jax.nn.sigmoid(o) * jnp.tanh(cell)
            return (hid, cell), hid

        zeros = jnp.zeros((x.shape[0], h), x_proj.dtype)
        _, hs = jax.lax.scan(step, (zeros, zeros), x_proj)
        return jnp.swapaxes(hs, 0, 1)


class CharLSTM(nn.Module):
    """LINDT's Shakespeare model (the LINDT paper): 819,920 parameters.

    embedding 80 -> 8, two PyTorch-style LSTM layers of 256, dense 256 -> 80 on
    the last step (``all_steps=True``: on every step, ``[B, T, 80]``). Inputs are
    integer character ids ``[B, T]`` (floats are cast). The paper's dropout 0.2
    is not implemented (no rng in ``Model.apply``).
    """

    vocab_size: int = 80
    embed_dim: int = 8
    hidden: int = 256
    num_layers: int = 2
    all_steps: bool = False

    @nn.compact
    def __call__(self, x):
        x = nn.Embed(self.vocab_size, self.embed_dim)(x.astype(jnp.int32))
        for _ in range(self.num_layers):
            x = TorchLSTM(self.hidden)(x)
        if not self.all_steps:
            x = x[:, -1]
        return _torch_dense(x, self.vocab_size)


def lindt_cifar_cnn(num_classes: int = 10) -> Model:
    """LINDT's CIFAR-10 CNN (dropout off) on NHWC ``[B, 32, 32, 3]``."""
    return from_flax(LindtCIFARCNN(num_classes), (32, 32, 3))


def lindt_shakespeare_lstm(
    seq_len: int = 80, vocab_size: int = 80, all_steps: bool = False
) -> Model:
    """LINDT's 2x256 character LSTM; next-character logits ``[B, vocab_size]``.

    With ``all_steps=True`` the outputs are ``[B, T, vocab]`` and the labels must
    be ``[B, T]`` (the per-example loss then has shape ``[B, T]``: average it over
    T before using the engine's ``[B]``-shaped losses).
    """
    return from_flax(
        CharLSTM(vocab_size, all_steps=all_steps), (seq_len,), "cross_entropy"
    )
