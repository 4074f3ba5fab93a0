"""The glibc malloc setting the package applies at import (fedjax_pfl/_cpu_malloc.py)."""

import os
import subprocess
import sys
import textwrap

import pytest

from fedjax_pfl import _cpu_malloc


class FakeLibc:
    def __init__(self, result=1):
        self.calls, self.result = [], result

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return self.result


@pytest.fixture
def fresh(monkeypatch):
    """A CPU-only install with no backend started yet."""
    monkeypatch.setattr(_cpu_malloc, "_gpu_plugin", lambda: False)
    monkeypatch.setattr(_cpu_malloc, "_backends_initialized", lambda: False)


def test_applied_sets_one_arena_no_mmap_and_a_high_trim(fresh):
    libc = FakeLibc()
    assert _cpu_malloc.apply({}, libc) == "applied"
    assert libc.calls == [(-8, 1), (-4, 0), (-1, 1 << 30)]


@pytest.mark.parametrize("env, status", [
    ({"FEDJAX_PFL_MALLOC": "0"}, "disabled"),
    ({"MALLOC_ARENA_MAX": "4"}, "user"),
    ({"MALLOC_TRIM_THRESHOLD_": "0"}, "user"),
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, "user"),
])
def test_left_alone_when_asked(fresh, env, status):
    libc = FakeLibc()
    assert _cpu_malloc.apply(env, libc) == status and libc.calls == []


def test_left_alone_off_glibc_with_a_gpu_or_too_late(fresh, monkeypatch):
    monkeypatch.setattr(_cpu_malloc, "_glibc", lambda: None)
    assert _cpu_malloc.apply({}) == "libc"
    libc = FakeLibc()
    monkeypatch.setattr(_cpu_malloc, "_gpu_plugin", lambda: True)
    assert _cpu_malloc.apply({}, libc) == "gpu" and libc.calls == []
    # a GPU plugin is installed but the user runs on the CPU
    assert _cpu_malloc.apply({"JAX_PLATFORMS": "cpu"}, libc) == "applied"
    libc = FakeLibc()
    monkeypatch.setattr(_cpu_malloc, "_backends_initialized", lambda: True)
    assert _cpu_malloc.apply({"JAX_PLATFORMS": "cpu"}, libc) == "initialized"
    assert libc.calls == []


def test_refused_parameter_is_reported(fresh):
    assert _cpu_malloc.apply({}, FakeLibc(result=0)) == "failed"


# a 256 MiB block written, freed and taken again: with glibc's defaults it is
# mapped afresh (every page faults again), with the package's setting it is
# reused from the heap
_PROBE = textwrap.dedent("""
    import ctypes, resource
    import fedjax_pfl
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    n = 256 << 20
    def touch():
        p = libc.malloc(n)
        ctypes.memset(p, 1, n)
        libc.free(p)
    touch()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        touch()
    print(fedjax_pfl.cpu_malloc_setting,
          resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


@pytest.mark.skipif(_cpu_malloc._glibc() is None, reason="not glibc")
@pytest.mark.skipif(_cpu_malloc._gpu_plugin(), reason="a JAX GPU plugin")
def test_large_blocks_stay_mapped_between_calls():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MALLOC_", "FEDJAX_PFL_MALLOC", "GLIBC_TUNABLES"))}

    def faults(**more):
        out = subprocess.run([sys.executable, "-c", _PROBE], env={**env, **more},
                             check=True, capture_output=True, text=True).stdout
        status, n = out.split("\n")[-2].split()
        return status, int(n)

    pages = 3 * (256 << 20) // 4096
    status, n = faults()
    assert status == "applied" and n < pages // 100
    status, n = faults(FEDJAX_PFL_MALLOC="0")  # glibc's defaults: mapped afresh
    assert status == "disabled" and n > pages // 2
