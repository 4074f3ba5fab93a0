"""The four papers' module-level kernels alone (Ditto, LINDT, Fed+, FedFDP):
the lifted round equals a Python loop over single clients calling them;
Ditto's lambda selection and LINDT's switching and stopping rules as named
functions."""

import functools
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import engine_cohort, take

from fedjax_pfl import EngineConfig, algorithms, metrics, models
from fedjax_pfl import data as fdata
from fedjax_pfl import privacy as fp_privacy
from fedjax_pfl import toolkit as tk
from fedjax_pfl.aggregators import mean
from fedjax_pfl.algorithms import _ditto, _fedfdp, _fedplus, _lindt
from fedjax_pfl.core import AlgorithmState, execution

MODEL = models.mlp((6,), 3, hidden=(8,))
ENGINE = EngineConfig("map", 1, unroll=1)
M = 3  # cohort size


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=6, dim=6, num_classes=3,
                                   min_size=12, max_size=40,
                                   fractions=(0.6, 0.2, 0.2), seed=4)



def _loop_round(one, state, data, key, weighted):
    """One round as a Python loop over the cohort calling the jitted one-client
    kernel ``one``; the server adds the (weighted) mean of the uploads."""
    clients, ups, ws = state.clients, [], []
    for c, k in engine_cohort(data, key, int(state.round), M):
        r = one(state.server, take(clients, c), c, k, data)
        ups.append(r.update)
        ws.append(float(r.weight) if weighted else 1.0)
        clients = jax.tree.map(lambda a, v, c=c: a.at[c].set(v), clients,
                               r.client_state)
    mean_up = jax.tree.map(lambda *u: sum(w * x for w, x in zip(ws, u)) / sum(ws),
                           *ups)
    return clients, mean_up


def _lifted_rounds(alg, data, key, n):
    states = [alg.init(jax.random.key(1), data)]
    step = jax.jit(lambda s, d, k: alg.round_step(s, d, k)[0])
    with execution(ENGINE):
        for _ in range(n):
            states.append(step(states[-1], data, key))
    return states


@pytest.mark.parametrize("selection", ["fixed", "paper", "greedy_step"])
def test_ditto_round_is_its_kernel_over_single_clients(data, selection):
    hp = dict(client_lr=0.2, num_local_steps=2, personal_steps=3, batch_size=4,
              cohort_size=M)
    alg = algorithms.ditto(MODEL, lam=0.5, lam_selection=selection, **hp)
    key = jax.random.key(7)
    states = _lifted_rounds(alg, data, key, 2)
    cfg = tk.make_local_config(0.2, 2, 4, "with_replacement")
    pcfg = cfg._replace(num_steps=3)
    grid, fallback = _ditto._lam_grid(selection, None, False, None)
    sel = _ditto.LamSelection(selection, grid, fallback, 4, "loss")
    solver = tk.global_solver(MODEL, cfg)
    one = jax.jit(functools.partial(_ditto.ditto_client, MODEL, pcfg, sel,
                                    "independent", solver.client_update,
                                    cohort_size=M))
    for before, after in itertools.pairwise(states):
        with execution(ENGINE):
            clients, up = _loop_round(one, before, data, key, weighted=True)
        chex.assert_trees_all_close(after.clients, clients, atol=1e-6)
        w = jax.tree.map(jnp.add, before.server.params, up)
        chex.assert_trees_all_close(after.server.params, w, atol=1e-6)


def test_select_lambda_keeps_the_best_validation_candidate(data):
    """The paper's rule by hand: every grid lambda trained on the same
    minibatches, the lowest validation loss kept; below min_val_examples the
    fallback's candidate."""
    pcfg = tk.make_local_config(0.3, 3, 4, "with_replacement", unroll=1)
    grid = (0.0, 1.0, 5.0)
    w = MODEL.init(jax.random.key(1))
    v = MODEL.init(jax.random.key(2))
    key = jax.random.key(3)
    for cid in range(3):
        with execution(ENGINE):
            trained = [_ditto.personal_step(MODEL, pcfg, v, lam, w, cid, key, data)
                       for lam in grid]
            scores = [float(_ditto.validation_score(MODEL, "loss", p, cid, data))
                      for p, _ in trained]
            for min_val, want in ((0, int(np.argmin(scores))), (10**6, 1)):
                sel = _ditto.LamSelection("paper", grid, 1.0, min_val, "loss")
                got_v, got_lam, got_loss = _ditto.select_lambda(
                    MODEL, pcfg, sel, v, w, cid, key, data)
                assert float(got_lam) == grid[want]
                chex.assert_trees_all_close(got_v, trained[want][0], atol=1e-6)
                np.testing.assert_allclose(got_loss, trained[want][1], rtol=1e-6)


def test_greedy_step_lambda_with_a_one_lambda_grid_is_a_personal_step(data):
    pcfg = tk.make_local_config(0.3, 3, 4, "with_replacement", unroll=1)
    w = MODEL.init(jax.random.key(1))
    v = MODEL.init(jax.random.key(2))
    sel = _ditto.LamSelection("greedy_step", (0.7,), 0.7, 4, "loss")
    with execution(ENGINE):
        got_v, lam, _ = _ditto.greedy_step_lambda(MODEL, pcfg, sel, v, 0.0, w, 2,
                                                  jax.random.key(3), data)
        want_v, _ = _ditto.personal_step(MODEL, pcfg, v, 0.7, w, 2,
                                         jax.random.key(3), data)
    assert float(lam) == pytest.approx(0.7)
    chex.assert_trees_all_close(got_v, want_v, atol=1e-6)


@pytest.mark.parametrize("mode", ["always", "off"])
def test_lindt_round_is_its_kernel_over_single_clients(data, mode):
    dual = algorithms.dual_mlp((6,), 3, (8,))
    mal = np.zeros(6, bool)
    mal[0] = True
    alg = algorithms.lindt(dual, mode=mode, client_lr=0.2, lr_decay=0.9,
                           num_local_steps=2, batch_size=4, cohort_size=M,
                           malicious=mal, malicious_multiplier=2)
    key = jax.random.key(5)
    states = _lifted_rounds(alg, data, key, 2)
    cfg = tk.make_local_config(0.2, 2, 4, "with_replacement")
    lc = _lindt.LindtConfig(dual, cfg, 0.9, mode != "off", "random", "paper",
                            False, None, jnp.asarray(mal), 2)
    one = jax.jit(functools.partial(_lindt.lindt_client, lc))
    for before, after in itertools.pairwise(states):
        with execution(ENGINE):
            clients, up = _loop_round(one, before, data, key, weighted=False)
        chex.assert_trees_all_close(after.clients, clients, atol=1e-6)
        w = jax.tree.map(jnp.add, before.server.params, up)
        chex.assert_trees_all_close(after.server.params, w, atol=1e-6)
    server, _ = _lindt.lindt_server(
        mean(weighted=False), float("inf"), 0.0, True, 1e-3, 5, states[0].server,
        jax.tree.map(lambda a: jnp.stack([a, 3 * a]), states[0].server.params),
        jnp.ones(2), jnp.ones(2), {}, jax.random.key(0))
    chex.assert_trees_all_close(
        server.params, jax.tree.map(lambda a: 3 * a, states[0].server.params),
        atol=1e-6)


def _state(dual_on, stopped, detected, below, has_local):
    det = metrics.detector_init()._replace(detected=jnp.asarray(detected),
                                           below=jnp.asarray(below, jnp.int32))
    server = _lindt.LindtServerState((), (), det, jnp.asarray(dual_on),
                                     jnp.asarray(stopped), jnp.zeros((), jnp.int32))
    clients = _lindt.LindtClientState((), jnp.asarray(has_local))
    return AlgorithmState(server, clients, jnp.zeros((), jnp.int32))


def test_stopping_rules():
    det = metrics.detector_init()
    for stop, has_local, below, want in [
            ("never", [True, True], 99, False),
            ("all_trained_once", [True, False], 0, False),
            ("all_trained_once", [True, True], 0, True),
            ("delta_below", [False, False], 2, False),
            ("delta_below", [False, False], 3, True)]:
        got = _lindt.stopping_rule(stop, jnp.asarray(has_local),
                                   det._replace(below=jnp.asarray(below)), 3)
        assert bool(got) == want, (stop, has_local, below)


@pytest.mark.parametrize("mode,dual_on,detected,stop,has_local,want_on,want_stop", [
    ("detect", False, False, "never", [False], False, False),
    ("detect", False, True, "never", [False], True, False),      # switched on
    ("always", True, False, "all_trained_once", [True], False, True),  # stops
    ("always", True, False, "all_trained_once", [False], True, False),
    ("detect", False, True, "all_trained_once", [True], True, False),  # on first
    ("off", False, True, "never", [False], False, False),
])
def test_transitions(mode, dual_on, detected, stop, has_local, want_on, want_stop):
    st = _lindt.transitions(mode, stop, 3,
                            _state(dual_on, False, detected, 0, has_local))
    assert bool(st.server.dual_on) == want_on
    assert bool(st.server.stopped) == want_stop
    # once stopped, never on again
    again = _lindt.transitions(mode, stop, 3, _state(False, True, True, 0, has_local))
    assert not bool(again.server.dual_on) and bool(again.server.stopped)


def _check_rounds(states, one, data, key, weighted, server=True):
    for before, after in itertools.pairwise(states):
        with execution(ENGINE):
            clients, up = _loop_round(one, before, data, key, weighted=weighted)
        chex.assert_trees_all_close(after.clients, clients, atol=1e-6)
        if server:
            w = jax.tree.map(jnp.add, before.server.params, up)
            chex.assert_trees_all_close(after.server.params, w, atol=1e-6)


def test_fedplus_round_is_its_kernel_over_single_clients(data):
    hp = dict(sigma=0.5, delta=0.1, client_lr=0.2, num_local_steps=2, batch_size=4,
              cohort_size=M, init_mix=0.3)
    alg = algorithms.fedplus(MODEL, psi="l1", agg_set="sampled", aggregator=mean(),
                             **hp)
    key = jax.random.key(9)
    states = _lifted_rounds(alg, data, key, 2)
    cfg = tk.make_local_config(0.2, 2, 4, "with_replacement")
    fc = _fedplus.FedPlusConfig(MODEL, cfg, "l1", 0.1, 0.5, 0.3, None, None, None,
                                False, False)
    one = jax.jit(functools.partial(_fedplus.fedplus_client, fc, cohort_size=M))
    _check_rounds(states, one, data, key, weighted=True)


def test_fedfdp_round_is_its_kernel_over_single_clients(data):
    alg = algorithms.fedfdp(MODEL, lam=0.2, clip=1.0, noise_multiplier=0.5,
                            sampling_rate=0.5, client_lr=0.3, num_local_steps=2,
                            cohort_size=M)
    key = jax.random.key(11)
    states = _lifted_rounds(alg, data, key, 2)
    dp = fp_privacy.make_dp_config(1.0, 0.5, "poisson", 0.5, None, "expected",
                                   "auto", None, "sign_preserving")
    fc = _fedfdp.FedFDPConfig(MODEL, 0.3, 2, dp, 0.2, "per_sample", 5.0, 0.0, True)
    one = jax.jit(functools.partial(_fedfdp.fedfdp_client, fc))
    _check_rounds(states, one, data, key, weighted=True)
