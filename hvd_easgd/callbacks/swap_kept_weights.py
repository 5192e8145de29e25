"""Evaluates and predicts on the model you keep (EASGD's center), as Keras's SwapEMAWeights does for EMA."""
import keras

from ..training.kept_model import KeptWeights
from ..training.model_optimizers import distributed_optimizers


class SwapKeptWeights(keras.callbacks.Callback):
    """Swaps the kept weights (``hvd_easgd.training.kept_model``) into the model for
    ``evaluate`` (and ``fit``'s validation) and ``predict``, and the local
    weights back after. A no-op when the kept model is the model's own
    (SyncAverage).

    Args:
      swap_on_epoch: also swap the kept weights in at each epoch end, and back
        out at the next epoch's start, so that a callback placed *after* this
        one (a user's ``keras.callbacks.ModelCheckpoint``) saves the kept
        model. Local weights are back in the model when ``fit`` returns.
        hvd_easgd's own per-rank checkpoints always hold the local weights.

    Example::

        callbacks = hvd_easgd.callbacks.defaults(swap_on_epoch=True) + [
            keras.callbacks.ModelCheckpoint("kept.keras")]
    """

    def __init__(self, swap_on_epoch=False):
        super().__init__()
        self.swap_on_epoch = swap_on_epoch
        self._swap = None
        self._swap_state = False  # kept weights already in when evaluate/predict began

    def _drain(self):
        # A synchronisation in flight (``overlap``) is merged before the kept model is read.
        for optimizer in distributed_optimizers(self.model):
            optimizer.strategy.drain()

    def _swap_in(self):
        if self._swap is None:
            self._drain()
            self._swap = KeptWeights(self.model).__enter__()

    def _swap_out(self):
        if self._swap is not None:
            self._swap.__exit__(None, None, None)
            self._swap = None

    def on_epoch_begin(self, epoch, logs=None):
        self._swap_out()

    def on_epoch_end(self, epoch, logs=None):
        if self.swap_on_epoch:
            self._swap_in()

    def on_train_end(self, logs=None):
        self._swap_out()
        self._drain()  # fit ends with nothing in flight

    # evaluate (and fit's validation) and predict swap alike: in for the run, and
    # back out after it unless the kept weights were already in (swap_on_epoch).
    def _begin_inference(self, logs=None):
        self._swap_state = self._swap is not None
        self._swap_in()

    def _end_inference(self, logs=None):
        if not self._swap_state:
            self._swap_out()

    on_test_begin = on_predict_begin = _begin_inference
    on_test_end = on_predict_end = _end_inference
