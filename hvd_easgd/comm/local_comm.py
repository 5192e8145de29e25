"""A one-process communicator: collectives are identities.

Lets strategy logic (and its byte/call account) be unit-tested fast, without
a launcher or Horovod. It is also the communicator of a group of one rank
(``split`` of any communicator into singletons): such a group exchanges
nothing, and its account stays at zero.
"""
import tensorflow as tf

from .communicator import Communicator


class LocalCommunicator(Communicator):
    def _grouped_allreduce(self, tensors, op):
        # One rank: its average and its sum are itself.
        return [tf.identity(t) for t in tensors]

    def _broadcast(self, tensors, root_rank):
        if root_rank != 0:
            raise ValueError(f"`root_rank` must be 0 with one process. Received: root_rank={root_rank}")
        return [tf.identity(t) for t in tensors]

    def _allgather(self, tensor):
        return tf.identity(tensor)

    def _sub_communicators(self, groups):
        return [solo_communicator(self, group[0]) for group in groups]


def solo_communicator(parent, parent_rank):
    """The communicator of a group holding only ``parent``'s rank ``parent_rank``."""
    comm = LocalCommunicator(parent=parent)
    comm._ranks = (parent_rank,)
    comm.local_rank, comm.local_size = parent.local_rank, parent.local_size
    return comm
