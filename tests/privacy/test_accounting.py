"""Accounting through dp_accounting against independently computed values (epsilon
table, largest T, the Abadi cross-check, the closed-form RDP at order 2) and PLD."""

import dp_accounting
import numpy as np
import pytest

from fedjax_pfl import privacy

Q, DELTA = 0.05, 1e-5
ORD = privacy.INTEGER_ORDERS  # the FedFDP authors' code's orders


def _event(sigma, sigma_loss, rounds):
    """FedFDP's event; without a loss release (``None``), DP-SGD's."""
    if sigma_loss is None:
        return privacy.dp_sgd_event(Q, sigma, rounds)
    return privacy.fedfdp_event(Q, sigma, rounds, sigma_loss)


def test_fedfdp_event_counts_the_loss_release():
    with pytest.raises(ValueError, match="loss_noise_multiplier"):
        privacy.fedfdp_event(Q, 2.0, 10, None)
    with_loss = privacy.epsilon(privacy.fedfdp_event(Q, 2.0, 10, 5.0), DELTA)
    assert with_loss > privacy.epsilon(privacy.dp_sgd_event(Q, 2.0, 10), DELTA)


@pytest.mark.parametrize("sigma,sigma_loss,rounds,eps", [
    (2, None, 100, 1.2222), (2, None, 1000, 4.0260), (1, None, 100, 4.1117),
    (1, None, 1000, 12.0629), (2, 1, 100, 4.2973), (2, 2, 100, 1.7229),
    (1, 1, 100, 5.3711)])
def test_epsilon_table(sigma, sigma_loss, rounds, eps):
    ev = _event(sigma, sigma_loss, rounds)
    assert privacy.epsilon(ev, DELTA, orders=ORD) == pytest.approx(eps, rel=0.01)
    # the richer default orders can only lower epsilon
    assert privacy.epsilon(ev, DELTA) <= privacy.epsilon(ev, DELTA, orders=ORD) + 1e-9


def test_local_steps_compose_like_rounds():
    a = privacy.epsilon(privacy.dp_sgd_event(Q, 2.0, 50, num_local_steps=2), DELTA)
    b = privacy.epsilon(privacy.dp_sgd_event(Q, 2.0, 100), DELTA)
    assert a == b


@pytest.mark.parametrize("target,sigma,sigma_loss,expected", [
    (1.0, 2, None, 65), (3.52, 2, None, 776), (3.52, 1, None, 68),
    (3.52, 2, 5, 683), (3.52, 2, 2.5, 486), (1.0, 2, 1, 0)])
def test_max_rounds(target, sigma, sigma_loss, expected):
    def event(t):
        return _event(sigma, sigma_loss, t)

    t = privacy.max_rounds(target, DELTA, event, orders=ORD)
    assert t == pytest.approx(expected, rel=0.01)
    if t > 0:  # the defining property, whatever the exact count
        assert privacy.epsilon(event(t), DELTA, orders=ORD) <= target
    assert privacy.epsilon(event(t + 1), DELTA, orders=ORD) > target


def test_abadi_cross_check_and_order_two_closed_form():
    ev = privacy.sampled_gaussian_event(256 / 60000, 1.1, 14063)
    assert privacy.epsilon(ev, DELTA, orders=ORD) == pytest.approx(2.5971, rel=0.01)
    # one step, alpha = 2: R = log(1 + q^2 (e^{1/sigma^2} - 1)) = 0.004286504...
    eps = privacy.epsilon(privacy.sampled_gaussian_event(Q, 1.0, 1), DELTA,
                          orders=[2.0])
    rdp = eps - np.log(0.5) + (np.log(DELTA) + np.log(2.0))  # Balle conversion
    assert rdp == pytest.approx(np.log1p(Q**2 * np.expm1(1.0)), rel=1e-6)
    assert rdp == pytest.approx(0.004286504, rel=1e-6)


def test_pld_accountant():
    # no subsampling: PLD is (near) exact for the Gaussian mechanism
    ev = privacy.sampled_gaussian_event(1.0, 3.0, 1)
    exact = dp_accounting.get_epsilon_gaussian(3.0, DELTA)
    assert privacy.epsilon(ev, DELTA, accountant="pld") == pytest.approx(exact,
                                                                         rel=0.01)
    # subsampled: PLD is tighter than RDP, and not absurdly so
    ev = privacy.sampled_gaussian_event(0.01, 1.1, 1000)
    pld = privacy.epsilon(ev, DELTA, accountant="pld")
    rdp = privacy.epsilon(ev, DELTA)
    assert 0.8 * rdp < pld < rdp


def test_client_level_event():
    ev = privacy.client_level_event(10, 100, 1.0, 50)
    assert privacy.epsilon(ev, DELTA) == privacy.epsilon(
        privacy.sampled_gaussian_event(0.1, 1.0, 50), DELTA)
    with pytest.raises(ValueError, match="cohort_size"):
        privacy.client_level_event(200, 100, 1.0, 50)
    with pytest.raises(ValueError, match="sampling"):
        privacy.client_level_event(10, 100, 1.0, 50, sampling="shuffle")


def test_client_level_event_fixed_size_cohort():
    def eps(m, n=100, z=2.0, t=50):
        return privacy.epsilon(privacy.client_level_event(
            m, n, z, t, sampling="fixed_size"), DELTA)

    # full participation: no sampling; replacing a client moves the clipped sum by
    # 2S, so it is the Gaussian mechanism with multiplier z/2, T times
    assert eps(100) == pytest.approx(privacy.epsilon(
        privacy.sampled_gaussian_event(1.0, 1.0, 50), DELTA), rel=1e-6)
    # amplification: a smaller cohort spends less; more rounds spend more
    assert eps(5) < eps(20) < eps(100)
    assert eps(10, t=25) < eps(10, t=50)
    # replace-one with 2S sensitivity is more conservative than the Poisson
    # approximation at the same rate (add/remove, sensitivity S)
    poisson = privacy.epsilon(privacy.client_level_event(10, 100, 2.0, 50), DELTA)
    assert eps(10) > poisson
    with pytest.raises(ValueError, match="num_rounds"):
        privacy.client_level_event(10, 100, 1.0, -1, sampling="fixed_size")
    with pytest.raises(ValueError, match="accountant: 'pld'"):
        privacy.epsilon(privacy.client_level_event(10, 100, 1.0, 5,
                                                   sampling="fixed_size"),
                        DELTA, accountant="pld")


def test_bad_arguments():
    ev = privacy.dp_sgd_event(Q, 1.0, 10)
    for kw, name in [({"delta": 0.0}, "delta"), ({"delta": 1.0}, "delta"),
                     ({"delta": 1e-5, "accountant": "moments"}, "accountant")]:
        with pytest.raises(ValueError, match=name):
            privacy.epsilon(ev, **kw)
    with pytest.raises(ValueError, match="sampling_rate"):
        privacy.dp_sgd_event(1.5, 1.0, 10)
    with pytest.raises(ValueError, match="noise_multiplier"):
        privacy.dp_sgd_event(0.1, 0.0, 10)
    with pytest.raises(ValueError, match="count"):
        privacy.sampled_gaussian_event(0.1, 1.0, -1)
    with pytest.raises(ValueError, match="target_epsilon"):
        privacy.max_rounds(-1.0, DELTA, lambda t: privacy.dp_sgd_event(Q, 1.0, t))


def _ev():
    return privacy.dp_sgd_event(Q, 1.0, 10)


@pytest.mark.parametrize("call, match", [
    # negative counts are refused under their own name (-2 rounds x -3 steps used
    # to compose +6 times; -1 rounds x 2 steps was reported as "count")
    (lambda: privacy.dp_sgd_event(Q, 1.0, -2, -3), "num_rounds: must be an integer"),
    (lambda: privacy.dp_sgd_event(Q, 1.0, 10, -2), "num_local_steps: must be an int"),
    (lambda: privacy.dp_sgd_event(Q, 1.0, -1), "num_rounds: must be an integer >= 0"),
    (lambda: privacy.fedfdp_event(Q, 2.0, -5, 5.0), "num_rounds"),
    (lambda: privacy.fedfdp_event(Q, 2.0, 5, 5.0, -1), "num_local_steps"),
    (lambda: privacy.client_level_event(10, 100, 1.0, -1), "num_rounds"),
    (lambda: privacy.sampled_gaussian_event(Q, 1.0, -3), "count: must be an integer"),
    # wrong types: never silently rounded or truth-tested
    (lambda: privacy.dp_sgd_event(Q, 1.0, 2.7), "num_rounds: must be an integer"),
    (lambda: privacy.dp_sgd_event(Q, 1.0, True), "num_rounds: must be an integer"),
    (lambda: privacy.dp_sgd_event(Q, 1.0, "10"), "num_rounds: must be an integer"),
    (lambda: privacy.dp_sgd_event(Q, 1.0, 10, 1.5), "num_local_steps"),
    (lambda: privacy.sampled_gaussian_event(Q, 1.0, None), "count"),
    (lambda: privacy.dp_sgd_event("0.05", 1.0, 10), "sampling_rate: must be a num"),
    (lambda: privacy.dp_sgd_event(Q, "1.0", 10), "noise_multiplier: must be a num"),
    (lambda: privacy.dp_sgd_event(Q, float("inf"), 10), "noise_multiplier"),
    (lambda: privacy.fedfdp_event(Q, 2.0, 5, -1.0), "loss_noise_multiplier"),
    (lambda: privacy.client_level_event(10.0, 100, 1.0, 5), "cohort_size"),
    (lambda: privacy.client_level_event(0, 100, 1.0, 5), "cohort_size"),
    (lambda: privacy.client_level_event(10, "100", 1.0, 5), "num_clients"),
    (lambda: privacy.client_level_event(10, 100, 1.0, 5.0, sampling="fixed_size"),
     "num_rounds"),
    (lambda: privacy.epsilon("event", DELTA), "event: must be a dp_accounting"),
    (lambda: privacy.epsilon(_ev(), "1e-5"), "delta: must be a number"),
    (lambda: privacy.epsilon(_ev(), float("nan")), "delta"),
    (lambda: privacy.epsilon(_ev(), DELTA, orders=[]), "orders"),
    (lambda: privacy.epsilon(_ev(), DELTA, orders=[1.0, 2.0]), "orders"),
    (lambda: privacy.epsilon(_ev(), DELTA, pld_discretization=0.0),
     "pld_discretization"),
    (lambda: privacy.max_rounds(1.0, DELTA, 3), "event_fn"),
    (lambda: privacy.max_rounds(1.0, 2.0, _ev), "delta"),
    (lambda: privacy.max_rounds(1.0, DELTA, lambda t: _ev(), upper=0), "upper"),
    (lambda: privacy.max_rounds("1", DELTA, lambda t: _ev()), "target_epsilon"),
])
def test_counts_rounds_steps_and_types_are_refused_by_name(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_zero_counts_are_allowed():
    # a zero-fold composition is epsilon 0 (dp_accounting itself refuses count 0)
    assert privacy.epsilon(privacy.client_level_event(
        10, 100, 1.0, 0, sampling="fixed_size"), DELTA) == 0.0
    assert privacy.epsilon(privacy.dp_sgd_event(Q, 1.0, 0), DELTA) == 0.0
    assert privacy.epsilon(privacy.dp_sgd_event(Q, 1.0, 5, 0), DELTA) == 0.0
    ev = privacy.dp_sgd_event(Q, 1.0, np.int64(3), np.int32(2))  # NumPy ints
    assert privacy.epsilon(ev, DELTA) == privacy.epsilon(
        privacy.dp_sgd_event(Q, 1.0, 6), DELTA)
