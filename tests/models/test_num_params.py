"""``models.num_params`` takes what users pass: parameters, a Model, or a flax
module with an example input; anything else is a ValueError naming the argument."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl import models


class _Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)
        return nn.Dense(3)(nn.relu(nn.Dense(8)(x)))


EXPECTED = 4 * 8 + 8 + 8 * 3 + 3  # for 4 input features


def test_params_model_and_module_agree():
    model = models.from_flax(_Net(), (4,))
    params = model.init(jax.random.key(0))
    assert models.num_params(params) == EXPECTED
    assert models.num_params(model) == EXPECTED
    assert models.num_params(_Net(), (4,)) == EXPECTED  # one example's shape
    assert models.num_params(_Net(), jnp.zeros((7, 2, 2))) == EXPECTED  # a batch
    assert models.num_params(_Net(), jax.ShapeDtypeStruct((1, 4), jnp.float32)) \
        == EXPECTED
    assert models.num_params({"params": params}) == EXPECTED
    assert models.num_params(jax.eval_shape(model.init, jax.random.key(0))) \
        == EXPECTED


def test_zoo_models_without_allocating():
    assert models.num_params(models.ditto_fmnist_cnn()) == 3_274_634
    assert models.num_params(models.DittoFMNISTCNN(), (28, 28, 1)) == 3_274_634
    lr = models.logistic_regression((60,), 10)
    assert models.num_params(lr) == models.num_params(lr.init(jax.random.key(1))) \
        == 610


def test_stacked_and_scalar_leaves_count_every_entry():
    stacked = {"w": np.zeros((5, 2, 3)), "b": jnp.zeros((5, 3))}
    assert models.num_params(stacked) == 45
    assert models.num_params({"a": 1.5, "b": np.float32(2.0)}) == 2
    assert models.num_params({}) == 0


@pytest.mark.parametrize("args, match", [
    ((_Net(),), "example_input: a flax module needs an example input"),
    ((models.mlp((4,), 3), (4,)), "example_input: only used with a flax module"),
    ((models.mlp((4,), 3).apply,), "params_or_model: .*leaf of type function"),
    (("weights",), "params_or_model: .*leaf of type str"),
    (({"w": None, "f": print},), "params_or_model: .*builtin_function"),
])
def test_clear_errors(args, match):
    with pytest.raises(ValueError, match=match):
        models.num_params(*args)
