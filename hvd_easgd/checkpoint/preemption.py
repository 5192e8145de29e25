"""Stop requests: a signal on any rank becomes one checkpoint step that every rank agrees on.

A scheduler that preempts a job, or warns it before its time limit
(SLURM's ``--signal=B:USR1@60``), signals some of its processes, not
necessarily all, and not at the same moment. Each rank only notes the signal
here; ``callbacks.PeriodicCheckpoint`` sums the notes of every rank in one
small allreduce every ``check_every`` micro-batches, so all ranks see the
request at the same global step, checkpoint there together, and stop.

A stop can also be asked for without a signal, by creating the file
``RUN_DIR/STOP`` (``STOP_FILE``): rank 0 looks for it at each agreement and
removes it once the checkpoint is written. The SLURM templates use it, since
a batch script cannot signal ranks that horovodrun started on other hosts,
and a file written before the ranks are up is not lost (a signal that early
would kill them).

A second signal, or a save that has not finished ``grace_seconds`` after the
first signal (a rank died, a collective hangs), ends the process at once
with ``EXIT_FORCED``. Every checkpoint file is written under a temporary name
and the manifest last (``hvd_easgd.checkpoint``), so the last complete
checkpoint survives that exit.
"""
import os
import signal
import threading

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: checkpointed on request; run again with --auto-resume
EXIT_FORCED = 76  # a second signal or the grace period: stopped at once, last complete checkpoint kept

STOP_FILE = "STOP"
SIGNALS = {"TERM": signal.SIGTERM, "USR1": signal.SIGUSR1, "USR2": signal.SIGUSR2, "INT": signal.SIGINT}


class TrainingPreempted(Exception):
    """Training stopped after the checkpoint a signal asked for."""

    def __init__(self, epoch, step_in_epoch, saved=True):
        if saved:
            message = f"stopped on a signal after the checkpoint at epoch {epoch}, micro-batch {step_in_epoch}"
        else:  # the disk refused it: a resume continues from the newest intact checkpoint
            message = (f"stopped on a signal; the checkpoint at epoch {epoch}, micro-batch {step_in_epoch} could "
                       "not be saved, a resume continues from the newest intact one")
        super().__init__(message)
        self.epoch, self.step_in_epoch, self.saved = epoch, step_in_epoch, saved


class StopRequests:
    """Notes the signals in ``names`` (``"TERM"``, ``"USR1"``, ...) on this rank.

    Args:
      names: signal names without ``SIG``; empty installs nothing.
      grace_seconds: after the first signal, exit with ``EXIT_FORCED`` if the
        process is still running this long after it.
      stop_file: a path whose existence also requests a stop (see above); None: none.
    """

    def __init__(self, names=(), grace_seconds=120.0, stop_file=None):
        unknown = [n for n in names if n not in SIGNALS]
        if unknown:
            raise ValueError(f"`names` must be among {sorted(SIGNALS)}. Received: names={list(names)}")
        if grace_seconds <= 0:
            raise ValueError(f"`grace_seconds` must be > 0. Received: grace_seconds={grace_seconds}")
        self.names, self.grace_seconds = tuple(names), grace_seconds
        self.received = None  # the first signal's number
        self.stop_file = stop_file
        self._previous_handlers = {}
        self._grace_timer = None

    @property
    def enabled(self):
        return bool(self.names)

    @property
    def requested(self):
        """A signal arrived on this rank, or the stop file exists (looked up at each call)."""
        return self.received is not None or bool(self.stop_file and os.path.exists(self.stop_file))

    def consume(self):
        """Removes the stop file once its checkpoint is written (a later run must not stop at once)."""
        if self.stop_file and os.path.exists(self.stop_file):
            os.remove(self.stop_file)

    def install(self):
        for name in self.names:
            self._previous_handlers[name] = signal.signal(SIGNALS[name], self._on_signal)
        return self

    def uninstall(self):
        """Puts the previous handlers back and cancels a running grace period:
        for a process that goes on after training (a notebook, a test runner),
        which the grace period would otherwise end with ``EXIT_FORCED``."""
        for name, handler in self._previous_handlers.items():
            signal.signal(SIGNALS[name], handler)
        self._previous_handlers = {}
        if self._grace_timer is not None:
            self._grace_timer.cancel()
            self._grace_timer = None

    def _on_signal(self, signum, frame):
        if self.received is not None:
            os._exit(EXIT_FORCED)  # the second signal: at once, without touching any checkpoint file
        self.received = signum
        self._grace_timer = threading.Timer(self.grace_seconds, os._exit, (EXIT_FORCED,))
        self._grace_timer.daemon = True
        self._grace_timer.start()
