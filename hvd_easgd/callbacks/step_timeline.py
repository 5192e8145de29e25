"""Records each train step's wall times into the communicator's timeline, and writes it (rank 0) at fit's end."""
import time

import keras

from ..atomic import write_json
from ..comm.timeline import Timeline, overlap_share


class StepTimeline(keras.callbacks.Callback):
    """A ``Timeline`` (comm/timeline.py) of this fit: the background collectives the communicator's worker
    records, and every train step's begin and end recorded here; rank 0 writes it to ``path`` as JSON, with
    its ``overlap_share``, when fit ends.

    Place it after ``SwapKeptWeights``: that one drains the collective in flight at fit's end, so its wait
    is on the timeline too.

    Args:
      comm: the job's communicator (the one without a parent: sub-communicators record there).
      path: the JSON file rank 0 writes.
    """

    def __init__(self, comm, path):
        super().__init__()
        self.comm, self.path = comm, path
        self._begin = None

    def on_train_begin(self, logs=None):
        self.comm.timeline = Timeline()

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = time.time()

    def on_train_batch_end(self, batch, logs=None):
        self.comm.timeline.record_step(self._begin, time.time())

    def on_train_end(self, logs=None):
        timeline, self.comm.timeline = self.comm.timeline.as_dict(), None
        if self.comm.rank == 0:
            write_json(self.path, {"overlap_share": overlap_share(timeline), **timeline}, indent=1)
