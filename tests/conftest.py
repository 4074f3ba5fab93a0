"""Test setup: 4 fake CPU devices (for sharding tests) before JAX initializes.

The suite compiles with XLA's backend optimization level 0 (LLVM -O0) unless
``XLA_FLAGS`` is already set: its programs are tiny, compiling dominates, and
-O0 compiles them about 1.5x faster (tests/core/test_local.py: 102 s -> 65 s on
two cores). IEEE semantics are the same (XLA:CPU does not use fast math); set
``XLA_FLAGS=`` (empty) to run the suite at the default level.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

import jax  # noqa: E402  (after XLA_FLAGS)

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_platforms", "cpu")

DATA_DIR = os.environ.get("FEDJAX_PFL_DATA_DIR")

# Run directories write no figures in the suite (about 3 s of matplotlib a
# run, most of a tiny run's time); the tests of the figures ask for them with
# plots= / --plots (tests/experiments/test_presets.py).
os.environ.setdefault("FEDJAX_PFL_PLOTS", "none")

# Persistent compilation cache: the suite builds the same small programs many
# times over (every simulate/run_preset jits a fresh closure), and XLA's cache
# keys on the program, so later compiles of an identical program are loads.
# Shared by the xdist workers; FEDJAX_PFL_TEST_JAX_CACHE=0 turns it off, a path
# moves it (a clean machine, as in CI, starts with it empty).
_CACHE = os.environ.get("FEDJAX_PFL_TEST_JAX_CACHE", "")
if _CACHE != "0":
    import tempfile  # noqa: E402

    jax.config.update("jax_compilation_cache_dir", _CACHE or os.path.join(
        tempfile.gettempdir(), f"fedjax_pfl-test-jax-cache-{os.getuid()}"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
