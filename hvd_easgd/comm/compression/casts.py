"""Formats that change an element's type and nothing else: none, fp16, bf16.

``none`` and ``fp16`` can be summed as they travel, so they go through the
communicator's ordinary allreduce (fp16 is cast back after it). ``bf16``
cannot under Horovod 0.28.1, whose TF ops take no bfloat16: it travels as
raw bytes through the quantised allreduce (``comm/quantised_allreduce.py``)
like int8 and int4, with one element per "block" and no scale.
"""
import tensorflow as tf

from .kinds import EVERY_PAYLOAD


class NoCompression:
    """Every element as it is: 4 bytes a float32."""

    name = "none"
    summable = True
    applies_to = EVERY_PAYLOAD

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, original_dtype):
        return tensor

    @staticmethod
    def wire_itemsize(dtype):
        """The bytes one element of ``dtype`` takes on the wire."""
        return tf.as_dtype(dtype).size


class FP16Compression:
    """Halves the bytes of fp32/fp64 tensors; other dtypes travel unchanged.

    Summable: Horovod and MPI add fp16 as they reduce, so the payload needs
    no collective of its own (the sum is rounded to fp16 at every hop).
    """

    name = "fp16"
    summable = True
    applies_to = EVERY_PAYLOAD

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, original_dtype):
        return tensor if original_dtype is None else tf.cast(tensor, original_dtype)

    @staticmethod
    def wire_itemsize(dtype):
        """The bytes one element of ``dtype`` takes on the wire: 2 for a float, as ``compress`` sends it."""
        dtype = tf.as_dtype(dtype)
        return 2 if dtype.is_floating else dtype.size


class BF16Compression:
    """bfloat16: fp32's exponent range in 2 bytes (8 bits of mantissa).

    Not summable here: Horovod's TF ops take no bfloat16, so each rank's
    bf16 bits travel as bytes through a collective that does not add them,
    and every rank adds the decoded values in fp32, in rank order.
    """

    name = "bf16"
    summable = False
    sparse = False
    applies_to = EVERY_PAYLOAD
    block_size = 1
    block_bytes = 2  # one bf16, no scale

    @staticmethod
    def encode(blocks):
        """fp32 ``[m, 1]`` -> uint8 ``[2m]``: the bf16 bits of each value (round to nearest even)."""
        return tf.reshape(tf.bitcast(tf.cast(blocks, tf.bfloat16), tf.uint8), [-1])

    @staticmethod
    def decode(data, blocks):
        """uint8 ``[2m]`` -> fp32 ``[m, 1]``."""
        pairs = tf.reshape(data, [blocks, 1, 2])
        return tf.cast(tf.bitcast(pairs, tf.bfloat16), tf.float32)
