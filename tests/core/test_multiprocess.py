"""Multi-process (multi-host) runs: 2 processes x 2 CPU devices, the client axis
sharded over all 4 devices, equal the single-process run."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

WORKER = os.path.join(os.path.dirname(__file__), "multiprocess_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _launch(nproc, tmp_path, tag):
    port = str(_free_port())
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, WORKER, str(i), str(nproc), port,
                               str(tmp_path / f"{tag}{i}.npz")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i in range(nproc)]
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out.decode()[-3000:]
    return [np.load(tmp_path / f"{tag}{i}.npz") for i in range(nproc)]


@pytest.mark.slow  # two JAX processes, ~35 s; run with -m slow
def test_two_processes_equal_one(tmp_path):
    (ref,) = _launch(1, tmp_path, "single")
    runs = _launch(2, tmp_path, "multi")
    ref_hist = json.loads(str(ref["history"]))
    for run in runs:
        hist = json.loads(str(run["history"]))
        assert len(hist) == len(ref_hist) == 3
        for row, ref_row in zip(hist, ref_hist, strict=True):
            assert row.keys() == ref_row.keys()
            assert row == pytest.approx(ref_row, rel=1e-5, abs=1e-6)
        for k in ref.files:
            if k.startswith("leaf"):
                np.testing.assert_allclose(run[k], ref[k], rtol=1e-5, atol=1e-6)
    # only process 0 writes the history file
    assert (tmp_path / "multi0.npz.jsonl").exists()
    assert not (tmp_path / "multi1.npz.jsonl").exists()
