"""Figures (matplotlib, an optional extra: ``pip install fedjax_pfl[plots]``)
and the per-client values behind them; see docs/plots.md."""

from ._common import FORMATS as FORMATS
from ._common import save_figure as save_figure
from ._curves import nfl_curves as nfl_curves
from ._curves import training_curves as training_curves
from ._per_client import per_client_metric as per_client_metric
from ._per_client import sweep_per_client as sweep_per_client
from ._plots import adversary_ratio as adversary_ratio
from ._plots import client_accuracy_distribution as client_accuracy_distribution
from ._plots import lambda_sweep as lambda_sweep
from ._style import PALETTE as PALETTE
from ._style import model_color as model_color
from ._style import model_colors as model_colors
