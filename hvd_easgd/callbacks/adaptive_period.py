"""Hands an adaptive period (``--tau adaptive``) the training loss it adapts to."""
import keras

from .. import _compat
from ..training.model_optimizers import distributed_optimizers
from ..strategies.base import walk


def adaptive_schedules(model):
    """The adaptive period schedules of every strategy of the model's DistributedOptimizers."""
    return [s.schedule for opt in distributed_optimizers(model) for s in walk(opt.strategy)
            if getattr(getattr(s, "schedule", None), "adaptive", False)]


class AdaptivePeriodLoss(keras.callbacks.Callback):
    """Binds each adaptive schedule to the model's loss tracker and its optimizer's
    learning rate before the first step is traced, and restarts the schedule's
    reading of the tracker at each epoch's start, where Keras resets it.

    Does nothing for a fixed τ. In ``hvd_easgd.callbacks.defaults()``; a custom
    ``train_step`` that does not update ``model._loss_tracker`` leaves τ at τ₀.
    """

    def on_train_begin(self, logs=None):
        tracker = _compat.keras_loss_tracker(self.model)
        for opt in distributed_optimizers(self.model):
            for strategy in walk(opt.strategy):
                schedule = getattr(strategy, "schedule", None)
                if getattr(schedule, "adaptive", False):
                    schedule.bind_loss(tracker, lambda opt=opt: opt.learning_rate)

    def on_epoch_begin(self, epoch, logs=None):
        for schedule in adaptive_schedules(self.model):
            schedule.restart_reading()
