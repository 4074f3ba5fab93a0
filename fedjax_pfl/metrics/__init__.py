"""Per-client evaluation and fairness/robustness summaries."""

from fedjax_pfl.core import evaluate as evaluate
from fedjax_pfl.core import evaluate_split as evaluate_split
from fedjax_pfl.core import summarize as summarize

from ._nfl import EPS as EPS
from ._nfl import R_PRIME as R_PRIME
from ._nfl import STOP_STREAK as STOP_STREAK
from ._nfl import DetectorState as DetectorState
from ._nfl import add_gain as add_gain
from ._nfl import client_gain as client_gain
from ._nfl import deployed_accuracy_fn as deployed_accuracy_fn
from ._nfl import detection_round as detection_round
from ._nfl import detector_init as detector_init
from ._nfl import detector_update as detector_update
from ._nfl import divergence_from_updates as divergence_from_updates
from ._nfl import gain_callback as gain_callback
from ._nfl import gain_metrics as gain_metrics
from ._nfl import mean_update_norm as mean_update_norm
from ._nfl import nfl_delta as nfl_delta
from ._nfl import nfl_verdict as nfl_verdict
from ._nfl import system_gain as system_gain
from ._nfl import weight_divergence as weight_divergence
