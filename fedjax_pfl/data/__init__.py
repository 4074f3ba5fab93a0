"""Federated data container, synthetic generators (loaders come with issue 3)."""

from ._federated import SAMPLING_MODES as SAMPLING_MODES
from ._federated import Batch as Batch
from ._federated import FederatedData as FederatedData
from ._federated import Split as Split
from ._federated import client_batch_indices as client_batch_indices
from ._federated import from_client_arrays as from_client_arrays
from ._federated import gather_batch as gather_batch
from ._federated import split_clients as split_clients
from ._synthetic import fedprox_synthetic as fedprox_synthetic
from ._synthetic import linear_regression_problem as linear_regression_problem
from ._synthetic import point_estimation_problem as point_estimation_problem
