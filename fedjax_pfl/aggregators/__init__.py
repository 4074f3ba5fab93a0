"""Server aggregation rules over stacked client updates."""

from ._mean import Aggregator as Aggregator
from ._mean import mean as mean
from ._mean import tilted_mean as tilted_mean
from ._mean import weighted_mean as weighted_mean
