"""The GPU suite's helpers: the environment check and the report."""

import json
import os
import pathlib
import subprocess
import sys
import tarfile

import pytest
from helpers import load_benchmark

_load = load_benchmark


def test_env_writes_versions_and_missing(tmp_path, capsys):
    assert _load("gpu_suite").main(["env", str(tmp_path)]) == 0
    info = json.loads((tmp_path / "env.json").read_text())
    assert info["backend"] == "cpu" and info["missing_required"] == {}
    assert info["fedjax_pfl_import_error"] is None and info["versions"]["jax"]
    assert "all required modules import" in capsys.readouterr().out


def test_env_fails_when_a_gpu_is_expected_on_cpu(tmp_path):
    assert _load("gpu_suite").main(["env", str(tmp_path), "--expect-gpu"]) == 1


def test_report_merges_records_and_steps(tmp_path):
    suite = _load("gpu_suite")
    suite.main(["env", str(tmp_path)])
    _load("throughput").main([
        "--models", "logreg", "--clients", "3", "--steps", "1", "--batch", "2",
        "--per-client", "4", "--repeats", "1", "--strategies", "vmap",
        "--scan-rounds", "0", "--out", str(tmp_path / "throughput.jsonl")])
    (tmp_path / "throughput.status").write_text(
        "throughput\tpassed\t0\t5\t300\tpython benchmarks/throughput.py\n")
    (tmp_path / "w1.status").write_text("w1\tskipped: no data\t-\t0\t0\t-\n")
    docs = tmp_path / "docs"
    assert suite.main(["report", str(tmp_path), "--docs", str(docs)]) == 0
    md = (tmp_path / "gpu.md").read_text()
    assert "| throughput | passed | 5 | 300 |" in md and "skipped: no data" in md
    assert "| logreg | 3 | 1 | vmap |" in md  # throughput's own table
    assert md.count("No records.") == 4  # w1, ditto_cost, privacy, ditto_fmnist
    assert (docs / "gpu.md").read_text() == md
    assert len((docs / "throughput_gpu.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow
def test_gpu_jobs_runs_in_order_until_the_deadline(tmp_path):
    """benchmarks/gpu_jobs.sh: jobs in file order, {out}/{hist} filled in, a
    failed job does not stop the others, the one still running at the deadline
    is killed and later ones are not started; the outcome of each is in
    jobs.tsv and every record, trajectory and log in results.tar.gz. The
    records name FEDJAX_PFL_GIT_SHA's commit."""
    jobs = tmp_path / "jobs.txt"
    sha = (f'{sys.executable} -c "import sys; sys.path.insert(0, \'benchmarks\'); '
           f'import throughput, json; print(json.dumps(throughput._meta()))" > {{out}}')
    lines = ["# a comment", sha, "mkdir -p {hist} && echo x > {hist}/h.jsonl; exit 3",
             "", "sleep 120", "echo never > {out}"]
    jobs.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "out"
    env = {**os.environ, "GPU_JOBS_PARALLEL": "1", "GPU_JOBS_DEADLINE": "25",
           "GPU_JOBS_MIN_LEFT": "5",
           "GPU_JOBS_WHEELS": str(tmp_path / "no_wheels"), "PYTHON": sys.executable,
           "FEDJAX_PFL_GIT_SHA": "abc1234", "GPU_JOBS_DETERMINISTIC": "1"}
    repo = pathlib.Path(__file__).resolve().parents[2]
    res = subprocess.run(["bash", str(repo / "benchmarks" / "gpu_jobs.sh"), str(jobs),
                          str(out)], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert "--xla_gpu_deterministic_ops=true" in res.stdout  # XLA on CPU accepts it
    rows = [line.split("\t") for line in (out / "jobs.tsv").read_text().splitlines()]
    assert [(r[0], r[1]) for r in rows] == [
        ("2", "done"), ("3", "failed_rc3"), ("5", "killed_at_deadline"),
        ("6", "not_started")]
    with tarfile.open(out / "results.tar.gz") as tar:
        names = set(tar.getnames())
        rec = json.loads(tar.extractfile("recs/2.jsonl").read())
    assert {"logs/2.log", "logs/5.log", "hist/3/h.jsonl"} <= names
    assert "recs/6.jsonl" not in names
    assert rec["git_sha"] == "abc1234"


def test_gpu_stage_sends_a_folder_in_parts(tmp_path):
    """benchmarks/gpu_stage.sh: split cuts a folder into parts with a manifest;
    collect keeps the parts of each call, says what is missing (exit 3),
    refuses a corrupted part (exit 2) and unpacks the folder once all came."""
    repo = pathlib.Path(__file__).resolve().parents[2]
    src = tmp_path / "mydata"
    src.mkdir()
    payload = os.urandom(5000)
    (src / "x.bin").write_bytes(payload)
    here, there = tmp_path / "here", tmp_path / "there"
    env = {**os.environ, "GPU_STAGE_ROOT": str(here),
           "GPU_STAGE_DIR": str(tmp_path / "keep")}

    def stage(*args, root=here):
        return subprocess.run(["bash", str(repo / "benchmarks" / "gpu_stage.sh"), *args],
                              env={**env, "GPU_STAGE_ROOT": str(root)},
                              capture_output=True, text=True, timeout=60, check=False)

    res = stage("split", str(src), "d", "4K")
    assert res.returncode == 0, res.stderr
    parts = sorted(p.name for p in (here / "d").glob("part.*"))
    assert len(parts) == 3
    assert res.stdout.count('"') == 4 * len(parts)  # one carry list per part
    dest = tmp_path / "dest"
    for i, name in enumerate(parts):  # one call per part, as on the machine
        (there / "d").mkdir(parents=True, exist_ok=True)
        for old in (there / "d").glob("*"):
            old.unlink()
        (there / "d" / "MANIFEST").write_bytes((here / "d" / "MANIFEST").read_bytes())
        data = (here / "d" / name).read_bytes()
        if i == 1:  # a part damaged on the way is refused
            (there / "d" / name).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
            res = stage("collect", "d", str(dest), root=there)
            assert res.returncode == 2 and "does not match" in res.stderr
        (there / "d" / name).write_bytes(data)
        res = stage("collect", "d", str(dest), root=there)
        if i < len(parts) - 1:
            assert res.returncode == 3 and f"{i + 1}/3 parts" in res.stdout, res.stdout
            assert not dest.exists()
    assert res.returncode == 0, res.stderr
    assert (dest / "mydata" / "x.bin").read_bytes() == payload
    res = stage("collect", "d", str(dest), root=there)  # a later call: nothing to do
    assert res.returncode == 0 and "already unpacked" in res.stdout
    # a new split: the parts kept from the old one do not count towards it
    (src / "x.bin").write_bytes(os.urandom(5000))
    assert stage("split", str(src), "d", "4K").returncode == 0
    for old in (there / "d").glob("*"):
        old.unlink()
    for name in ("MANIFEST", parts[-1]):
        (there / "d" / name).write_bytes((here / "d" / name).read_bytes())
    res = stage("collect", "d", str(dest), root=there)
    assert res.returncode == 3 and "1/3 parts" in res.stdout, res.stdout
    assert stage("split", str(tmp_path / "nope"), "d").returncode == 2
    assert stage("split", str(src), "../bad").returncode == 2
