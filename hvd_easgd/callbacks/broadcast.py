"""Rank 0's initial weights and optimizer state, on every rank, before step 1."""
import keras

from ..optimizer import broadcast_initial_state


class BroadcastInitialState(keras.callbacks.Callback):
    """Broadcasts the model and optimizer state from ``root_rank`` at the start of ``fit``.

    Skipped when ``skip=True`` is set by a resume that restored per-rank state
    (broadcasting would overwrite each rank's own EASGD local weights).
    """

    def __init__(self, root_rank=0):
        super().__init__()
        self.root_rank = root_rank
        self.skip = False
        self._done = False

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        if hasattr(optimizer, "attach"):
            optimizer.attach(self.model)
        if self._done or self.skip:
            if not optimizer.built:
                optimizer.build(self.model.trainable_variables)
            return
        broadcast_initial_state(self.model, optimizer, self.root_rank)
        self._done = True
