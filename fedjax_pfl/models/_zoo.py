"""Paper models as flax modules and :class:`Model` factories."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax.numpy as jnp

from ._conv import Conv, max_pool
from ._model import Model, from_flax

# Glorot-uniform kernels and zero biases: TF1's defaults, used by the Ditto code.
_glorot = nn.initializers.glorot_uniform()


class LogisticRegression(nn.Module):
    """Multinomial logistic regression (flatten -> dense)."""

    num_classes: int

    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        return nn.Dense(self.num_classes, kernel_init=_glorot)(x)


class MLP(nn.Module):
    """Fully connected ReLU network (flatten -> hidden... -> out)."""

    hidden: Sequence[int]
    num_outputs: int

    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        for h in self.hidden:
            x = nn.relu(nn.Dense(h, kernel_init=_glorot)(x))
        return nn.Dense(self.num_outputs, kernel_init=_glorot)(x)


class DittoFMNISTCNN(nn.Module):
    """Ditto's Fashion-MNIST CNN (Li et al., ICML 2021): 3,274,634 parameters.

    conv5x5x32 same, ReLU, maxpool 2 -> conv5x5x64 same, ReLU, maxpool 2 ->
    dense 1024 ReLU -> dense 10.
    """

    num_classes: int = 10

    @nn.compact
    def __call__(self, x):
        if x.ndim == 2:
            x = x.reshape(x.shape[0], 28, 28, 1)
        x = nn.relu(Conv(32, (5, 5), padding="SAME", kernel_init=_glorot)(x))
        x = max_pool(x, (2, 2), (2, 2))
        x = nn.relu(Conv(64, (5, 5), padding="SAME", kernel_init=_glorot)(x))
        x = max_pool(x, (2, 2), (2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.relu(nn.Dense(1024, kernel_init=_glorot)(x))
        return nn.Dense(self.num_classes, kernel_init=_glorot)(x)


def logistic_regression(input_shape: tuple[int, ...], num_classes: int) -> Model:
    """Multinomial logistic regression with softmax cross-entropy."""
    return from_flax(LogisticRegression(num_classes), input_shape)


def mlp(
    input_shape: tuple[int, ...],
    num_outputs: int,
    hidden: Sequence[int] = (200, 200),
    loss: str = "cross_entropy",
) -> Model:
    """ReLU MLP; ``loss='squared_error'`` for regression."""
    return from_flax(MLP(tuple(hidden), num_outputs), input_shape, loss)


def linear_regression(input_shape: tuple[int, ...], num_outputs: int = 1) -> Model:
    """Linear model with the squared-error loss ``0.5 ||Wx + b - y||^2``."""
    return from_flax(MLP((), num_outputs), input_shape, "squared_error")


def ditto_fmnist_cnn(num_classes: int = 10) -> Model:
    """Ditto's Fashion-MNIST CNN on 28x28x1 inputs (flat 784 inputs are reshaped)."""
    return from_flax(DittoFMNISTCNN(num_classes), (28, 28, 1))


def mean_model(dim: int) -> Model:
    """A point estimate ``w`` with loss ``0.5 ||w - y||^2`` (x is ignored).

    The federated point-estimation problem of the Ditto paper (Li et al., ICML 2021):
    each client's loss is minimized at its sample mean.
    """

    class _Point(nn.Module):
        @nn.compact
        def __call__(self, x):
            w = self.param("w", nn.initializers.zeros, (dim,))
            return jnp.broadcast_to(w, (x.shape[0], dim))

    return from_flax(_Point(), (1,), "squared_error")
