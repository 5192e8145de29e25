"""Epoch metrics averaged across ranks, so rank 0 reports the global figures."""
import keras
import numpy as np

from ..training.model_optimizers import communicator_of

VALIDATION_PREFIX = "val_"


class MetricAverage(keras.callbacks.Callback):
    """Replaces each numeric training entry of the epoch logs by its mean over ranks.

    Every rank runs the same number of training steps of the same batch size,
    so the mean of the ranks' means is the global mean. Under unequal shares of
    the global batch (``--balance speed``, ``sample_shares``) ``share_weight``,
    p·b_r / Σ b, weighs this rank's means by its samples: Σ_r (b_r / Σ b) m_r. Validation entries
    (``val_*``) are left alone: ``GlobalEvaluationMetrics`` has already made
    them exact over a sharded test set (sums and counts reduced), and a mean of
    per-rank means would weigh shards of different sizes alike.

    Must come before the progress bar and any logger in the callback list
    (``hvd_easgd.callbacks.defaults()`` orders them). The allreduce is not
    counted in the communicator's account: that account is training traffic.
    """

    def __init__(self, comm=None, share_weight=1.0):
        super().__init__()
        self._comm = comm
        self.share_weight = share_weight

    def on_epoch_end(self, epoch, logs=None):
        if not logs:
            return
        comm = self._comm or communicator_of(self.model)
        if comm.size == 1:
            return
        keys = sorted(k for k, v in logs.items()
                      if not k.startswith(VALIDATION_PREFIX) and (np.isscalar(v) or np.ndim(v) == 0))
        values = np.array([float(logs[k]) * self.share_weight for k in keys], dtype=np.float64)
        averaged = comm.allreduce([values], op="average", record=False)[0].numpy()
        logs.update({k: float(v) for k, v in zip(keys, averaged)})
