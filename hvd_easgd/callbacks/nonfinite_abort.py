"""Stops training after too many consecutive steps with NaN/Inf updates."""
import keras

from ..training.model_optimizers import distributed_optimizers
from ..strategies import walk


class NonFiniteTrainingError(RuntimeError):
    pass


class AbortOnNonFinite(keras.callbacks.Callback):
    """Strategies skip non-finite updates and count them; this turns a run of
    ``max_consecutive`` skipped steps into a clear error.

    It looks every ``check_every`` training steps, counted over the whole
    run (Keras's batch index restarts each epoch, and an epoch may be shorter
    than ``check_every``), and at the end of every epoch. It reads every
    strategy in the tree (``children()``: EASGD's warm-up SyncAverage, the
    strategy an accumulation wraps). Every rank reads the same counter for
    SyncAverage; for EASGD a rank stops on its own counter and the launcher
    ends the others.
    """

    def __init__(self, max_consecutive=25, check_every=10):
        super().__init__()
        self.max_consecutive = max_consecutive
        self.check_every = check_every
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps % self.check_every == 0:
            self._check()

    def on_epoch_end(self, epoch, logs=None):
        self._check()

    def _check(self):
        # Every DistributedOptimizer of the model (a GAN has two), not only model.optimizer.
        runs = [int(s.consecutive_skips.numpy()) for optimizer in distributed_optimizers(self.model)
                for s in walk(optimizer.strategy) if s.built]
        run = max(runs, default=0)
        if run >= self.max_consecutive:
            raise NonFiniteTrainingError(
                f"{run} consecutive optimizer steps had NaN/Inf gradients and were skipped "
                f"(limit --max-bad-steps={self.max_consecutive}); lower the learning rate or check the data")
