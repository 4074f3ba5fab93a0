"""Server aggregation rules over stacked client updates."""

from ._mean import Aggregator as Aggregator
from ._mean import mean as mean
from ._mean import tilted_mean as tilted_mean
from ._mean import weighted_mean as weighted_mean
from ._moreau import PSI as PSI
from ._moreau import IterationState as IterationState
from ._moreau import moreau as moreau
from ._moreau import moreau_objective as moreau_objective
from ._moreau import moreau_solve as moreau_solve
from ._moreau import prox as prox
from ._moreau import prox_stacked as prox_stacked
from ._moreau import weiszfeld as weiszfeld
from ._moreau import weiszfeld_solve as weiszfeld_solve
from ._robust import coordinate_median as coordinate_median
from ._robust import fedmgda_plus as fedmgda_plus
from ._robust import geometric_median as geometric_median
from ._robust import k_loss as k_loss
from ._robust import k_norm as k_norm
from ._robust import krum as krum
from ._robust import mgda_weights as mgda_weights
from ._robust import multi_krum as multi_krum
from ._robust import norm_clipping as norm_clipping
from ._robust import trimmed_mean as trimmed_mean
