"""Fed+'s Moreau aggregation and the smoothed Weiszfeld kernel: prox closed forms,
closed-form aggregates (e.g. delta / m toward one far outlier), the two solvers
against each other and against a float64 NumPy reference, invariances, masks,
jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize

from fedjax_pfl import aggregators as A
from fedjax_pfl.aggregators import moreau_objective, moreau_solve, prox, prox_stacked


def _tree(rng, m, scale=1.0, shift=0.0):
    """A two-leaf pytree of ``m`` stacked float32 client vectors."""
    return {"w": jnp.asarray(shift + scale * rng.normal(size=(m, 3, 2)), jnp.float32),
            "b": jnp.asarray(shift + scale * rng.normal(size=(m, 4)), jnp.float32)}


def _flat(tree):
    """``[m, d]`` NumPy view of a stacked pytree (leaf order of ``jax.tree``)."""
    return np.concatenate([np.asarray(x).reshape(x.shape[0], -1)
                           for x in jax.tree.leaves(tree)], 1)


def _flat1(tree):
    return np.concatenate([np.asarray(x).ravel() for x in jax.tree.leaves(tree)])


def _agg(agg, updates, weights=None, mask=None, jit=True):
    m = jax.tree.leaves(updates)[0].shape[0]
    weights = jnp.ones(m) if weights is None else weights
    mask = jnp.ones(m) if mask is None else mask
    fn = jax.jit(agg.aggregate) if jit else agg.aggregate
    return fn(agg.init(None), updates, weights, mask, jax.random.key(0))


# ---------------------------------------------------------------------- prox


def test_prox_closed_forms():
    u = {"a": jnp.array([3.0, -4.0]), "b": jnp.array([[0.05, -0.2]])}
    d = 0.5
    flat = _flat1(u)
    np.testing.assert_allclose(_flat1(prox("sq", u, d)), flat / 1.5, rtol=1e-6)
    # l2: block soft-threshold over the WHOLE pytree norm.
    norm = np.linalg.norm(flat)
    np.testing.assert_allclose(_flat1(prox("l2", u, d)), (1 - d / norm) * flat,
                               rtol=1e-6)
    # l1: the correct soft threshold (a negative entry stays negative).
    np.testing.assert_allclose(_flat1(prox("l1", u, d)), [2.5, -3.5, 0.0, 0.0],
                               rtol=1e-6)
    np.testing.assert_array_equal(_flat1(prox("ind0", u, d)), np.zeros(4))
    np.testing.assert_array_equal(_flat1(prox("zero", u, d)), flat)
    # l2 inside the ball is 0, and safe (finite gradient) at u = 0.
    small = jax.tree.map(lambda x: x * 1e-3, u)
    np.testing.assert_array_equal(_flat1(prox("l2", small, d)), np.zeros(4))
    g = jax.grad(lambda x: jnp.sum(prox("l2", {"a": x}, d)["a"]))(jnp.zeros(3))
    assert np.all(np.isfinite(np.asarray(g)))


@pytest.mark.parametrize("psi", ["l2", "l1", "sq"])
def test_prox_minimizes_the_penalized_objective(psi):
    """O1: prox(u) = argmin_theta Psi(theta)/sigma + 1/2 ||u - theta||^2."""
    rng = np.random.default_rng(1)
    u, d = rng.normal(size=5), 0.7
    pen = {"l2": lambda t: d * np.linalg.norm(t), "l1": lambda t: d * np.abs(t).sum(),
           "sq": lambda t: 0.5 * d * t @ t}[psi]
    res = optimize.minimize(lambda t: pen(t) + 0.5 * np.sum((u - t) ** 2), u,
                            method="Powell", options={"xtol": 1e-10, "ftol": 1e-14})
    np.testing.assert_allclose(np.asarray(prox(psi, {"x": jnp.asarray(u)}, d)["x"]),
                               res.x, atol=1e-4)


def test_prox_stacked_is_rowwise():
    rng = np.random.default_rng(2)
    U = _tree(rng, 4)
    for psi in A.PSI:
        out = prox_stacked(psi, U, 0.9)
        for k in range(4):
            row = prox(psi, jax.tree.map(lambda x, k=k: x[k], U), 0.9)
            np.testing.assert_allclose(_flat(out)[k], _flat1(row), rtol=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match="psi"):
        A.moreau("l3")
    with pytest.raises(ValueError, match="method"):
        A.moreau("l2", method="newton")
    with pytest.raises(ValueError, match="delta"):
        A.moreau("l2", delta=0.0)
    with pytest.raises(ValueError, match="num_iters"):
        A.moreau("l2", num_iters=0)
    with pytest.raises(ValueError, match="tol"):
        A.moreau("l1", tol=-1.0)
    with pytest.raises(ValueError, match="psi"):
        prox("huber", {"a": jnp.ones(2)}, 0.1)


# ------------------------------------------------------------------- oracles


@pytest.mark.parametrize("psi", ["l2", "l1"])
@pytest.mark.parametrize("method", ["irls", "paper"])
def test_one_dimensional_oracle(psi, method):
    """O2: {0, 0, 0, 0, 100} with delta = 0.1 gives delta/4 = 0.025 (not the
    paper's printed soft threshold's 0.01); m points at 0 + 1 outlier: delta/m."""
    for m, want in ((4, 0.025), (3, 0.1 / 3)):
        U = {"a": jnp.asarray([[0.0]] * m + [[100.0]])}
        z, st = _agg(A.moreau(psi, 0.1, method=method, tol=1e-9), U)
        np.testing.assert_allclose(float(z["a"][0]), want, rtol=1e-4)
        assert int(st.iterations) >= 1


def test_paper_needs_many_more_iterations_than_irls():
    """The paper's step moves w by at most delta: from the mean 20 to
    0.025 it needs >= 200 iterations; IRLS needs tens."""
    U = {"a": jnp.asarray([[0.0]] * 4 + [[100.0]])}
    _, it_irls = moreau_solve(U, jnp.ones(5), "l2", 0.1, method="irls", tol=1e-7)
    _, it_paper = moreau_solve(U, jnp.ones(5), "l2", 0.1, method="paper", tol=1e-7)
    assert 200 <= int(it_paper) < 10_000 and int(it_irls) < 50


@pytest.mark.parametrize("psi", ["l2", "l1"])
def test_irls_equals_paper_iteration(psi):
    """Odd m (unique minimizer): both solvers reach the same aggregate, and it is
    stationary for the Moreau objective (lower than nearby points)."""
    rng = np.random.default_rng(3)
    U = _tree(rng, 7)
    c = jnp.ones(7)
    z_irls, _ = moreau_solve(U, c, psi, 0.3, method="irls", num_iters=500, tol=1e-8)
    z_pap, _ = moreau_solve(U, c, psi, 0.3, method="paper", num_iters=20_000, tol=1e-8)
    np.testing.assert_allclose(_flat1(z_irls), _flat1(z_pap), atol=2e-4)
    g0 = float(moreau_objective(U, c, z_irls, psi, 0.3))
    for _ in range(5):
        pert = jax.tree.map(lambda x: x + 1e-2 * rng.normal(size=x.shape), z_irls)
        assert g0 <= float(moreau_objective(U, c, pert, psi, 0.3)) + 1e-6


@pytest.mark.parametrize("psi", ["l2", "l1"])
def test_objective_non_increasing_along_paper_iteration(psi):
    """O2: G(w) never increases along (25); moreau_solve runs that iteration."""
    rng = np.random.default_rng(4)
    U = _tree(rng, 6, scale=2.0)
    c = jnp.asarray([1.0, 2.0, 1.0, 3.0, 1.0, 1.0])
    p = c / jnp.sum(c)
    w_mean = jax.tree.map(lambda u: jnp.tensordot(p, u, axes=1), U)

    @jax.jit
    def step(w):
        theta = prox_stacked(psi, jax.tree.map(lambda u, x: u - x[None], U, w), 0.2)
        w = jax.tree.map(lambda a, t: a - jnp.tensordot(p, t, axes=1), w_mean, theta)
        return w, moreau_objective(U, c, w, psi, 0.2)

    w, objs = w_mean, [float(moreau_objective(U, c, w_mean, psi, 0.2))]
    for _ in range(40):
        w, obj = step(w)
        objs.append(float(obj))
    assert np.all(np.diff(objs) <= 1e-6) and objs[-1] < objs[0] - 1e-3
    z, it = moreau_solve(U, c, psi, 0.2, method="paper", num_iters=40, tol=0.0)
    assert int(it) == 40
    np.testing.assert_allclose(_flat1(z), _flat1(w), atol=1e-5)


def _np_weiszfeld(X, a, nu, iters=5000):
    z = a @ X / a.sum()
    for _ in range(iters):
        b = a / np.maximum(nu, np.linalg.norm(X - z, axis=1))
        z = b @ X / b.sum()
    return z


def test_weiszfeld_matches_float64_reference():
    rng = np.random.default_rng(5)
    with jax.enable_x64(True):
        X = rng.normal(size=(9, 5))
        X[:2, 0] += 5.0
        a = rng.uniform(0.5, 2.0, size=9)
        z = A.weiszfeld({"x": jnp.asarray(X)}, jnp.asarray(a), 1e-6, num_iters=2000,
                        tol=1e-14)["x"]
        assert z.dtype == jnp.float64
        np.testing.assert_allclose(np.asarray(z), _np_weiszfeld(X, a, 1e-6), atol=1e-9)
        # Fed+'s GeoMed+ is the exact geometric median when delta < min distance
        # to it; it equals the IRLS fixed point with nu = delta.
        gm = _np_weiszfeld(X, np.ones(9), 1e-12)
        dmin = np.min(np.linalg.norm(X - gm, axis=1))
        zd, _ = moreau_solve({"x": jnp.asarray(X)}, jnp.ones(9), "l2", 0.5 * dmin,
                             method="paper", num_iters=100_000, tol=1e-13)
        np.testing.assert_allclose(np.asarray(zd["x"]), gm, atol=1e-7)


def test_weiszfeld_coordinatewise_tends_to_coordinate_median():
    rng = np.random.default_rng(6)
    U = _tree(rng, 9)
    z = A.weiszfeld(U, jnp.ones(9), 1e-5, num_iters=300, coordinatewise=True)
    np.testing.assert_allclose(_flat1(z), np.median(_flat(U), 0), atol=1e-3)


# ------------------------------------------------------------ the aggregator


@pytest.mark.parametrize("psi", ["sq", "ind0", "zero"])
@pytest.mark.parametrize("weighted", [False, True])
def test_linear_penalties_give_the_mean_and_stream(psi, weighted):
    rng = np.random.default_rng(7)
    U, w = _tree(rng, 5), jnp.asarray([1.0, 4.0, 2.0, 3.0, 5.0])
    mask = jnp.asarray([1.0, 1.0, 0.0, 1.0, 1.0])
    agg = A.moreau(psi, 0.1, weighted=weighted)
    assert agg.linear_weights is not None
    want = A.mean(weighted=weighted).aggregate((), U, w, mask, None)[0]
    for method in ("irls", "paper"):
        got, st = _agg(A.moreau(psi, 0.1, method=method, weighted=weighted), U, w, mask)
        np.testing.assert_allclose(_flat1(got), _flat1(want), rtol=1e-6)
        assert int(st.iterations) == 0
    c = np.asarray(agg.linear_weights(w, mask))
    np.testing.assert_allclose(c, np.asarray(mask * w if weighted else mask))
    assert A.moreau("l2").linear_weights is None
    assert A.moreau("l1").linear_weights is None


@pytest.mark.parametrize("psi", ["l2", "l1"])
@pytest.mark.parametrize("method", ["irls", "paper"])
def test_invariances(psi, method):
    """Permutation invariance, translation equivariance, scaling
    A(sU; s delta) = s A(U; delta); masked (NaN) rows are ignored."""
    rng = np.random.default_rng(8)
    U = _tree(rng, 7)
    kw = {"method": method, "tol": 1e-8,
          "num_iters": 5000 if method == "paper" else 300}

    @jax.jit
    def agg(U, delta, mask):
        m = mask.shape[0]
        return A.moreau(psi, delta, **kw).aggregate((), U, jnp.ones(m), mask, None)[0]

    ones = jnp.ones(7)
    base = _flat1(agg(U, 0.3, ones))
    perm = np.array([3, 0, 6, 2, 5, 1, 4])
    got = _flat1(agg(jax.tree.map(lambda x: x[perm], U), 0.3, ones))
    np.testing.assert_allclose(got, base, atol=1e-5)
    shifted = agg(jax.tree.map(lambda x: x + 2.5, U), 0.3, ones)
    np.testing.assert_allclose(_flat1(shifted), base + 2.5, atol=1e-4)
    scaled = agg(jax.tree.map(lambda x: 2 * x, U), 0.6, ones)
    np.testing.assert_allclose(_flat1(scaled), 2 * base, atol=1e-4)
    # Two extra masked rows full of NaN / huge values change nothing.
    bad = jax.tree.map(lambda x: jnp.concatenate(
        [x, jnp.full((1, *x.shape[1:]), jnp.nan), jnp.full((1, *x.shape[1:]), 1e30)]),
        U)
    got = _flat1(agg(bad, 0.3, jnp.asarray([1.0] * 7 + [0.0, 0.0])))
    np.testing.assert_allclose(got, base, atol=1e-5)


def test_weights_act_as_replicated_clients():
    rng = np.random.default_rng(9)
    U = _tree(rng, 4)
    w = jnp.asarray([1.0, 3.0, 1.0, 2.0])
    rep = jax.tree.map(lambda x: jnp.repeat(x, np.array([1, 3, 1, 2]), axis=0), U)
    for psi in ("l2", "l1"):
        got = _agg(A.moreau(psi, 0.2, weighted=True, tol=1e-9, num_iters=500), U, w)[0]
        want = _agg(A.moreau(psi, 0.2, tol=1e-9, num_iters=500), rep)[0]
        np.testing.assert_allclose(_flat1(got), _flat1(want), atol=1e-5)


def test_jit_equals_no_jit_and_traced_delta():
    rng = np.random.default_rng(10)
    U = _tree(rng, 5)
    for psi in ("l2", "l1"):
        agg = A.moreau(psi, 0.25, method="paper", num_iters=300, tol=0.0)
        np.testing.assert_allclose(_flat1(_agg(agg, U)[0]),
                                   _flat1(_agg(agg, U, jit=False)[0]), rtol=1e-5,
                                   atol=1e-6)
    deltas = jnp.asarray([0.05, 0.5, 2.0])

    def run(d):
        return A.moreau("l2", d, tol=0.0, num_iters=100).aggregate(
            (), U, jnp.ones(5), jnp.ones(5), None)[0]

    swept = jax.jit(jax.vmap(run))(deltas)
    for i, d in enumerate([0.05, 0.5, 2.0]):
        one = _agg(A.moreau("l2", d, tol=0.0, num_iters=100), U)[0]
        np.testing.assert_allclose(_flat1(jax.tree.map(lambda x, i=i: x[i], swept)),
                                   _flat1(one), rtol=1e-5, atol=1e-6)
