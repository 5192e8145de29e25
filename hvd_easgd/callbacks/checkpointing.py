"""Writes a complete checkpoint every N epochs (see hvd_easgd.checkpoint)."""
import keras

from .. import checkpoint
from ..kept_model import LocalWeights


class PeriodicCheckpoint(keras.callbacks.Callback):
    """Per-rank checkpoints hold each rank's *local* state: taken with the
    local weights in the model even if ``SwapKeptWeights(swap_on_epoch=True)``
    swapped the kept ones in first (list this callback before it anyway)."""

    def __init__(self, run_dir, comm, config, every=1, keep=3):
        super().__init__()
        self.run_dir, self.comm, self.config = run_dir, comm, config
        self.every, self.keep = every, keep

    def on_epoch_end(self, epoch, logs=None):
        if self.every > 0 and (epoch + 1) % self.every == 0:
            with LocalWeights(self.model):
                checkpoint.save(self.run_dir, epoch + 1, self.model, self.model.optimizer, self.comm,
                                self.config, keep=self.keep)
