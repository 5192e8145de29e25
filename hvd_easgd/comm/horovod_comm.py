"""The Horovod communicator: ring-allreduce over MPI or Gloo (CPU) or NCCL (GPU).

One of the two modules of hvd_easgd that import Horovod (with runtime.py).
Only Horovod's raw collectives are used; its high-level wrappers are broken
under Keras 3.
"""
import horovod.tensorflow as hvd

from .communicator import Communicator

_HOROVOD_OPS = {"average": hvd.Average, "sum": hvd.Sum}


class HorovodCommunicator(Communicator):
    def __init__(self):
        if not hvd.is_initialized():
            raise RuntimeError("Horovod is not initialised; call hvd_easgd.init() first")
        super().__init__()
        self.rank = hvd.rank()
        self.size = hvd.size()
        self.local_rank = hvd.local_rank()
        self.local_size = hvd.local_size()
        self.cross_rank = hvd.cross_rank()
        self.cross_size = hvd.cross_size()

    def _grouped_allreduce(self, tensors, op):
        return hvd.grouped_allreduce(tensors, op=_HOROVOD_OPS[op])

    def _broadcast(self, tensors, root_rank):
        return [hvd.broadcast(t, root_rank=root_rank) for t in tensors]

    def _allgather(self, tensor):
        return hvd.allgather(tensor)
