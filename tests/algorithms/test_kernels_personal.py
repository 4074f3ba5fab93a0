"""The module-level one-client kernels of APFL, mapper, Per-FedAvg, L2SGD and
MOCHA (the last two with attacked uploads, which their kernels apply
themselves): two jitted rounds (the CPU engine lifts the kernel with lax.map) equal a
Python loop over the cohort that calls the kernel for one client at a time,
with the cohort and client keys rebuilt as the engine draws them, and each
method's server step written out; only the cohort's rows change."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import engine_cohort, rows_changed, take

from fedjax_pfl import EngineConfig, algorithms, attacks, models
from fedjax_pfl import data as fdata
from fedjax_pfl import toolkit as tk
from fedjax_pfl.algorithms import _apfl, _l2sgd, _mapper, _mocha, _perfedavg
from fedjax_pfl.core import execution

MODEL = models.mlp((6,), 3, hidden=(8,))
ENGINE = EngineConfig("map", 1, unroll=1)
STEPS = dict(num_local_steps=2, batch_size=4, cohort_size=3)
M, N = 3, 6  # cohort, clients
MAL = np.array([1, 0, 1, 0, 1, 0], bool)
ATTACK = attacks.model_replacement(3.0)


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=N, dim=6, num_classes=3,
                                   min_size=12, max_size=40,
                                   fractions=(0.8, 0.0, 0.2), seed=4)


def _cfg(lr):
    """The factories' LocalConfig (unroll left to the engine, as they leave it)."""
    return tk.make_local_config(lr, 2, 4, "with_replacement")


def _upload():
    return tk.global_solver(MODEL, _cfg(0.2)).upload  # FedAvg's weighted mean


def _fedavg_server(state, results):
    """FedAvg's server: ``w + sum n_k u_k / sum n_k``."""
    ws = [float(r.weight) for r in results]
    return jax.tree.map(lambda p, *u: p + sum(w * x for w, x in zip(ws, u)) / sum(ws),
                        state.server.params, *[r.update for r in results])


def _l2sgd_server(state, results):
    """L2SGD's server: ``wbar + (m / N) mean(uploads)`` (unweighted)."""
    return jax.tree.map(lambda p, *u: p + M / N * (sum(u) / len(u)),
                        state.server.mean, *[r.update for r in results])


# name -> (factory, kernel: (server, client_state, cid, key, data) ->
#          ClientResult, server step: (state, [ClientResult]) -> tree to compare,
#          the engine's state -> that tree)
CASES = {
    "apfl": (
        lambda: algorithms.apfl(MODEL, alpha=0.3, alpha_lr=0.5, client_lr=0.2,
                                **STEPS),
        lambda: functools.partial(_apfl.client_update, MODEL, _cfg(0.2), True, 0.5,
                                  _upload(), cohort_size=M),
        _fedavg_server, lambda s: s.server.params),
    "mapper": (
        lambda: algorithms.mapper(MODEL, client_lr=0.2, finetune_steps=1, **STEPS),
        lambda: functools.partial(_mapper.client_update, MODEL, _cfg(0.2),
                                  (0.25, 0.5, 0.75), _upload(), cohort_size=M),
        _fedavg_server, lambda s: s.server.params),
    "per_fedavg": (
        lambda: algorithms.per_fedavg(MODEL, alpha=0.1, beta=0.3, finetune_steps=1,
                                      **STEPS),
        lambda: functools.partial(_perfedavg.client_update, MODEL, _cfg(0.3), 0.1,
                                  1e-3, "hf", _upload(), cohort_size=M),
        _fedavg_server, lambda s: s.server.params),
    "l2sgd_attacked": (
        lambda: algorithms.l2sgd(MODEL, lam=0.5, client_lr=0.2, attack=ATTACK,
                                 malicious=MAL, **STEPS),
        lambda: functools.partial(_l2sgd.client_update, MODEL, _cfg(0.2), 0.5,
                                  "exact", ATTACK, jnp.asarray(MAL), cohort_size=M),
        _l2sgd_server, lambda s: s.server.mean),
    "mocha_attacked": (
        lambda: algorithms.mocha(MODEL, lam1=0.1, lam2=0.05, client_lr=0.2,
                                 attack=ATTACK, malicious=MAL, **STEPS),
        lambda: functools.partial(_mocha.client_update, MODEL, _cfg(0.2), 0.1, 0.05,
                                  ATTACK, jnp.asarray(MAL), cohort_size=M),
        None, None),  # MOCHA's server state is compared in the test
}



def _close(a, b):
    chex.assert_trees_all_close(a, b, rtol=1e-6, atol=1e-6)


def _mocha_server(state, results, cohort):
    """MOCHA's server: the uploaded columns written into ``W``, then the
    closed-form Sigma and Omega = Sigma^-1 (``omega_every=1``)."""
    W = state.server.W
    for (c, _), r in zip(cohort, results):
        sel, cols = r.update
        np.testing.assert_array_equal(sel, np.eye(N)[c])  # one-hot, zero elsewhere
        assert all(not np.any(np.delete(np.asarray(a), c, 0))
                   for a in jax.tree.leaves(cols))
        W = jax.tree.map(lambda a, v, c=c: a.at[c].set(v[c]), W, cols)
    sigma = _mocha.task_covariance(_mocha.flat_tasks(W), 1e-6)
    return W, sigma, _mocha.omega_of(sigma, "inverse", 1e-6)


@pytest.mark.parametrize("name", list(CASES))
def test_lifted_equals_loop_over_single_clients(name, data):
    """Two jitted rounds equal, round by round, the kernel called for one client
    at a time (jitted, traced under the same engine) and the server step
    written out: the new client states, the server's model, and only the
    cohort's rows change."""
    factory, kernel, server_step, server_view = CASES[name]
    alg = factory()
    state = alg.init(jax.random.key(1), data)
    key = jax.random.key(0)
    step, one = jax.jit(alg.round_step), jax.jit(kernel())
    for t in range(2):
        cohort = engine_cohort(data, key, t, M)
        with execution(ENGINE):
            new, _ = step(state, data, key)
            results = [one(state.server, take(state.clients, c) if state.clients
                           else (), c, k, data) for c, k in cohort]
        ids = sorted(c for c, _ in cohort)
        if name.startswith("mocha"):
            W, sigma, omega = _mocha_server(state, results, cohort)
            _close(new.server.W, W)
            _close(new.server.sigma, sigma)
            chex.assert_trees_all_close(new.server.omega, omega, rtol=1e-4)
            old, now = state.server.W, new.server.W
        else:
            _close(server_view(new), server_step(state, results))
            for (c, _), r in zip(cohort, results):
                _close(take(new.clients, c) if new.clients else (), r.client_state)
            old, now = state.clients, new.clients
        if old:  # only the cohort's rows change
            assert np.flatnonzero(rows_changed(old, now)).tolist() == ids
            changed = rows_changed(old, now)
            chex.assert_trees_all_equal(take(old, ~changed), take(now, ~changed))
        state = new
