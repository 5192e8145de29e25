"""A one-process communicator: collectives are identities.

Lets strategy logic (and its byte/call account) be unit-tested fast, without
a launcher or Horovod.
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
