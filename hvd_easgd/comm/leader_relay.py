"""The groups of ranks seen as the ranks of one communicator, through their leaders.

Hierarchical's inter level treats each group of ranks as one worker. Only
the group's leader (its rank 0) takes part in the collective over the
groups, on the leaders' communicator; it then broadcasts the result within
its group. Every rank of a group runs the inter strategy on the same inputs
(the ranks of a group are identical), so once they share the collective's
result they stay identical, for any inter strategy, without broadcasting
weights or state.

Why leaders and not every rank: with n ranks per group, "every rank in a
cross-group set per local rank" sends n copies of the same payload over the
link between groups (the slow one, between hosts); leaders send one, and the
copies travel on the fast link within the group instead.
"""
import tensorflow as tf

from .communicator import Communicator
from .compression import Compression


class LeaderRelay(Communicator):
    """Rank ``group_index`` of ``group_count`` groups.

    Args:
      leaders: the communicator of the groups' leaders, or None on a rank that does not lead.
      group: this rank's group; its rank 0 is the leader.
      group_index: this rank's group among the groups (the leader's rank in ``leaders``).
      group_count: the number of groups.

    Accounts: the collective over the groups is recorded by ``leaders`` (on
    the leaders only); the broadcast within the group by this communicator,
    whose parent is ``group`` (so the group's account includes it). One
    broadcast call per dtype of the result.
    """

    def __init__(self, leaders, group, group_index, group_count):
        super().__init__(parent=group)
        if (leaders is not None) != (group.rank == 0):
            raise ValueError("a group's rank 0, and only it, must lead its group")
        self.leaders = leaders
        self.group = group
        self.rank, self.size = group_index, group_count
        self.local_rank, self.local_size = group.local_rank, group.local_size

    def allreduce(self, tensors, op="average", compression=Compression.none, record=True):
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        if self.leaders is not None:
            reduced = self.leaders.allreduce(tensors, op=op, compression=compression, record=record)
        else:  # the shapes and dtypes of the leader's result; its values arrive by the broadcast
            reduced = [tf.zeros_like(t) for t in tensors]
        return self._from_leader(reduced, compression, record)

    def broadcast(self, tensors, root_rank=0):
        """``root_rank`` names a group: its leader's values reach every rank of every group."""
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        if self.leaders is not None:
            tensors = self.leaders.broadcast(tensors, root_rank)
        return self._from_leader(tensors, Compression.none, record=True)

    def _from_leader(self, tensors, compression, record):
        """The leader's ``tensors`` on every rank of the group: one broadcast per dtype.

        Sent in ``compression``'s form: a result that crossed the leaders'
        wire in fp16 is exactly representable in fp16, so this loses nothing.
        """
        if not tensors:
            return []
        wire, dtypes = zip(*(compression.compress(t) for t in tensors))
        out = list(wire)
        by_dtype = {}
        for i, t in enumerate(wire):
            by_dtype.setdefault(t.dtype, []).append(i)
        for indices in by_dtype.values():
            flat = tf.concat([tf.reshape(wire[i], [-1]) for i in indices], axis=0)
            if record:
                self._record([flat])
            flat = self.group._broadcast([flat], 0)[0]
            sizes = [int(wire[i].shape.num_elements()) for i in indices]
            for i, part in zip(indices, tf.split(flat, sizes)):
                out[i] = tf.reshape(part, tf.shape(wire[i]))
        return [compression.decompress(t, d) for t, d in zip(out, dtypes)]

    def _allgather(self, tensor):
        raise NotImplementedError("LeaderRelay relays allreduce and broadcast only (what inter strategies use)")
