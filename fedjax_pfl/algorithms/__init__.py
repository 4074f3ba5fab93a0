"""Federated algorithms as Algorithm(init, round_step, eval_models) factories."""

from fedjax_pfl.toolkit import GlobalSolver as GlobalSolver
from fedjax_pfl.toolkit import finetune_all as finetune_all
from fedjax_pfl.toolkit import global_solver as global_solver

from ._afl import AFLServerState as AFLServerState
from ._afl import afl as afl
from ._ali_dpfl import AliServerState as AliServerState
from ._ali_dpfl import ali_dpfl as ali_dpfl
from ._ali_dpfl import ali_dpfl_event as ali_dpfl_event
from ._ali_dpfl import ali_dpfl_max_steps as ali_dpfl_max_steps
from ._ali_dpfl import ali_tau as ali_tau
from ._afl import project_simplex as project_simplex
from ._apfl import APFLClientState as APFLClientState
from ._apfl import apfl as apfl
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
from ._dp_baselines import dp_feddyn as dp_feddyn
from ._dp_baselines import dp_fedprox as dp_fedprox
from ._dp_baselines import dp_qffl as dp_qffl
from ._dp_baselines import dp_scaffold as dp_scaffold
from ._ewc import ewc as ewc
from ._fedavg import fedavg as fedavg
from ._fedavg import local_only as local_only
from ._feddyn import FedDynServerState as FedDynServerState
from ._feddyn import feddyn as feddyn
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
from ._fedprox import fedprox as fedprox
from ._fedrep import fedrep as fedrep
from ._l2sgd import L2SGDServerState as L2SGDServerState
from ._l2sgd import l2sgd as l2sgd
from ._lgfedavg import lg_fedavg as lg_fedavg
from ._lindt import LindtClientState as LindtClientState
from ._lindt import LindtServerState as LindtServerState
from ._lindt import finetune_top as finetune_top
from ._lindt import lindt as lindt
from ._lindt_model import DualModel as DualModel
from ._lindt_model import attach as attach
from ._lindt_model import dual_apply as dual_apply
from ._lindt_model import dual_lindt_cnn as dual_lindt_cnn
from ._lindt_model import dual_lindt_lstm as dual_lindt_lstm
from ._lindt_model import dual_mlp as dual_mlp
from ._lindt_model import local_head_model as local_head_model
from ._mapper import MapperClientState as MapperClientState
from ._mapper import mapper as mapper
from ._mocha import MochaServerState as MochaServerState
from ._mocha import mocha as mocha
from ._mocha import task_covariance as task_covariance
from ._perfedavg import per_fedavg as per_fedavg
from ._pfedme import pfedme as pfedme
from ._qffl import qffl as qffl
from ._scaffold import ScaffoldServerState as ScaffoldServerState
from ._scaffold import scaffold as scaffold
from ._skl import skl as skl
