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
