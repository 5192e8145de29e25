"""Rank 0's initial weights and optimizer state, on every rank, before step 1."""
import keras

from ..training.initial_state import broadcast_initial_state
from ..training.model_optimizers import require_distributed_optimizers


class BroadcastInitialState(keras.callbacks.Callback):
    """At the start of ``fit``: finds the model's DistributedOptimizers (also
    a GAN's, kept as attributes) and calls ``broadcast_initial_state``, which
    puts a mixed-precision loss-scale optimizer inside the DistributedOptimizer
    and broadcasts the model and optimizer state from ``root_rank``, once per
    optimizer (a later ``fit`` does not broadcast again).

    ``skip=True`` is set by a resume that restored per-rank state: every
    optimizer then counts as agreed (a broadcast would overwrite each rank's
    own EASGD local weights); the loss-scale layout is made safe all the same.
    """

    def __init__(self, root_rank=0):
        super().__init__()
        self.root_rank = root_rank
        self.skip = False

    def on_train_begin(self, logs=None):
        optimizers = require_distributed_optimizers(self.model)
        if self.skip:
            for optimizer in optimizers:
                optimizer.initial_state_synced = True
        broadcast_initial_state(self.model, optimizers, self.root_rank)
