"""fedjax_pfl: a JAX-vectorized simulator for personalized federated learning."""

from . import _xla_cpu  # XLA:CPU's flags, before any JAX backend starts
from . import aggregators as aggregators
from . import algorithms as algorithms
from . import attacks as attacks
from . import core as core
from . import data as data
from . import metrics as metrics
from . import models as models
from . import plots as plots
from . import privacy as privacy
from . import tracking as tracking
from .core import Algorithm as Algorithm
from .core import AlgorithmState as AlgorithmState
from .core import EngineConfig as EngineConfig
from .core import Interrupted as Interrupted
from .core import Plateau as Plateau
from .core import evaluate_state as evaluate_state
from .core import simulate as simulate
from .core import sweep as sweep

# what the package did with XLA:CPU's flags at import (fedjax_pfl/_xla_cpu.py,
# docs/engine.md): "applied", "disabled", "user", "jaxlib" or "initialized"
xla_cpu_setting: str = _xla_cpu.STATUS

__version__ = "0.1.0"
