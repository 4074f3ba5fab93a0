"""Federated algorithms as Algorithm(init, round_step, eval_models) factories."""

from ._ditto import DittoClientState as DittoClientState
from ._ditto import ditto as ditto
from ._ditto_theory import ditto_expected_mse as ditto_expected_mse
from ._ditto_theory import ditto_expected_variance as ditto_expected_variance
from ._ditto_theory import ditto_lambda_star as ditto_lambda_star
from ._ditto_theory import (
    ditto_linear_regression_solution as ditto_linear_regression_solution,
)
from ._ditto_theory import (
    ditto_point_estimate_solution as ditto_point_estimate_solution,
)
from ._dp import dp_fedavg as dp_fedavg
from ._fedavg import GlobalSolver as GlobalSolver
from ._fedavg import fedavg as fedavg
from ._fedavg import finetune_all as finetune_all
from ._fedavg import global_solver as global_solver
from ._fedavg import local_only as local_only
from ._fedfdp import FedFDPClientState as FedFDPClientState
from ._fedfdp import FedFDPServerState as FedFDPServerState
from ._fedfdp import fedfair as fedfair
from ._fedfdp import fedfdp as fedfdp
from ._fedplus import FedPlusClientState as FedPlusClientState
from ._fedplus import FedPlusServerState as FedPlusServerState
from ._fedplus import fedavg_plus as fedavg_plus
from ._fedplus import fedcomed_plus as fedcomed_plus
from ._fedplus import fedgeomed_plus as fedgeomed_plus
from ._fedplus import fedplus as fedplus
from ._fedplus import fedplus_sgd as fedplus_sgd
