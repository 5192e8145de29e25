"""The direct MPI communicator: every collective is one synchronous MPI call inside the step (a started
allreduce, on the communicator's worker thread: communicator.py, Started collectives).

Why it exists: one model's gradients (153 KB in 8 tensors) take ~1 ms
through ``hvd.grouped_allreduce`` in a ``tf.function`` over MPI at np = 2,
but ~40 µs through a bare ``MPI_Allreduce``. Horovod hands each tensor to a
background thread that negotiates, once per cycle, which tensors every rank
has ready; at this size that wait and negotiation, not the wire, is the
cost. Here a grouped allreduce is ONE TF op (``MpiDirectAllreduce``,
comm/_mpi_ops/mpi_ops.cc) that packs the tensors of each dtype into one
buffer and reduces it with ``MPI_Allreduce`` on the thread TF runs it on.
(A first version ran mpi4py inside ``tf.numpy_function``: the GIL and
Python per call made it slower than Horovod.)

What replaces the negotiation: program order. Every rank traces the same
code, so it issues the same collectives in the same order, provided TF runs
them in program order. The ops are *stateful*, and TF's automatic control
dependencies run the stateful ops of a ``tf.function`` that touch no
resource in program order (also across ``tf.cond`` branches, whose If op is
itself stateful, and loop iterations); eager calls run in order anyway. Two
guards make a breach visible instead of silent: a collective that starts
while another is running on the same communicator fails instead of taking
turns (taking turns could pick a different order on each rank), and
``order_digest()`` is a running hash of every collective's kind, dtypes and
sizes, which tests compare across ranks.

It replaces every collective of the job, and Horovod is not started: a
collective on Horovod's side and one here, waiting on each other from two
threads, could deadlock; and an idle Horovod background thread still enters
MPI every cycle, taking a core's time from a 2-core node. MPI is initialised
by mpi4py with ``MPI_THREAD_MULTIPLE`` (TF calls MPI from its own threads),
and the collectives run on a duplicate of ``COMM_WORLD`` (``split``: on
``MPI_Comm_split`` of it), so they never match anyone else's messages. MPI
launches only (``horovodrun --mpi``, ``mpirun``, ``srun --mpi=pmix``); a
Gloo launch has no MPI to use.

Guarantees kept from the Horovod path: the byte/call account (the base
class records the same tensors before calling the primitives below), NaN
agreement (a NaN on one rank reaches every rank through the Sum, and the
strategies decide after the reduction), bit-identical results on every rank
(at np = 2 both ranks compute a + b, and IEEE addition is commutative bit
for bit; beyond, this rests on Open MPI's allreduce reducing each element
along one tree or ring and distributing it, which the tests do not cover:
they run np = 2), and no endless hang: a collective still waiting after
``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` (hvd_easgd sets 60) aborts the job,
as Horovod's stall inspector does.
"""
import atexit
import os

import mpi4py

# MPI is started explicitly below: the automatic choice of collectives may
# have loaded mpi4py already, with automatic initialisation off, to read MPI's
# version (_mpi_ops.mpi_library_version).
mpi4py.rc.initialize = False
from mpi4py import MPI  # noqa: E402


def _start_mpi():
    """MPI with ``MPI_THREAD_MULTIPLE``: TF runs the ops on its executor threads,
    not the thread that initialised MPI. Finalised at exit, as every MPI process
    must be before it ends (mpirun reports an abnormal exit otherwise)."""
    if MPI.Is_initialized():
        return
    MPI.Init_thread(MPI.THREAD_MULTIPLE)
    atexit.register(lambda: MPI.Is_finalized() or MPI.Finalize())


_start_mpi()

import tensorflow as tf  # noqa: E402

from . import _mpi_ops  # noqa: E402
from .communicator import Communicator  # noqa: E402
from .local_comm import solo_communicator  # noqa: E402

DEFAULT_STALL_SECONDS = 60.0


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


class DirectMPICommunicator(Communicator):
    """Collectives straight over MPI, one TF op per grouped collective.

    Args:
      stall_seconds: a collective still waiting after this long aborts the
        whole job (default ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``, else 60);
        0 waits forever.
      mpi_comm, parent, ranks: for ``split`` (a sub-communicator over an
        ``MPI_Comm_split`` of the parent's communicator).
    """

    def __init__(self, stall_seconds=None, mpi_comm=None, parent=None, ranks=None):
        provided = MPI.Query_thread()
        if provided < MPI.THREAD_MULTIPLE:
            raise RuntimeError("the mpi-direct communicator needs MPI_THREAD_MULTIPLE (TF calls MPI from its own "
                               f"threads); MPI was initialised at thread level {provided} by whoever imported mpi4py "
                               "first; create the communicator before anything else initialises MPI")
        self._ops = _mpi_ops.load(MPI.Get_library_version())  # first: a missing library says so before anything
        super().__init__(parent=parent)
        if parent is None:
            (_, _, self.local_rank, self.local_size, self.cross_rank, self.cross_size) = launch_layout()
            # Our own matching space: nobody else's messages meet ours.
            self._mpi = MPI.COMM_WORLD.Dup()
        else:
            self.local_rank, self.local_size = parent.local_rank, parent.local_size
            self.cross_rank, self.cross_size = parent.cross_rank, parent.cross_size
            self._mpi = mpi_comm
            self._ranks = tuple(ranks)
        self.rank, self.size = self._mpi.Get_rank(), self._mpi.Get_size()
        self._handle = self._mpi.py2f()  # how the ops name the communicator
        # Started allreduces run on a worker thread (communicator.py, Started collectives), over a duplicate
        # of this communicator (a collective of its ranks, made here by all of them): they never interleave
        # with the main thread's collectives, and the one-at-a-time guard holds on each.
        self._started_mpi = self._mpi.Dup()
        self._started_handle = self._started_mpi.py2f()
        self._reduce_in_background(self._background_allreduce)
        if stall_seconds is None:
            stall_seconds = (parent.stall_seconds if parent is not None else
                             float(os.environ.get("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", DEFAULT_STALL_SECONDS)))
        self.stall_seconds = float(stall_seconds)

    def order_digest(self):
        """``(collectives so far, hash of their kinds, dtypes and sizes in order)``: equal on every rank
        when the ranks issued the same collectives in the same order."""
        count, digest = self._ops.mpi_direct_order(comm=self._handle).numpy().tolist()
        return count, format(digest & (2**64 - 1), "016x")

    # --- the primitives ---------------------------------------------------------------------
    def _grouped_allreduce(self, tensors, op):
        return self._ops.mpi_direct_allreduce(tensors, comm=self._handle, average=op == "average",
                                              stall_seconds=self.stall_seconds)

    def _background_allreduce(self, arrays, op, handle):
        """The worker's eager allreduce of a started collective, on the duplicate communicator."""
        return self._ops.mpi_direct_allreduce([tf.convert_to_tensor(a) for a in arrays], comm=self._started_handle,
                                              average=op == "average", stall_seconds=self.stall_seconds)

    def _broadcast(self, tensors, root_rank):
        if not 0 <= root_rank < self.size:
            raise ValueError(f"`root_rank` must be in [0, {self.size}). Received: root_rank={root_rank}")
        return self._ops.mpi_direct_broadcast(tensors, comm=self._handle, root_rank=root_rank,
                                              stall_seconds=self.stall_seconds)

    def _allgather(self, tensor):
        return self._ops.mpi_direct_allgather(tensor, comm=self._handle, stall_seconds=self.stall_seconds)

    has_alltoall = True  # MpiDirectAlltoall: the quantised allreduce's p > 2 form

    def _alltoall(self, tensor):
        return self._ops.mpi_direct_alltoall(tensor, comm=self._handle, stall_seconds=self.stall_seconds)
    def _grouped_reducescatter(self, tensors, op):
        return self._ops.mpi_direct_reducescatter(tensors, comm=self._handle, average=op == "average",
                                                  stall_seconds=self.stall_seconds)

    def _sub_communicators(self, groups):
        # One MPI_Comm_split of this communicator (a collective of all its
        # ranks): a rank's color is its group, or none.
        mine = next((i for i, g in enumerate(groups) if self.rank in g), None)
        color = MPI.UNDEFINED if mine is None or len(groups[mine]) == 1 else mine
        sub = self._mpi.Split(color=color, key=self.rank)
        made = [None] * len(groups)
        if mine is not None:
            group = groups[mine]
            made[mine] = (solo_communicator(self, group[0]) if len(group) == 1 else
                          DirectMPICommunicator(mpi_comm=sub, parent=self, ranks=group))
        return made
