"""One process of a multi-process run (tests/core/test_multiprocess.py).

    python multiprocess_worker.py PROCESS_ID NUM_PROCESSES PORT OUT_NPZ

Each process has 2 CPU devices; with NUM_PROCESSES > 1 the processes join one
JAX runtime (gloo collectives) and shard the client axis over every device of
every process. NUM_PROCESSES = 1 without a mesh is the reference run.
"""

import json
import sys

import jax

pid, nproc, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
jax.config.update("jax_num_cpu_devices", 2)
if nproc > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{port}", num_processes=nproc,
                               process_id=pid, initialization_timeout=120)

import numpy as np  # noqa: E402

import fedjax_pfl as fp  # noqa: E402
from fedjax_pfl import algorithms, data, models  # noqa: E402

assert jax.process_count() == nproc and jax.device_count() == 2 * nproc
fed = data.fedprox_synthetic(1.0, 1.0, num_clients=16, max_size=80, seed=0)
model = models.logistic_regression((60,), 10)
mesh = fp.core.client_mesh() if nproc > 1 else None
alg = algorithms.ditto(model, lam=0.5, cohort_size=8, num_local_steps=3, batch_size=5,
                       client_lr=0.05, cohort="size_weighted", weighted=False)
res = fp.simulate(alg, fed, num_rounds=4, eval_every=2, key=jax.random.key(0),
                  progress=False, jsonl_path=out + ".jsonl",
                  engine=fp.EngineConfig("vmap", mesh=mesh))
leaves = {f"leaf{i}": np.asarray(a) for i, a in enumerate(jax.tree.leaves(res.state))}
np.savez(out, history=json.dumps([{k: v for k, v in r.items() if k != "seconds"}
                                  for r in res.history]), **leaves)
