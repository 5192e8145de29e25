"""Top-k sparsification with low-bit values: the ``topk`` choice of ``--compression``.

SparseLoCo (Sarfi et al. 2025, arXiv:2508.15706) sends DiLoCo's
pseudo-gradient at 1–3 % density, top-k by magnitude per chunk, with 2-bit
values and error feedback; DeMo (Peng et al. 2024, arXiv:2411.19870) also
takes its top-k chunk by chunk (of each chunk's DCT). This format sends, per rank, the k largest
magnitudes of each chunk of its payload, each as a 12-bit position and a
B-bit code, and one float32 scale per chunk. What it does not send stays in
the rank's residual (error feedback: ``strategies/error_feedback.py``;
EASGD keeps it in x_i − x̃ instead).

The choices, and why:

* **Per chunk, over the concatenated payload.** The payload (the
  collective's tensors of more than one element, flattened and concatenated
  in order, as the quantised formats lay it out) is cut into chunks of
  C = 4095 elements; the last is padded with zeros. Per chunk, not per
  tensor: a position within a chunk takes 12 bits (a position in a tensor
  of 2^24 elements would take 24); every chunk has the same k, so every
  rank's message has the same static size and one ``tf.math.top_k`` over a
  ``[chunks, C]`` matrix selects them all; each chunk's scale fits its own
  magnitudes. Over the concatenation, not chunk by tensor: a bias of 64
  elements padded to its own chunk would send all its elements. A chunk's
  k-th value can be smaller than another chunk's largest unsent one; error
  feedback sends that one later.
* **C = 4095 = 2^12 − 1.** A 12-bit position then has one value left over,
  4095, the *sink*: a slot that sends nothing points there (see below), and
  the decoder drops it. Why 12 bits: at the densities SparseLoCo uses a
  kept element costs 12 + B bits and a chunk 32 more; 8-bit positions
  (C = 255) would put a 4-byte scale on every 255 elements, 16-bit ones
  spend 4 bits more on every kept element. At density 1/64 and B = 2 an
  element of the payload costs 0.227 bits with 12-bit positions, 0.282
  with 8-bit or 16-bit ones.
* **k = ⌈D·C⌉** slots per chunk for a density D (0 < D <= 1; default
  1/64: 64 of every 4095 elements, 1.6 %, inside SparseLoCo's 1–3 %).
* **B-bit codes, sign and magnitude, no zero** (B in 1, 2, 4, 8; default
  2). The kept elements are the chunk's largest, so a code for zero would
  be wasted: with L = 2^(B−1) magnitude cells of width w = s/L over
  [0, s], s the chunk's largest magnitude, an element u is sent as the
  centre of its cell (a mid-rise quantiser)::

      q = min(⌊|u|/w⌋, L − 1)          code = L·[u < 0] + q
      û = ±(2q + 1) · s·2^−B           |u − û| <= s·2^−B

  B = 2 gives ±s/4 and ±3s/4; B = 1 gives ±s/2 (sign and scale). q is
  counted as the edges j·w (0 < j < L) at or below |u|, not divided out,
  so that no rounding of a quotient puts u in a cell it is not in.
* **The sink.** A kept element with |u| < s·2^−(B+1) (a quarter of a cell)
  is not sent: its nearest code, ±w/2, would leave an error larger than
  |u|, so sending it would make its error worse. Its slot points at the sink
  (position 4095, code 0), and u stays in the residual whole. So is an
  exact zero (a chunk with fewer than k non-zero elements, the padding).

The update (DiLoCo, ``strategies/error_feedback.py``), on rank i of p at a
synchronisation, with e_i what its earlier messages left::

    u_i = Δ_i + e_i                    the pseudo-gradient, and what is owed
    m_i = encode(u_i)                  this module: at most k slots a chunk
    e_i ← u_i − decode(m_i)            what stays, exactly (below)
    θ  ← outer(θ, (1/p) Σ_j decode(m_j))   summed in rank order (sparse_allreduce.py)

EASGD sends m_i = encode(α(x_i − x̃)), keeps no e_i, and x_i loses
decode(m_i) alone: what was not sent stays in x_i − x̃ (``easgd.py``).

What is sent plus what stays is exactly what there was, bit for bit: a
sent element's û is within a factor 2 of u (|u| >= w/4 in the lowest
cell, |u| >= q·w in cell q >= 1), so u − û is exact in floating point
(Sterbenz's lemma), and û + (u − û) = u; an unsent element sends 0 and
keeps u. (A scale below 2^−117 makes s·2^−(B+1) subnormal, and the
quarter-cell test may then be off by a rounding.)

Message layout (uint8), n = m·k slots for m chunks, chunk by chunk, each
chunk's slots in ``top_k`` order (largest magnitude first; ties: the lower
position first)::

    positions   3·⌈n/2⌉ bytes       two 12-bit positions a, b per 3 bytes:
                                    a mod 256, ⌊a/256⌋ + 16·(b mod 16), ⌊b/16⌋
                                    (an odd n is padded with one sink)
    codes       ⌈n·B/8⌉ bytes       8/B codes a byte, the first in the low bits
    scales      4·m bytes           float32 s per chunk

    bytes = 3·⌈n/2⌉ + ⌈n·B/8⌉ + 4·m,     m = ⌈elements / 4095⌉,  n = m·⌈D·4095⌉

plus 4 bytes per one-element tensor (a flag, a count), which travels exact.
On the language model (141,312 parameters, m = 35) at the defaults:
n = 2,240, 3,360 + 560 + 140 = 4,060 bytes, and 4 for the flag: 4,064
bytes, 0.0072 of fp32's 565,252 and 0.056 of int4's 72,868. The payloads
of different ranks keep different positions, so they cannot be summed on
the way: ``comm/sparse_allreduce.py`` is their collective.
"""
import math

import tensorflow as tf

from ... import validation
from .kinds import ELASTIC_DIFFERENCES, PSEUDO_GRADIENTS

CHUNK = 4095  # 2**12 - 1 elements: a 12-bit position has one value left, the sink
SINK = CHUNK
POSITION_BITS = 12
SCALE_BYTES = 4  # one float32 per chunk
BITS = (1, 2, 4, 8)
DEFAULT_DENSITY = 1 / 64
DEFAULT_BITS = 2


def slots_per_chunk(density):
    """k = ⌈D·C⌉ (rounded to 9 places first, so that D = k/C gives k back)."""
    return math.ceil(round(density * CHUNK, 9))


class TopKCompression:
    """``--compression topk --density D --bits B``: per chunk of 4095 elements, the ⌈D·4095⌉ largest
    magnitudes, each as a 12-bit position and a B-bit code, and a float32 scale (module docstring).

    Args:
      density: D, the share of each chunk sent, 0 < D <= 1 (default 1/64).
      bits: B, the bits of a value's code: 1, 2, 4 or 8 (default 2).
    """

    name = "topk"
    summable = False
    sparse = True  # its collective is comm/sparse_allreduce.py
    applies_to = frozenset({PSEUDO_GRADIENTS, ELASTIC_DIFFERENCES})
    chunk_size = CHUNK

    def __init__(self, density=DEFAULT_DENSITY, bits=DEFAULT_BITS):
        self.density = validation.number("density", density, minimum=0, maximum=1, min_inclusive=False)
        if not validation.is_integer(bits) or bits not in BITS:
            raise validation.refusal("bits", f"one of {', '.join(map(str, BITS))}", bits)
        self.bits = int(bits)
        self.k = slots_per_chunk(self.density)

    @property
    def options(self):
        """What this format is made from besides its name (``compression.config_of``)."""
        return {"density": self.density, "bits": self.bits}

    def __eq__(self, other):
        return isinstance(other, TopKCompression) and (self.density, self.bits) == (other.density, other.bits)

    def __hash__(self):
        return hash((self.name, self.density, self.bits))

    def __repr__(self):
        return f"TopKCompression(density={self.density!r}, bits={self.bits!r})"

    # --- sizes ------------------------------------------------------------------------------
    def chunks(self, elements):
        """m = ⌈elements / 4095⌉."""
        return -(-int(elements) // CHUNK)

    def coded_bytes(self, chunks):
        """The positions, codes and scales of ``chunks`` chunks (module docstring)."""
        slots = chunks * self.k
        return 3 * -(-slots // 2) + -(-slots * self.bits // 8) + SCALE_BYTES * chunks

    def message_bytes(self, elements, exact_values):
        """One rank's message: a payload of ``elements`` and ``exact_values`` one-element tensors."""
        return self.coded_bytes(self.chunks(elements)) + 4 * exact_values

    # --- encoding -----------------------------------------------------------------------------
    def encode(self, chunks):
        """fp32 ``[m, 4095]`` -> uint8 ``[coded_bytes(m)]``: positions, codes, scales (module docstring)."""
        levels = 2 ** (self.bits - 1)
        magnitudes, positions = tf.math.top_k(tf.abs(chunks), self.k)  # largest first; ties: lower position
        values = tf.gather(chunks, positions, batch_dims=1)
        scales = magnitudes[:, 0]
        # q: the cell edges j·w (j = 1..L-1, w = s/L) at or below |u|; compared, not divided, so that
        # no rounding of a quotient moves u to a cell whose centre is not within a factor 2 of it.
        edges = (scales * 2.0 ** -(self.bits - 1))[:, None] * tf.range(1, levels, dtype=tf.float32)
        q = tf.reduce_sum(tf.cast(magnitudes[:, :, None] >= edges[:, None, :], tf.int32), axis=2)
        sent = tf.logical_and(magnitudes >= (scales * 2.0 ** -(self.bits + 1))[:, None], magnitudes > 0)
        codes = tf.where(sent, q + levels * tf.cast(values < 0, tf.int32), 0)
        positions = tf.where(sent, positions, SINK)
        return tf.concat([self._pack_positions(positions), self._pack_codes(codes),
                          tf.reshape(tf.bitcast(scales, tf.uint8), [-1])], axis=0)

    @staticmethod
    def _pack_positions(positions):
        flat = tf.reshape(positions, [-1])
        flat = tf.pad(flat, [[0, -int(flat.shape[0]) % 2]], constant_values=SINK)
        pairs = tf.reshape(flat, [-1, 2])
        a, b = pairs[:, 0], pairs[:, 1]
        packed = tf.stack([a % 256, a // 256 + (b % 16) * 16, b // 16], axis=1)
        return tf.reshape(tf.cast(packed, tf.uint8), [-1])

    def _pack_codes(self, codes):
        per_byte = 8 // self.bits
        flat = tf.reshape(codes, [-1])
        flat = tf.pad(flat, [[0, -int(flat.shape[0]) % per_byte]])
        shifts = tf.constant([2 ** (self.bits * j) for j in range(per_byte)], tf.int32)
        return tf.cast(tf.reduce_sum(tf.reshape(flat, [-1, per_byte]) * shifts, axis=1), tf.uint8)

    # --- decoding -----------------------------------------------------------------------------
    def decode(self, data, chunks):
        """uint8 ``[coded_bytes(m)]`` -> fp32 ``[m, 4095]``: what the message stands for."""
        return self.decode_rows(data[None], chunks)[0]

    def decode_rows(self, messages, chunks):
        """uint8 ``[p, coded_bytes(m)]`` (p messages) -> fp32 ``[p, m, 4095]``, in one scatter."""
        p, slots = int(messages.shape[0]), chunks * self.k
        position_bytes, code_bytes, scale_bytes = tf.split(
            messages, [3 * -(-slots // 2), -(-slots * self.bits // 8), SCALE_BYTES * chunks], axis=1)
        packed = tf.reshape(tf.cast(position_bytes, tf.int32), [p, -1, 3])
        a = packed[:, :, 0] + (packed[:, :, 1] % 16) * 256
        b = packed[:, :, 1] // 16 + packed[:, :, 2] * 16
        positions = tf.reshape(tf.reshape(tf.stack([a, b], axis=2), [p, -1])[:, :slots], [p, chunks, self.k])
        per_byte, levels = 8 // self.bits, 2 ** (self.bits - 1)
        shifts = tf.constant([2 ** (self.bits * j) for j in range(per_byte)], tf.int32)
        codes = (tf.cast(code_bytes, tf.int32)[:, :, None] // shifts) % (2 ** self.bits)
        codes = tf.reshape(tf.reshape(codes, [p, -1])[:, :slots], [p, chunks, self.k])
        scales = tf.bitcast(tf.reshape(scale_bytes, [p, chunks, SCALE_BYTES]), tf.float32)
        unit = scales * 2.0 ** -self.bits  # s·2^-B, exact
        magnitudes = tf.cast(2 * (codes % levels) + 1, tf.float32) * unit[:, :, None]
        values = tf.where(codes >= levels, -magnitudes, magnitudes)
        rows = tf.broadcast_to(tf.range(p)[:, None, None], positions.shape)
        chunk_at = tf.broadcast_to(tf.range(chunks)[None, :, None], positions.shape)
        where = tf.reshape(tf.stack([rows, chunk_at, positions], axis=3), [-1, 3])
        # Positions within a message are distinct but for the sink, whose column is dropped.
        dense = tf.scatter_nd(where, tf.reshape(values, [-1]), [p, chunks, CHUNK + 1])
        return dense[:, :, :CHUNK]
