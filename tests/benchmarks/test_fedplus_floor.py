"""benchmarks/fedplus_table2.mean_shift_error: the regression's error of a
model that learns only each party's mean shift lies between the noise (a
perfect model) and the untrained model's test MSE, and grows with the spread."""


import numpy as np
from helpers import load_benchmark

from fedjax_pfl import data

ft = load_benchmark("fedplus_table2")


def test_mean_shift_error_is_between_the_noise_and_the_untrained_model():
    for party_mean in ("vector", "scalar"):
        floor = ft.mean_shift_error(0, "variance", party_mean)
        reg = data.fedplus_synthetic_regression(10, party_mean=party_mean, seed=0)
        untrained = float(np.mean(np.asarray(reg.data.test.y) ** 2))  # w = 0
        # Var v = 2 for a perfect model; the untrained model also pays the
        # mean-shift term (w_k . mu_k)^2, most of its error
        assert 2.0 < floor < 0.5 * untrained
    # N(0, s) read as a std: the w's variances grow 5x (normal) to 50x (outlier)
    assert 4 < ft.mean_shift_error(0, "std") / ft.mean_shift_error(0) < 60
