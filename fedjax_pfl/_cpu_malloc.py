"""glibc malloc setting applied when the package is imported (docs/engine.md).

XLA:CPU's Eigen convolutions take a fresh work buffer of 90-200 MB on every
call for the CIFAR-10 CNN over a DP batch or a cohort of clients. glibc serves
blocks above 32 MiB with ``mmap`` and unmaps them on ``free``, and in the
per-thread arenas that Eigen's worker threads get it does so for every block
above 64 MiB whatever ``M_MMAP_MAX`` says, so the kernel zeroes each 4 KiB page
again on every call: 5.5 million minor page faults in 20 CIFAR-10 rounds, a
fifth of the process's CPU time spent in the kernel.

On the CPU the package therefore calls ``mallopt``: one arena for all threads
(``M_ARENA_MAX`` 1), no ``mmap`` for large blocks (``M_MMAP_MAX`` 0) and up to
``TRIM_BYTES`` kept free at the top of the heap (``M_TRIM_THRESHOLD``), so a
buffer freed after one call is reused, already mapped, by the next. The cost is
memory: the process keeps its peak heap (up to ``TRIM_BYTES`` more than it uses
at the moment). Numbers: ``python benchmarks/xla_cpu_flags.py --env
no_malloc=FEDJAX_PFL_MALLOC=0``, docs/results/throughput.md.

It does so only if

* ``FEDJAX_PFL_MALLOC`` is not ``0`` (set it to keep glibc's defaults),
* the C library is glibc (``mallopt`` and its parameters are glibc's),
* no ``MALLOC_*`` variable or ``glibc.malloc`` tunable is set (the user's
  allocator setting wins),
* no GPU plugin of JAX is installed (measured on the CPU only; with a GPU the
  large buffers live on the device) unless ``JAX_PLATFORMS`` is ``cpu``, and
* no JAX backend is initialized yet (threads that already have an arena keep
  it; import the package before running JAX code).
"""

from __future__ import annotations

import ctypes
import os

ENV = "FEDJAX_PFL_MALLOC"
TRIM_BYTES = 1 << 30
# glibc's malloc.h
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
_USER_VARS = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_",
              "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def _glibc():
    """The process's C library if it is glibc, else None."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") else None  # glibc only


def _gpu_plugin() -> bool:
    """Whether a JAX GPU plugin (CUDA or ROCm) is installed."""
    from importlib import metadata
    names = (d.metadata.get("Name", "") or "" for d in metadata.distributions())
    return any(n.lower().replace("_", "-").startswith(("jax-cuda", "jax-rocm",
                                                       "jaxlib-cuda"))
               for n in names)


def _backends_initialized() -> bool:
    from ._xla_cpu import _backends_initialized
    return _backends_initialized()


def apply(environ=os.environ, libc=None) -> str:
    """Call ``mallopt`` when the conditions above hold.

    Returns what happened: ``"applied"``, ``"disabled"`` (the environment
    variable), ``"user"`` (a ``MALLOC_*`` variable or tunable is set),
    ``"libc"`` (not glibc), ``"gpu"`` (a GPU plugin), ``"initialized"`` (too
    late) or ``"failed"`` (glibc refused a parameter)."""
    if environ.get(ENV, "1") == "0":
        return "disabled"
    if any(v in environ for v in _USER_VARS) or "glibc.malloc" in environ.get(
            "GLIBC_TUNABLES", ""):
        return "user"
    libc = libc if libc is not None else _glibc()
    if libc is None:
        return "libc"
    if environ.get("JAX_PLATFORMS", "").strip().lower() != "cpu" and _gpu_plugin():
        return "gpu"
    if _backends_initialized():
        return "initialized"
    ok = [libc.mallopt(M_ARENA_MAX, 1), libc.mallopt(M_MMAP_MAX, 0),
          libc.mallopt(M_TRIM_THRESHOLD, TRIM_BYTES)]
    return "applied" if all(ok) else "failed"


STATUS = apply()
