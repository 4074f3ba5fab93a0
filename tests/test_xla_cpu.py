"""The XLA:CPU flag the package sets at import (fedjax_pfl/_xla_cpu.py)."""

import os
import subprocess
import sys
import textwrap

import pytest

from fedjax_pfl import _xla_cpu

FLAG = "--xla_cpu_experimental_ynn_fusion_type="


@pytest.fixture
def fresh(monkeypatch):
    """A process state where the flag may be applied: jaxlib 0.10, no backend."""
    monkeypatch.setattr(_xla_cpu, "_jaxlib_minor", lambda: (0, 10))
    monkeypatch.setattr(_xla_cpu, "_backends_initialized", lambda: False)


def test_applied_appends_to_the_callers_flags(fresh):
    env = {}
    assert _xla_cpu.apply(env) == "applied"
    assert env["XLA_FLAGS"] == FLAG
    env = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}
    assert _xla_cpu.apply(env) == "applied"
    assert env["XLA_FLAGS"] == "--xla_backend_optimization_level=0 " + FLAG


@pytest.mark.parametrize("env, status", [
    ({"FEDJAX_PFL_XLA_CPU_DEFAULTS": "0"}, "disabled"),
    ({"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=dot"}, "user"),
])
def test_left_alone_when_asked(fresh, env, status):
    before = dict(env)
    assert _xla_cpu.apply(env) == status
    assert env == before


def test_left_alone_for_other_jaxlibs_and_late_imports(fresh, monkeypatch):
    for minor in [(0, 8), (0, 11), None]:  # an XLA that may not know the flag
        monkeypatch.setattr(_xla_cpu, "_jaxlib_minor", lambda m=minor: m)
        env = {}
        assert _xla_cpu.apply(env) == "jaxlib" and env == {}
    monkeypatch.setattr(_xla_cpu, "_jaxlib_minor", lambda: (0, 10))
    monkeypatch.setattr(_xla_cpu, "_backends_initialized", lambda: True)
    env = {}
    assert _xla_cpu.apply(env) == "initialized" and env == {}


_PROBE = textwrap.dedent("""
    import os, sys, warnings
    import jax
    if sys.argv[1] == "late":
        jax.numpy.ones(1).block_until_ready()  # the CPU backend starts first
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import fedjax_pfl
    f = jax.jit(lambda x, w: jax.lax.conv_general_dilated(
        x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")))
    hlo = f.lower(jax.numpy.ones((8, 32, 32, 3)),
                  jax.numpy.ones((5, 5, 3, 32))).compile().as_text()
    print(fedjax_pfl.xla_cpu_setting, "ynn_fusion" in hlo,
          any("import fedjax_pfl first" in str(w.message) for w in caught))
""")


@pytest.mark.skipif(_xla_cpu._jaxlib_minor() not in _xla_cpu._KNOWN,
                    reason="a jaxlib whose XLA may not have the flag")
@pytest.mark.parametrize("order, expected", [
    ("first", "applied False False"),  # no YNN convolution in the program
    ("late", "initialized True True"),  # XLA's default, with a warning
])
def test_import_order_decides(order, expected):
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", "FEDJAX_PFL_XLA_CPU_DEFAULTS")}
    out = subprocess.run([sys.executable, "-c", _PROBE, order], env=env, check=True,
                         capture_output=True, text=True).stdout
    assert out.split("\n")[-2] == expected
