"""Commits the elastic state (hvd_easgd/checkpoint/elastic.py) every N micro-batches and at every epoch end."""
import keras

from ..checkpoint import elastic


class ElasticCommit(keras.callbacks.Callback):
    """Advances an ``elastic.ElasticState``'s position and commits it.

    A commit copies the state to host memory and asks Horovod whether hosts
    were added or removed (it may raise ``HostsUpdatedInterrupt``, which
    ``elastic.run`` handles). A failure rewinds the state, and so this
    callback's counters, to the last commit.

    Args:
      state: the ``ElasticState``.
      every: micro-batches between commits (``elastic.commit_period``; 0: epoch ends only).
      steps_per_epoch: micro-batches per epoch at the current size.
    """

    def __init__(self, state, every, steps_per_epoch):
        super().__init__()
        self.state, self.every, self.steps_per_epoch = state, every, steps_per_epoch

    def on_train_batch_end(self, batch, logs=None):
        state = self.state
        state.step_in_epoch += 1
        state.global_step += 1
        elastic.maybe_die_for_test(state.global_step)
        elastic.maybe_pace_for_test()
        if self.every and state.step_in_epoch % self.every == 0 and state.step_in_epoch < self.steps_per_epoch:
            state.commit()

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = epoch + 1
        self.state.step_in_epoch = 0
        self.state.steps_per_epoch = self.steps_per_epoch
        self.state.commit()
