"""What crosses the wire: full precision, or fp16 cast back after the collective."""
import tensorflow as tf


class _NoCompression:
    name = "none"

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


class _FP16Compression:
    """Halves the bytes of fp32/fp64 tensors; other dtypes travel unchanged."""

    name = "fp16"

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


class Compression:
    """Named choices, as Horovod spells them: ``Compression.none``, ``Compression.fp16``."""

    none = _NoCompression()
    fp16 = _FP16Compression()

    @classmethod
    def by_name(cls, name):
        choices = {"none": cls.none, "fp16": cls.fp16}
        if name not in choices:
            raise ValueError(f"`compression` must be one of {sorted(choices)}. Received: compression={name!r}")
        return choices[name]
