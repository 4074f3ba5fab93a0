"""The one-client kernels of SCAFFOLD, FedDyn, q-FFL, pFedMe and AFL, each a
module-level function: two jitted rounds (the engine lifts the kernel over the
cohort with lax.map) equal the same rounds as a Python loop over the cohort
that calls the kernel for one client at a time, then the method's server step
written out here (docs/extending.md, section 8)."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import engine_cohort, leaves_equal, rows_changed, take

from fedjax_pfl import EngineConfig, aggregators, algorithms, models
from fedjax_pfl import data as fdata
from fedjax_pfl import toolkit as tk
from fedjax_pfl.algorithms import _afl, _feddyn, _pfedme, _qffl, _scaffold
from fedjax_pfl.core import execution

MODEL = models.mlp((6,), 3, hidden=(8,))
M = 3  # the cohort (of 6 clients)
HP = dict(client_lr=0.2, num_local_steps=2, batch_size=4, cohort_size=M)
ENGINE = EngineConfig("map", 1, unroll=1)
CFG = tk.make_local_config(0.2, 2, 4, "with_replacement", unroll=1)
MEAN = aggregators.mean(weighted=True)  # the factories' default aggregator
ETA_G, ALPHA, LAM, INNER_LR, BETA, Q, L, LAMBDA_LR = (0.7, 0.1, 2.0, 0.05, 1.5, 0.5,
                                                      10.0, 0.3)


def _mean(trees, ws):
    """``sum_k ws_k trees_k / sum_k ws_k``."""
    return jax.tree.map(lambda *u: sum(w * x for w, x in zip(ws, u)) / sum(ws),
                        *trees)


def _scaffold_server(s, rs, n):
    """x <- x + eta_g agg(dy) (size-weighted), c <- c + m/N mean(dc)."""
    dy = _mean([r.update[0] for r in rs], [float(r.weight) for r in rs])
    dc = _mean([r.update[1] for r in rs], [1.0] * len(rs))
    return s._replace(
        params=jax.tree.map(lambda p, d: p + ETA_G * d, s.params, dy),
        control=jax.tree.map(lambda c, d: c + M / n * d, s.control, dc))


def _feddyn_server(s, rs, n):
    """h <- h - alpha m/N agg(u), w <- (w + agg(u)) - h / alpha."""
    d = _mean([r.update for r in rs], [float(r.weight) for r in rs])
    h = jax.tree.map(lambda a, x: a - (ALPHA * M / n) * x, s.h, d)
    return s._replace(params=jax.tree.map(lambda p, x, a: (p + x) - a / ALPHA,
                                          s.params, d, h), h=h)


def _pfedme_server(s, rs, n):
    """w <- w + beta agg(w_k - w)."""
    d = _mean([r.update for r in rs], [float(r.weight) for r in rs])
    return s._replace(params=jax.tree.map(lambda p, x: p + BETA * x, s.params, d))


def _qffl_server(w, rs, n):
    """w <- w - sum_k F_k^q Delta_k / sum_k h_k."""
    scaled = _mean([r.update[0] for r in rs], [1.0] * len(rs))
    h = sum(r.update[1] for r in rs) / len(rs)
    return jax.tree.map(lambda p, x: p - x / h, w, scaled)


def _afl_server(s, rs, n):
    """w <- w + N/m sum_S lam_k delta_k, lam <- Proj(lam + lr N/m sum_S F_k e_k)."""
    step, losses = _mean([r.update for r in rs], [1.0] * len(rs))
    return s._replace(
        params=jax.tree.map(lambda p, x: p + n * x, s.params, step),
        lam=algorithms.project_simplex(s.lam + LAMBDA_LR * (n * losses)))


# name: (the algorithm, its module-level kernel with the same settings, the
# server step, whether clients keep state)
METHODS = {
    "scaffold": (
        lambda: algorithms.scaffold(MODEL, global_lr=ETA_G, **HP),
        functools.partial(_scaffold.client_update, MODEL, CFG, False, None, None),
        _scaffold_server, True),
    "feddyn": (
        lambda: algorithms.feddyn(MODEL, alpha=ALPHA, **HP),
        functools.partial(_feddyn.client_update, MODEL, CFG, ALPHA, MEAN, None,
                          None),
        _feddyn_server, True),
    "pfedme": (
        lambda: algorithms.pfedme(MODEL, lam=LAM, inner_steps=2, inner_lr=INNER_LR,
                                  beta=BETA, **HP),
        functools.partial(_pfedme.client_update, MODEL, CFG, LAM, INNER_LR, 2, MEAN,
                          None, None),
        _pfedme_server, True),
    "qffl": (
        lambda: algorithms.qffl(MODEL, q=Q, lipschitz_L=L, **HP),
        functools.partial(_qffl.client_update, MODEL, CFG, "qfedavg", Q, L, None,
                          None),
        _qffl_server, False),
    "afl": (
        lambda: algorithms.afl(MODEL, lambda_lr=LAMBDA_LR, **HP),
        functools.partial(_afl.client_update, MODEL, CFG, None, None),
        _afl_server, False),
}


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=6, dim=6, num_classes=3,
                                   min_size=12, max_size=40,
                                   fractions=(0.8, 0.0, 0.2), seed=4)



def _loop(one, server_step, state, data, key, t):
    """Round ``t`` as a Python loop over single clients calling the jitted
    kernel ``one``, then the server step on their results."""
    clients, rs = state.clients, []
    for c, k in engine_cohort(data, key, t, M):
        r = one(state.server, take(clients, c), jnp.int32(c), k, data)
        rs.append(r)
        clients = jax.tree.map(lambda a, v, c=c: a.at[c].set(v), clients,
                               r.client_state)
    return server_step(state.server, rs, data.num_clients), clients


@pytest.mark.parametrize("name", list(METHODS))
def test_lifted_equals_loop(name, data):
    """Two jitted rounds (one compilation) equal the loop over the cohort
    calling the module-level kernel; only the cohort's client states change,
    to the kernel's."""
    make, kernel, server_step, stateful = METHODS[name]
    alg = make()
    state = alg.init(jax.random.key(1), data)
    chex.clear_trace_counter()

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(s, d, k):
        return alg.round_step(s, d, k)

    key = jax.random.key(7)
    one = jax.jit(functools.partial(kernel, cohort_size=M))
    for t in range(2):
        server, clients = _loop(one, server_step, state, data, key, t)
        with execution(ENGINE):
            new, _ = step(state, data, key)
        chex.assert_trees_all_close(new.server, server, atol=1e-6, rtol=1e-6)
        chex.assert_trees_all_close(new.clients, clients, atol=1e-6, rtol=1e-6)
        if stateful:
            changed = rows_changed(state.clients, new.clients)
            assert np.flatnonzero(changed).tolist() == sorted(
                c for c, _ in engine_cohort(data, key, t, M))
            leaves_equal(take(state.clients, ~changed), take(new.clients, ~changed))
        state = new
