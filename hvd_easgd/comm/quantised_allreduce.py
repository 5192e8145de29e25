"""The allreduce of payloads that cannot be summed as they travel (bf16, int8, int4, sign).

A quantised code cannot be added on the way: int8 sums overflow, and two
blocks have different scales; Horovod's TF ops take no bfloat16 at all. So
every hop must decode, add in fp32 and encode again, or every rank must
receive every payload. Two forms, built on the communicator's alltoall and
allgather (so SimulatedCluster, Horovod over Gloo or MPI and the direct MPI
path all get them):

* **alltoall + allgather** (the reduce-scatter of INTELLECT-1, done as one
  alltoall): the payload's blocks are cut into p equal chunks; rank j
  receives every rank's chunk j, decodes them, adds them in fp32 in rank
  order, encodes that sum again and sends it to every rank (allgather);
  every rank decodes the p reduced chunks. Bytes per rank on the wire:
  ``(p−1)/p·S_q + (p−1)·S_q/p = 2(p−1)/p·S_q``, the ring allreduce's figure.
* **allgather**: every rank sends its whole encoded payload to every other
  rank, which decodes the p payloads and adds them in rank order:
  ``(p−1)·S_q`` per rank.

S_q is the encoded payload, scales included. Wire bytes per rank, in units
of S_q:

====  ==================  ===========
p     alltoall+allgather  allgather
====  ==================  ===========
2     1.00                1
4     1.50                3
8     1.75                7
16    1.88                15
64    1.97                63
====  ==================  ===========

At p = 2 the two are equal, and the allgather form is used: one call
instead of two, and no second quantisation (the sum is exact in fp32, not
re-encoded). From p = 3 on alltoall + allgather, which stays under 2·S_q
while the allgather grows with p. A communicator without an alltoall
(``has_alltoall`` False) uses the allgather form at every p, and its
account says so; SimulatedCluster, Horovod (``hvd.alltoall``, uint8 over
Gloo and MPI) and the direct MPI path (``MpiDirectAlltoall``) have one.

Message layout (uint8): the encoded blocks (``compression.encode``), then
the *exact values*, float32: the tensors of one element (a non-finite flag,
a sample count), which must survive the collective exactly and are summed
in fp32, not quantised. Every rank decodes the same bytes in the same order,
so every rank ends with bit-identical results.

Blocks run over the concatenation of the tensors of more than one element,
flattened, in order; the last is padded with zeros, and the alltoall form
pads to p equal chunks of ``ceil(blocks/p)`` blocks.
"""
import tensorflow as tf

from .flat_payload import FlatPayload, split_payload  # noqa: F401 -- split_payload: the strategies' traffic

ALLTOALL = "alltoall"
ALLGATHER = "allgather"


def form(size, has_alltoall, elements):
    """Which form runs at ``size`` ranks (module docstring). A payload of exact values alone (``elements``
    coded, 0: a fragment holding a scalar) has no chunks to hand over: the allgather."""
    return ALLTOALL if size > 2 and has_alltoall and elements else ALLGATHER


def message_bytes(elements, exact_values, compression, size, has_alltoall=True):
    """Bytes of one message: an alltoall chunk (and each reduced chunk), or the whole allgather payload."""
    blocks = -(-elements // compression.block_size)
    if form(size, has_alltoall, elements) == ALLTOALL:
        blocks = -(-blocks // size)
    return blocks * compression.block_bytes + 4 * exact_values


def expected_collectives(elements, exact_values, compression, size, has_alltoall=True):
    """``[(collective, payload bytes, calls, wire bytes), ...]`` per rank of one
    quantised allreduce, by the collective that carries each part (module
    docstring): the alltoall hands over p messages, the allgather one."""
    message = message_bytes(elements, exact_values, compression, size, has_alltoall)
    gathered = (ALLGATHER, message, 1, (size - 1) * message)
    if form(size, has_alltoall, elements) == ALLTOALL:
        return [(ALLTOALL, size * message, 1, (size - 1) * message), gathered]
    return [gathered]


def expected_traffic(elements, exact_values, compression, size, has_alltoall=True):
    """``(payload bytes, calls, wire bytes)`` per rank of one quantised allreduce (module docstring)."""
    parts = expected_collectives(elements, exact_values, compression, size, has_alltoall)
    return tuple(sum(part[i] for part in parts) for i in (1, 2, 3))


def _rows(messages, coded):
    """The rows of ``messages`` (uint8 ``[p, L]``), each cut after its ``coded`` bytes: ``(codes, exact bytes)``
    per row. One split and two unstacks, not 2p slices: eager slicing costs several ops a slice, and the
    ranks of SimulatedCluster spend their time in eager op dispatch. Same bytes as the slices."""
    codes, exact = tf.split(messages, [coded, -1], axis=1)
    return list(zip(tf.unstack(codes), tf.unstack(exact)))


def _decode_sum(messages, compression, blocks, payload):
    """Σ over the rows of ``messages`` (uint8 ``[p, L]``) in row order: (fp32 ``[blocks, B]``, fp32 exact values)."""
    values = exact = None
    for codes, exact_bytes in _rows(messages, blocks * compression.block_bytes):
        v = compression.decode(codes, blocks)
        e = payload.exact_values(exact_bytes)
        values, exact = (v, e) if values is None else (values + v, exact + e)
    return values, exact


def quantised_allreduce(comm, tensors, op, compression, record=True, with_errors=False):
    """The sum (or mean, ``op="average"``) of ``tensors`` over ``comm``'s ranks, encoded by ``compression``.

    Args:
      comm: a ``Communicator`` of more than one rank.
      tensors: tensors of static shapes, floating.
      op: ``"sum"`` or ``"average"``.
      compression: a format with ``summable`` False (bf16, int8, int4, sign).
      record: whether the calls go in the account.
      with_errors: also return this rank's quantisation errors.

    Returns:
      The reduced tensors, identical on every rank; with ``with_errors``,
      ``(reduced, errors)``: also this rank's quantisation error per tensor
      (its tensor minus what its encoded payload stands for; zero for the
      exact values), the residual that error feedback keeps.
    """
    size = comm.size
    payload = FlatPayload(tensors)
    elements, block = payload.elements, compression.block_size
    blocks = -(-elements // block)
    chosen = form(size, comm.has_alltoall, elements)
    chunk = -(-blocks // size) if chosen == ALLTOALL else blocks
    total = chunk * size if chosen == ALLTOALL else blocks
    padded = tf.reshape(tf.pad(payload.coded, [[0, total * block - elements]]), [total, block])
    exact_bytes = payload.exact_bytes()
    own_messages = [tf.concat([compression.encode(part), exact_bytes], axis=0)
                    for part in (tf.split(padded, total // chunk) if chunk else [padded])]
    if chosen == ALLTOALL:
        outgoing = tf.concat(own_messages, axis=0)
        if record:
            comm._record([outgoing], collective="alltoall")
        incoming = tf.reshape(comm._alltoall(outgoing), [size, -1])
        reduced_chunk, exact_sum = _decode_sum(incoming, compression, chunk, payload)
        # Past the payload's end the blocks are padding. Every format but sign decodes it to zero; sign has no
        # code for zero and decodes it to ±s. Zeroed before the sum is encoded again: it would weigh in the
        # block's scale, and it is no value of the payload's. Only a chunk that reaches past the end has any.
        start = comm.rank * chunk * block
        if start + chunk * block > elements:
            inside = tf.reshape(tf.range(start, start + chunk * block) < elements, [chunk, block])
            reduced_chunk = tf.where(inside, reduced_chunk, tf.zeros_like(reduced_chunk))
        message = tf.concat([compression.encode(reduced_chunk), payload.exact_bytes(exact_sum)], axis=0)
        if record:
            comm._record([message], collective="allgather")
        gathered = tf.reshape(comm._allgather(message), [size, -1])
        rows = _rows(gathered, chunk * compression.block_bytes)
        parts = [compression.decode(codes, chunk) for codes, _ in rows]
        values = tf.reshape(tf.concat(parts, axis=0), [-1])
        exact_total = payload.exact_values(rows[0][1])
    else:
        message = own_messages[0]
        if record:
            comm._record([message], collective="allgather")
        gathered = tf.reshape(comm._allgather(message), [size, -1])
        summed, exact_total = _decode_sum(gathered, compression, blocks, payload)
        values = tf.reshape(summed, [-1])
    if op == "average":
        values, exact_total = values / size, exact_total / size
    if with_errors:
        # What this rank's payload stands for once decoded: the error it leaves behind.
        sent = tf.concat([tf.reshape(compression.decode(tf.split(m, [chunk * compression.block_bytes, -1])[0],
                                                        chunk), [-1])
                          for m in own_messages], axis=0)
    return payload.results(values, exact_total, sent if with_errors else None)
