"""The direct MPI communicator: every collective is one mpi4py call inside the step.

Why it exists (issue 14): one model's gradients (153 KB in 8 tensors) took
~1.1 ms through ``hvd.grouped_allreduce`` in a ``tf.function`` (0.4 ms with
``HOROVOD_CYCLE_TIME=0.1``) but 34 µs through mpi4py's ``Allreduce``.
Horovod hands each tensor to a background thread that negotiates, once per
cycle, which tensors every rank has ready; at this size that negotiation,
not the wire, is the cost. Here a grouped allreduce is ONE
``tf.numpy_function`` that packs the tensors of each dtype into one buffer
and reduces it with ``Iallreduce`` on the calling thread, with no
negotiation (see SPIN_SECONDS for why nonblocking).

What replaces the negotiation: program order. Every rank traces the same
code, so it issues the same collectives in the same order, provided TF runs
them in program order. The numpy functions are *stateful*, and TF's
automatic control dependencies run the stateful ops of a ``tf.function``
that touch no resource in program order (also across ``tf.cond`` branches,
whose If op is itself stateful, and loop iterations); eager calls run in
order anyway. Two guards make a breach visible instead of silent: a
collective that starts while another is running raises instead of taking
turns (taking turns could pick a different order on each rank), and
``order_digest()`` is a running hash of every collective's kind, dtypes and
sizes, which tests compare across ranks.

It replaces every collective of the job, and Horovod is not started:
a collective on Horovod's side and one here, waiting on each other from two
threads, could deadlock; and an idle Horovod background thread still enters
MPI every cycle, taking a core's time from a 2-core node. MPI is initialised
by mpi4py with ``MPI_THREAD_MULTIPLE`` (the level Horovod asks for too, so a
process may still start Horovod beside it, as the benchmark does), and the
collectives run on a duplicate of ``COMM_WORLD``, so they never match
anyone else's messages. MPI launches only (``horovodrun --mpi``, ``mpirun``,
``srun --mpi=pmix``); a Gloo launch has no MPI to use.

Guarantees kept from the Horovod path: the byte/call account (the base
class records the same tensors before calling the primitives below), NaN
agreement (a NaN on one rank reaches every rank through the Sum, and the
strategies decide after the reduction), bit-identical results on every rank
(at np = 2 both ranks compute a + b, and IEEE addition is commutative bit
for bit; beyond, this rests on Open MPI's nonblocking allreduce reducing
each element along one tree or ring and distributing it, which the tests do
not cover: they run np = 2), and no endless
hang: a collective still waiting after ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``
(hvd_easgd sets 60) aborts the job, as Horovod's stall inspector does.
"""
import functools
import hashlib
import os
import sys
import threading
import time

import mpi4py

# Before the first `from mpi4py import MPI`, which initialises MPI: TF runs the
# numpy functions on its executor threads, not the thread that initialised MPI.
mpi4py.rc.thread_level = "multiple"
from mpi4py import MPI  # noqa: E402 -- after the thread level

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from .communicator import Communicator  # noqa: E402

DEFAULT_STALL_SECONDS = 60.0
# How a rank waits for the others: nonblocking collectives, tested in a loop
# that spins briefly and then sleeps between tests. A blocking MPI call
# busy-polls; on a loaded node (or ranks pinned to one core each) the polling
# thread then shares its core with TF's own spinning threads and every call
# costs scheduler slices (measured on 2 cores, load 13-20: 7-30 ms for a 4 KB
# or 153 KB allreduce in a numpy_function, 3-40 µs from a bare loop). A thread
# that sleeps is woken ahead of the threads that spin.
SPIN_SECONDS = 50e-6
SLEEP_SECONDS = 20e-6


def _half_sum(dtype):
    """An MPI reduction adding ``dtype`` elements (MPI 3 has no 16-bit floats)."""
    def add(inbuf, inoutbuf, datatype):
        out = np.frombuffer(inoutbuf, dtype)
        np.add(np.frombuffer(inbuf, dtype), out, out=out)

    return MPI.Op.Create(add, commute=True)


_MPI_TYPES = {np.dtype(k): v for k, v in {
    np.float32: MPI.FLOAT, np.float64: MPI.DOUBLE, np.int32: MPI.INT32_T, np.int64: MPI.INT64_T,
    np.int16: MPI.INT16_T, np.int8: MPI.INT8_T, np.uint8: MPI.UINT8_T, np.uint16: MPI.UINT16_T,
    np.uint32: MPI.UINT32_T, np.uint64: MPI.UINT64_T}.items()}
# 16-bit floats travel as 16-bit words and are added by a user-defined reduction.
_HALF_OPS = {np.dtype(np.float16): _half_sum(np.float16)}
try:
    import ml_dtypes

    _HALF_OPS[np.dtype(ml_dtypes.bfloat16)] = _half_sum(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover -- TF depends on ml_dtypes
    pass


def launch_layout():
    """``(rank, size, local_rank, local_size, cross_rank, cross_size)`` of this
    process, from MPI alone (Horovod's definitions: local = same host, cross =
    same local rank on every host)."""
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    local = world.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = local.Get_rank(), local.Get_size()
    local.Free()
    cross = world.Split(color=local_rank, key=rank)
    cross_rank, cross_size = cross.Get_rank(), cross.Get_size()
    cross.Free()
    return rank, size, local_rank, local_size, cross_rank, cross_size


def _shaped_like(tensors, outputs):
    """numpy_function's outputs as a list (one output comes back bare), with the inputs' static shapes."""
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    for out, t in zip(outputs, tensors):
        out.set_shape(t.shape)
    return outputs


class ConcurrentCollectivesError(RuntimeError):
    """Two collectives of one DirectMPICommunicator ran at once (their order could differ by rank)."""


class DirectMPICommunicator(Communicator):
    """Collectives straight over MPI (mpi4py), one call per grouped collective.

    Args:
      stall_seconds: a collective still waiting after this long aborts the
        whole job (default ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``, else 60);
        0 waits forever.
    """

    def __init__(self, stall_seconds=None):
        provided = MPI.Query_thread()
        if provided < MPI.THREAD_MULTIPLE:
            raise RuntimeError("the mpi-direct communicator needs MPI_THREAD_MULTIPLE (TF calls MPI from its own "
                               f"threads); MPI was initialised at thread level {provided} by whoever imported mpi4py "
                               "first; create the communicator before anything else initialises MPI")
        super().__init__()
        (self.rank, self.size, self.local_rank, self.local_size,
         self.cross_rank, self.cross_size) = launch_layout()
        self._mpi = MPI.COMM_WORLD.Dup()  # our own matching space: nobody else's messages meet ours
        self._busy = threading.Lock()
        self._order = hashlib.sha256()
        self._collectives = 0
        if stall_seconds is None:
            stall_seconds = float(os.environ.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", DEFAULT_STALL_SECONDS))
        self.stall_seconds = float(stall_seconds)
        self._waiting_since = None  # (monotonic start, what) of the collective in progress
        if self.stall_seconds > 0 and self.size > 1:
            threading.Thread(target=self._watch_for_stalls, name="mpi-direct-stall-watch", daemon=True).start()

    # --- order: one collective at a time, in program order ----------------------------
    def order_digest(self):
        """``(collectives so far, hash of their kinds, dtypes and sizes in order)``: equal on every rank
        when the ranks issued the same collectives in the same order."""
        return self._collectives, self._order.hexdigest()[:16]

    def _run(self, what, call):
        if not self._busy.acquire(blocking=False):
            raise ConcurrentCollectivesError(
                f"{what} started while another collective of the mpi-direct communicator was running; "
                "collectives must run one at a time, in program order, for every rank to issue them alike")
        try:
            self._order.update(what.encode())
            self._collectives += 1
            self._waiting_since = (time.monotonic(), what)
            return call()
        finally:
            self._waiting_since = None
            self._busy.release()

    @staticmethod
    def _wait(request):
        """Waits for a nonblocking MPI request: spin briefly, then sleep between tests."""
        spin_until = time.perf_counter() + SPIN_SECONDS
        while not request.Test():
            if time.perf_counter() > spin_until:
                time.sleep(SLEEP_SECONDS)

    def _watch_for_stalls(self):
        while True:
            time.sleep(min(5.0, self.stall_seconds / 4))
            waiting = self._waiting_since
            if waiting is not None and time.monotonic() - waiting[0] > self.stall_seconds:
                print(f"hvd_easgd (rank {self.rank}): the collective {waiting[1]} has waited "
                      f"{self.stall_seconds:g} s for the other ranks (a rank stopped or died); aborting the job",
                      file=sys.stderr, flush=True)
                MPI.COMM_WORLD.Abort(1)

    # --- the primitives, as numpy functions -----------------------------------------------
    def _grouped_allreduce(self, tensors, op):
        return _shaped_like(tensors, tf.numpy_function(
            functools.partial(self._allreduce_arrays, op), list(tensors), [t.dtype for t in tensors],
            stateful=True, name="mpi_direct_allreduce"))

    def _broadcast(self, tensors, root_rank):
        if not 0 <= root_rank < self.size:
            raise ValueError(f"`root_rank` must be in [0, {self.size}). Received: root_rank={root_rank}")
        return _shaped_like(tensors, tf.numpy_function(
            functools.partial(self._broadcast_arrays, root_rank), list(tensors), [t.dtype for t in tensors],
            stateful=True, name="mpi_direct_broadcast"))

    def _allgather(self, tensor):
        out = tf.numpy_function(self._allgather_array, [tensor], tensor.dtype, stateful=True,
                                name="mpi_direct_allgather")
        out.set_shape(tf.TensorShape([None]).concatenate(tensor.shape[1:]))
        return out

    # --- what runs inside them ------------------------------------------------------------------
    def _allreduce_arrays(self, op, *arrays):
        # One buffer per dtype, dtypes in order of first appearance: the same on every rank.
        groups = {}
        for i, a in enumerate(arrays):
            groups.setdefault(a.dtype, []).append(i)
        what = f"allreduce {op} " + " ".join(f"{d.name}x{sum(arrays[i].size for i in idx)}"
                                              for d, idx in groups.items())
        return self._run(what, lambda: self._allreduce_groups(op, arrays, groups))

    def _allreduce_groups(self, op, arrays, groups):
        results = [None] * len(arrays)
        for dtype, idx in groups.items():
            buf = np.concatenate([arrays[i].ravel() for i in idx]) if len(idx) > 1 else arrays[idx[0]].ravel().copy()
            if dtype in _HALF_OPS:
                self._wait(self._mpi.Iallreduce(MPI.IN_PLACE, [buf.view(np.uint16), MPI.UINT16_T],
                                                op=_HALF_OPS[dtype]))
            elif dtype in _MPI_TYPES:
                self._wait(self._mpi.Iallreduce(MPI.IN_PLACE, [buf, _MPI_TYPES[dtype]], op=MPI.SUM))
            else:
                raise TypeError(f"the mpi-direct communicator cannot reduce {dtype.name} tensors")
            if op == "average":  # sum, then divide: floats exactly as divided, integers floored
                if np.issubdtype(dtype, np.integer):
                    np.floor_divide(buf, self.size, out=buf)
                else:
                    np.divide(buf, dtype.type(self.size), out=buf)
            start = 0
            for i in idx:
                n = arrays[i].size
                results[i] = buf[start:start + n].reshape(arrays[i].shape)
                start += n
        return results

    def _broadcast_arrays(self, root_rank, *arrays):
        # Every dtype in one byte buffer: one Bcast for the whole group.
        what = f"broadcast {root_rank} " + " ".join(f"{a.dtype.name}x{a.size}" for a in arrays)

        def call():
            buf = np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays])
            self._wait(self._mpi.Ibcast([buf, MPI.BYTE], root=root_rank))
            if self.rank == root_rank:
                return list(arrays)
            out, start = [], 0
            for a in arrays:
                out.append(buf[start:start + a.nbytes].view(a.dtype).reshape(a.shape))
                start += a.nbytes
            return out

        return self._run(what, call)

    def _allgather_array(self, array):
        # The leading dimension may differ by rank: gather it first, then the bytes.
        what = f"allgather {array.dtype.name} {array.shape[1:]}"

        def call():
            rows = np.empty(self.size, np.int64)
            self._wait(self._mpi.Iallgather([np.array([array.shape[0]], np.int64), MPI.INT64_T], [rows, MPI.INT64_T]))
            row_bytes = int(np.prod(array.shape[1:], dtype=np.int64)) * array.itemsize
            counts = rows * row_bytes
            displacements = np.concatenate([[0], np.cumsum(counts)[:-1]])
            out = np.empty(int(rows.sum()) * row_bytes, np.uint8)
            send = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            self._wait(self._mpi.Iallgatherv([send, MPI.BYTE], [out, (counts, displacements), MPI.BYTE]))
            return out.view(array.dtype).reshape((int(rows.sum()),) + array.shape[1:])

        return self._run(what, call)
