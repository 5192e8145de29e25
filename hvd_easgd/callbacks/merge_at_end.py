"""Merges what the ranks hold since their last synchronisation into the kept model when ``fit`` ends."""
import keras

from ..training.kept_model import merge_at_end


class MergeAtEnd(keras.callbacks.Callback):
    """At the end of ``fit``, on every rank: ``hvd_easgd.merge_at_end(model)``, so the
    model you keep holds every update (DiLoCo's last partial period, the steps since
    PeriodicAverage's last average, EASGD's center onto the workers' mean).

    Place it after ``SwapKeptWeights``, which puts the local weights back first. The
    merge leaves the training state as it was (the kept model is read from it, then every
    variable is put back), so a training split over several ``fit`` calls continues bit
    for bit as one longer ``fit``; each ``fit`` costs one more collective at its end.
    """

    def on_train_end(self, logs=None):
        merge_at_end(self.model)
