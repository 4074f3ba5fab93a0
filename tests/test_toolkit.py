"""The toolkit: the engine applies update attacks for any method (FedFDP and
LINDT included), round_step resolves the cohort from the data, a method written
in a few lines with it equals FedAvg."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_pfl import EngineConfig, algorithms, attacks, models
from fedjax_pfl import data as fdata
from fedjax_pfl import toolkit as tk
from helpers import leaves_equal, run_jitted

MODEL = models.mlp((6,), 3, hidden=(8,))
UNROLL1 = EngineConfig(unroll=1)


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=4, dim=6, num_classes=3,
                                   min_size=20, max_size=40, fractions=(0.8, 0, 0.2),
                                   seed=5)


def _max_diff(a, b):
    return max(float(jnp.max(jnp.abs(x - y)))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


FACTORIES = {
    "fedfdp": lambda **kw: algorithms.fedfdp(MODEL, clip=1.0, noise_multiplier=0.5,
                                             sampling_rate=0.5, client_lr=1.0,
                                             num_local_steps=1, cohort_size=None,
                                             cohort="full", **kw),
    "lindt": lambda **kw: algorithms.lindt(
        algorithms.dual_mlp((6,), 3, (8,)), client_lr=0.1, num_local_steps=2,
        batch_size=4, cohort_size=4, **kw),
    "fedavg": lambda **kw: algorithms.fedavg(MODEL, num_local_steps=2, batch_size=4,
                                             cohort_size=4, **kw),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_engine_attacks_malicious_uploads_of_any_method(name, data):
    """No attacker: the attacked run is bitwise the clean run; one model
    replacement attacker moves the global model; the mask is checked."""
    make = FACTORIES[name]
    clean = run_jitted(make(), data, 2, engine=UNROLL1)
    none = np.zeros(4, bool)
    harmless = run_jitted(make(attack=attacks.model_replacement(10.0),
                               malicious=none), data, 2, engine=UNROLL1)
    leaves_equal(clean.server.params, harmless.server.params)
    one = none.copy()
    one[1] = True
    attacked = run_jitted(make(attack=attacks.model_replacement(10.0),
                               malicious=one), data, 2, engine=UNROLL1)
    assert _max_diff(clean.server.params, attacked.server.params) > 1e-3
    with pytest.raises(ValueError, match="malicious"):
        make(attack=attacks.model_replacement(10.0))
    with pytest.raises(ValueError, match="malicious"):
        make(attack=attacks.model_replacement(10.0),
             malicious=np.zeros(3, bool)).init(jax.random.key(0), data)


def _my_fedavg(model, *, lr, steps, batch_size, cohort_size):
    """FedAvg written with the toolkit alone (the docs/extending.md pattern)."""
    cfg = tk.make_local_config(lr, steps, batch_size, "with_replacement", unroll=1)

    def init(key, data):
        return tk.AlgorithmState(model.init(key), (), jnp.zeros((), jnp.int32))

    def client_fn(w, client_state, cid, key, data):
        w_k, loss = tk.run_local(model, w, data, cid, key, cfg)
        delta = jax.tree.map(jnp.subtract, w_k, w)
        return tk.ClientResult((), delta, data.train.counts[cid].astype(jnp.float32),
                               {"loss": loss})

    def server_fn(w, updates, weights, mask, metrics, key):
        c = weights * mask / jnp.sum(weights * mask)
        return jax.tree.map(lambda p, u: p + jnp.tensordot(c, u, 1), w, updates), {}

    def eval_models(state, data, key):
        return {"global": tk.ModelView(model, state.server, False)}

    return tk.Algorithm(init, tk.round_step(client_fn, server_fn,
                                            cohort_size=cohort_size), eval_models)


def test_a_method_in_a_few_lines_equals_fedavg(data):
    mine = run_jitted(_my_fedavg(MODEL, lr=0.1, steps=3, batch_size=4,
                                 cohort_size=2), data, 3)
    ref = run_jitted(algorithms.fedavg(MODEL, client_lr=0.1, num_local_steps=3,
                                       batch_size=4, cohort_size=2,
                                       server_optimizer=optax.sgd(1.0)), data, 3,
                     engine=UNROLL1)
    assert _max_diff(mine.server, ref.server.params) < 1e-6


def test_round_step_resolves_cohort_from_the_data(data):
    alg = _my_fedavg(MODEL, lr=0.1, steps=1, batch_size=4, cohort_size=5)
    with pytest.raises(ValueError, match="cohort_size: 5 is larger"):
        alg.round_step(alg.init(jax.random.key(0), data), data, jax.random.key(0))
    with pytest.raises(ValueError, match="cohort_size"):
        tk.round_step(lambda *a: None, lambda *a: None, cohort_size="2")
    with pytest.raises(ValueError, match="cohort"):
        tk.round_step(lambda *a: None, lambda *a: None, cohort_size=2, cohort="all")


def test_key_tags_are_the_registry():
    assert int(tk.KeyTag.ATTACK) == 11 and int(tk.KeyTag.CLIENT) == 1
    assert len({int(t) for t in tk.KeyTag}) == len(tk.KeyTag)
