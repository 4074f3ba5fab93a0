"""Every command in benchmarks/gpu_jobs_*.txt passes its benchmark's argument
checks. A lent GPU has 15 minutes; a job file whose flag no longer exists (or
whose values a check refuses) would waste its share of them. Each command
runs its script's ``main`` until the first data load, which is replaced by a
stub that stops it: what comes before is the whole argument checking. The files that
record what a past lease ran (gpu_jobs_lease_*.txt, gpu_jobs_ditto_table1.txt)
stay as they ran and are not checked."""

import functools
import pathlib
import shlex

import pytest
from helpers import BENCHMARKS, load_benchmark

# where each script's checks end: the loader it calls first, as (the module
# attribute that holds it, its name)
FIRST_LOAD = {
    "ditto_fmnist": (None, "load"),
    "ditto_table2": ("data", "load_femnist"),
    "fedfdp_sweeps": ("_presets", "fedfdp_data"),
    "fedfdp_tables": ("_presets", "fedfdp_data"),
    "lindt_nfl": (None, "load"),
    "lindt_private": ("lindt_nfl", "load"),
}


# the queues that already ran: records of a lease, kept as they were
def _ran(path):
    return path.name.startswith("gpu_jobs_lease_") or path.name == "gpu_jobs_ditto_table1.txt"


def _jobs():
    for path in sorted(BENCHMARKS.glob("gpu_jobs_*.txt")):
        if _ran(path):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#"):
                yield pytest.param(line, id=f"{path.stem}:{n}")


class _Stop(Exception):
    pass


def _stop(*args, **kwargs):
    raise _Stop


@functools.cache
def _module(name):
    return load_benchmark(name)


@pytest.mark.parametrize("line", list(_jobs()))
def test_job_passes_its_benchmarks_checks(line, tmp_path, monkeypatch):
    words = shlex.split(line.replace("{out}", str(tmp_path / "out.jsonl"))
                        .replace("{hist}", str(tmp_path / "hist")))
    assert words[0] == "python3", line
    script = pathlib.Path(words[1])
    assert script.parent.name == "benchmarks" and script.suffix == ".py", line
    name = script.stem
    assert name in FIRST_LOAD, f"{name}: add where its argument checks end"
    mod = _module(name)
    holder, attr = FIRST_LOAD[name]
    monkeypatch.setattr(mod if holder is None else getattr(mod, holder), attr, _stop)
    with pytest.raises(_Stop):
        mod.main(words[2:])


def test_a_stale_flag_is_caught(monkeypatch):
    """The check above can fail: an unknown flag stops before the data."""
    mod = _module("ditto_fmnist")
    monkeypatch.setattr(mod, "load", _stop)
    with pytest.raises(SystemExit):
        mod.main(["--no-such-flag"])
    with pytest.raises(SystemExit):  # a value its own check refuses
        mod.main(["--snapshot"])
