"""BatchNorm moving statistics averaged across ranks (the rule in hvd_easgd.statistics)."""
import keras

from ..training.model_optimizers import communicator_of
from ..statistics import average_statistics


class AverageStatistics(keras.callbacks.Callback):
    """Averages the model's floating non-trainable state across ranks at each
    epoch end, at train end, and before evaluation and prediction; with
    ``every_step=True`` also after every training step.

    Place it before any callback that saves or evaluates the model
    (``hvd_easgd.callbacks.defaults()`` does). Nothing is sent when no
    training step ran since the last average.
    """

    def __init__(self, every_step=False, comm=None):
        super().__init__()
        self.every_step = every_step
        self._comm = comm
        self._stale = False

    def _average(self):
        if self._stale:
            average_statistics(self.model, self._comm or communicator_of(self.model))
            self._stale = False

    def on_train_batch_end(self, batch, logs=None):
        self._stale = True
        if self.every_step:
            self._average()

    def on_epoch_end(self, epoch, logs=None):
        self._average()

    def on_train_end(self, logs=None):
        self._average()

    def on_test_begin(self, logs=None):
        self._average()

    def on_predict_begin(self, logs=None):
        self._average()
