"""Figures: the plotted data equal the inputs; bad input names the argument."""

import sys

import jax
import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import fedjax_pfl as fp
from fedjax_pfl import algorithms, data, models, plots


def _by_label(ax, label):
    lines = [ln for ln in ax.get_lines() if ln.get_label() == label]
    assert len(lines) == 1, [ln.get_label() for ln in ax.get_lines()]
    return lines[0]


def _xy(line):
    return np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)


def test_accuracy_cdf_steps_through_sorted_values_of_masked_clients():
    glob = np.array([0.5, 0.2, np.nan, 0.9, 0.4])
    pers = np.array([0.7, 0.6, 0.1, 1.0, 0.8])
    mask = np.array([1, 1, 1, 1, 0])
    fig = plots.client_accuracy_distribution({"global": glob, "personal": pers},
                                             mask=mask)
    (ax,) = fig.axes
    g, p = ax.get_lines()
    assert g.get_label().startswith("global") and p.get_label().startswith("personal")
    assert g.get_drawstyle() == "steps-post"
    x, y = _xy(g)  # NaN client and masked client dropped: 0.2, 0.5, 0.9
    np.testing.assert_allclose(x, [0.2, 0.2, 0.5, 0.9])
    np.testing.assert_allclose(y, [0, 1 / 3, 2 / 3, 1])
    x, y = _xy(p)
    np.testing.assert_allclose(x, [0.1, 0.1, 0.6, 0.7, 1.0])
    np.testing.assert_allclose(y, [0, 0.25, 0.5, 0.75, 1.0])
    assert "(unweighted mean 0.533)" in g.get_label()  # of the plotted clients


def test_accuracy_histogram_counts_clients_per_common_bin():
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0, 1, 40), rng.uniform(0.3, 1, 40)
    fig = plots.client_accuracy_distribution({"a": a, "b": b}, kind="both", bins=7)
    cdf, hist = fig.axes
    assert len(cdf.get_lines()) == 2
    edges = np.histogram_bin_edges(np.concatenate([a, b]), 7)
    heights = [[r.get_height() for r in c] for c in hist.containers]
    np.testing.assert_array_equal(heights[0], np.histogram(a, edges)[0])
    np.testing.assert_array_equal(heights[1], np.histogram(b, edges)[0])


@pytest.mark.parametrize("kwargs, arg", [
    ({"per_client": {}}, "per_client"),
    ({"per_client": {"g": [0.1, 0.2], "p": [0.3]}}, "per_client"),
    ({"per_client": {"g": [[0.1]]}}, "per_client['g']"),
    ({"per_client": {"g": [0.1, 0.2]}, "mask": [1]}, "mask"),
    ({"per_client": {"g": [0.1, 0.2]}, "mask": [0, 0]}, "per_client['g']"),
    ({"per_client": {"g": [0.1]}, "kind": "pdf"}, "kind"),
    ({"per_client": {"g": [0.1]}, "bins": 0}, "bins"),
])
def test_accuracy_distribution_rejects_bad_input(kwargs, arg):
    with pytest.raises(ValueError, match=r"^" + arg.replace("[", r"\[")):
        plots.client_accuracy_distribution(**kwargs)


def _sweep_history(lams, evals=3):
    s = len(lams)
    base = np.arange(s * evals, dtype=float).reshape(s, evals)
    return {"round": np.arange(evals),
            "personal/test/accuracy/mean": base / 100,
            "personal/test/accuracy/worst10": base / 200,
            "personal/test/accuracy/std": base / 1000,
            "global/test/accuracy/mean": base}


def test_lambda_sweep_plots_sorted_lambdas_and_per_client_lines():
    lams = np.array([1.0, 0.0, 0.1, 10.0])
    hist = _sweep_history(lams)
    per_client = np.array([[0.9, 0.5, np.nan], [0.1, 0.2, 0.3],
                           [0.4, 0.4, 0.4], [0.8, 0.7, 0.6]])
    fig = plots.lambda_sweep(lams, hist, per_client=per_client, eval_index=1)
    ax_acc, ax_std, ax_pc = fig.axes
    order = [1, 2, 0, 3]
    x, y = _xy(_by_label(ax_acc, "mean weighted by test examples"))
    np.testing.assert_allclose(x, [0, 0.1, 1, 10])
    np.testing.assert_allclose(y, hist["personal/test/accuracy/mean"][order, 1])
    _, y = _xy(_by_label(ax_acc, "worst 10 % of clients, unweighted mean"))
    np.testing.assert_allclose(y, hist["personal/test/accuracy/worst10"][order, 1])
    _, y = _xy(_by_label(ax_std, "std across clients"))
    np.testing.assert_allclose(y, hist["personal/test/accuracy/std"][order, 1])
    lines = ax_pc.get_lines()  # client 2 has a NaN: left out
    assert len(lines) == 2
    for c, line in enumerate(lines):
        np.testing.assert_allclose(_xy(line)[1], per_client[order, c])
    assert ax_acc.get_xscale() == "symlog"
    one = plots.lambda_sweep(lams, {k: v[:, -1] for k, v in hist.items()
                                    if k != "round"}, model="personal")
    assert len(one.axes) == 2
    np.testing.assert_allclose(_xy(one.axes[0].get_lines()[0])[1],
                               hist["personal/test/accuracy/mean"][order, -1])


@pytest.mark.parametrize("kwargs, arg", [
    ({"lams": [0.0, 1.0, 2.0]}, "history"),  # 3 lambdas, 4 rows
    ({"model": "finetuned"}, "history"),
    ({"history": [1, 2]}, "history"),
    ({"lams": [[0.0]]}, "lams"),
    ({"xscale": "log"}, "xscale"),  # a lambda is 0
    ({"xscale": "cubic"}, "xscale"),
    ({"eval_index": 3}, "eval_index"),
    ({"per_client": np.zeros((3, 2))}, "per_client"),
])
def test_lambda_sweep_rejects_bad_input(kwargs, arg):
    args = {"lams": [1.0, 0.0, 0.1, 10.0], "history": _sweep_history([0] * 4)}
    args.update(kwargs)
    with pytest.raises(ValueError, match="^" + arg):
        plots.lambda_sweep(**args)


def test_adversary_ratio_lines_and_error_bands():
    ratios = [0.5, 0.0, 0.2]
    acc = {"FedAvg": [0.3, 0.8, 0.6], "Ditto": [0.7, 0.85, 0.8]}
    fig = plots.adversary_ratio(ratios, acc, errors={"Ditto": [0.05, 0.01, 0.02]})
    (ax,) = fig.axes
    x, y = _xy(_by_label(ax, "FedAvg"))
    np.testing.assert_allclose(x, [0.0, 0.2, 0.5])
    np.testing.assert_allclose(y, [0.8, 0.6, 0.3])
    np.testing.assert_allclose(_xy(_by_label(ax, "Ditto"))[1], [0.85, 0.8, 0.7])
    (band,) = ax.collections  # only Ditto has errors
    verts = band.get_paths()[0].vertices
    np.testing.assert_allclose(verts[:, 1].max(), 0.86)
    np.testing.assert_allclose(verts[:, 1].min(), 0.65)
    assert ax.xaxis.get_major_formatter()(0.5) == "50%"


@pytest.mark.parametrize("kwargs, arg", [
    ({"ratios": [0.0, 1.5]}, "ratios"),
    ({"accuracies": {"a": [0.1]}}, r"accuracies\['a'\]"),
    ({"accuracies": [0.1, 0.2]}, "accuracies"),
    ({"errors": {"b": [0.1, 0.1]}}, "errors"),
    ({"errors": {"a": [0.1, -0.1]}}, r"errors\['a'\]"),
])
def test_adversary_ratio_rejects_bad_input(kwargs, arg):
    args = {"ratios": [0.0, 0.5], "accuracies": {"a": [0.9, 0.5]}}
    args.update(kwargs)
    with pytest.raises(ValueError, match="^" + arg):
        plots.adversary_ratio(**args)


HISTORY = [
    {"round": 0, "global/test/accuracy/mean": 0.1, "personal/test/accuracy/mean": 0.2},
    {"round": 5, "global/test/accuracy/mean": 0.4, "personal/test/accuracy/mean": 0.5,
     "train/loss": 2.0},
    {"round": 10, "global/test/accuracy/mean": float("nan"),
     "personal/test/accuracy/mean": 0.7, "train/loss": 1.0},
]


def test_training_curves_one_line_per_key_and_panels():
    keys = ["global/test/accuracy/mean", "personal/test/accuracy/mean"]
    fig = plots.training_curves(HISTORY, [keys, ["train/loss"]],
                                labels={"train/loss": "training loss"})
    acc, loss = fig.axes
    x, y = _xy(_by_label(acc, "global: mean weighted by test examples"))  # NaN row:
    # skipped
    np.testing.assert_allclose(x, [0, 5])
    np.testing.assert_allclose(y, [0.1, 0.4])
    x, y = _xy(_by_label(acc, "personal: mean weighted by test examples"))
    np.testing.assert_allclose(x, [0, 5, 10])
    np.testing.assert_allclose(y, [0.2, 0.5, 0.7])
    assert acc.get_ylabel() == "test accuracy (mean weighted by test examples)"
    x, y = _xy(_by_label(loss, "training loss"))  # absent in row 0
    np.testing.assert_allclose(x, [5, 10])
    np.testing.assert_allclose(y, [2.0, 1.0])
    single = plots.training_curves(HISTORY, "train/loss", logy=True,
                                   ylabels="loss")
    assert len(single.axes) == 1 and single.axes[0].get_yscale() == "log"
    assert single.axes[0].get_ylabel() == "loss"


@pytest.mark.parametrize("history, keys, arg", [
    (HISTORY, "nfl/delta", "keys"),
    (HISTORY, [], "keys"),
    (HISTORY, [["train/loss"], []], "keys"),
    ([], "train/loss", "history"),
    ({"train/loss": [1.0]}, "train/loss", "history"),
])
def test_training_curves_rejects_bad_input(history, keys, arg):
    with pytest.raises(ValueError, match="^" + arg):
        plots.training_curves(history, keys)
    with pytest.raises(ValueError, match="^ylabels"):
        plots.training_curves(HISTORY, [["train/loss"], ["train/loss"]],
                              ylabels=["one"])


def _nfl_history():
    rows = []
    for r in range(12):
        row = {"round": r, "nfl/delta": 0.5 - 0.03 * r, "nfl/detected": int(r >= 7)}
        if r % 4 == 0:
            row["nfl/beta"] = -0.1 + 0.01 * r
        rows.append(row)
    return rows


def test_nfl_curves_delta_epsilon_detection_and_beta():
    rows = _nfl_history()
    fig = plots.nfl_curves(rows, epsilon=0.2)
    delta_ax, beta_ax = fig.axes
    x, y = _xy(_by_label(delta_ax, r"$\Delta$"))
    np.testing.assert_allclose(x, np.arange(12))
    np.testing.assert_allclose(y, 0.5 - 0.03 * np.arange(12))
    np.testing.assert_allclose(
        _xy(_by_label(delta_ax, r"threshold $\varepsilon = 0.2$"))[1], 0.2)
    np.testing.assert_allclose(_xy(_by_label(delta_ax, "NFL detected (round 7)"))[0], 7)
    x, y = _xy(_by_label(beta_ax, r"$\beta$"))
    np.testing.assert_allclose(x, [0, 4, 8])
    np.testing.assert_allclose(y, [-0.1, -0.06, -0.02])
    np.testing.assert_allclose(_xy(_by_label(beta_ax, r"$\beta = 0$"))[1], 0.0)
    only = plots.nfl_curves([{k: v for k, v in r.items() if k != "nfl/beta"}
                             for r in rows], detection_round=3, epsilon=None)
    (ax,) = only.axes
    assert [ln.get_label() for ln in ax.get_lines()] == [
        r"$\Delta$", "NFL detected (round 3)"]
    renamed = plots.nfl_curves([{"round": 1, "d": 0.3}], delta_key="d")
    assert _xy(_by_label(renamed.axes[0], r"$\Delta$"))[1].tolist() == [0.3]


@pytest.mark.parametrize("kwargs, arg", [
    ({"history": [{"round": 0, "x": 1.0}]}, "history"),
    ({"history": "nfl"}, "history"),
    ({"epsilon": -1.0}, "epsilon"),
    ({"epsilon": float("nan")}, "epsilon"),
    ({"detection_round": "31"}, "detection_round"),
])
def test_nfl_curves_rejects_bad_input(kwargs, arg):
    args = {"history": _nfl_history()}
    args.update(kwargs)
    with pytest.raises(ValueError, match="^" + arg):
        plots.nfl_curves(**args)


def test_path_writes_a_png(tmp_path):
    path = tmp_path / "curves.png"
    fig = plots.training_curves(HISTORY, "train/loss", title="loss", path=path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert fig._suptitle.get_text() == "loss"
    long = "a title far too long for one line of a five-inch figure " * 3
    fig = plots.training_curves(HISTORY, "train/loss", title=long)
    assert fig._suptitle.get_text().replace("\n", " ") == long.strip()
    assert max(map(len, fig._suptitle.get_text().split("\n"))) <= 55


def test_missing_matplotlib_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install fedjax_pfl\[plots\]"):
        plots.training_curves(HISTORY, "train/loss")


def test_per_client_values_reproduce_the_drivers_summaries():
    """The size-weighted mean of the recomputed per-client values equals the
    history's mean, for every view (finetuned uses the evaluation key)."""
    fed = data.fedprox_synthetic(1.0, 1.0, num_clients=6, max_size=40, seed=1)
    model = models.logistic_regression((60,), 10)

    def make(client_lr, finetune_steps=0):
        return algorithms.fedavg(model, client_lr=client_lr, num_local_steps=2,
                                 batch_size=4, cohort_size=3,
                                 finetune_steps=finetune_steps)

    rolled = fp.EngineConfig(unroll=False)
    key = jax.random.key(3)
    counts = np.asarray(fed.test.counts, float)
    alg = make(0.5, finetune_steps=2)
    res = fp.simulate(alg, fed, num_rounds=2, key=key, progress=False,
                      splits=("test",), engine=rolled)
    with fp.core.execution(rolled):
        pc = plots.per_client_metric(alg, res.state, fed, key=key)
    assert set(pc) == {"global", "finetuned"}
    for name, v in pc.items():
        assert v.shape == (6,)
        np.testing.assert_allclose((v * counts).sum() / counts.sum(),
                                   res.history[-1][f"{name}/test/accuracy/mean"],
                                   atol=1e-6)
    lrs = {"client_lr": [0.0, 0.5]}
    states, hist = fp.sweep(make, lrs, fed, num_rounds=2, key=key, splits=("test",),
                            engine=rolled)
    with fp.core.execution(rolled):
        spc = plots.sweep_per_client(make, lrs, states, fed, key=key, metric="loss")
    (v,) = spc.values()
    assert v.shape == (2, 6)
    np.testing.assert_allclose((v * counts).sum(1) / counts.sum(),
                               hist["global/test/loss/mean"][:, -1], rtol=1e-5)
    assert v[0, 0] != v[1, 0]  # lr 0 never moves the model; lr 0.5 does
    with pytest.raises(ValueError, match="^split"):
        plots.per_client_metric(alg, res.state, fed, key=key, split="val")
    with pytest.raises(ValueError, match="^metric"):
        plots.per_client_metric(alg, res.state, fed, key=key, metric="f1")
    with pytest.raises(ValueError, match="^hparams"):
        plots.sweep_per_client(make, {"client_lr": [[0.0]]}, states, fed, key=key)
