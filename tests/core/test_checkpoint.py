"""simulate's checkpoints: a crashed run resumed from its last checkpoint ends
with the same state and history as an uninterrupted run; atomic writes; refusal
of another run's checkpoints; argument validation."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedjax_pfl as fp
from fedjax_pfl import algorithms, models
from fedjax_pfl import data as fdata
from fedjax_pfl.core import Algorithm

MODEL = models.logistic_regression((60,), 10)
RUN = dict(num_rounds=7, eval_every=2, key=jax.random.key(3), progress=False)


class Crash(Exception):
    pass


def with_key(alg):
    """``alg`` with a typed PRNG key (split every round, drawn from into the
    metrics) and a zero-size leaf in the server state."""

    def init(key, data):
        s = alg.init(key, data)
        return s._replace(server={"inner": s.server, "key": jax.random.key(11),
                                  "empty": jnp.zeros((0, 3))})

    def round_step(s, data, key):
        inner, m = alg.round_step(s._replace(server=s.server["inner"]), data, key)
        k = jax.random.split(s.server["key"])[0]
        server = dict(s.server, inner=inner.server, key=k)
        return inner._replace(server=server), dict(m, draw=jax.random.uniform(k))

    def eval_models(s, data, key):
        return alg.eval_models(s._replace(server=s.server["inner"]), data, key)

    return Algorithm(init, round_step, eval_models)


@pytest.fixture(scope="module")
def data():
    return fdata.fedprox_synthetic(1.0, 1.0, num_clients=8, max_size=40, min_size=8)


@pytest.fixture(scope="module")
def alg():
    return with_key(algorithms.ditto(MODEL, lam=0.5, client_lr=0.1, num_local_steps=2,
                                     batch_size=4, cohort_size=3))


@pytest.fixture(scope="module")
def full(alg, data):
    return fp.simulate(alg, data, **RUN)


def crash_at(round_):
    def callback(state, row):
        if row["round"] == round_:
            raise Crash

    return callback


def leaves(state):
    return [jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
            else x for x in jax.tree.leaves(state)]


def assert_same_run(a, b):
    la, lb = leaves(a.state), leaves(b.state)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)
    strip = [[{k: v for k, v in r.items() if k != "seconds"} for r in h]
             for h in (a.history, b.history)]
    assert strip[0] == strip[1]


def steps(path):
    return sorted(int(n) for n in os.listdir(path) if n.isdigit())


def test_crash_and_resume_equals_an_uninterrupted_run(tmp_path, alg, data, full):
    ck, jl = tmp_path / "ck", tmp_path / "h.jsonl"
    kw = dict(RUN, checkpoint_dir=str(ck), checkpoint_every=4, jsonl_path=str(jl))
    with pytest.raises(Crash):  # after the evaluation at round 6; last checkpoint: 4
        fp.simulate(alg, data, callback=crash_at(6), **kw)
    assert steps(ck) == [4]
    seen = []
    res = fp.simulate(alg, data, resume=True,
                      callback=lambda s, row: seen.append(row["round"]), **kw)
    assert seen == [6, 7]  # only the remaining rounds ran
    assert_same_run(res, full)
    assert (res.resumed_from, full.resumed_from) == (4, None)
    assert any(k == "draw" for k in res.history[-1])  # the key chain is compared
    assert steps(ck) == [4, 7]  # the end of the run is always checkpointed
    # the row written for round 6 before the crash was dropped, not duplicated
    rows = [json.loads(line) for line in jl.read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 2, 4, 6, 7]
    # resuming a finished run runs nothing and returns the same result
    again = fp.simulate(alg, data, resume=True, callback=crash_at(7), **kw)
    assert_same_run(again, full)
    assert again.resumed_from == 7


@pytest.mark.parametrize("damage", ["crash_mid_write", "corrupt_newest"])
def test_a_broken_newer_checkpoint_falls_back_to_the_last_good_one(
        tmp_path, monkeypatch, alg, data, full, damage):
    ck = tmp_path / "ck"
    kw = dict(RUN, checkpoint_dir=str(ck))
    if damage == "crash_mid_write":
        # orbax writes <step>.orbax-checkpoint-tmp-*, then renames it: die before
        # the rename of step 6, after its files are written
        from orbax.checkpoint._src.path import atomicity

        finalize = atomicity.AtomicRenameTemporaryPath.finalize

        async def dying_finalize(self):
            if self.get_final().name == "6":
                raise Crash
            return await finalize(self)

        monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize",
                            dying_finalize)
        with pytest.raises(Crash):
            fp.simulate(alg, data, **kw)
        monkeypatch.undo()
        assert steps(ck) == [2, 4]
        assert any(".orbax-checkpoint-tmp" in n for n in os.listdir(ck))
        res = fp.simulate(alg, data, resume=True, **kw)
    else:
        with pytest.raises(Crash):
            fp.simulate(alg, data, callback=crash_at(6), **kw)
        assert steps(ck) == [4, 6]  # the last 2 are kept
        for root, _, files in os.walk(ck / "6" / "state"):
            for f in files:
                os.remove(os.path.join(root, f))
        with pytest.warns(UserWarning, match="checkpoint 6"):
            res = fp.simulate(alg, data, resume=True, **kw)
    assert_same_run(res, full)
    assert steps(ck) == [6, 7]
    assert not any(".orbax-checkpoint-tmp" in n for n in os.listdir(ck))


def test_resume_without_a_checkpoint_starts_afresh(tmp_path, alg, data, full):
    res = fp.simulate(alg, data, checkpoint_dir=str(tmp_path / "new"), resume=True,
                      **RUN)
    assert_same_run(res, full)
    assert res.resumed_from is None


def test_another_runs_checkpoint_is_refused(tmp_path, alg, data):
    ck = str(tmp_path / "ck")
    kw = dict(num_rounds=2, eval_every=1, key=jax.random.key(0), progress=False,
              checkpoint_dir=ck)
    fp.simulate(alg, data, **kw)
    fedavg = algorithms.fedavg(MODEL, client_lr=0.1, num_local_steps=2, batch_size=4,
                               cohort_size=3)
    for change, what in [(dict(key=jax.random.key(1)), "key"),
                         (dict(num_rounds=3), "num_rounds"),
                         (dict(eval_every=2), "eval_every")]:
        # a changed privacy monitor: tests/privacy/test_monitor.py
        with pytest.raises(ValueError, match=f"different run.*{what}"):
            fp.simulate(alg, data, resume=True, **dict(kw, **change))
    with pytest.raises(ValueError, match="different run.*state"):
        fp.simulate(fedavg, data, resume=True, **kw)
    with pytest.raises(ValueError, match="already holds checkpoints"):
        fp.simulate(alg, data, **kw)


def test_checkpoint_config_tells_configurations_apart(tmp_path, alg, data, full):
    """A hyperparameter that leaves the state's shapes alone is invisible to the
    fingerprint; ``checkpoint_config`` makes it visible: the same config resumes
    exactly, another config (or none, against a checkpoint that has one) is
    refused, and a checkpoint written without a config still resumes without."""
    ck = str(tmp_path / "ck")
    cfg = {"method": "ditto", "lam": 0.5, "lr": 0.1}
    with pytest.raises(Crash):
        fp.simulate(alg, data, checkpoint_dir=ck, checkpoint_config=cfg,
                    callback=crash_at(4), **RUN)
    for other, what in [(dict(cfg, lam=1.0), "config"), (None, "config")]:
        with pytest.raises(ValueError, match=f"different run.*{what}"):
            fp.simulate(alg, data, checkpoint_dir=ck, resume=True,
                        checkpoint_config=other, **RUN)
    res = fp.simulate(alg, data, checkpoint_dir=ck, resume=True,
                      checkpoint_config=dict(reversed(list(cfg.items()))), **RUN)
    assert_same_run(res, full)
    assert res.resumed_from is not None
    plain = str(tmp_path / "plain")
    with pytest.raises(Crash):
        fp.simulate(alg, data, checkpoint_dir=plain, callback=crash_at(4), **RUN)
    assert fp.simulate(alg, data, checkpoint_dir=plain, resume=True,
                       **RUN).resumed_from is not None


def test_a_checkpoint_in_another_format_is_refused(tmp_path, monkeypatch, alg, data):
    from fedjax_pfl.core import _checkpoint

    kw = dict(RUN, checkpoint_dir=str(tmp_path / "ck"))
    fp.simulate(alg, data, **dict(kw, num_rounds=2))
    monkeypatch.setattr(_checkpoint, "FORMAT", _checkpoint.FORMAT + 1)
    with pytest.raises(ValueError, match="checkpoint_dir: .* in format 2; this "
                       "version reads format 3"):
        fp.simulate(alg, data, resume=True, **dict(kw, num_rounds=2))


@pytest.mark.parametrize("kwargs, match", [
    (dict(checkpoint_every=3), "checkpoint_every"),  # not a multiple of eval_every
    (dict(checkpoint_every=0), "checkpoint_every"),
    (dict(checkpoint_every=2.0), "checkpoint_every"),
    (dict(checkpoint_dir=None, checkpoint_every=2), "checkpoint_every"),
    (dict(checkpoint_dir=None, resume=True), "resume"),
    (dict(resume="yes"), "resume"),
    (dict(privacy=object()), "privacy"),
    ({"checkpoint_config": [("lam", 1)]}, "checkpoint_config"),
    ({"checkpoint_config": {"lam": object()}}, "checkpoint_config"),
    ({"checkpoint_config": {"lam": float("nan")}}, "checkpoint_config"),
    ({"checkpoint_dir": None, "checkpoint_config": {"lam": 1}}, "checkpoint_config"),
])
def test_invalid_checkpoint_arguments(tmp_path, alg, data, kwargs, match):
    kw = dict(RUN, checkpoint_dir=str(tmp_path / "ck"))
    kw.update(kwargs)
    with pytest.raises(ValueError, match=match):
        fp.simulate(alg, data, **kw)
    assert not (tmp_path / "ck").exists() or not os.listdir(tmp_path / "ck")


@pytest.mark.parametrize("shape, dtype", [
    ((37, 5), jnp.float32),  # 5 rows a block: 8 blocks, the last one overlapping
    ((9, 3), jnp.bfloat16), ((11,), jnp.bool_), ((), jnp.int32), ((7, 2, 3), jnp.uint32),
    ((2, 40), jnp.float32),  # a row larger than a block: one row a block
])
def test_leaves_are_streamed_in_row_blocks(tmp_path, monkeypatch, shape, dtype):
    """A leaf larger than BLOCK_BYTES is copied from the device one row block at a
    time and read back exactly (an ordinary .npy file)."""
    from fedjax_pfl.core import _checkpoint

    monkeypatch.setattr(_checkpoint, "BLOCK_BYTES", 100)
    x = jax.random.normal(jax.random.key(0), shape) * 100
    x = (x > 0) if dtype == jnp.bool_ else x.astype(dtype)
    fetched = []
    get = jax.device_get

    def counting_get(a):
        fetched.append(int(np.prod(np.shape(a))) * jnp.dtype(a.dtype).itemsize)
        return get(a)

    monkeypatch.setattr(jax, "device_get", counting_get)
    path = tmp_path / "leaf.npy"
    _checkpoint.write_leaf(path, x)
    monkeypatch.undo()
    row = x.nbytes // shape[0] if shape else x.nbytes
    if x.nbytes > 100:
        assert len(fetched) > 1 and max(fetched) <= max(100, row)
    back = _checkpoint.read_leaf(path, shape, str(jnp.dtype(dtype)))
    assert back.dtype == x.dtype and back.shape == x.shape
    np.testing.assert_array_equal(np.asarray(back), np.asarray(x))
    if dtype != jnp.bfloat16:
        np.testing.assert_array_equal(np.load(path), np.asarray(x))


@pytest.mark.parametrize("block_bytes", [64 << 20, 100])
def test_a_written_leaf_is_still_donated_in_place(tmp_path, monkeypatch, block_bytes):
    """The writer fetches copies, never a host view of the leaf's own buffer (on
    CPU such a view makes jax copy the buffer instead of donating it)."""
    from fedjax_pfl.core import _checkpoint

    monkeypatch.setattr(_checkpoint, "BLOCK_BYTES", block_bytes)
    for x in (jnp.arange(1000.0).reshape(100, 10), jnp.float32(2.0)):
        ptr = x.unsafe_buffer_pointer()
        _checkpoint.write_leaf(tmp_path / "x.npy", x)
        y = jax.jit(lambda a: a + 1, donate_argnums=0)(x)
        assert x.is_deleted() and y.unsafe_buffer_pointer() == ptr


def test_a_truncated_leaf_file_is_refused(tmp_path):
    from fedjax_pfl.core import _checkpoint

    path = tmp_path / "leaf.npy"
    _checkpoint.write_leaf(path, jnp.arange(12.0).reshape(4, 3))
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 4)
    with pytest.raises(ValueError, match="expected"):
        _checkpoint.read_leaf(path, (4, 3), "float32")
    with pytest.raises(ValueError, match="expected"):
        _checkpoint.read_leaf(path, (4, 2), "float32")
    _checkpoint.write_leaf(path, jnp.arange(12.0).reshape(4, 3))
    with pytest.raises(ValueError, match="expected"):
        _checkpoint.read_leaf(path, (4, 3), "int32")  # same size, another dtype


def test_a_streamed_stacked_state_resumes_exactly(tmp_path, monkeypatch, alg, data,
                                                  full):
    """The personal models ([8, 60, 10] and [8, 10]) written and read in blocks of
    3 clients (the last block overlapping): the resumed run equals an
    uninterrupted one."""
    from fedjax_pfl.core import _checkpoint

    monkeypatch.setattr(_checkpoint, "BLOCK_BYTES", 3 * 60 * 10 * 4 + 1)
    ck = tmp_path / "ck"
    kw = dict(RUN, checkpoint_dir=str(ck), checkpoint_every=4)
    with pytest.raises(Crash):
        fp.simulate(alg, data, callback=crash_at(6), **kw)
    res = fp.simulate(alg, data, resume=True, **kw)
    assert_same_run(res, full)
    kernel = [f for f in os.listdir(ck / "7" / "state") if f.endswith(".npy")]
    shapes = {np.load(ck / "7" / "state" / f, mmap_mode="r").shape for f in kernel}
    assert (8, 60, 10) in shapes  # the stacked personal kernel, one file
