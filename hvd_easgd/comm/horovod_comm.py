"""The Horovod communicator: ring-allreduce over MPI or Gloo (CPU) or NCCL (GPU).

One of the two modules of hvd_easgd that import Horovod (with startup/runtime.py).
Only Horovod's raw collectives are used; its high-level wrappers are broken
under Keras 3.

Sub-communicators are Horovod process sets. Horovod takes them either at
``hvd.init(process_sets=[...])``, which needs every set's ranks before
Horovod starts, or, with dynamic process sets (``hvd.init(process_sets=
"dynamic")``, i.e. HOROVOD_DYNAMIC_PROCESS_SETS=1), from
``hvd.add_process_set`` afterwards, a collective of all ranks. Groups by host
are known only once Horovod runs, so ``split`` uses the dynamic form (tested
under horovodrun with Gloo and with MPI); ``hvd_easgd.init(process_sets=
"dynamic")`` enables it.

Started allreduces run in the background (communicator.py, Started
collectives): the worker calls ``hvd.grouped_allreduce`` eagerly under a
name of its own, ``hvd_easgd_started_<process set>_<handle>``. Horovod
matches collectives across ranks by name, and eager ops would otherwise all
share one; the handle counts this communicator's starts, which every rank
makes in the same order, so the name is the same on every rank and unique
among the collectives in flight.
"""
import horovod.tensorflow as hvd
import tensorflow as tf

from .communicator import Communicator
from .local_comm import solo_communicator

_HOROVOD_OPS = {"average": hvd.Average, "sum": hvd.Sum}


class HorovodCommunicator(Communicator):
    """Horovod's global ranks, or (``process_set``) those of one process set.

    Args:
      process_set: a Horovod ``ProcessSet`` holding this rank; default the global one.
      parent: the communicator this one was split from (its account also records this one's traffic).
      dynamic_process_sets: whether Horovod was started with dynamic process sets (``split`` needs them).
    """

    def __init__(self, process_set=None, parent=None, dynamic_process_sets=False):
        if not hvd.is_initialized():
            raise RuntimeError("Horovod is not initialised; call hvd_easgd.init() first")
        super().__init__(parent=parent)
        self.process_set = hvd.global_process_set if process_set is None else process_set
        self.dynamic_process_sets = dynamic_process_sets
        self.refresh_membership()
        if process_set is not None:
            self._ranks = tuple(process_set.ranks)
        self._reduce_in_background(self._background_allreduce)

    def refresh_membership(self):
        """Reads this rank's place among the ranks from Horovod.

        Called once here and again after Horovod's elastic mode re-initialised
        with other ranks (hvd_easgd/checkpoint/elastic.py): every holder of this
        communicator (strategy, callbacks) then sees the new rank and size.
        """
        self.rank = self.process_set.rank()
        self.size = self.process_set.size()
        self.local_rank = hvd.local_rank()
        self.local_size = hvd.local_size()
        self.cross_rank = hvd.cross_rank()
        self.cross_size = hvd.cross_size()
        self.homogeneous = hvd.is_homogeneous()

    def _grouped_allreduce(self, tensors, op):
        return hvd.grouped_allreduce(tensors, op=_HOROVOD_OPS[op], process_set=self.process_set)

    def _background_allreduce(self, arrays, op, handle):
        """The worker's eager grouped allreduce of a started collective (module docstring: its name)."""
        name = f"hvd_easgd_started_{self.process_set.process_set_id}_{handle}"
        return hvd.grouped_allreduce([tf.convert_to_tensor(a) for a in arrays], op=_HOROVOD_OPS[op],
                                     process_set=self.process_set, name=name)

    def _broadcast(self, tensors, root_rank):
        # Horovod names the root by its global rank, even within a process set.
        root = self.ranks[root_rank] if self.parent is not None else root_rank
        return [hvd.broadcast(t, root_rank=root, process_set=self.process_set) for t in tensors]

    def _allgather(self, tensor):
        return hvd.allgather(tensor, process_set=self.process_set)

    # hvd.alltoall takes uint8 over Gloo and MPI (the quantised allreduce sends bytes).
    has_alltoall = True

    def _alltoall(self, tensor):
        # Without splits Horovod cuts axis 0 into size equal parts.
        return hvd.alltoall(tensor, process_set=self.process_set)
    def _grouped_reducescatter(self, tensors, op):
        # Each tensor is a flat multiple of the set's size (the base class pads):
        # Horovod's split of the leading dimension is then our equal blocks in rank order.
        return hvd.grouped_reducescatter(tensors, op=_HOROVOD_OPS[op], process_set=self.process_set)

    def _sub_communicators(self, groups):
        if self.parent is not None:
            raise NotImplementedError("a Horovod sub-communicator cannot be split again; split the global one")
        made = []
        for group in groups:
            if len(group) == 1:  # a group of one exchanges nothing: no process set
                made.append(solo_communicator(self, group[0]))
            elif len(group) == self.size:  # Horovod refuses a duplicate of the global set
                made.append(HorovodCommunicator(hvd.global_process_set, parent=self))
                made[-1]._ranks = tuple(group)
            else:
                if not self.dynamic_process_sets:
                    raise RuntimeError("sub-communicators need Horovod's dynamic process sets: start with "
                                       "hvd_easgd.init(process_sets='dynamic') (train.py does when the "
                                       "strategy asks for them)")
                # Every rank adds every set, in the same order: it is a collective.
                process_set = hvd.add_process_set(list(group))
                made.append(HorovodCommunicator(process_set, parent=self) if self.rank in group else None)
        return made
