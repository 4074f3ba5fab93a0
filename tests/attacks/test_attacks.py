"""The Ditto threat model (Li et al., ICML 2021, Def. 1, with the authors' code's
details): the fixed malicious set, label poisoning (A1), Gaussian updates (A2),
model replacement (A3); and TERM's tilted mean (Ditto's §4.2), the 'fair'
baseline's aggregator."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pfl as fp
from fedjax_pfl import aggregators, algorithms, attacks, models
from fedjax_pfl import data as fdata

MODEL = models.logistic_regression((6,), 3)


def _labelled(labels_of, sizes=(300, 500, 400, 350, 450, 420), seed=0):
    """Clients with ragged train sizes and labels ``labels_of(rng, n)``; val/test
    with the same label law."""
    rng = np.random.default_rng(seed)
    split = lambda n: [(rng.normal(size=(n_k, 2)).astype(np.float32),
                        labels_of(rng, n_k)) for n_k in n]
    return fdata.from_client_arrays(split(sizes), split([20] * len(sizes)),
                                    split([30] * len(sizes)))


MAL = np.array([True, False, True, False, False, True])


def _owner_rows(d, mask):
    return np.asarray(mask)[np.asarray(d.train.client_of_row)]


def _assert_split_equal(a, b):
    np.testing.assert_array_equal(np.asarray(a.x), np.asarray(b.x))
    np.testing.assert_array_equal(np.asarray(a.y), np.asarray(b.y))


# --------------------------------------------------------- the malicious set


@pytest.mark.parametrize("k,ratio", [(10, 0.0), (10, 0.2), (23, 0.5), (100, 0.29),
                                     (500, 0.8), (7, 0.99)])
def test_malicious_clients_has_int_ratio_k_members(k, ratio):
    mask = attacks.malicious_clients(k, ratio, seed=1)
    assert mask.dtype == bool and mask.shape == (k,)
    assert mask.sum() == int(ratio * k)


def test_malicious_clients_is_seeded_and_uniform():
    a = attacks.malicious_clients(100, 0.5, seed=3)
    np.testing.assert_array_equal(a, attacks.malicious_clients(100, 0.5, seed=3))
    masks = [attacks.malicious_clients(40, 0.25, seed=s) for s in range(2000)]
    assert len({m.tobytes() for m in masks[:50]}) == 50  # seeds give new sets
    # every client is equally likely to be corrupted (binomial, 5 sigma)
    np.testing.assert_allclose(np.mean(masks, 0), 0.25, atol=5 * np.sqrt(
        0.25 * 0.75 / 2000))


@pytest.mark.parametrize("ratio", [1.0, 1.5, -0.1])
def test_malicious_clients_rejects_ratio_outside_unit_interval(ratio):
    with pytest.raises(ValueError, match="ratio"):
        attacks.malicious_clients(10, ratio)


# ------------------------------------------------------- A1: label poisoning


def test_random_relabelling_only_touches_malicious_training_labels():
    d = _labelled(lambda rng, n: rng.integers(0, 10, n).astype(np.int32))
    p = attacks.poison_labels(d, MAL, seed=0)
    _assert_split_equal(p.val, d.val)
    _assert_split_equal(p.test, d.test)
    np.testing.assert_array_equal(np.asarray(p.train.x), np.asarray(d.train.x))
    rows = _owner_rows(d, MAL)
    old, new = np.asarray(d.train.y), np.asarray(p.train.y)
    np.testing.assert_array_equal(new[~rows], old[~rows])
    assert new.dtype == old.dtype and new.min() >= 0 and new.max() < 10
    n_bad = rows.sum()  # 1120 rows: binomial std of the fraction ~ 0.009
    changed = np.mean(new[rows] != old[rows])
    assert abs(changed - 0.9) < 0.04  # random labels may keep the true one
    np.testing.assert_allclose(np.bincount(new[rows], minlength=10) / n_bad, 0.1,
                               atol=0.04)
    again = attacks.poison_labels(d, MAL, seed=0)
    np.testing.assert_array_equal(np.asarray(again.train.y), new)
    other = attacks.poison_labels(d, MAL, seed=1)
    assert not np.array_equal(np.asarray(other.train.y), new)


def test_random_relabelling_uses_num_classes():
    d = _labelled(lambda rng, n: rng.integers(0, 3, n).astype(np.int32))
    new = np.asarray(attacks.poison_labels(d, MAL, num_classes=7).train.y)
    rows = _owner_rows(d, MAL)
    assert new[rows].max() == 6 and new.min() >= 0  # classes the data never shows


@pytest.mark.parametrize("values,dtype", [((0, 1), np.int32), ((-1, 1), np.int32),
                                          ((-1.0, 1.0), np.float32)])
def test_binary_labels_are_flipped(values, dtype):
    d = _labelled(lambda rng, n: rng.choice(np.asarray(values, dtype), n))
    p = attacks.poison_labels(d, MAL)
    rows = _owner_rows(d, MAL)
    old, new = np.asarray(d.train.y), np.asarray(p.train.y)
    flipped = -old if min(values) < 0 else 1 - old
    np.testing.assert_array_equal(new[rows], flipped[rows])
    np.testing.assert_array_equal(new[~rows], old[~rows])
    _assert_split_equal(p.val, d.val)
    _assert_split_equal(p.test, d.test)


def test_poison_labels_validates_its_arguments():
    d = _labelled(lambda rng, n: rng.integers(0, 10, n).astype(np.int32))
    with pytest.raises(ValueError, match="malicious"):
        attacks.poison_labels(d, MAL[:4])
    with pytest.raises(ValueError, match="mode"):
        attacks.poison_labels(d, MAL, mode="flip")  # not binary
    with pytest.raises(ValueError, match="mode"):
        attacks.poison_labels(d, MAL, mode="swap")


def test_setup_attack_draws_the_set_and_poisons_as_the_code_does():
    d = _labelled(lambda rng, n: rng.integers(0, 10, n).astype(np.int32))
    y = np.asarray(d.train.y)
    clean, threat = attacks.setup_attack(d, "none", 0.5)
    assert not threat.malicious.any() and threat.update_attack is None
    np.testing.assert_array_equal(np.asarray(clean.train.y), y)
    for kind, name in (("A1", None), ("A2", "A2"), ("A3", "A3")):
        p, threat = attacks.setup_attack(d, kind, 0.5, seed=2)
        np.testing.assert_array_equal(threat.malicious,
                                      attacks.malicious_clients(6, 0.5, seed=2))
        np.testing.assert_array_equal(threat.benign, ~threat.malicious)
        assert (None if threat.update_attack is None else
                threat.update_attack.name) == name
        rows = _owner_rows(d, threat.malicious)
        new = np.asarray(p.train.y)
        assert np.mean(new[rows] != y[rows]) > 0.8  # poisoned under A1, A2, A3
        np.testing.assert_array_equal(new[~rows], y[~rows])
    unpoisoned, _ = attacks.setup_attack(d, "A3", 0.5, poison=False)
    np.testing.assert_array_equal(np.asarray(unpoisoned.train.y), y)
    with pytest.raises(ValueError, match="kind"):
        attacks.setup_attack(d, "A4", 0.5)


# ----------------------------------------------------------- update attacks


def _update(seed=0, mean=0.3, std=2.0):
    rng = np.random.default_rng(seed)
    return {"a": jnp.asarray(rng.normal(mean, std, (200, 300)), jnp.float32),
            "b": jnp.asarray(rng.normal(mean, std, (5000,)), jnp.float32)}


def _flat(tree):
    return np.concatenate([np.asarray(a).ravel() for a in jax.tree.leaves(tree)])


def test_a2_noise_has_the_honest_updates_entry_std_and_zero_mean():
    upd = _update()
    honest = _flat(upd)
    noise = attacks.gaussian_updates().apply(jax.random.key(0), upd, 10)
    chex.assert_trees_all_equal_shapes_and_dtypes(noise, upd)
    flat = _flat(noise)
    assert abs(flat.std() / honest.std() - 1) < 0.05
    for leaf in jax.tree.leaves(noise):  # every leaf, not just the pool
        assert abs(np.asarray(leaf).std() / honest.std() - 1) < 0.05
    assert abs(flat.mean()) < 5 * honest.std() / np.sqrt(flat.size)  # not 0.3
    assert abs(np.corrcoef(flat, honest)[0, 1]) < 0.02  # independent of the update
    assert not np.array_equal(
        flat, _flat(attacks.gaussian_updates().apply(jax.random.key(1), upd, 10)))
    fixed = _flat(attacks.gaussian_updates(std=1.0).apply(jax.random.key(0), upd, 1))
    assert abs(fixed.std() - 1.0) < 0.05


def test_a3_scales_exactly_by_the_cohort_size_or_scale():
    upd = _update(std=1.0)
    out = attacks.model_replacement().apply(jax.random.key(0), upd, 7)
    chex.assert_trees_all_equal(out, jax.tree.map(lambda u: jnp.float32(7) * u, upd))
    out = attacks.model_replacement(scale=3.5).apply(jax.random.key(0), upd, 7)
    chex.assert_trees_all_equal(out, jax.tree.map(lambda u: jnp.float32(3.5) * u,
                                                  upd))


@pytest.mark.parametrize("attack", [attacks.gaussian_updates(),
                                    attacks.model_replacement()],
                         ids=["A2", "A3"])
def test_only_malicious_uploads_change_and_benign_are_bit_identical(attack):
    rng = np.random.default_rng(0)
    ups = {"w": jnp.asarray(rng.normal(size=(5, 400)), jnp.float32)}
    ups["w"] = ups["w"].at[3].set(ups["w"][1])  # two malicious twins
    mal = jnp.array([False, True, False, True, False])
    out = np.asarray(attacks.attack_updates(attack, jax.random.key(0), ups, mal)["w"])
    np.testing.assert_array_equal(out[~np.asarray(mal)],
                                  np.asarray(ups["w"])[~np.asarray(mal)])
    assert not np.allclose(out[1], ups["w"][1])
    if attack.name == "A3":  # default scale: the number of uploads (cohort)
        np.testing.assert_array_equal(out[mal], 5 * np.asarray(ups["w"])[mal])
        out10 = attacks.attack_updates(attack, jax.random.key(0), ups, mal, 10)["w"]
        np.testing.assert_array_equal(np.asarray(out10)[1], 10 * np.asarray(
            ups["w"])[1])
    else:  # each client its own noise
        assert not np.allclose(out[1], out[3])
    one = attacks.attack_update(attack, jax.random.key(0), {"w": ups["w"][0]},
                                jnp.bool_(False), 5)
    np.testing.assert_array_equal(one["w"], ups["w"][0])
    assert attacks.attack_update(None, jax.random.key(0), ups, True, 5) is ups


def _fed(**kw):
    base = dict(client_lr=0.3, num_local_steps=2, batch_size=4, cohort="full",
                cohort_size=5, sampling="full_batch", weighted=False)
    base.update(kw)
    return algorithms.fedavg(MODEL, **base)


UNROLL1 = fp.EngineConfig(unroll=1)


def _one_round(alg, data):
    state = alg.init(jax.random.key(1), data)
    with fp.core.execution(UNROLL1):
        return state, jax.jit(alg.round_step)(state, data, jax.random.key(0))[0]


@pytest.fixture(scope="module")
def small():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=5, dim=6, num_classes=3,
                                   min_size=10, max_size=30, seed=1)


def test_a3_in_fedavg_ratio_zero_is_clean_and_one_attacker_is_boosted(small):
    """ratio 0: bit-identical to clean FedAvg. One attacker (full cohort of K,
    plain mean, no poisoning): w' = w_clean + (K - 1)/K * delta_attacker."""
    _, clean = _one_round(_fed(), small)
    zero, threat0 = attacks.setup_attack(small, "A3", 0.0)
    _, at_zero = _one_round(_fed(attack=threat0.update_attack,
                                 malicious=threat0.malicious), zero)
    chex.assert_trees_all_equal(at_zero.server.params, clean.server.params)
    _, threat = attacks.setup_attack(small, "A3", 0.2, poison=False, seed=4)
    assert threat.malicious.sum() == 1
    start, boosted = _one_round(_fed(attack=threat.update_attack,
                                     malicious=threat.malicious), small)
    _, local = _one_round(algorithms.local_only(
        MODEL, client_lr=0.3, num_local_steps=2, batch_size=4, cohort="full",
        cohort_size=5, sampling="full_batch"), small)
    c = int(np.flatnonzero(threat.malicious)[0])
    delta = jax.tree.map(lambda v, w: v[c] - w, local.clients, start.server.params)
    expected = jax.tree.map(lambda w, dl: w + 4 / 5 * dl, clean.server.params, delta)
    chex.assert_trees_all_close(boosted.server.params, expected, atol=1e-6)


# ---------------------------------------------------------------- TERM


def _agg(agg, updates, weights, mask, losses):
    return agg.aggregate(agg.init(None), updates, jnp.asarray(weights, jnp.float32),
                         jnp.asarray(mask, jnp.float32), jax.random.key(0),
                         losses=jnp.asarray(losses, jnp.float32))[0]


def test_tilted_mean_at_zero_is_the_plain_mean():
    rng = np.random.default_rng(0)
    ups = {"a": jnp.asarray(rng.normal(size=(6, 3, 2)), jnp.float32),
           "b": jnp.asarray(rng.normal(size=(6,)), jnp.float32)}
    weights, losses = rng.uniform(1, 50, 6), rng.uniform(0, 3, 6)
    mask = np.ones(6)
    got = _agg(aggregators.tilted_mean(0.0), ups, weights, mask, losses)
    want = _agg(aggregators.mean(weighted=False), ups, weights, mask, losses)
    chex.assert_trees_all_close(got, want, atol=1e-6)
    chex.assert_trees_all_close(got, jax.tree.map(lambda u: u.mean(0), ups),
                                atol=1e-6)
    weighted = _agg(aggregators.tilted_mean(0.0, weighted=True), ups, weights, mask,
                    losses)
    chex.assert_trees_all_close(
        weighted, _agg(aggregators.mean(weighted=True), ups, weights, mask, losses),
        atol=1e-6)


@pytest.mark.parametrize("t", [1.5, -2.0, 1.0])
def test_tilted_weights_are_proportional_to_exp_t_loss(t):
    """One-hot updates: the aggregate IS the weight vector."""
    losses = np.array([0.1, 0.5, 2.0, 1.0]) + (1000.0 if t == 1.0 else 0.0)
    losses = losses.astype(np.float32).astype(np.float64)  # what the rule sees
    n = np.array([10.0, 40.0, 20.0, 5.0])
    eye = {"u": jnp.eye(4, dtype=jnp.float32)}
    got = np.asarray(_agg(aggregators.tilted_mean(t), eye, n, np.ones(4), losses)["u"])
    want = np.exp(t * (losses - losses.max()))
    rtol = 2e-4 if t == 1.0 else 1e-5  # float32 logits near 1000: ulp 6e-5
    np.testing.assert_allclose(got, want / want.sum(), rtol=rtol)  # no overflow
    got_w = _agg(aggregators.tilted_mean(t, weighted=True), eye, n, np.ones(4),
                 losses)["u"]
    want_w = n * want
    np.testing.assert_allclose(got_w, want_w / want_w.sum(), rtol=rtol)


def test_masked_out_members_are_ignored():
    rng = np.random.default_rng(1)
    ups = {"u": jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)}
    ups["u"] = ups["u"].at[1].set(1e6)  # masked-out garbage, with the top loss
    losses, n, mask = [0.2, 9.0, 1.0, 0.5], [3.0, 4.0, 5.0, 6.0], [1, 0, 1, 1]
    keep = np.array([0, 2, 3])
    sub = lambda a: jnp.asarray(np.asarray(a)[keep])
    for agg in (aggregators.tilted_mean(2.0), aggregators.tilted_mean(2.0, True),
                aggregators.mean(weighted=True)):
        got = _agg(agg, ups, n, mask, losses)
        want = _agg(agg, jax.tree.map(sub, ups), sub(n), np.ones(3), sub(losses))
        chex.assert_trees_all_close(got, want, rtol=1e-6)


def test_masked_out_nonfinite_update_is_ignored():
    ups = {"u": jnp.array([[1.0, 2.0], [jnp.nan, jnp.inf], [3.0, 4.0]])}
    for agg in (aggregators.tilted_mean(1.0), aggregators.mean(weighted=False)):
        got = _agg(agg, ups, [1.0, 1.0, 1.0], [1, 0, 1], [0.0, 0.0, 0.0])
        np.testing.assert_allclose(got["u"], [2.0, 3.0])


def test_tilted_mean_needs_losses_and_reports_it():
    agg = aggregators.tilted_mean(1.0)
    assert agg.needs_losses and agg.linear_weights is None
    with pytest.raises(ValueError, match="losses"):
        agg.aggregate((), {"u": jnp.ones((2, 1))}, jnp.ones(2), jnp.ones(2),
                      jax.random.key(0))


def test_fedavg_with_term_runs_and_tilts_toward_worse_clients(small):
    alg = _fed(aggregator=aggregators.tilted_mean(1.0), cohort="uniform",
               cohort_size=3, sampling="with_replacement")
    res = fp.simulate(alg, small, num_rounds=4, eval_every=2, key=jax.random.key(0),
                      progress=False, splits=("test",), engine=UNROLL1)
    last = res.history[-1]
    assert "train/round_start_loss" in last
    assert all(np.all(np.isfinite(v)) for k, v in last.items()
               if isinstance(v, (float, list)))
    assert last["nonfinite_clients"] == 0
    # t = 0 is the unweighted-mean FedAvg; t = 1 differs from it
    _, t0 = _one_round(_fed(aggregator=aggregators.tilted_mean(0.0)), small)
    _, plain = _one_round(_fed(), small)
    _, t1 = _one_round(_fed(aggregator=aggregators.tilted_mean(1.0)), small)
    chex.assert_trees_all_close(t0.server.params, plain.server.params, atol=1e-6)
    assert not np.allclose(t1.server.params["Dense_0"]["kernel"],
                           plain.server.params["Dense_0"]["kernel"], atol=1e-4)
