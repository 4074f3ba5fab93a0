"""Models as pure (init, apply) pairs with per-example losses; the paper zoo."""

from ._model import LOSSES as LOSSES
from ._model import Model as Model
from ._model import accuracy as accuracy
from ._model import batch_loss as batch_loss
from ._model import cross_entropy as cross_entropy
from ._model import from_flax as from_flax
from ._model import hinge as hinge
from ._model import num_params as num_params
from ._model import squared_error as squared_error
from ._zoo import DittoFMNISTCNN as DittoFMNISTCNN
from ._zoo import ditto_fmnist_cnn as ditto_fmnist_cnn
from ._zoo import linear_regression as linear_regression
from ._zoo import logistic_regression as logistic_regression
from ._zoo import mean_model as mean_model
from ._zoo import mlp as mlp
