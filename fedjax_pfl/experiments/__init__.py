"""The papers' experiments as validated presets, their runner and the CLI."""

from . import _presets, _presets_fedplus, _presets_lindt  # noqa: F401  (register)
from ._config import Experiment as Experiment
from ._config import Key as Key
from ._config import Preset as Preset
from ._config import load_config as load_config
from ._config import resolve as resolve
from ._config import run_keys as run_keys
from ._private import private_accuracy as private_accuracy
from ._registry import PRESETS as PRESETS
from ._registry import register_preset as register_preset
from ._run import get_preset as get_preset
from ._run import plot_formats as plot_formats
from ._run import provenance as provenance
from ._run import run_experiment as run_experiment
from ._run import run_preset as run_preset
from ._study import across_seeds as across_seeds
from ._study import parse_seeds as parse_seeds
from ._study import run_study as run_study
from ._study import study_report as study_report
