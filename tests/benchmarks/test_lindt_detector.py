"""benchmarks/lindt_detector.py: the detector's flag round, detection and false
alarms computed from hand-made per-round series."""


import numpy as np
from helpers import load_benchmark

ld = load_benchmark("lindt_detector")


def record(scheme, ratio, delta, update_norm, seed=0):
    return {"method": "fedavg", "scheme": scheme, "attack_ratio": ratio,
            "noise_std": 0.01, "rounds": len(delta), "lr": 0.05, "lr_decay": 0.995,
            "eps": 0.1, "r_prime": 3, "seed": seed, "beta": 1.0,
            "per_round": {"nfl/delta": list(delta),
                          "server/update_norm": list(update_norm)}}


def test_flag_round_counts_rounds_above_eps_until_r_prime_is_passed():
    assert ld.flag_round([0.2, 0.0, 0.2, 0.2, 0.2, 0.2], 0.1, 3) == 5
    assert ld.flag_round([0.2, 0.2, 0.2], 0.1, 3) is None
    assert ld.flag_round([0.1] * 10, 0.1, 0) is None  # strictly above eps


def test_report_separates_detection_from_false_alarms():
    rounds = 10
    nfl = record("mixed", 0.2, [0.5] * rounds, [1.0] * rounds)
    # a normal federation whose Delta also stays above eps (a false alarm under
    # the paper's rule) but is small next to the aggregate's step
    normal = record("iid", 0.0, [0.2] * rounds, [10.0] * rounds)
    text = ld.report([nfl, normal], grid=[0.1, 0.3])
    rule = [ln for ln in text.splitlines() if ln.startswith("| NFL")
            or ln.startswith("| normal")]
    assert rule[0].endswith("| 4 |") and rule[1].endswith("| 4 |")  # both flagged
    tables = text.split("\n\nDelta")
    count, ratio, window = tables[1], tables[2], tables[3]
    assert count.startswith(", the paper's count rule, r' = 3")
    assert "| 0.1 | 1/1 | 1/1 | 4 |" in count
    assert "| 0.3 | 1/1 | 0/1 | 4 |" in count
    assert ratio.startswith(" / ||aggregate||, the count rule")
    assert "| 0.1 | 1/1 | 0/1 | 4 |" in ratio  # 0.5 vs 0.02: separated
    assert window.startswith(", window rule")
    assert "| 0.1 | 0/1 | 0/1 | nan |" in window  # 10 rounds < the window
    assert np.isfinite(float(rule[0].split("|")[5]))


def test_window_rule_looks_at_where_the_statistic_settled():
    sparse = [1.0, 0.01, 0.01] * 60  # above eps one round in three
    assert ld.flag_round(sparse, 0.1, 50) == 151  # the count rule fires
    assert ld.window_flag_round(sparse, 0.1, 50, window=50) is None
    settled_high = [0.01] * 40 + [1.0] * 80
    # round 65: 25 of the last 50 above, the median (mean of the middle two) 0.505
    assert ld.window_flag_round(settled_high, 0.1, 50, window=50) == 65


def test_the_clients_own_step_normalises_delta_when_recorded():
    rounds = 10
    # Delta larger in the normal run, because its clients move further
    nfl = record("mixed", 0.2, [0.5] * rounds, [1.0] * rounds)
    normal = record("iid", 0.0, [0.8] * rounds, [1.0] * rounds)
    text = ld.report([nfl, normal], grid=[0.3, 0.6])
    assert "mean ||u_k||" not in text  # not recorded: the table is left out
    nfl["per_round"]["nfl/client_update_norm"] = [1.0] * rounds
    normal["per_round"]["nfl/client_update_norm"] = [4.0] * rounds
    text = ld.report([nfl, normal], grid=[0.3, 0.6])
    medians = text.split("Medians over the last 50 rounds, per run")[1]
    assert ("| environment | seed | Delta | Delta / aggregate norm | Delta / mean "
            "client step | mean client step | alignment: aggregate norm / mean "
            "client step |") in medians
    assert "| NFL (mixed, 20 % attackers) | 0 | 0.5 | 0.5 | 0.5 | 1 | 1 |" in medians
    assert ("| normal (iid, 0 % attackers) | 0 | 0.8 | 0.8 | 0.2 | 4 | 0.25 |"
            in medians)
    own = text.split("Delta / mean ||u_k||")[1]
    assert "| 0.3 | 1/1 | 0/1 | 4 |" in own  # 0.5 vs 0.2: separated
    count = text.split("\n\nDelta")[1]
    assert "| 0.6 | 0/1 | 1/1 | nan |" in count  # raw Delta: the wrong way round


def test_runs_of_other_models_or_gradient_bounds_are_not_pooled():
    rounds = 10
    mlp = record("mixed", 0.2, [0.5] * rounds, [1.0] * rounds)  # no model key
    cnn = dict(record("mixed", 0.2, [0.5] * rounds, [1.0] * rounds),
               model="cnn", class_sigma=2.0, grad_clip=5.0)
    normal = dict(record("iid", 0.0, [0.2] * rounds, [10.0] * rounds),
                  model="cnn", class_sigma=0.0, grad_clip=5.0)
    text = ld.report([mlp, cnn, normal], grid=[0.3])
    heads = [ln for ln in text.splitlines() if ln.startswith("## ")]
    assert heads == [
        ("## cnn, noise std 0.01, 10 rounds, lr 0.05 decaying 0.995 a round, "
         "gradient norm bound 5"),
        "## mlp, noise std 0.01, 10 rounds, lr 0.05 decaying 0.995 a round"]
    cnn_part, mlp_part = text.split("## mlp")
    assert "| NFL (mixed, class sigma 2, 20 % attackers" in cnn_part
    assert "| normal (iid, 0 % attackers" in cnn_part
    assert "| 0.3 | 1/1 | 0/1 | 4 |" in cnn_part  # the pair's characteristic
    assert "no pair of NFL and normal runs" in mlp_part
