"""A one-process communicator: no collective ever leaves the process.

Lets strategy logic run fast in unit tests and on a machine without
Horovod. Like every communicator with one rank (``Communicator``), its
allreduce, broadcast and allgather return their inputs and its account
stays at 0 bytes, 0 calls; tests that count bytes by formula use a
``SimulatedCluster`` of p > 1 ranks instead. It is also the communicator of a group of one rank (``split``
of any communicator into singletons).
"""
import tensorflow as tf

from .communicator import Communicator


class LocalCommunicator(Communicator):
    def _allgather(self, tensor):
        # Reached only through allgather_json: one rank gathers itself.
        return tf.identity(tensor)

    def _sub_communicators(self, groups):
        return [solo_communicator(self, group[0]) for group in groups]


def solo_communicator(parent, parent_rank):
    """The communicator of a group holding only ``parent``'s rank ``parent_rank``."""
    comm = LocalCommunicator(parent=parent)
    comm._ranks = (parent_rank,)
    comm.local_rank, comm.local_size = parent.local_rank, parent.local_size
    return comm
