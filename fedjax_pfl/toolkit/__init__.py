"""The toolkit for writing a federated method in one screen of code.

Everything a method's factory needs, in one public module: the one-client
local-training step, penalties, cohort resolution, the uploads (with the threat
model's attacks), FedAvg's server half, finetuning, the key-tag registry and a
plain ``round_step`` built from a one-client kernel, and splitting a model's
layers into shared and personal parts. docs/extending.md walks
through two methods written with it.

A method is ``Algorithm(init, round_step, eval_models)``:

>>> from fedjax_pfl import toolkit as tk
>>> def client_fn(server, client_state, cid, key, data):   # ONE client
...     w_k, loss = tk.run_local(model, server.params, data, cid, key, cfg)
...     ...
>>> step = tk.round_step(client_fn, server_fn, cohort_size=10)
"""

from fedjax_pfl.core import COHORT_MODES as COHORT_MODES
from fedjax_pfl.core import Algorithm as Algorithm
from fedjax_pfl.core import AlgorithmState as AlgorithmState
from fedjax_pfl.core import ClientResult as ClientResult
from fedjax_pfl.core import EngineConfig as EngineConfig
from fedjax_pfl.core import KeyTag as KeyTag
from fedjax_pfl.core import LocalConfig as LocalConfig
from fedjax_pfl.core import ModelView as ModelView
from fedjax_pfl.core import client_keys as client_keys
from fedjax_pfl.core import client_loss as client_loss
from fedjax_pfl.core import client_steps as client_steps
from fedjax_pfl.core import current_engine as current_engine
from fedjax_pfl.core import default_unroll as default_unroll
from fedjax_pfl.core import federated_round as federated_round
from fedjax_pfl.core import lift as lift
from fedjax_pfl.core import linear_penalty as linear_penalty
from fedjax_pfl.core import make_local_config as make_local_config
from fedjax_pfl.core import mean_over_steps as mean_over_steps
from fedjax_pfl.core import passes_needed as passes_needed
from fedjax_pfl.core import prox_penalty as prox_penalty
from fedjax_pfl.core import resolve_unroll as resolve_unroll
from fedjax_pfl.core import run_local as run_local
from fedjax_pfl.core import run_steps as run_steps
from fedjax_pfl.core import tree_broadcast as tree_broadcast
from fedjax_pfl.core import tree_gather as tree_gather
from fedjax_pfl.core import tree_scatter as tree_scatter

from ._finetune import FinetuneConfig as FinetuneConfig
from ._finetune import finetune_all as finetune_all
from ._finetune import finetune_views as finetune_views
from ._finetune import make_finetune_config as make_finetune_config
from ._partition import check_layers as check_layers
from ._partition import freeze_layers as freeze_layers
from ._partition import layer_names as layer_names
from ._partition import layer_split_algorithm as layer_split_algorithm
from ._partition import merge_params as merge_params
from ._partition import split_params as split_params
from ._round import attack_delta as attack_delta
from ._round import check_cohort as check_cohort
from ._round import check_malicious as check_malicious
from ._round import deferred as deferred
from ._round import lift_clients as lift_clients
from ._round import malicious_mask as malicious_mask
from ._round import resolve_cohort_size as resolve_cohort_size
from ._round import round_step as round_step
from ._solver import GlobalSolver as GlobalSolver
from ._solver import ServerState as ServerState
from ._solver import client_dp_mechanism as client_dp_mechanism
from ._solver import client_upload as client_upload
from ._solver import global_solver as global_solver
from ._solver import server_update as server_update
from ._solver import stateless_algorithm as stateless_algorithm
