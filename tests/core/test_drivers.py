"""simulate/sweep drivers and input validation."""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pfl as fp
from fedjax_pfl import algorithms, metrics, models
from fedjax_pfl import data as fdata

MODEL = models.logistic_regression((10,), 3)


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(0.5, 0.5, num_clients=6, dim=10, num_classes=3,
                                   max_size=30, min_size=8, seed=1)


def make(lr, **kw):
    base = dict(client_lr=lr, num_local_steps=2, batch_size=4, cohort_size=3)
    base.update(kw)
    return algorithms.fedavg(MODEL, **base)


def test_sweep_equals_separate_runs(data):
    lrs = [0.01, 0.3, 1.0]
    states, hist = fp.sweep(lambda lr: make(lr), {"lr": lrs}, data, num_rounds=5,
                            eval_every=2, key=jax.random.key(4))
    assert hist["round"].tolist() == [0, 2, 4, 5]
    for i, lr in enumerate(lrs):
        res = fp.simulate(make(lr), data, num_rounds=5, eval_every=2,
                          key=jax.random.key(4), progress=False)
        chex.assert_trees_all_close(
            jax.tree.map(lambda a: a[i], states.server.params),
            res.state.server.params, atol=1e-5)
        got = hist["global/test/accuracy/mean"][i]
        want = [r["global/test/accuracy/mean"] for r in res.history]
        np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("hparams", [{}, {"lr": [0.3, 1.0, 0.3]}])
def test_sweep_over_seeds_equals_separate_runs(data, hparams):
    seeds = [0, 7, 3]
    keys = jax.vmap(jax.random.key)(jnp.asarray(seeds))
    lrs = hparams.get("lr", [0.3] * 3)
    states, hist = fp.sweep(lambda lr=0.3: make(lr), hparams, data, num_rounds=4,
                            eval_every=2, key=keys)
    finals = hist["global/test/accuracy/mean"][:, -1]
    for i, (seed, lr) in enumerate(zip(seeds, lrs, strict=True)):
        res = fp.simulate(make(lr), data, num_rounds=4, eval_every=2,
                          key=jax.random.key(seed), progress=False)
        chex.assert_trees_all_close(
            jax.tree.map(lambda a: a[i], states.server.params),
            res.state.server.params, atol=1e-5)
        np.testing.assert_allclose(finals[i],
                                   res.history[-1]["global/test/accuracy/mean"],
                                   atol=1e-5)
    first = jax.tree.leaves(states.server.params)[0]
    assert not np.allclose(first[0], first[1])  # the seeds differ


@pytest.mark.parametrize("hparams,key,match", [
    ({}, jax.random.key(0), "hparams: give at least one"),
    ({"lr": [0.1, 0.2]}, jax.vmap(jax.random.key)(jnp.arange(3)), "same length"),
    ({}, jax.vmap(jax.random.key)(jnp.arange(4)).reshape(2, 2), "key: one key"),
])
def test_sweep_refuses_bad_seed_batches(data, hparams, key, match):
    with pytest.raises(ValueError, match=match):
        fp.sweep(lambda lr=0.1: make(lr), hparams, data, num_rounds=1, key=key)


def test_the_progress_bar_says_compiling_then_shows_the_last_evaluation(data, capsys):
    res = fp.simulate(make(0.1), data, num_rounds=4, eval_every=2,
                      key=jax.random.key(0), progress=True)
    err = capsys.readouterr().err
    assert "compiling" in err.split("\r")[1]  # the bar's first line
    last = err.rstrip().split("\r")[-1]  # the bar as closed
    assert "4/4" in last and "compiling" not in last
    assert f"global={res.history[-1]['global/test/accuracy/mean']:.3f}" in last


def test_sweep_rejects_ragged_hparams(data):
    with pytest.raises(ValueError, match="hparams"):
        fp.sweep(lambda lr, b: make(lr), {"lr": [0.1, 0.2], "b": [1.0]}, data,
                 num_rounds=1, key=jax.random.key(0))


def test_simulate_writes_jsonl_and_resumes(tmp_path, data):
    path = tmp_path / "h.jsonl"
    full = fp.simulate(make(0.1), data, num_rounds=4, eval_every=2,
                       key=jax.random.key(0), progress=False, jsonl_path=str(path))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 2, 4]
    half = fp.simulate(make(0.1), data, num_rounds=2, key=jax.random.key(0),
                       progress=False)
    rest = fp.simulate(make(0.1), data, num_rounds=2, key=jax.random.key(0),
                       progress=False, state=half.state)
    np.testing.assert_array_equal(
        jax.tree.leaves(rest.state.server.params)[0],
        jax.tree.leaves(full.state.server.params)[0])


@pytest.mark.parametrize("kwargs, match", [
    (dict(client_lr=0.0), "client_lr"),
    (dict(client_lr=-1.0), "client_lr"),
    (dict(client_lr=float("nan")), "client_lr"),
    (dict(num_local_steps=0), "num_local_steps"),
    (dict(batch_size=0), "batch_size"),
    (dict(cohort_size=0), "cohort_size"),
    (dict(sampling="sometimes"), "sampling"),
    (dict(cohort="random"), "cohort"),
])
def test_invalid_algorithm_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(kwargs.pop("client_lr", 0.1), **kwargs)


def test_cohort_larger_than_clients_rejected_before_work(tmp_path, data):
    # the algorithm checks its cohort when its round is built for the data: the
    # round is traced before the first evaluation, so nothing is written
    alg = make(0.1, cohort_size=50)
    with pytest.raises(ValueError, match="cohort_size"):
        fp.simulate(alg, data, num_rounds=1, key=jax.random.key(0), progress=False,
                    jsonl_path=str(tmp_path / "h.jsonl"),
                    checkpoint_dir=str(tmp_path / "ck"))
    assert not (tmp_path / "h.jsonl").exists() and not (tmp_path / "ck").exists()


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_rounds=0), "num_rounds"),
    (dict(num_rounds=2, eval_every=0), "eval_every"),
    (dict(num_rounds=2, key=0), "key"),
])
def test_invalid_run_arguments(data, kwargs, match):
    kw = dict(key=jax.random.key(0), progress=False)
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        fp.simulate(make(0.1), data, **kw)


def test_invalid_engine_arguments():
    with pytest.raises(ValueError, match="strategy"):
        fp.EngineConfig("pmap")
    with pytest.raises(ValueError, match="map_batch_size"):
        fp.EngineConfig("map", 0)


def test_scanned_and_per_round_calls_agree_and_state_is_not_consumed(data):
    alg = algorithms.ditto(MODEL, lam=0.5, client_lr=0.1, num_local_steps=2,
                           batch_size=4, cohort_size=3)
    kw = dict(num_rounds=5, eval_every=2, key=jax.random.key(3), progress=False)
    a = fp.simulate(alg, data, scan_rounds=True, **kw)
    b = fp.simulate(alg, data, scan_rounds=False, **kw)
    chex.assert_trees_all_close(a.state, b.state, atol=1e-6)
    for ra, rb in zip(a.history, b.history):
        np.testing.assert_allclose(ra["personal/test/accuracy/mean"],
                                   rb["personal/test/accuracy/mean"], atol=1e-6)
        np.testing.assert_allclose(ra.get("train/loss", 0), rb.get("train/loss", 0),
                                   rtol=1e-5)
    # continuing from a caller's state leaves that state usable (it is copied)
    c = fp.simulate(alg, data, state=a.state, scan_rounds=False, **kw)
    assert int(c.state.round) == 10 and int(a.state.round) == 5
    np.asarray(jax.tree.leaves(a.state.clients)[0])  # not deleted by donation


def test_participation_counts_match_the_rounds(data):
    """Clients whose personal model moved are exactly those the cohort
    reconstruction says took part."""
    from fedjax_pfl.core import participation_counts

    alg = algorithms.ditto(MODEL, lam=0.5, client_lr=0.1, num_local_steps=2,
                           batch_size=4, cohort_size=2, cohort="size_weighted")
    key = jax.random.key(5)
    res = fp.simulate(alg, data, num_rounds=2, key=key, progress=False)
    counts = participation_counts(data, 2, jax.random.split(key)[1], 2,
                                  "size_weighted")
    assert counts.sum() == 4
    w0 = res.state.clients.personal  # compare with the initial (broadcast) w^0
    init = alg.init(jax.random.split(key)[0], data).clients.personal
    moved = np.asarray(jax.tree.leaves(jax.tree.map(
        lambda a, b: jnp.any(a != b, axis=tuple(range(1, a.ndim))), w0, init))[0])
    np.testing.assert_array_equal(moved, counts > 0)


def test_evaluate_state_reproduces_simulates_last_evaluation(data):
    # finetuned evaluation draws minibatches: the key schedule must match simulate's
    alg = make(0.3, finetune_steps=3)
    key = jax.random.key(7)
    res = fp.simulate(alg, data, num_rounds=3, eval_every=3, key=key, progress=False)
    last = res.history[-1]
    ev = jax.jit(lambda s: fp.evaluate_state(alg, s, data, key=key, splits=("test",),
                                             per_client=True))(res.state)
    for name in ("finetuned", "global"):
        k = f"{name}/test/accuracy/mean"
        assert float(ev[k]) == pytest.approx(last[k], abs=1e-6)
    per = np.asarray(ev["finetuned/test/accuracy/per_client"])
    assert per.shape == (data.num_clients,)
    only = fp.evaluate_state(alg, res.state, data, key=key, views=("global",),
                             splits=("test",))
    assert {k.split("/")[0] for k in only} == {"global"}
    # another key changes the finetuned models (the test above can fail)
    other = fp.evaluate_state(alg, res.state, data, key=jax.random.key(8),
                              splits=("test",), per_client=True)
    assert not np.allclose(np.asarray(other["finetuned/test/loss/per_client"]),
                           np.asarray(ev["finetuned/test/loss/per_client"]))


# ------------------------------------- refused before any round (or any file)


def _clients(dim=10, labels=(0, 1, 2), num_clients=6, rows=8, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(rows, dim)).astype(np.float32),
             rng.choice(np.asarray(labels), rows).astype(np.int32))
            for _ in range(num_clients)]


def _refused_before_any_work(tmp_path, data, match, alg=None, **kwargs):
    """simulate raises ``match`` and wrote nothing: no history row, no
    checkpoint folder (so no round and no evaluation ran)."""
    kw = dict(num_rounds=2, key=jax.random.key(0), progress=False,
              jsonl_path=str(tmp_path / "h.jsonl"),
              checkpoint_dir=str(tmp_path / "ck"))
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        fp.simulate(alg or make(0.1), data, **kw)
    assert not (tmp_path / "h.jsonl").exists()
    assert not (tmp_path / "ck").exists()


BAD_LABELS = r"data: labels of the 'train' split must be class indices in \[0, 3\)"
BAD_FEATURES = r"data: features of shape \(12,\) \(float32\) do not match the model"


def test_labels_outside_the_models_classes_are_refused(tmp_path):
    bad = fdata.from_client_arrays(_clients(labels=(0, 1, 5)),
                                   test=_clients(num_clients=6, rows=3))
    _refused_before_any_work(tmp_path, bad, BAD_LABELS + r".*got labels in \[0, 5\]")
    neg = fdata.from_client_arrays(_clients(), test=_clients(labels=(-1, 0)))
    _refused_before_any_work(tmp_path, neg, "labels of the 'test' split")
    with pytest.raises(ValueError, match=BAD_LABELS):
        fp.sweep(lambda lr: make(lr), {"lr": [0.1, 0.2]}, bad, num_rounds=1,
                 key=jax.random.key(0))
    state = make(0.1).init(jax.random.key(0), bad)
    with pytest.raises(ValueError, match=BAD_LABELS):
        fp.evaluate_state(make(0.1), state, bad, key=jax.random.key(0))


def test_features_that_do_not_fit_the_model_are_refused(tmp_path):
    wide = fdata.from_client_arrays(_clients(dim=12), test=_clients(dim=12))
    _refused_before_any_work(tmp_path, wide, BAD_FEATURES)
    with pytest.raises(ValueError, match=BAD_FEATURES):
        fp.sweep(lambda lr: make(lr), {"lr": [0.1, 0.2]}, wide, num_rounds=1,
                 key=jax.random.key(0))
    narrow = fdata.from_client_arrays(_clients(dim=10))
    state = make(0.1).init(jax.random.key(0), narrow)
    with pytest.raises(ValueError, match=BAD_FEATURES):
        fp.evaluate_state(make(0.1), state, wide, key=jax.random.key(0))


def test_a_personal_model_is_checked_too(tmp_path):
    wide = fdata.from_client_arrays(_clients(dim=12), test=_clients(dim=12))
    alg = algorithms.ditto(MODEL, lam=0.5, client_lr=0.1, num_local_steps=2,
                           batch_size=4, cohort_size=3)
    _refused_before_any_work(tmp_path, wide, BAD_FEATURES, alg=alg)


@pytest.mark.parametrize("kwargs, match", [
    (dict(splits=("train", "valid")), r"splits: must be one of \('train', 'val'"),
    (dict(splits="test"), "splits: must be a sequence of split names"),
    (dict(eval_mask=np.ones(5)), r"eval_mask: must have shape \(6,\)"),
    (dict(eval_mask=np.full(6, 0.5)), "eval_mask: must be a boolean mask"),
    (dict(eval_mask=np.ones((6, 1))), r"eval_mask: must have shape \(6,\)"),
])
def test_evaluation_options_are_refused_before_any_work(tmp_path, data, kwargs,
                                                        match):
    _refused_before_any_work(tmp_path, data, match, **kwargs)
    if "eval_mask" not in kwargs:
        with pytest.raises(ValueError, match=match.split(":")[0]):
            fp.sweep(lambda lr: make(lr), {"lr": [0.1]}, data, num_rounds=1,
                     key=jax.random.key(0), **kwargs)


def test_evaluate_state_options_are_checked(data):
    alg = make(0.1)
    state = alg.init(jax.random.key(0), data)
    key = jax.random.key(0)
    for kw, match in [
        (dict(splits=("tst",)), "splits: must be one of"),
        (dict(mask=np.ones(4)), r"mask: must have shape \(6,\)"),
        (dict(metrics=("acc",)), "metrics: must be one of"),
        (dict(per_client="yes"), "per_client: must be one of"),
        (dict(bogus=1), r"eval_kwargs: unknown option\(s\) \['bogus'\]"),
        (dict(views=("personal",)), r"views: unknown \['personal'\]"),
        (dict(views="global"), "views: must be a sequence"),
    ]:
        with pytest.raises(ValueError, match=match):
            fp.evaluate_state(alg, state, data, key=key, **kw)
    # the same checks hold for the public evaluate
    with pytest.raises(ValueError, match="splits"):
        metrics.evaluate({}, data, splits=("training",))


def test_output_paths_that_cannot_be_written_are_refused(tmp_path, data):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for kw, match in [
        (dict(checkpoint_dir=str(a_file)), "checkpoint_dir: .* must be a folder"),
        (dict(checkpoint_dir=str(a_file / "ck")), "checkpoint_dir: .* is a file"),
        (dict(jsonl_path=str(tmp_path)), "jsonl_path: .* is a folder"),
        (dict(jsonl_path=str(a_file / "h.jsonl")), "jsonl_path: cannot write"),
    ]:
        _refused_before_any_work(tmp_path, data, match, **kw)
    assert a_file.read_text() == "x"


def test_bad_types_of_the_other_arguments(data):
    kw = dict(num_rounds=1, key=jax.random.key(0), progress=False)
    for extra, match in [
        (dict(data=object()), "data: must be a fedjax_pfl.data.FederatedData"),
        (dict(algorithm=3), "algorithm: must be a fedjax_pfl.Algorithm"),
        (dict(state={"w": 1}), "state: must be an AlgorithmState"),
        (dict(callback=3), "callback: must be callable"),
        (dict(scan_rounds="yes"), "scan_rounds: must be one of"),
        (dict(num_rounds=2.0), "num_rounds: must be an integer"),
        (dict(num_rounds=True), "num_rounds: must be an integer"),
        (dict(eval_every=-1), "eval_every: must be an integer >= 1"),
    ]:
        args = dict(kw, algorithm=make(0.1), data=data)
        args.update(extra)
        with pytest.raises(ValueError, match=match):
            fp.simulate(args.pop("algorithm"), args.pop("data"), **args)
