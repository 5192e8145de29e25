"""Merges what the ranks hold since their last synchronisation into the kept model when ``fit`` ends."""
import keras

from ..training.kept_model import merge_at_end


class MergeAtEnd(keras.callbacks.Callback):
    """At the end of ``fit``, on every rank: ``hvd_easgd.merge_at_end(model)``, so the
    model you keep holds every update (DiLoCo's last partial period, the steps since
    PeriodicAverage's last average, EASGD's center onto the workers' mean).

    Place it after ``SwapKeptWeights``, which puts the local weights back first. A
    training split over several ``fit`` calls merges at the end of each, which takes one
    synchronisation early; to merge once, leave it out (``defaults(merge_at_end=False)``)
    and call ``hvd_easgd.merge_at_end(model)`` after the last ``fit``.
    """

    def on_train_end(self, logs=None):
        merge_at_end(self.model)
