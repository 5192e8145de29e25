"""One worker thread per communicator that runs started allreduces while the caller's steps compute.

``Communicator.start_allreduce`` hands copies of the wire tensors (from a
``tf.py_function`` inside the traced step) to ``BackgroundReducer.submit``;
the worker calls the transport's blocking grouped allreduce eagerly, and
``wait`` (the finish's ``tf.py_function``) takes the result. ONE worker per
communicator: its jobs run in submission order, which is program order,
the same on every rank, so the ranks meet in the same collectives.

A job that raised (a dead peer, a stalled collective) makes ``wait`` raise
that error: the finish fails, the step fails, the job ends. The worker is a
daemon thread, so a process that stops with a job in flight is not held at
exit by a collective that can no longer complete.

``inline=True`` runs each job at its submission, on the caller's thread:
the blocking path with the same code and the same timeline records (the
tests' twin, ``HVD_EASGD_BACKGROUND=0``; not a documented option).
"""
import concurrent.futures
import os
import queue
import threading
import time

import numpy as np


class BackgroundReducer:
    """Runs ``reduce(arrays, op, handle)`` jobs one at a time, in submission order.

    Args:
      reduce: the transport's eager grouped allreduce: a list of NumPy arrays, ``"sum"`` or
        ``"average"`` and the job's handle (for a name that is the same on every rank) → the
        reduced arrays (tensors or arrays).
      timeline: a callable returning where to record the jobs (``Timeline``) or None.
      inline: run each job on the caller's thread at its submission (the blocking twin).
    """

    def __init__(self, reduce, timeline=lambda: None, inline=False):
        self._reduce = reduce
        self._timeline = timeline
        self.inline = inline
        self._jobs = {}
        self._handles = 0
        self._lock = threading.Lock()
        self._queue = None

    def submit(self, arrays, op, then=None):
        """Queues the allreduce of ``arrays`` (copied: the caller's buffers may change) and returns its handle;
        ``then(reduced)``, if given, runs on the result in the worker (the communicator's decompression)."""
        arrays = [np.array(a, copy=True) for a in arrays]
        future = concurrent.futures.Future()
        with self._lock:
            self._handles += 1
            handle = self._handles
            self._jobs[handle] = future
        submitted = time.time()
        if self.inline:
            self._run(handle, arrays, op, then, future, submitted)
            self._record_wait(handle, submitted, time.time())
        else:
            self._worker().put((handle, arrays, op, then, future, submitted))
        return handle

    def wait(self, handle):
        """The reduced arrays of job ``handle``, once it has run; its error if it raised.

        A handle not in flight (waited for already, or never submitted) is a KeyError, not a wait."""
        with self._lock:
            future = self._jobs.pop(int(handle), None)
        if future is None:
            raise KeyError(f"allreduce {int(handle)} is not in flight")
        begin = time.time()
        try:
            return future.result()
        finally:
            if not self.inline:
                self._record_wait(handle, begin, time.time())

    def in_flight(self):
        with self._lock:
            return sorted(self._jobs)

    def holds(self, handle):
        """Whether ``handle`` is a job of this worker not waited for yet."""
        with self._lock:
            return int(handle) in self._jobs

    # --- the worker -----------------------------------------------------------------------
    def _worker(self):
        if self._queue is None:
            self._queue = queue.SimpleQueue()
            threading.Thread(target=self._serve, name="hvd_easgd-background-allreduce", daemon=True).start()
        return self._queue

    def _serve(self):
        while True:
            self._run(*self._queue.get())

    def _run(self, handle, arrays, op, then, future, submitted):
        started = time.time()
        try:
            reduced = self._reduce(arrays, op, handle)
            reduced = [np.asarray(r) for r in (then(reduced) if then is not None else reduced)]
        except BaseException as err:  # noqa: BLE001 - handed to the waiter, which raises it
            future.set_exception(err)
            return
        finally:
            timeline = self._timeline()
            if timeline is not None:
                timeline.record_collective(handle, submitted, started, time.time())
        future.set_result(reduced)

    def _record_wait(self, handle, begin, end):
        timeline = self._timeline()
        if timeline is not None:
            timeline.record_wait(handle, begin, end)


def background_off(environ=None):
    """Whether ``HVD_EASGD_BACKGROUND=0`` asks for the blocking twin (read once, when a communicator is made)."""
    return (os.environ if environ is None else environ).get("HVD_EASGD_BACKGROUND", "1") == "0"
