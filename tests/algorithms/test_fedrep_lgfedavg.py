"""FedRep (Collins et al., ICML 2021) and LG-FedAvg (Liang et al. 2020), both
written with fedjax_pfl.toolkit: jit == no-jit, the lifted kernel == a Python
loop over single clients, the exact reductions to FedAvg and to local training,
only the cohort's personal parts change, one compilation across rounds, bad
arguments refused by name, and the layer split itself."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import engine_cohort, leaves_equal, rows_changed, run_jitted, take

from fedjax_pfl import EngineConfig, algorithms, attacks, models
from fedjax_pfl import data as fdata
from fedjax_pfl import toolkit as tk
from fedjax_pfl.algorithms import _fedrep, _lgfedavg
from fedjax_pfl.core import execution

MODEL = models.mlp((6,), 3, hidden=(8,))  # layers Dense_0, Dense_1
HP = dict(client_lr=0.2, num_local_steps=2, batch_size=4, cohort_size=3)
UNROLL1 = EngineConfig(unroll=1)  # every round's engine
METHODS = {
    "fedrep": lambda **kw: algorithms.fedrep(MODEL, **{"head_steps": 3, **HP, **kw}),
    "lg_fedavg": lambda **kw: algorithms.lg_fedavg(MODEL, **{**HP, **kw}),
}


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=6, dim=6, num_classes=3,
                                   min_size=12, max_size=40,
                                   fractions=(0.8, 0.0, 0.2), seed=4)


_RUNS = {}  # each configuration is compiled and run once for all the tests


def _run(data, name, **kw):
    """Two jitted rounds of ``METHODS[name](**kw)`` (cached)."""
    k = (name, tuple(sorted(kw.items())))
    if k not in _RUNS:
        _RUNS[k] = run_jitted(METHODS[name](**kw), data, 2, engine=UNROLL1)
    return _RUNS[k]



def _kernel(name):
    """The method's module-level one-client kernel with METHODS' settings:
    ``(server, client_state, cid, key, data) -> ClientResult``."""
    cfg = tk.make_local_config(0.2, 2, 4, "with_replacement", unroll=1)
    if name == "fedrep":
        return functools.partial(_fedrep.client_update, MODEL,
                                 cfg._replace(num_steps=3), cfg, False)
    return functools.partial(_lgfedavg.client_update, MODEL, cfg, False)


def _loop(one, state, data, key, t):
    """Round ``t`` as a Python loop over single clients calling the jitted
    kernel ``one``, then FedAvg's server (the size-weighted mean of uploads)."""
    w, personal = state.server.params, state.clients
    ups, ws = [], []
    for c, k in engine_cohort(data, key, t, 3):
        r = one(state.server, take(personal, c), c, k, data)
        ups.append(r.update)
        ws.append(float(r.weight))
        personal = jax.tree.map(lambda a, v, c=c: a.at[c].set(v), personal,
                                r.client_state)
    w = jax.tree.map(lambda p, *u: p + sum(wi * ui for wi, ui in zip(ws, u))
                     / sum(ws), w, *ups)
    return w, personal


@pytest.mark.parametrize("name", sorted(METHODS))
def test_lifted_equals_loop_only_cohort_changes_compiles_once(name, data):
    """Three jitted rounds (the CPU engine lifts the kernel with lax.map) equal
    a Python loop over the cohort calling the kernel; personal parts start at
    w^0's layers and change exactly for the cohort; one compilation."""
    alg = METHODS[name]()
    state = alg.init(jax.random.key(1), data)
    w0 = MODEL.init(jax.random.key(1))
    leaves_equal(take(state.clients, 5), {k: w0[k] for k in state.clients})
    chex.clear_trace_counter()

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(s, d, k):
        return alg.round_step(s, d, k)

    key, one = jax.random.key(7), jax.jit(_kernel(name))
    for t in range(3):
        w, personal = _loop(one, state, data, key, t)
        with execution(UNROLL1):
            new, _ = step(state, data, key)
        chex.assert_trees_all_close(new.server.params, w, atol=1e-6)
        chex.assert_trees_all_close(new.clients, personal, atol=1e-6)
        changed = rows_changed(state.clients, new.clients)
        assert np.flatnonzero(changed).tolist() == [c for c, _ in
                                                    engine_cohort(data, key, t, 3)]
        leaves_equal(take(state.clients, ~changed), take(new.clients, ~changed))
        state = new


@pytest.mark.parametrize("name", sorted(METHODS))
def test_jit_equals_no_jit(name, data):
    """The method's kernel jitted and op by op (the engine around it has its
    own jit == no-jit test in tests/core)."""
    alg = METHODS[name]()
    state = alg.init(jax.random.key(1), data)
    args = (state.server, take(state.clients, 2), 2, jax.random.key(3), data)
    a = jax.jit(_kernel(name))(*args)
    with jax.disable_jit():
        b = _kernel(name)(*args)
    chex.assert_trees_all_close(a, b, atol=1e-6)


def test_reductions_to_fedavg_and_local(data):
    """Exact: FedRep with no personal layer and LG-FedAvg with every layer global
    are FedAvg (same minibatch stream: the client key); LG-FedAvg with every
    layer local is local training."""
    both = ("Dense_0", "Dense_1")
    ref = run_jitted(algorithms.fedavg(MODEL, **HP), data, 2, engine=UNROLL1)
    leaves_equal(_run(data, "fedrep", head_layers=()).server.params,
                 ref.server.params)
    leaves_equal(_run(data, "lg_fedavg", head_layers=both).server.params,
                 ref.server.params)
    local = run_jitted(algorithms.local_only(MODEL, **HP), data, 2, engine=UNROLL1)
    lg_local = _run(data, "lg_fedavg", head_layers=())
    leaves_equal(lg_local.clients, local.clients)


def test_personal_view_is_global_body_with_own_head(data):
    alg = METHODS["fedrep"]()
    state = _run(data, "fedrep")
    view = alg.eval_models(state, data, jax.random.key(0))["personal"]
    assert view.per_client and set(view.params) == {"Dense_1"}
    x = data.test.x[:5]
    full = tk.merge_params(state.server.params, take(state.clients, 2))
    np.testing.assert_allclose(view.model.apply(take(view.params, 2), x),
                               MODEL.apply(full, x), rtol=1e-6)


def test_engine_attacks_the_uploads(data):
    every = np.ones(6, bool)  # every client malicious: the body must move
    clean = _run(data, "fedrep")
    hit = run_jitted(METHODS["fedrep"](attack=attacks.model_replacement(10.0),
                                       malicious=every), data, 2, engine=UNROLL1)
    diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))),
                        clean.server.params, hit.server.params)
    assert max(jax.tree.leaves(diff)) > 1e-3


BAD = [
    (dict(head_layers="Dense_9"), "head_layers"),
    (dict(head_layers=("Dense_1", "Dense_1")), "head_layers"),
    (dict(head_layers=3), "head_layers"),
    (dict(client_lr=float("nan")), "client_lr"),
    (dict(client_lr=-0.1), "client_lr"),
    (dict(num_local_steps=0), "num_local_steps"),
    (dict(num_local_steps=True), "num_local_steps"),
    (dict(batch_size=True), "batch_size"),
    (dict(local_epochs=0.0), "local_epochs"),
    (dict(batch_size=2.5), "batch_size"),
    (dict(cohort_size=0), "cohort_size"),
    (dict(cohort="everyone"), "cohort"),
    (dict(sampling="random"), "sampling"),
    (dict(weighted="yes"), "weighted"),
    (dict(attack=attacks.model_replacement(10.0)), "malicious"),
]
BAD_FEDREP = [
    (dict(head_steps=0), "head_steps"),
    (dict(head_steps=1.5), "head_steps"),
    (dict(head_epochs=float("nan")), "head_epochs"),
    (dict(head_lr=0.0), "head_lr"),
    (dict(head_lr="fast"), "head_lr"),
]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_bad_arguments_are_refused_by_name(name):
    for kw, arg in BAD + (BAD_FEDREP if name == "fedrep" else []):
        with pytest.raises(ValueError, match=f"^{arg}:"):
            METHODS[name](**kw)
    with pytest.raises(ValueError, match=r"Dense_0', 'Dense_1'"):
        METHODS[name](head_layers=("dense",))  # lists the model's layers


def test_layer_split():
    """Layers in init order (not sorted), default the last, split/merge inverse,
    a frozen part gets no gradient, non-dict parameters refused."""
    m = models.Model(lambda k: {"z": jnp.ones((2, 2)), "a": jnp.ones((2,))},
                     lambda p, x: x @ p["z"] + p["a"], models.squared_error,
                     models.squared_error)
    assert tk.layer_names(m) == ("z", "a")
    assert tk.check_layers(m, None) == ("a",) and tk.check_layers(m, "z") == ("z",)
    p = m.init(None)
    rest, sel = tk.split_params(p, ("a",))
    assert set(rest) == {"z"} and set(sel) == {"a"}
    leaves_equal(tk.merge_params(rest, sel), p)
    g = jax.grad(lambda q: jnp.sum(tk.freeze_layers(m, rest).apply(
        q, jnp.ones((3, 2)))))(sel)
    assert set(g) == {"a"}
    bad = m._replace(init=lambda k: [jnp.ones(2)])
    with pytest.raises(ValueError, match="^model:"):
        algorithms.fedrep(bad)
