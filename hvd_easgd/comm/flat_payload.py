"""The layout both collectives of payloads that cannot be summed use (the quantised allreduce and the
sparse one): a collective's tensors of more than one element flattened and concatenated in order, the
*coded* part; and its one-element tensors (a non-finite flag, a sample count), the *exact values*,
which travel as float32 beside the codes and are summed exactly, not encoded.
"""
import math

import tensorflow as tf


def elements(shape):
    return int(math.prod(int(d) for d in shape))


def split_payload(shapes):
    """``(coded elements, exact values)`` of tensors of these shapes: a one-element tensor travels
    exact, every other one coded."""
    sizes = [elements(s) for s in shapes]
    return sum(n for n in sizes if n != 1), sum(1 for n in sizes if n == 1)


class FlatPayload:
    """``tensors`` laid out as the module docstring says.

    Attributes:
      coded: the concatenation of the tensors of more than one element, fp32 ``[elements]``.
      exact: the one-element tensors, fp32 ``[exact values]``.
    """

    def __init__(self, tensors):
        self.tensors = tensors
        self.exact_at = [i for i, t in enumerate(tensors) if elements(t.shape) == 1]
        self.coded_at = [i for i in range(len(tensors)) if i not in self.exact_at]
        self.coded = self._concat(self.coded_at, [-1])
        self.exact = self._concat(self.exact_at, [1])

    def _concat(self, at, shape):
        return tf.concat([tf.reshape(tf.cast(self.tensors[i], tf.float32), shape) for i in at] or
                         [tf.zeros([0], tf.float32)], axis=0)

    @property
    def elements(self):
        return int(self.coded.shape[0])

    def exact_bytes(self, values=None):
        """``values`` (default: this payload's exact values), float32, as uint8 bytes."""
        return tf.reshape(tf.bitcast(self.exact if values is None else values, tf.uint8), [-1])

    def exact_values(self, data):
        """The float32 exact values that ``data`` (uint8, as ``exact_bytes`` wrote them) holds."""
        return tf.bitcast(tf.reshape(data, [len(self.exact_at), 4]), tf.float32)

    def results(self, coded, exact, sent=None):
        """The reduced tensors from the reduced ``coded`` values (fp32 ``[>= elements]``, padding after)
        and the reduced ``exact`` ones; with ``sent`` (what this rank's coded part stands for once
        decoded, fp32 ``[>= elements]``), also this rank's errors (tensor minus what it sent; zero for
        the exact values): ``(reduced, errors)``."""
        reduced, errors = [None] * len(self.tensors), [None] * len(self.tensors)
        # Each tensor's elements, then the padding: one split each instead of a slice per tensor (eager
        # slicing costs several ops a slice, and SimulatedCluster's ranks spend their time in op dispatch).
        sizes = [elements(self.tensors[i].shape) for i in self.coded_at]
        # No coded tensor (every one a single value, sent exact): nothing to split, and TF's split
        # of an empty tensor into one inferred piece fails.
        pieces = tf.split(coded, sizes + [-1]) if sizes else []
        sent_pieces = tf.split(sent, sizes + [-1]) if sent is not None and sizes else None
        for k, i in enumerate(self.coded_at):
            t = self.tensors[i]
            reduced[i] = tf.cast(tf.reshape(pieces[k], t.shape), t.dtype)
            if sent is not None:
                errors[i] = t - tf.cast(tf.reshape(sent_pieces[k], t.shape), t.dtype)
        for k, value in enumerate(tf.unstack(exact)):
            t = self.tensors[self.exact_at[k]]
            reduced[self.exact_at[k]] = tf.cast(tf.reshape(value, t.shape), t.dtype)
            errors[self.exact_at[k]] = tf.zeros_like(t)
        return (reduced, errors) if sent is not None else reduced
