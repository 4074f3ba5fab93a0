"""NFL measurement and detection (LINDT, Lin et al., arXiv 2020: the gain, Eqs.
2-3; detection, Sec. 3.4 and Alg. 2; Proposition 1, Eq. 6)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_pfl import metrics

# ------------------------------------------------------------------ measurement


def test_gain_hand_values():
    glob = np.array([0.5, 0.9, 0.4, np.nan])
    priv = np.array([0.7, 0.6, 0.4, 0.9])
    beta_i = metrics.client_gain(glob, priv)
    np.testing.assert_allclose(beta_i[:3], [-0.2, 0.3, 0.0], atol=1e-7)
    # alpha = 1/N over clients with a test split: (-0.2 + 0.3 + 0) / 3
    assert metrics.system_gain(beta_i) == pytest.approx(0.1 / 3, abs=1e-7)
    # n_i/n weights and a benign-only mask
    alpha = np.array([1.0, 3.0, 0.0, 5.0])
    assert metrics.system_gain(beta_i, alpha=alpha) == pytest.approx(
        (-0.2 + 0.9) / 4, abs=1e-7)
    assert metrics.system_gain(beta_i, mask=np.array([0, 1, 1, 1])) == pytest.approx(
        0.15, abs=1e-7)
    g = metrics.gain_metrics(glob, priv, mask=np.array([1, 1, 0, 0]))
    assert float(g["nfl/beta"]) == pytest.approx(5.0, abs=1e-4)  # percent
    assert float(g["nfl/local_acc"]) - float(g["nfl/private_acc"]) == pytest.approx(
        float(g["nfl/beta"]), abs=1e-4)  # Local - beta = private mean (LINDT's tables)
    row = metrics.add_gain({"round": 3}, glob, priv)
    assert row["round"] == 3 and row["nfl/beta"] == pytest.approx(100 * 0.1 / 3, 1e-5)


def test_verdict():
    v = metrics.nfl_verdict([-3.0, 1.0, -1.0, 2.0, 2.5], window=2)
    assert not v["in_nfl"] and v["settled_from"] == 3
    assert v["beta_tail_mean"] == pytest.approx(2.25)
    assert metrics.nfl_verdict([1.0, -0.5, 2.0], window=2)["in_nfl"]
    assert metrics.nfl_verdict([1.0, -0.5], window=5)["settled_from"] is None
    with pytest.raises(ValueError, match="window"):
        metrics.nfl_verdict([1.0], window=0)


# -------------------------------------------------------------------- detection


def _scan_detector(deltas, eps, r_prime):
    def body(s, xs):
        r, d = xs
        s = metrics.detector_update(s, d, r, eps=eps, r_prime=r_prime)
        return s, s.detected

    rounds = jnp.arange(1, len(deltas) + 1)
    return jax.jit(lambda d: jax.lax.scan(body, metrics.detector_init(), (rounds, d)))(
        jnp.asarray(deltas, jnp.float32))


@pytest.mark.parametrize("r_prime", [0, 3, 250])
def test_detection_fires_at_r_prime_plus_one(r_prime):
    n = r_prime + 6
    state, flags = _scan_detector(np.full(n, 0.5), 0.1, r_prime)
    assert int(state.detect_round) == r_prime + 1  # count > r' (strict), Alg. 2
    assert metrics.detection_round(np.full(n, 0.5), eps=0.1, r_prime=r_prime) == (
        r_prime + 1)
    np.testing.assert_array_equal(np.asarray(flags), np.arange(1, n + 1) > r_prime)
    assert int(state.count) == n  # never reset


def test_detection_cumulative_and_below_eps():
    # Delta > eps only in odd rounds: the counter is cumulative, so it fires at
    # round 2 r' + 1 (Alg. 2 counts strictly: count > r').
    alt = np.where(np.arange(1, 41) % 2 == 1, 0.3, 0.05)
    state, _ = _scan_detector(alt, 0.1, 5)
    assert int(state.detect_round) == 11 == metrics.detection_round(alt, r_prime=5)
    # a stream below eps (or equal to it: strict >) never fires
    for stream in (np.full(50, 0.0999), np.full(50, 0.1), -np.ones(50)):
        state, flags = _scan_detector(stream, 0.1, 0)
        assert int(state.detect_round) == -1 and not np.any(np.asarray(flags))
        assert metrics.detection_round(stream, r_prime=0) is None
    assert int(state.below) == 50  # consecutive rounds below eps (stop strategy 3)
    # random streams: the jitted detector equals the host reference
    rng = np.random.default_rng(0)
    for _ in range(5):
        s = rng.uniform(0, 0.2, 60)
        st, _ = _scan_detector(s, 0.1, 20)
        ref = metrics.detection_round(s, r_prime=20)
        assert int(st.detect_round) == (-1 if ref is None else ref)


def test_detection_invalid():
    with pytest.raises(ValueError, match="r_prime"):
        metrics.detection_round([1.0], r_prime=-1)
    with pytest.raises(ValueError, match="eps"):
        metrics.detection_round([1.0], eps=0.0)


def test_divergence_and_noise_correction():
    rng = np.random.default_rng(1)
    w_prev = {"a": rng.normal(size=(3, 2)), "b": rng.normal(size=4)}
    ups = {"a": rng.normal(size=(5, 3, 2)), "b": rng.normal(size=(5, 4))}
    noise = {"a": 0.01 * rng.normal(size=(3, 2)), "b": 0.01 * rng.normal(size=4)}
    change = jax.tree.map(lambda u, z: u.mean(0) + z, ups, noise)  # sigma-DP mean
    w_new = jax.tree.map(jnp.add, w_prev, change)
    locals_ = jax.tree.map(lambda p, u: p[None] + u, w_prev, ups)
    flat = lambda t: np.concatenate([np.ravel(a) for a in jax.tree.leaves(t)])
    expect = np.mean([np.linalg.norm(flat(jax.tree.map(lambda a, i=i: a[i], locals_))
                                     - flat(w_new)) for i in range(5)])
    np.testing.assert_allclose(metrics.weight_divergence(locals_, w_new), expect,
                               rtol=1e-5)
    np.testing.assert_allclose(metrics.divergence_from_updates(ups, change), expect,
                               rtol=1e-5)
    mask = np.array([1, 1, 0, 0, 1.0])
    exp_m = np.mean([np.linalg.norm(flat(jax.tree.map(lambda a, i=i: a[i], locals_))
                                    - flat(w_new)) for i in (0, 1, 4)])
    np.testing.assert_allclose(metrics.weight_divergence(locals_, w_new, mask), exp_m,
                               rtol=1e-5)
    # the clients' own step sizes: (1/K) sum_k ||u_k||, masked rows dropped
    step = [np.linalg.norm(flat(jax.tree.map(lambda a, i=i: a[i], ups)))
            for i in range(5)]
    np.testing.assert_allclose(metrics.mean_update_norm(ups), np.mean(step), rtol=1e-5)
    np.testing.assert_allclose(metrics.mean_update_norm(ups, mask),
                               np.mean([step[i] for i in (0, 1, 4)]), rtol=1e-5)
    # Delta = w_div - ||noise|| with the realized draw (a tree or its norm)
    nn = np.linalg.norm(flat(noise))
    np.testing.assert_allclose(metrics.nfl_delta(expect, noise), expect - nn, rtol=1e-5)
    np.testing.assert_allclose(metrics.nfl_delta(expect, jnp.float32(nn)), expect - nn,
                               rtol=1e-5)
    assert metrics.nfl_delta(2.0) == 2.0
    # identical clients + DP noise only: every w_k is the mean, w_div = ||noise||
    same = jax.tree.map(lambda u: jnp.broadcast_to(u[:1], u.shape), ups)
    ch = jax.tree.map(lambda u, z: u[0] + z, ups, noise)
    assert abs(float(metrics.nfl_delta(metrics.divergence_from_updates(same, ch),
                                       noise))) < 1e-6


def test_proposition1_bound_on_label_skew_quadratics():
    """Eq. 6 (Proposition 1): full-batch GD on per-class quadratics, clients that
    differ only by their label mix, plain mean, no clipping: w_div <= bound."""
    rng = np.random.default_rng(0)
    d, c, k, t_steps, eta = 5, 4, 6, 20, 0.05
    a_mats = []
    for _ in range(c):
        q = rng.normal(size=(d, d))
        a_mats.append(q @ q.T / d + 0.1 * np.eye(d))
    b = rng.normal(size=(c, d))
    lam = np.array([np.linalg.eigvalsh(a).max() for a in a_mats])
    p = rng.dirichlet(0.3 * np.ones(c), size=k)
    grads = lambda w: np.stack([a_mats[y] @ w - b[y] for y in range(c)])
    w = rng.normal(size=d)
    for _ in range(5):
        traj = np.zeros((k, t_steps + 1, d))
        for i in range(k):
            wi = w.copy()
            traj[i, 0] = wi
            for s in range(t_steps):
                wi = wi - eta * p[i] @ grads(wi)
                traj[i, s + 1] = wi
        w_new = traj[:, -1].mean(0)
        w_div = float(metrics.weight_divergence(jnp.asarray(traj[:, -1]),
                                                jnp.asarray(w_new)))
        bound = 0.0
        for i in range(k):
            a_i = 1 + eta * np.sum(lam * p[i])
            for j in range(k):
                if j != i:
                    gmax = [np.linalg.norm(grads(traj[j, t_steps - 1 - s]),
                                           axis=1).max() for s in range(t_steps)]
                    bound += np.abs(p[i] - p[j]).sum() * sum(
                        a_i ** s * gmax[s] for s in range(t_steps))
        bound *= eta / k ** 2
        assert 0 < w_div <= bound
        w = w_new


def test_wrong_types_are_refused_by_name():
    for call, match in [
        (lambda: metrics.detection_round([1.0], r_prime=True), "r_prime"),
        (lambda: metrics.detection_round([1.0], r_prime=2.0), "r_prime"),
        (lambda: metrics.detection_round([1.0], eps="0.1"), "eps: must be a number"),
        (lambda: metrics.nfl_verdict([0.1, -0.2], window=0), "window"),
        (lambda: metrics.nfl_verdict([0.1, -0.2], window=2.0), "window"),
    ]:
        with pytest.raises(ValueError, match=match):
            call()
    assert metrics.nfl_verdict([0.1, -0.2], window=np.int64(1))["in_nfl"]


def test_deployed_accuracy_names_its_split_and_view():
    from fedjax_pfl import algorithms, models
    from fedjax_pfl import data as fdata

    alg = algorithms.fedavg(models.logistic_regression((60,), 10), client_lr=0.1,
                            num_local_steps=1, batch_size=5, cohort_size=2)
    with pytest.raises(ValueError, match="split: must be one of"):
        metrics.deployed_accuracy_fn(alg, split="testing")
    fed = fdata.fedprox_synthetic(num_clients=3, max_size=30, seed=0)
    state = alg.init(jax.random.key(0), fed)
    with pytest.raises(ValueError, match=r"view: unknown 'personal'"):
        metrics.deployed_accuracy_fn(alg, view="personal")(state, fed)
    with pytest.raises(ValueError, match="split: the data has no 'val' split"):
        metrics.deployed_accuracy_fn(alg, split="val")(state, fed)
    assert metrics.deployed_accuracy_fn(alg)(state, fed).shape == (3,)
