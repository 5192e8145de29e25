"""Block-scaled symmetric quantisation: int8, int4 and sign (1 bit).

The payload (the concatenation of a collective's tensors, flattened) is cut
into blocks of ``BLOCK_SIZE`` = 256 consecutive elements; the last block is
padded with zeros. Each block b has one float32 scale and integer codes::

    s_b = max_{i in b} |x_i| / Q          Q = 127 (int8), 7 (int4)
    q_i = round(x_i / s_b)                 in [-Q, Q]; 0 where s_b = 0
    x̂_i = q_i · s_b

``round`` is to nearest, ties to even (TF's and NumPy's). A block costs
``256 + 4`` bytes in int8 (1.016 bytes an element, 0.254 of fp32) and
``128 + 4`` in int4, two codes per byte (0.516 bytes an element, 0.129 of
fp32). Why 256: the scale's 4 bytes add 1.6 % to int8 and 3.1 % to int4,
while one large value flattens the codes of 255 neighbours only; per-tensor
scales would let a single outlier zero a whole layer.

``sign`` sends one bit an element, its sign, and one float32 scale per
block of ``SIGN_BLOCK_SIZE`` = 2048: the block's mean magnitude, the scale
that leaves the least squared error on a sign (EF-SignSGD, Karimireddy et
al. 2019, arXiv:1901.09847; 1-bit SGD, Seide et al. 2014)::

    s_b = mean_{i in b} |x_i|      x̂_i = +s_b if x_i >= 0, else −s_b

A block costs 2048/8 + 4 = 260 bytes: 0.127 bytes an element, 0.246 of
int4's and 1/31.5 of fp32's. Why 2048: at 256 the scale would add a quarter
again (0.141, over a quarter of int4's); a mean magnitude is steadier than a
maximum over more elements, so a larger block costs less of the
approximation than it would int8's. Every element's error, the sign's
whole shortfall, goes to the rank's residual (error feedback), so it
applies only where a strategy keeps one: not to SyncAverage's gradients.

The codes cannot be summed as integers (int8 sums overflow, and blocks have
different scales), so these formats travel through the quantised allreduce
(``comm/quantised_allreduce.py``). Non-finite values must be kept out
before quantising: one Inf makes its block's scale Inf and every code of
the block NaN. The strategies check first (``local_updates``).
"""
import tensorflow as tf

from .kinds import ELASTIC_DIFFERENCES, EVERY_PAYLOAD, PSEUDO_GRADIENTS, WEIGHT_DIFFERENCES

BLOCK_SIZE = 256
SIGN_BLOCK_SIZE = 2048
SCALE_BYTES = 4  # one float32 per block


def quantise(blocks, levels):
    """fp32 ``[m, B]`` -> (int32 codes in [-levels, levels] ``[m, B]``, fp32 scales ``[m]``)."""
    scales = tf.reduce_max(tf.abs(blocks), axis=1) / levels
    codes = tf.round(tf.math.divide_no_nan(blocks, scales[:, None]))
    return tf.cast(tf.clip_by_value(codes, -levels, levels), tf.int32), scales


def dequantise(codes, scales):
    """The values the codes stand for: ``codes · scale`` per block, fp32 ``[m, B]``."""
    return tf.cast(codes, tf.float32) * scales[:, None]


def _scale_bytes(scales):
    return tf.reshape(tf.bitcast(scales, tf.uint8), [-1])


def _scales_of(data, blocks):
    return tf.bitcast(tf.reshape(data, [blocks, SCALE_BYTES]), tf.float32)


class Int8Compression:
    """int8 codes, one float32 scale per block of 256 (module docstring)."""

    name = "int8"
    summable = False
    sparse = False
    applies_to = EVERY_PAYLOAD
    block_size = BLOCK_SIZE
    block_bytes = BLOCK_SIZE + SCALE_BYTES
    levels = 127

    def encode(self, blocks):
        """fp32 ``[m, B]`` -> uint8 ``[m · block_bytes]``: the m·B codes, then the m scales."""
        codes, scales = quantise(blocks, self.levels)
        code_bytes = tf.bitcast(tf.cast(tf.reshape(codes, [-1]), tf.int8), tf.uint8)
        return tf.concat([code_bytes, _scale_bytes(scales)], axis=0)

    def decode(self, data, blocks):
        """uint8 ``[m · block_bytes]`` -> fp32 ``[m, B]``."""
        # tf.split, not data[:n] and data[n:]: one eager op instead of two slices' worth (same bytes).
        code_bytes, scale_bytes = tf.split(data, [blocks * BLOCK_SIZE, -1])
        codes = tf.reshape(tf.bitcast(code_bytes, tf.int8), [blocks, BLOCK_SIZE])
        return dequantise(codes, _scales_of(scale_bytes, blocks))


class Int4Compression:
    """int4 codes in [-7, 7], two per byte, one float32 scale per block of 256.

    A code q is stored as the nibble q + 8 (1..15); element 2i of a block
    takes the low nibble of byte i, element 2i + 1 the high one.
    """

    name = "int4"
    summable = False
    sparse = False
    applies_to = EVERY_PAYLOAD
    block_size = BLOCK_SIZE
    block_bytes = BLOCK_SIZE // 2 + SCALE_BYTES
    levels = 7

    def encode(self, blocks):
        codes, scales = quantise(blocks, self.levels)
        nibbles = tf.reshape(codes + 8, [-1, 2])
        packed = tf.cast(nibbles[:, 0] + nibbles[:, 1] * 16, tf.uint8)
        return tf.concat([packed, _scale_bytes(scales)], axis=0)

    def decode(self, data, blocks):
        packed_bytes, scale_bytes = tf.split(data, [blocks * BLOCK_SIZE // 2, -1])  # as Int8Compression.decode
        packed = tf.cast(packed_bytes, tf.int32)
        codes = tf.stack([packed % 16, packed // 16], axis=1) - 8
        return dequantise(tf.reshape(codes, [blocks, BLOCK_SIZE]), _scales_of(scale_bytes, blocks))


class SignCompression:
    """One bit an element, its sign, and one float32 scale per block of 2048, the block's mean
    magnitude (module docstring). Element 8i + j of the payload is bit j of byte i; a set bit is −s."""

    name = "sign"
    summable = False
    sparse = False
    applies_to = frozenset({PSEUDO_GRADIENTS, ELASTIC_DIFFERENCES, WEIGHT_DIFFERENCES})
    block_size = SIGN_BLOCK_SIZE
    block_bytes = SIGN_BLOCK_SIZE // 8 + SCALE_BYTES
    _weights = tf.constant([1, 2, 4, 8, 16, 32, 64, 128], tf.int32)

    def encode(self, blocks):
        scales = tf.reduce_mean(tf.abs(blocks), axis=1)
        negative = tf.reshape(tf.cast(blocks < 0, tf.int32), [-1, 8])
        packed = tf.cast(tf.reduce_sum(negative * self._weights, axis=1), tf.uint8)
        return tf.concat([packed, _scale_bytes(scales)], axis=0)

    def decode(self, data, blocks):
        packed_bytes, scale_bytes = tf.split(data, [blocks * SIGN_BLOCK_SIZE // 8, -1])  # as Int8Compression.decode
        bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(tf.cast(packed_bytes, tf.int32)[:, None],
                                                              tf.range(8, dtype=tf.int32)), 1)
        signs = tf.reshape(1.0 - 2.0 * tf.cast(bits, tf.float32), [blocks, SIGN_BLOCK_SIZE])
        return signs * _scales_of(scale_bytes, blocks)[:, None]
