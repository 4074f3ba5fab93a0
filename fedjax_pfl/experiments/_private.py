"""Private reference models for negative-FL measurements: every client trains
alone in the same engine (an experiment runner: it trains, so it lives here and
not in ``metrics``, which only measures)."""

from __future__ import annotations

import warnings

import numpy as np

from fedjax_pfl.algorithms import local_only
from fedjax_pfl.core import simulate
from fedjax_pfl.metrics import deployed_accuracy_fn
from fedjax_pfl.validation import check_choice


def private_accuracy(model, data, key, *, client_lr=0.1, num_local_steps=10,
                     batch_size=10, num_rounds=20, eval_every=5, split="test",
                     select="best", engine=None) -> np.ndarray:
    """Per-client accuracy ``V_i^P`` of private models trained in the same engine
    (``algorithms.local_only`` with every client every round).

    The LINDT paper gives no training recipe for them. Here: SGD at ``client_lr``,
    ``num_local_steps`` steps per round for ``num_rounds`` rounds, each client's
    accuracy taken at its best evaluation (``select='best'``, optimistic, like
    early stopping on the test split) or the last (``'last'``). ``engine``: as
    in :func:`fedjax_pfl.simulate`. Returns ``[N]``.
    """
    check_choice("select", select, ("best", "last"))
    alg = local_only(model, client_lr=client_lr, num_local_steps=num_local_steps,
                     batch_size=batch_size, cohort="full")
    acc = deployed_accuracy_fn(alg, split=split)
    accs = []
    simulate(alg, data, num_rounds=num_rounds, eval_every=eval_every, key=key,
             splits=(), progress=False, engine=engine,
             callback=lambda state, row: accs.append(np.asarray(acc(state, data))))
    accs = np.stack(accs[1:])  # skip the untrained initial model
    if select == "last":
        return accs[-1]
    with warnings.catch_warnings():  # clients without test rows stay NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmax(accs, axis=0)
