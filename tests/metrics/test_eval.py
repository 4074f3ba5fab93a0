"""Per-client evaluation and fairness summaries on hand values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl import data as fdata
from fedjax_pfl import models
from fedjax_pfl.core import ModelView
from fedjax_pfl.metrics import evaluate, evaluate_split, summarize


def test_summaries_on_hand_values():
    v = jnp.array([0.1, 0.5, 0.9, 0.3, jnp.nan] + [0.7] * 15)
    w = jnp.array([10, 30, 10, 50, 5] + [1] * 15)
    s = summarize(v, w)
    valid = np.array([0.1, 0.5, 0.9, 0.3] + [0.7] * 15)
    wv = np.array([10, 30, 10, 50] + [1] * 15)
    np.testing.assert_allclose(s["mean"], (valid * wv).sum() / wv.sum(), rtol=1e-6)
    np.testing.assert_allclose(s["mean_unweighted"], valid.mean(), rtol=1e-6)
    np.testing.assert_allclose(s["var"], valid.var(), rtol=1e-5)
    np.testing.assert_allclose(s["std"], valid.std(), rtol=1e-5)
    np.testing.assert_allclose(s["worst10"], 0.1, rtol=1e-6)  # floor(0.1*19)=1
    np.testing.assert_allclose(s["best10"], 0.9, rtol=1e-6)
    masked = summarize(v, w, mask=jnp.array([1, 1, 0, 0, 0] + [0] * 15))
    np.testing.assert_allclose(masked["mean_unweighted"], 0.3, rtol=1e-6)
    np.testing.assert_allclose(masked["mean"], 0.4, rtol=1e-6)
    empty = summarize(v, w, mask=jnp.zeros(20))
    assert np.isnan(empty["mean"])


def test_worst_and_best_tail_use_ten_percent():
    v = jnp.arange(100, dtype=jnp.float32)
    s = summarize(v, jnp.ones(100))
    np.testing.assert_allclose(s["worst10"], np.arange(10).mean())
    np.testing.assert_allclose(s["best10"], np.arange(90, 100).mean())
    loss = summarize(v, jnp.ones(100), lower_is_better=True)
    np.testing.assert_allclose(loss["worst10"], np.arange(90, 100).mean())
    np.testing.assert_allclose(loss["best10"], np.arange(10).mean())


def test_shared_and_personal_eval_agree_and_match_manual():
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, n))
               for n in (5, 17, 2)]
    d = fdata.from_client_arrays(clients)
    model = models.logistic_regression((4,), 3)
    p = model.init(jax.random.key(0))
    shared = evaluate_split(ModelView(model, p, False), d.train, chunk_size=8)
    stacked = jax.tree.map(lambda a: jnp.stack([a] * 3), p)
    personal = evaluate_split(ModelView(model, stacked, True), d.train)
    for c, (x, y) in enumerate(clients):
        out = model.apply(p, x)
        np.testing.assert_allclose(shared["accuracy"][c],
                                   np.mean(np.argmax(out, -1) == y), atol=1e-6)
        np.testing.assert_allclose(shared["loss"][c],
                                   np.mean(models.cross_entropy(out, y)), rtol=1e-5)
    np.testing.assert_allclose(shared["loss"], personal["loss"], rtol=1e-5)
    out = evaluate({"g": ModelView(model, p, False)}, d, splits=("train",),
                   per_client=True)
    assert out["g/train/accuracy/per_client"].shape == (3,)
    # the tails of 3 clients are one client: a loss's worst is its highest,
    # an accuracy's its lowest
    loss = np.asarray(out["g/train/loss/per_client"])
    assert loss.max() > loss.min()
    np.testing.assert_allclose(out["g/train/loss/worst10"], loss.max(), rtol=1e-6)
    np.testing.assert_allclose(out["g/train/loss/best10"], loss.min(), rtol=1e-6)
    acc = np.asarray(out["g/train/accuracy/per_client"])
    np.testing.assert_allclose(out["g/train/accuracy/worst10"], acc.min(), rtol=1e-6)


def test_personal_eval_in_row_chunks_matches_each_clients_own_model():
    """Several chunks per client, a partial last chunk, and a client with no
    rows: every client's own parameters on exactly its own rows."""
    rng = np.random.default_rng(1)
    test = [(rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, n))
            for n in (9, 1, 0, 4)]
    train = [(rng.normal(size=(2, 4)).astype(np.float32), rng.integers(0, 3, 2))
             for _ in test]
    d = fdata.from_client_arrays(train, test=test)
    model = models.logistic_regression((4,), 3)
    params = [model.init(jax.random.key(i)) for i in range(4)]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *params)
    for row_chunk in (1, 4, 64):
        res = evaluate_split(ModelView(model, stacked, True), d.test,
                             row_chunk=row_chunk, chunk_size=8)
        assert np.isnan(res["loss"][2]) and int(res["count"][2]) == 0
        for c, (x, y) in enumerate(test):
            if not len(y):
                continue
            out = model.apply(params[c], x)
            np.testing.assert_allclose(res["loss"][c],
                                       np.mean(models.cross_entropy(out, y)), rtol=1e-5)
            np.testing.assert_allclose(res["accuracy"][c],
                                       np.mean(np.argmax(out, -1) == y), atol=1e-6)


def test_psi_is_the_training_size_weighted_variance():
    """FedFDP's Psi (eq. 6) on hand values: p_i = n_i / sum n over valid,
    unmasked clients."""
    v = jnp.array([1.0, 3.0, jnp.nan, 10.0])
    n = jnp.array([1, 3, 5, 4])
    s = summarize(v, jnp.ones(4), mask=jnp.array([1, 1, 1, 0]), psi_weights=n)
    p = np.array([1, 3]) / 4
    mean = (p * np.array([1.0, 3.0])).sum()  # 2.5
    np.testing.assert_allclose(s["psi"], (p * (np.array([1.0, 3.0]) - mean) ** 2).sum(),
                               rtol=1e-6)  # 0.75
    assert "psi" not in summarize(v, jnp.ones(4))


def _loop_reference(model, params_of, clients):
    """Per-client mean loss and accuracy, one client at a time in Python."""
    loss, acc = [], []
    for c, (x, y) in enumerate(clients):
        if not len(y):
            loss.append(np.nan)
            acc.append(np.nan)
            continue
        out = model.apply(params_of(c), x)
        loss.append(float(np.mean(models.cross_entropy(out, y))))
        acc.append(float(np.mean(np.argmax(out, -1) == y)))
    return np.array(loss), np.array(acc)


def test_evaluation_in_client_steps_and_row_chunks_equals_a_python_loop():
    """Personal models one client at a time and several (vmapped) at a time,
    with full row chunks, 8-row tail chunks and empty clients; a shared model
    in chunks that do not divide the rows: all equal a Python loop over
    clients, jitted with the split as an argument (traced counts)."""
    rng = np.random.default_rng(2)
    sizes = (0, 1, 7, 8, 9, 20, 33, 3)
    test = [(rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, n))
            for n in sizes]
    train = [(rng.normal(size=(2, 4)).astype(np.float32), rng.integers(0, 3, 2))
             for _ in sizes]
    d = fdata.from_client_arrays(train, test=test)
    model = models.mlp((4,), 3, hidden=(5,))
    params = [model.init(jax.random.key(i)) for i in range(len(sizes))]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *params)
    want = _loop_reference(model, lambda c: params[c], test)
    for k in (1, 2, 3, 8):
        for row_chunk in (1, 4, 16, 64):
            res = jax.jit(lambda p, s, k=k, r=row_chunk: evaluate_split(
                ModelView(model, p, True), s, row_chunk=r, clients_per_step=k))(
                    stacked, d.test)
            np.testing.assert_allclose(res["loss"], want[0], rtol=2e-5)
            np.testing.assert_allclose(res["accuracy"], want[1], atol=1e-6)
            np.testing.assert_array_equal(res["count"], sizes)
    shared = _loop_reference(model, lambda c: params[0], test)
    for chunk in (1, 5, 16, 1000):
        res = jax.jit(lambda p, s, n=chunk: evaluate_split(
            ModelView(model, p, False), s, chunk_size=n))(params[0], d.test)
        np.testing.assert_allclose(res["loss"], shared[0], rtol=2e-5)
        np.testing.assert_allclose(res["accuracy"], shared[1], atol=1e-6)


@pytest.mark.parametrize("kwargs", [{"chunk_size": 0}, {"row_chunk": -1},
                                    {"clients_per_step": 0}, {"row_chunk": 2.0}])
def test_evaluate_split_refuses_bad_sizes(kwargs):
    d = fdata.from_client_arrays([(np.zeros((2, 4), np.float32), np.zeros(2, int))])
    model = models.logistic_regression((4,), 3)
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        evaluate_split(ModelView(model, model.init(jax.random.key(0)), False), d.train,
                       **kwargs)
