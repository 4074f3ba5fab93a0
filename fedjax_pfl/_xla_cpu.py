"""XLA:CPU setting applied when the package is imported (docs/engine.md).

jaxlib 0.9-0.10 hands convolutions (and some dots, element-wise and reduce
fusions) on the CPU to the YNN library by default
(``--xla_cpu_experimental_ynn_fusion_type``). On the 2-vCPU AMD EPYC this
project measures on, its convolutions over a DP batch or a vmapped cohort run
2-4x slower than XLA's own code and allocate fresh memory on every call (the
kernel's page zeroing took a fifth of the CPU time), so the package turns those
fusions off: it adds ``--xla_cpu_experimental_ynn_fusion_type=`` to
``XLA_FLAGS``. Numbers: ``python benchmarks/xla_cpu_flags.py``,
docs/results/throughput.md.

It does so only if

* ``FEDJAX_PFL_XLA_CPU_DEFAULTS`` is not ``0`` (set it to keep XLA's own
  defaults),
* ``XLA_FLAGS`` does not already set the flag (the user's value wins),
* the installed jaxlib is one whose XLA has the flag (0.9 and 0.10: XLA aborts
  the process on a flag it does not know), and
* no JAX backend is initialized yet (XLA reads ``XLA_FLAGS`` once, when the
  first backend starts; import the package before running JAX code).

The flag only concerns the CPU backend; GPU programs are unchanged.
"""

from __future__ import annotations

import os

FLAG = "--xla_cpu_experimental_ynn_fusion_type"
ENV = "FEDJAX_PFL_XLA_CPU_DEFAULTS"
# jaxlib (major, minor) whose XLA knows FLAG (checked in the 0.9.2, 0.10.0,
# 0.10.1 and 0.10.2 wheels)
_KNOWN = ((0, 9), (0, 10))


def _jaxlib_minor() -> tuple[int, int] | None:
    try:
        from jaxlib import version
        major, minor = version.__version__.split(".")[:2]
        return int(major), int(minor)
    except (ImportError, AttributeError, ValueError):  # unknown layout: do not guess
        return None


def _backends_initialized() -> bool:
    try:
        from jax._src import xla_bridge
        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):  # a jax without the helper: assume the worst
        return True


def apply(environ=os.environ) -> str:
    """Add the flag to ``XLA_FLAGS`` when the conditions above hold.

    Returns what happened: ``"applied"``, ``"disabled"`` (the environment
    variable), ``"user"`` (``XLA_FLAGS`` sets it), ``"jaxlib"`` (another jaxlib)
    or ``"initialized"`` (too late)."""
    flags = environ.get("XLA_FLAGS", "")
    if environ.get(ENV, "1") == "0":
        return "disabled"
    if FLAG.lstrip("-") in flags:
        return "user"
    if _jaxlib_minor() not in _KNOWN:
        return "jaxlib"
    if _backends_initialized():
        return "initialized"
    environ["XLA_FLAGS"] = f"{flags} {FLAG}=".strip()
    return "applied"


def _warn_if_late(status: str) -> None:
    if status != "initialized":
        return
    import jax
    if jax.default_backend() == "cpu":
        import warnings
        warnings.warn(
            "fedjax_pfl was imported after JAX started its CPU backend, so "
            f"XLA_FLAGS could not get {FLAG}= (convolutions over large batches run "
            "2-4x slower with XLA's default): "
            f"import fedjax_pfl first, or set {FLAG}= in XLA_FLAGS yourself "
            f"({ENV}=0 silences this)", stacklevel=3)


STATUS = apply()
_warn_if_late(STATUS)
