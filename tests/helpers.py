"""Helpers shared by the algorithm tests (importable: tests/ is on sys.path
through its conftest.py)."""

import importlib.util
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

import fedjax_pfl as fp

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (the scripts import their siblings,
    e.g. ``throughput``, so their folder goes on ``sys.path``; dataclasses such
    as flax modules look their module up in ``sys.modules``)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def run_jitted(alg, data, num_rounds, key=0, state=None, engine=None):
    """``num_rounds`` jitted rounds from ``alg.init(key(1))`` (or ``state``)
    under ``engine`` (default: the one in force)."""
    if state is None:
        state = alg.init(jax.random.key(1), data)
    run = jax.jit(lambda s, d: fp.core.run_rounds(
        alg, s, d, jax.random.key(key), num_rounds, engine=engine)[0])
    return run(state, data)


def engine_cohort(data, key, t, m, mode="uniform"):
    """Round ``t``'s cohort (``core.round_cohort``) and each member's client key
    ``fold_in(fold_in(round_key, CLIENT), key_ids[c])``, as the engine draws
    them: ``[(cid, key), ...]`` in cohort order."""
    ids = np.asarray(fp.core.round_cohort(data, t, key, m, mode))
    ck = jax.random.fold_in(jax.random.fold_in(key, t), fp.core.KeyTag.CLIENT)
    return [(int(c), jax.random.fold_in(ck, data.key_ids[c])) for c in ids]


def leaves_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def take(tree, idx):
    """Rows ``idx`` of every leaf of a stacked pytree."""
    return jax.tree.map(lambda a: a[idx], tree)


def rows_changed(old, new):
    """``[num_clients]`` bool: clients whose stacked params differ."""
    return np.any(np.stack([np.asarray(jnp.any(
        (a != b).reshape(a.shape[0], -1), axis=1))
        for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(new))]), axis=0)


def small_ditto():
    """A small Ditto run on FedProx Synthetic(1, 1) (8 clients, logistic
    regression), shared by the driver tests: ``(data, algorithm)``."""
    from fedjax_pfl import algorithms, models
    from fedjax_pfl import data as fdata

    data = fdata.fedprox_synthetic(1.0, 1.0, num_clients=8, max_size=40, min_size=8)
    alg = algorithms.ditto(models.logistic_regression((60,), 10), lam=0.5,
                           client_lr=0.1, num_local_steps=2, batch_size=4,
                           cohort_size=3)
    return data, alg
