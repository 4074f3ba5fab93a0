"""SIGINT/SIGTERM stop ``simulate`` at the next evaluation: the state there is
checkpointed, ``Interrupted`` carries the result so far, and resuming gives the
uninterrupted run, whether the signal came during an evaluation, while the
first chunk of rounds compiled, or in the middle of a checkpoint write; a
second signal interrupts at once; the handlers are restored afterwards; a run
stopped before its first checkpoint resumes with an uninterrupted history
file; a run killed (SIGKILL) while writing a checkpoint resumes from the one
before."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import jax
import pytest
from helpers import small_ditto

import fedjax_pfl as fp
from fedjax_pfl.core import _checkpoint, _drivers

RUN = dict(num_rounds=8, eval_every=2, key=jax.random.key(3), progress=False)


@pytest.fixture(scope="module")
def setup():
    return small_ditto()


@pytest.fixture(scope="module")
def data(setup):
    return setup[0]


@pytest.fixture(scope="module")
def alg(setup):
    return setup[1]


@pytest.fixture(scope="module")
def full(alg, data):
    return fp.simulate(alg, data, **RUN)


def plain(history):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in history]


def steps(ck):
    return sorted(int(n) for n in os.listdir(ck) if n.isdigit())


def signal_at(round_, sig=signal.SIGINT, times=1):
    def callback(state, row):
        if row["round"] == round_:
            for _ in range(times):
                os.kill(os.getpid(), sig)
    return callback


def check_resumes(alg, data, full, kw, jl):
    res = fp.simulate(alg, data, resume=True, **kw)
    assert plain(res.history) == plain(full.history)
    written = [json.loads(line) for line in jl.read_text().splitlines()]
    assert plain(written) == plain(full.history)  # no row twice, none missing


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_at_the_next_evaluation_with_a_checkpoint(
        tmp_path, alg, data, full, sig):
    ck, jl = tmp_path / "ck", tmp_path / "h.jsonl"
    # checkpoints every 6 rounds: round 4 is checkpointed only because of the stop
    kw = dict(RUN, checkpoint_dir=str(ck), checkpoint_every=6, jsonl_path=str(jl))
    before = signal.getsignal(sig)
    with pytest.raises(fp.Interrupted) as info:
        fp.simulate(alg, data, callback=signal_at(4, sig), **kw)
    e = info.value
    assert isinstance(e, KeyboardInterrupt)
    assert (e.round, e.checkpointed, e.signal) == (4, True, sig.name)
    assert str(e) == (f"stopped by {sig.name} at round 4; continue with resume "
                      "(--resume)")
    assert plain(e.result.history) == plain(full.history[:3])
    assert int(e.result.state.round) == 4
    assert steps(ck) == [4]
    assert signal.getsignal(sig) is before
    check_resumes(alg, data, full, kw, jl)


def test_without_checkpoints_the_result_so_far_is_returned(alg, data, full):
    with pytest.raises(fp.Interrupted) as info:
        fp.simulate(alg, data, callback=signal_at(2), **RUN)
    assert not info.value.checkpointed and "no checkpoint" in str(info.value)
    assert plain(info.value.result.history) == plain(full.history[:2])


def test_a_second_signal_interrupts_at_once(tmp_path, alg, data):
    ck = tmp_path / "ck"
    # the handler in force before the run (SIG_IGN, not Python's default,
    # where the suite was started in the background by a shell without job
    # control) is the one the run must leave behind
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as info:
        fp.simulate(alg, data, callback=signal_at(2, times=2),
                    checkpoint_dir=str(ck), **RUN)
    assert not isinstance(info.value, fp.Interrupted)
    assert signal.getsignal(signal.SIGINT) is before
    assert steps(ck) == [2]  # written before the callback ran


def test_a_signal_while_the_first_chunk_compiles(tmp_path, monkeypatch, alg, data,
                                                 full):
    compile_ = _drivers._compile

    def signalling_compile(*args):
        chunk, evaluate, preflight = compile_(*args)
        calls = []

        def chunk_(*a):
            if not calls:  # the first call compiles the chunk of rounds
                os.kill(os.getpid(), signal.SIGINT)
            calls.append(1)
            return chunk(*a)
        return chunk_, evaluate, preflight

    monkeypatch.setattr(_drivers, "_compile", signalling_compile)
    ck, jl = tmp_path / "ck", tmp_path / "h.jsonl"
    kw = dict(RUN, checkpoint_dir=str(ck), jsonl_path=str(jl))
    with pytest.raises(fp.Interrupted) as info:
        fp.simulate(alg, data, **kw)
    assert info.value.round == 2 and steps(ck) == [2]
    monkeypatch.undo()
    check_resumes(alg, data, full, kw, jl)


def test_a_signal_during_a_checkpoint_write_lets_it_finish(tmp_path, monkeypatch,
                                                           alg, data, full):
    save = _checkpoint.Checkpointer.save

    def signalling_save(self, rounds_done, *a):
        if rounds_done == 4:
            os.kill(os.getpid(), signal.SIGTERM)
        return save(self, rounds_done, *a)

    monkeypatch.setattr(_checkpoint.Checkpointer, "save", signalling_save)
    ck, jl = tmp_path / "ck", tmp_path / "h.jsonl"
    kw = dict(RUN, checkpoint_dir=str(ck), jsonl_path=str(jl))
    with pytest.raises(fp.Interrupted) as info:
        fp.simulate(alg, data, **kw)
    assert info.value.round == 4 and steps(ck) == [2, 4]
    monkeypatch.undo()
    check_resumes(alg, data, full, kw, jl)


def test_a_stop_before_the_first_checkpoint_resumes_with_one_history(
        tmp_path, alg, data, full):
    ck, jl = tmp_path / "ck", tmp_path / "h.jsonl"
    kw = dict(RUN, checkpoint_dir=str(ck), checkpoint_every=4, jsonl_path=str(jl))

    def crash(state, row):
        if row["round"] == 2:
            raise RuntimeError("crash")

    with pytest.raises(RuntimeError):
        fp.simulate(alg, data, callback=crash, **kw)
    assert steps(ck) == [] and len(jl.read_text().splitlines()) == 2
    check_resumes(alg, data, full, kw, jl)


WORKER = textwrap.dedent("""
    import os, sys
    import jax
    import fedjax_pfl as fp
    from fedjax_pfl import algorithms, models
    from fedjax_pfl import data as fdata
    from fedjax_pfl.core import _checkpoint

    save = _checkpoint.Checkpointer.save

    def dying_save(self, rounds_done, state, *a):
        if rounds_done == 4:  # the state's files half written, then SIGKILL
            orig = _checkpoint.write_leaf
            def write_leaf(path, x):
                orig(path, x)
                os.kill(os.getpid(), 9)
            _checkpoint.write_leaf = write_leaf
        return save(self, rounds_done, state, *a)

    _checkpoint.Checkpointer.save = dying_save
    data = fdata.fedprox_synthetic(1.0, 1.0, num_clients=8, max_size=40, min_size=8)
    alg = algorithms.ditto(models.logistic_regression((60,), 10), lam=0.5,
                           client_lr=0.1, num_local_steps=2, batch_size=4,
                           cohort_size=3)
    fp.simulate(alg, data, num_rounds=8, eval_every=2, key=jax.random.key(3),
                progress=False, checkpoint_dir=sys.argv[1], jsonl_path=sys.argv[2])
""")


def test_a_kill_during_a_checkpoint_write_resumes_from_the_one_before(
        tmp_path, alg, data, full):
    ck, jl = tmp_path / "ck", tmp_path / "h.jsonl"
    proc = subprocess.run([sys.executable, "-c", WORKER, str(ck), str(jl)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert 4 not in steps(ck) and steps(ck) == [2]
    kw = dict(RUN, checkpoint_dir=str(ck), jsonl_path=str(jl))
    check_resumes(alg, data, full, kw, jl)
