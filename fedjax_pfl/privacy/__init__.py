"""Differential privacy: per-example clipping (nested vmap and ghost norms),
Gaussian noise, Poisson sampling, client-level DP for any aggregator, fair
clipping (FedFDP), the mechanisms algorithms declare (``Mechanism``), and
accounting on the host with ``dp_accounting``.

See docs/privacy.md.
"""

from ._accounting import ACCOUNTANTS as ACCOUNTANTS
from ._accounting import DEFAULT_ORDERS as DEFAULT_ORDERS
from ._accounting import INTEGER_ORDERS as INTEGER_ORDERS
from ._accounting import client_level_event as client_level_event
from ._accounting import dp_sgd_event as dp_sgd_event
from ._accounting import epsilon as epsilon
from ._accounting import fedfdp_event as fedfdp_event
from ._accounting import max_rounds as max_rounds
from ._accounting import sampled_gaussian_event as sampled_gaussian_event
from ._audit import AuditResult as AuditResult
from ._audit import clopper_pearson as clopper_pearson
from ._audit import epsilon_lower_bound as epsilon_lower_bound
from ._client_dp import ClientDP as ClientDP
from ._client_dp import client_level_dp as client_level_dp
from ._client_dp import clip_updates as clip_updates
from ._clip import FAIR_CLIP_MODES as FAIR_CLIP_MODES
from ._clip import METHODS as METHODS
from ._clip import clip_factor as clip_factor
from ._clip import clipped_grad as clipped_grad
from ._clip import example_loss as example_loss
from ._ghost import ghost_plan as ghost_plan
from ._local import NORMALIZERS as NORMALIZERS
from ._local import DPConfig as DPConfig
from ._local import dp_batches as dp_batches
from ._local import dp_client_loss as dp_client_loss
from ._local import dp_denominator as dp_denominator
from ._local import dp_gradient as dp_gradient
from ._local import dp_local_train as dp_local_train
from ._local import make_dp_config as make_dp_config
from ._local import on_sampled_rows as on_sampled_rows
from ._mechanism import LEVELS as LEVELS
from ._mechanism import Mechanism as Mechanism
from ._mechanism import client_level_mechanism as client_level_mechanism
from ._mechanism import dp_sgd_mechanism as dp_sgd_mechanism
from ._monitor import Monitor as Monitor
from ._noise import gaussian_noise as gaussian_noise
from ._noise import noise_std as noise_std
from ._noise import private_grad as private_grad
from ._noise import release_loss as release_loss
from ._sampling import LADDER_MAX_RUNGS as LADDER_MAX_RUNGS
from ._sampling import LADDER_MIN_ROWS as LADDER_MIN_ROWS
from ._sampling import batch_ladder as batch_ladder
from ._sampling import default_max_batch_size as default_max_batch_size
from ._sampling import poisson_batch_indices as poisson_batch_indices
from ._sampling import truncation_probability as truncation_probability
