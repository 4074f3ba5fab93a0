"""The data containers print as one short line: sizes, shapes and dtypes, never
the arrays (``print(fed)`` once dumped thousands of characters)."""

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_pfl import data


def _fed(num_clients=30, seed=0):
    rng = np.random.default_rng(seed)
    clients = [(rng.normal(size=(n, 28, 28, 1)).astype(np.float32),
                rng.integers(0, 10, size=n).astype(np.int32))
               for n in rng.integers(20, 200, size=num_clients)]
    return data.split_clients(clients, (0.7, 0.1, 0.2), seed=seed)


def test_federated_data_repr_is_one_short_line():
    fed = _fed()
    text = repr(fed)
    assert str(fed) == text and "\n" not in text and len(text) < 250, text
    assert text.startswith("FederatedData(clients=30, train=")
    for part in (f"train={fed.train.num_examples} examples "
                 f"({fed.train.min_count}..{fed.train.max_count} per client)",
                 f"val={fed.val.num_examples} examples",
                 f"test={fed.test.num_examples} examples",
                 "x=(28, 28, 1) float32", "y=int32", "classes=10)"):
        assert part in text, (part, text)


def test_missing_splits_regression_targets_and_no_classes():
    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(5, 3)).astype(np.float32),
                rng.normal(size=(5, 1)).astype(np.float32)) for _ in range(4)]
    text = repr(data.from_client_arrays(clients))
    assert text == ("FederatedData(clients=4, train=20 examples (5..5 per client), "
                    "val=None, test=None, x=(3,) float32, y=(1,) float32)")


def test_repr_under_jit_and_eval_shape_reads_shapes_only():
    fed = _fed(5)
    seen = []

    @jax.jit
    def f(d):
        seen.append(repr(d))
        return d.train.x.sum()

    f(fed)
    abstract = jax.eval_shape(lambda d: d, fed)
    for text in (seen[0], repr(abstract)):
        assert text.startswith("FederatedData(clients=5, train=")
        assert "x=(28, 28, 1) float32" in text and "classes" not in text


def test_split_batch_and_problem_containers_are_one_line():
    fed = _fed(8)
    split = repr(fed.train)
    assert split == (f"Split(clients=8, examples={fed.train.num_examples}, "
                     f"per_client={fed.train.min_count}..{fed.train.max_count}, "
                     "x=(28, 28, 1) float32, y=int32)")
    batch = data.gather_batch(fed.train, jnp.arange(4), jnp.ones(4))
    assert repr(batch) == ("Batch(x=(4, 28, 28, 1) float32, y=(4,) int32, "
                           "mask=(4,) float32)")
    problems = [data.point_estimation_problem(num_clients=50, n=200),
                data.linear_regression_problem(num_clients=40, n=60, dim=50),
                data.fedplus_synthetic_regression(num_clients=4, dim=300)]
    for p in problems:
        text = repr(p)
        assert "\n" not in text and len(text) < 400, text
        assert text.startswith(f"{type(p).__name__}(data=FederatedData(clients=")
    assert "w_true=(40, 50) float64" in repr(problems[1])


def test_fedplus_mnist_repr():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(200, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, size=200)
    text = repr(data.fedplus_mnist(x, y, num_clients=4))
    assert "\n" not in text and "negated=(4,) bool" in text, text
