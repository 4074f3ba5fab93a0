"""Per-client evaluation and fairness/robustness summaries."""

from ._eval import evaluate as evaluate
from ._eval import evaluate_split as evaluate_split
from ._eval import summarize as summarize
