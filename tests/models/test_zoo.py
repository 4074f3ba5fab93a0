"""The paper zoo: exact parameter counts, output shapes, layer semantics."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl import models

# name -> (factory, one example's input shape, outputs per example, params)
ZOO = {
    "ditto_fmnist_cnn": (models.ditto_fmnist_cnn, (28, 28, 1), (10,), 3_274_634),
    "ditto_femnist_cnn": (models.ditto_femnist_cnn, (784,), (62,), 222_078),
    "ditto_celeba_cnn": (models.ditto_celeba_cnn, (84, 84, 3), (2,), 31_202),
    "ditto_vehicle_svm": (models.ditto_vehicle_svm, (100,), (), 101),
    "fedavg_cnn_mnist": (models.fedavg_cnn, (28, 28, 1), (10,), 582_026),
    "fedavg_cnn_cifar": (lambda: models.fedavg_cnn((32, 32, 3)), (32, 32, 3), (10,),
                         878_538),
    "lindt_cifar_cnn": (models.lindt_cifar_cnn, (32, 32, 3), (10,), 940_362),
    "lindt_shakespeare_lstm": (models.lindt_shakespeare_lstm, (80,), (80,), 819_920),
    "logistic_regression": (lambda: models.logistic_regression((784,), 10), (784,),
                            (10,), 7_850),
}


def _np_params(init, *args):
    """Params of the right shapes from NumPy (no jitted initializers to compile)."""
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(init, *args)
    return jax.tree.map(
        lambda s: jnp.asarray(rng.uniform(-0.05, 0.05, s.shape), s.dtype), shapes
    )


@pytest.mark.parametrize("name", sorted(ZOO))
def test_parameter_count(name):
    factory, _, _, want = ZOO[name]
    shapes = jax.eval_shape(factory().init, jax.random.key(0))  # no compute
    assert sum(math.prod(a.shape) for a in jax.tree.leaves(shapes)) == want


@pytest.mark.parametrize("name", sorted(ZOO))
def test_apply_shape_and_finite_loss(name):
    factory, in_shape, out_shape, _ = ZOO[name]
    model = factory()
    # Random-looking params from NumPy: jitting the big initializers costs seconds
    # of CPU compile time per model (init itself is covered by the LSTM test).
    rng = np.random.default_rng(0)
    params = _np_params(model.init, jax.random.key(0))
    x = jnp.asarray(rng.uniform(0, 3, (2, *in_shape)), jnp.float32)
    y = jnp.array([1, -1]) if name == "ditto_vehicle_svm" else jnp.array([0, 1])

    @jax.jit  # one compilation per model
    def run(params):
        loss = models.batch_loss(model, params, x, y, jnp.ones(2))
        return model.apply(params, x), loss

    out, loss = run(params)
    assert out.shape == (2, *out_shape)
    assert np.isfinite(float(loss))


def test_flat_and_image_inputs_agree():
    module = models.FedAvgCNN(image_shape=(16, 16, 1))  # small: 1-channel 16x16
    x = jax.random.normal(jax.random.key(1), (2, 16, 16, 1))
    params = _np_params(module.init, jax.random.key(0), x)
    apply = jax.jit(module.apply)
    np.testing.assert_allclose(
        apply(params, x), apply(params, x.reshape(2, 256)), rtol=1e-5
    )


def test_nchw_to_nhwc():
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    y = models.nchw_to_nhwc(x)
    assert isinstance(y, np.ndarray) and y.shape == (2, 4, 5, 3)
    assert y[1, 2, 3, 0] == x[1, 0, 2, 3]
    assert models.nchw_to_nhwc(jnp.asarray(x)).shape == (2, 4, 5, 3)
    with pytest.raises(ValueError, match="NCHW"):
        models.nchw_to_nhwc(x[0])


def test_vehicle_svm_loss_is_hinge_plus_l2():
    model = models.ditto_vehicle_svm(input_dim=3)
    params = model.init(jax.random.key(0))
    assert models.num_params(params) == 4
    assert float(jnp.abs(model.apply(params, jnp.ones((2, 3)))).sum()) == 0.0  # zeros
    params = {"linear": {"kernel": jnp.array([[1.0], [-2.0], [0.5]]),
                         "bias": jnp.array([0.1])}}
    x = jnp.array([[1.0, 0.0, 0.0], [0.0, 1.0, 2.0]])
    y = jnp.array([1.0, 1.0])
    s = np.array([1.1, -0.9])
    want = np.mean(np.maximum(0, 1 - s)) + 0.01 * (1 + 4 + 0.25)
    got = models.batch_loss(model, params, x, y, jnp.ones(2))
    np.testing.assert_allclose(float(got), want, rtol=1e-6)
    np.testing.assert_array_equal(model.metric(model.apply(params, x), y), [1, 0])


def test_batch_stat_norm_uses_batch_statistics():
    norm = models.BatchStatNorm()
    x = jax.random.normal(jax.random.key(0), (8, 5, 5, 3)) * 4.0 + 2.0
    params = norm.init(jax.random.key(1), x)
    assert models.num_params(params) == 6
    params = {"params": {"scale": jnp.array([1.0, 2.0, 3.0]),
                         "bias": jnp.array([0.0, 1.0, -1.0])}}
    out = np.asarray(norm.apply(params, x))
    np.testing.assert_allclose(out.mean((0, 1, 2)), [0.0, 1.0, -1.0], atol=1e-5)
    np.testing.assert_allclose(out.std((0, 1, 2)), [1.0, 2.0, 3.0], rtol=1e-3)


def _lstm_reference(p, x):
    """PyTorch LSTM equations in NumPy, one layer."""
    h = np.zeros((x.shape[0], p["w_hh"].shape[0]))
    c = np.zeros_like(h)
    sig = lambda v: 1 / (1 + np.exp(-v))
    outs = []
    for t in range(x.shape[1]):
        g = x[:, t] @ p["w_ih"] + h @ p["w_hh"] + p["b_ih"] + p["b_hh"]
        i, f, gg, o = np.split(g, 4, axis=-1)
        c = sig(f) * c + sig(i) * np.tanh(gg)
        h = sig(o) * np.tanh(c)
        outs.append(h)
    return np.stack(outs, 1)


def test_torch_lstm_matches_reference_equations():
    layer = models.TorchLSTM(hidden=4)
    x = jax.random.normal(jax.random.key(0), (3, 6, 5))
    params = layer.init(jax.random.key(1), x)
    assert models.num_params(params) == 4 * 4 * (5 + 4) + 2 * 4 * 4
    leaves = np.concatenate([np.ravel(v) for v in jax.tree.leaves(params)])
    assert np.abs(leaves).max() <= 0.5 and np.abs(leaves).max() > 0.4  # U(+-1/sqrt(4))
    ref = _lstm_reference(jax.tree.map(np.asarray, params["params"]), np.asarray(x))
    np.testing.assert_allclose(np.asarray(layer.apply(params, x)), ref, atol=1e-5)


def test_char_lstm_all_steps():
    every = models.CharLSTM(vocab_size=11, hidden=6, all_steps=True)
    last = models.CharLSTM(vocab_size=11, hidden=6)
    x = jnp.arange(14).reshape(2, 7) % 11
    params = _np_params(every.init, jax.random.key(0), x)
    out_all, out_last = jax.jit(lambda p: (every.apply(p, x), last.apply(p, x)))(params)
    assert out_all.shape == (2, 7, 11)
    np.testing.assert_allclose(out_last, out_all[:, -1], rtol=1e-5, atol=1e-6)


def test_lindt_dropout_module_option():
    module = models.LindtCIFARCNN(dropout=True)
    x = jnp.ones((2, 32, 32, 3))
    params = _np_params(module.init, jax.random.key(0), x)
    apply = jax.jit(module.apply, static_argnames="train")
    eval_out = apply(params, x)  # train=False: deterministic, no rng needed
    a = apply(params, x, train=True, rngs={"dropout": jax.random.key(1)})
    b = apply(params, x, train=True, rngs={"dropout": jax.random.key(2)})
    assert eval_out.shape == a.shape == (2, 10)
    assert not np.allclose(a, b)
