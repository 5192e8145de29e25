"""A flat shard view of a model's variables: rank j of a group of n holds shard j.

Hierarchical's inter strategy runs on a shard of the flattened trainable
variables instead of on the variables themselves, so the state it keeps
(EASGD's center, DiLoCo's synced weights and outer optimizer, ...) is 1/n of
the model on each rank of a group. The layout is ``reducescatter``'s
(comm/communicator.py): the variables, in the order ``build`` received them,
are flattened and concatenated into N elements, zero-padded to n·m with
m = ⌈N/n⌉, and shard j is the elements [j·m, (j+1)·m). The padding is zeros
on every rank, stays zeros under every strategy's update (a zero gradient,
a zero difference), and is cut off when the shards are put back together.
At another layout of groups (a resize), ``ReCut`` puts each saved group's
shards together and cuts them again.
"""
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from .. import resize, validation
from ..comm.communicator import shard_length


@dataclass(frozen=True)
class ShardSpec:
    """What a strategy's ``build`` and ``expected_traffic`` read of a variable
    (its shape and dtype), for a shard that is not yet a variable."""

    shape: tuple
    dtype: tf.dtypes.DType


class FlatShards:
    """The layout of ``variables`` cut into ``parts`` flat shards, from the view of shard ``index``.

    Args:
      variables: the trainable variables (anything with a static ``shape``
        and a ``dtype``); they must share one dtype.
      parts: n, the shards (the ranks of a group).
      index: j, this rank's shard.
    """

    def __init__(self, variables, parts, index):
        variables = list(variables)
        dtypes = sorted({tf.as_dtype(v.dtype).name for v in variables})  # Keras variables name theirs
        if len(dtypes) != 1:
            raise validation.refusal("variables", "trainable variables of one dtype (Hierarchical shards them "
                                     "flattened into one vector)", dtypes)
        self.dtype = tf.as_dtype(variables[0].dtype)
        self.shapes = [tuple(int(d) for d in v.shape) for v in variables]
        self.sizes = [int(tf.TensorShape(s).num_elements()) for s in self.shapes]
        self.elements = sum(self.sizes)
        self.parts = int(parts)
        self.index = int(index)
        self.length = shard_length(self.elements, self.parts)

    @property
    def spec(self):
        """The shard as ``ShardSpec`` (shape [m], the variables' dtype)."""
        return ShardSpec((self.length,), self.dtype)

    def flatten(self, tensors):
        """``tensors`` (one per variable) as one flat vector of n·m elements, zero-padded."""
        flat = tf.concat([tf.reshape(tf.cast(t, self.dtype), [-1]) for t in tensors], axis=0)
        padding = self.parts * self.length - self.elements
        return tf.pad(flat, [[0, padding]]) if padding else flat

    def rows(self, tensors, extras=()):
        """``tensors`` flattened as n rows of m (row j is shard j), each row
        followed by the scalars ``extras``: every shard then carries them
        through ``reducescatter`` (a group's count reaches every rank of it)."""
        rows = tf.reshape(self.flatten(tensors), [self.parts, self.length])
        if not extras:
            return rows
        column = tf.reshape(tf.stack([tf.cast(e, self.dtype) for e in extras]), [1, len(extras)])
        return tf.concat([rows, tf.tile(column, [self.parts, 1])], axis=1)

    def shard_of(self, tensors):
        """This rank's shard j of ``tensors``: m elements."""
        return self.flatten(tensors)[self.index * self.length:(self.index + 1) * self.length]

    def unflatten(self, flat):
        """The n·m (or N) elements of ``flat`` back as one tensor per variable, padding dropped."""
        pieces = tf.split(flat[:self.elements], self.sizes)
        return [tf.reshape(p, s) for p, s in zip(pieces, self.shapes)]

    def describe(self):
        """``[n, j, m, N]``: what a checkpoint of shard state must be restored into."""
        return [self.parts, self.index, self.length, self.elements]


class ReCut(resize.Rule):
    """A sharded state variable at another layout of groups: gather each saved
    group's shards, apply ``across`` with the groups as the ranks, cut again.

    The saved p ranks formed p/n groups of ``saved_parts`` = n consecutive
    ranks, rank j of a group holding shard j. Each saved group's value is its
    n shards concatenated in rank order, padding stripped (the first N
    elements); ``across`` (the inter strategy's rule for the variable,
    ``resize.DEFAULT`` unless it declares one) maps those G values to the new
    group's, and the new rank keeps its shard of that, zero-padded as
    ``FlatShards`` pads. State every group holds alike (EASGD's center,
    DiLoCo's θ and outer slots) is so kept exactly: any group's concatenation
    is the whole of it.

    Args:
      across: the rule between groups.
      saved_parts: n of the saved layout.
      new_layout: ``rank -> (group index, groups, FlatShards of the rank)`` in the new layout.
    """

    name = "re_cut"

    def __init__(self, across, saved_parts, new_layout):
        self.across = across
        self.saved_parts = int(saved_parts)
        self.new_layout = new_layout

    def __call__(self, saved, ranks, rank):
        n = self.saved_parts
        group, groups, layout = self.new_layout(rank)
        if len(saved) % n or saved[0].shape != (shard_length(layout.elements, n),):
            raise ValueError(f"`saved` must be shards of {layout.elements} elements cut by groups of {n} ranks. "
                             f"Received: {len(saved)} shards of shape {saved[0].shape}")
        wholes = [np.concatenate(saved[start:start + n])[:layout.elements] for start in range(0, len(saved), n)]
        whole = self.across(wholes, groups, group)
        padded = np.zeros(layout.parts * layout.length, whole.dtype)
        padded[:layout.elements] = whole
        return padded[layout.index * layout.length:(layout.index + 1) * layout.length]

    def __repr__(self):
        return f"shards.ReCut({self.across!r}, saved_parts={self.saved_parts})"


class NewLayout(resize.Rule):
    """The saved layout ``[n, j, m, N]`` becomes the new rank's (``FlatShards.describe``)."""

    name = "new_layout"

    def __init__(self, new_layout):
        self.new_layout = new_layout

    def __call__(self, saved, ranks, rank):
        return np.asarray(self.new_layout(rank)[2].describe(), saved[0].dtype)
