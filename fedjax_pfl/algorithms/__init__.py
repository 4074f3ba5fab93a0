"""Federated algorithms as Algorithm(init, round_step, eval_models) factories."""

from ._fedavg import fedavg as fedavg
from ._fedavg import finetune_all as finetune_all
from ._fedavg import local_only as local_only
