"""Writes complete checkpoints every N epochs, every N micro-batches, every M
minutes, and on a stop request (see hvd_easgd.checkpoint and hvd_easgd.checkpoint.preemption)."""
import os
import sys
import time

import keras
import numpy as np

from .. import checkpoint
from ..training.kept_model import LocalWeights
from ..checkpoint.preemption import StopRequests, TrainingPreempted


class PeriodicCheckpoint(keras.callbacks.Callback):
    """Per-rank checkpoints hold each rank's *local* state: taken with the
    local weights in the model even if ``SwapKeptWeights(swap_on_epoch=True)``
    swapped the kept ones in first (list this callback before it anyway).

    Args:
      every: epochs between checkpoints (0: none at epoch ends).
      every_steps: micro-batches between checkpoints (0: none).
      every_minutes: minutes between checkpoints by rank 0's clock (0: none);
        agreed at the next check, as stop requests are.
      steps_per_epoch: micro-batches per epoch (needed for step checkpoints).
      initial_step: global micro-batch the run starts at (a resume's position).
      samples_in_epoch: ``(epoch, step) -> samples of the epoch's order seen``,
        where that is not step · batch · ranks (a resume that split the rest of
        an epoch over another number of ranks); None otherwise.
      stop_requests: a ``preemption.StopRequests``; on a request every rank
        checkpoints at the same step and training stops.
      check_every: micro-batches between agreements on stop requests and the
        minutes trigger: one allreduce of two floats, only when either is on.

    **A save that fails** (a full or read-only disk, on any rank) leaves the
    previous checkpoint intact: rank 0 says so in one line and training goes on,
    and the next checkpoint due tries again. Why not stop: on a preemptible or
    shared cluster, stopping turns a disk that fills for a while (another job's
    scratch, a quota) into a lost allocation and a wait in the queue, while going
    on risks nothing more (the last intact checkpoint stays either way). A save a
    stop request asked for that fails still stops the run.

    A step checkpoint that falls on an epoch's last micro-batch is written at
    the epoch end instead, after the epoch-end work (statistics average), so
    that a resume from it starts the next epoch exactly as an uninterrupted
    run does.
    """

    def __init__(self, run_dir, comm, config, every=1, keep=3, every_steps=0, every_minutes=0.0,
                 steps_per_epoch=None, initial_step=0, stop_requests=None, check_every=10, samples_in_epoch=None):
        super().__init__()
        if (every_steps or every_minutes or stop_requests) and not steps_per_epoch:
            raise ValueError("`steps_per_epoch` must be given (micro-batches per epoch) for step checkpoints. "
                             f"Received: steps_per_epoch={steps_per_epoch!r}")
        self.run_dir, self.comm, self.config = run_dir, comm, config
        self.every, self.keep = every, keep
        self.every_steps, self.every_minutes = every_steps, every_minutes
        self.steps_per_epoch, self.global_step = steps_per_epoch, initial_step
        self.samples_in_epoch = samples_in_epoch
        self.stop_requests = stop_requests or StopRequests()
        self.check_every = check_every
        self.stopped_at = None  # (epoch, step_in_epoch) of the checkpoint a stop request made
        self.failed_saves = []  # names of the checkpoints whose save failed (a full or read-only disk)
        self._due = False
        self._stopping = False
        self._last_save = time.monotonic()

    @property
    def agrees(self):
        """Whether the ranks run the periodic agreement (it costs one small allreduce per check)."""
        return self.stop_requests.enabled or self.every_minutes > 0

    def on_train_batch_end(self, batch, logs=None):
        self.global_step += 1
        if self.every_steps and self.global_step % self.every_steps == 0:
            self._due = True
        if self.agrees and self.global_step % self.check_every == 0:
            self._agree()
        epoch, step = divmod(self.global_step, self.steps_per_epoch or 1)
        if step == 0 or not self.steps_per_epoch:
            return  # the epoch end saves, after the epoch-end work
        if self._due:
            self._save(epoch, step)
        if self._stopping:
            self._stop(epoch, step)

    def on_epoch_end(self, epoch, logs=None):
        if self.steps_per_epoch and self.global_step % self.steps_per_epoch:
            return  # a stop mid-epoch: Keras still ends the epoch; the checkpoint is already written
        if self._due or (self.every > 0 and (epoch + 1) % self.every == 0):
            self._save(epoch + 1, 0)
        if self._stopping:
            self._stop(epoch + 1, 0)

    def _agree(self):
        """Every rank learns, at the same step, whether any rank was signalled or rank 0's clock says save."""
        minutes_due = (self.comm.rank == 0 and self.every_minutes > 0
                       and time.monotonic() - self._last_save >= 60 * self.every_minutes)
        # Rank 0 alone looks for the stop file (another host's file system cache may lag).
        asked = self.stop_requests.received is not None or (self.comm.rank == 0 and self.stop_requests.requested)
        local = np.array([float(asked), float(minutes_due)], np.float32)
        # Bookkeeping, not training traffic: left out of the strategy's byte account.
        signalled, minutes = self.comm.allreduce([local], op="sum", record=False)[0].numpy()
        if minutes > 0:
            self._due = True
        if signalled > 0:
            self._due = self._stopping = True

    def _save(self, epoch, step_in_epoch):
        try:
            with LocalWeights(self.model):
                checkpoint.save(self.run_dir, epoch, self.model, self.model.optimizer, self.comm, self.config,
                                keep=self.keep, step_in_epoch=step_in_epoch, steps_per_epoch=self.steps_per_epoch,
                                samples_in_epoch=self.samples_in_epoch(epoch, step_in_epoch)
                                if self.samples_in_epoch is not None and step_in_epoch else None)
        except checkpoint.CheckpointSaveError as err:
            # Every rank raised alike (the ranks agreed on the failure); training goes on.
            self.failed_saves.append(err.name)
            if self.comm.rank == 0:
                print(self._failure_line(err), file=sys.stderr, flush=True)
        self._due = False
        self._last_save = time.monotonic()

    def _failure_line(self, err):
        done = checkpoint.complete_checkpoints(self.run_dir)
        previous = f"{os.path.basename(done[-1][1])} stays the newest" if done else "no checkpoint was written yet"
        return f"hvd_easgd: {err}; {previous}; training goes on and the next checkpoint tries again"

    def _stop(self, epoch, step_in_epoch):
        if self.comm.rank == 0:
            self.stop_requests.consume()
        self.stopped_at = (epoch, step_in_epoch)
        self.model.stop_training = True

    def raise_if_stopped(self):
        if self.stopped_at is not None:
            name = os.path.basename(checkpoint.checkpoint_dir(self.run_dir, *self.stopped_at))
            raise TrainingPreempted(*self.stopped_at, saved=name not in self.failed_saves)
