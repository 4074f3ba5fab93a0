"""Test setup: 4 fake CPU devices (for sharding tests) before JAX initializes."""

import os

import jax

jax.config.update("jax_num_cpu_devices", 4)
jax.config.update("jax_platforms", "cpu")

DATA_DIR = os.environ.get("FEDJAX_PFL_DATA_DIR")
