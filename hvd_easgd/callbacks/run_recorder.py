"""Per-epoch figures for the run directory's metrics.json (written by rank 0)."""
import math
import time

import keras

from .. import atomic
from ..training.model_optimizers import distributed_optimizers
from ..strategies.base import walk


class RunRecorder(keras.callbacks.Callback):
    """Records loss/accuracy (already averaged across ranks by ``MetricAverage``,
    which must run first), samples/s over all ranks, and the communicator's
    bytes and collective calls per training step, and the wire bytes (what each
    rank sent under the collectives' algorithms), each epoch.

    A τ-strategy's epoch row also holds ``"tau"``, the period in force at the
    epoch's end, and ``"synchronisations"``, how many the epoch held.

    Training time is measured from the epoch's start to the start of its
    validation (or its end), so evaluation does not dilute samples/s.

    Every row holds ``samples``, what the epoch trained over every rank, so a
    curve against samples (or tokens) is read off the rows. A language model's
    rows (``tokens_per_sample``: its context) also hold ``tokens`` (the same
    in tokens), ``tokens_per_sec`` and the perplexities exp(loss) of training and test
    (its loss is in nats per token); the perplexities go into the epoch's logs
    too, for the loggers after this callback (TensorBoard).

    Every row holds ``rss_mb``, each rank's resident memory at the epoch's end
    (a collective: every rank records, rank 0 writes).
    """

    def __init__(self, path, comm, global_batch, steps_per_epoch, previous_epochs=(), write=True,
                 tokens_per_sample=None):
        super().__init__()
        self.tokens_per_sample = tokens_per_sample
        self.path = path
        self.comm = comm
        self.global_batch = global_batch
        self.steps_per_epoch = steps_per_epoch
        self.epochs = list(previous_epochs)
        self.write = write
        self._t0 = self._train_seconds = None
        self._account0 = None
        self._account_train = None
        self._syncs0 = None

    def _period_reading(self):
        """``(τ in force, synchronisations so far)`` of the first τ-strategy, or None."""
        for optimizer in distributed_optimizers(self.model) if self.model is not None else ():
            for strategy in walk(optimizer.strategy):
                schedule = getattr(strategy, "schedule", None)
                if schedule is not None and strategy.built:
                    return schedule.period_in_force(), schedule.synchronisations(int(strategy.local_steps()))
        return None

    def on_epoch_begin(self, epoch, logs=None):
        self._account0 = self.comm.account(wire=True)
        self._account_train = None
        self._train_seconds = None
        reading = self._period_reading()
        self._syncs0 = reading[1] if reading else None
        self._t0 = time.perf_counter()

    def _end_of_training_part(self):
        if self._train_seconds is None:
            self._train_seconds = time.perf_counter() - self._t0
            self._account_train = self.comm.account(wire=True)

    def on_test_begin(self, logs=None):
        if self._t0 is not None:
            self._end_of_training_part()

    def on_epoch_end(self, epoch, logs=None):
        self._end_of_training_part()
        logs = logs or {}
        steps = self.steps_per_epoch
        row = {
            "epoch": epoch + 1,
            "loss": logs.get("loss"),
            "accuracy": logs.get("accuracy"),
            "test_loss": logs.get("val_loss"),
            "test_accuracy": logs.get("val_accuracy"),
            "samples": steps * self.global_batch,  # the epoch's, over every rank: a curve's x from the rows
            "samples_per_sec": steps * self.global_batch / self._train_seconds,
            "bytes_sent_per_step": (self._account_train["bytes"] - self._account0["bytes"]) / steps,
            "collective_calls_per_step": (self._account_train["calls"] - self._account0["calls"]) / steps,
            # what each rank sent under the collectives' algorithms (comm/communicator.py)
            "wire_bytes_per_step": (self._account_train["wire_bytes"] - self._account0["wire_bytes"]) / steps,
            "seconds": self._train_seconds,
        }
        reading = self._period_reading()
        if reading is not None:
            row["tau"] = reading[0]
            row["synchronisations"] = reading[1] - (self._syncs0 or 0)
        if self.tokens_per_sample:
            row["tokens"] = row["samples"] * self.tokens_per_sample
            row["tokens_per_sec"] = row["samples_per_sec"] * self.tokens_per_sample
            for key in ("loss", "test_loss"):
                if row[key] is not None:
                    row[key.replace("loss", "perplexity")] = perplexity(row[key])
            logs.update({("val_" if key.startswith("test") else "") + "perplexity": row[key]
                         for key in ("perplexity", "test_perplexity") if key in row})
        rss = resident_mb()
        row["rss_mb"] = self.comm.allgather_json(rss) if self.comm.size > 1 else [rss]
        self.epochs.append(row)
        self._t0 = None
        self.save()

    def save(self, final=None):
        if not self.write:
            return
        payload = {"epochs": self.epochs}
        if final is not None:
            payload["final"] = final
        atomic.write_json(self.path, payload, indent=1)


def perplexity(loss):
    """exp(loss) of a loss in nats per token (inf past exp's range)."""
    return math.exp(loss) if loss < 700 else math.inf


def resident_mb():
    """This process's resident memory now, in MB (Linux's /proc; None elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None
