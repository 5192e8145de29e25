"""Writes a complete checkpoint every N epochs (see hvd_easgd.checkpoint)."""
import keras

from .. import checkpoint


class PeriodicCheckpoint(keras.callbacks.Callback):
    def __init__(self, run_dir, comm, config, every=1, keep=3):
        super().__init__()
        self.run_dir, self.comm, self.config = run_dir, comm, config
        self.every, self.keep = every, keep

    def on_epoch_end(self, epoch, logs=None):
        if self.every > 0 and (epoch + 1) % self.every == 0:
            checkpoint.save(self.run_dir, epoch + 1, self.model, self.model.optimizer, self.comm,
                            self.config, keep=self.keep)
