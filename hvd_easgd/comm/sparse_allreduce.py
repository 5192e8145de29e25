"""The allreduce of a sparse payload (``--compression topk``): one allgather, decoded and summed in rank order.

Each rank's top-k positions differ from every other rank's (the payload is
its own pseudo-gradient plus its own residual), so two ranks' messages
cannot be added on the way: a position of one means nothing to the other.
This module keeps the three steps apart, as ``quantised_allreduce.py``
does:

1. **encode** (``compression/topk.py``): this rank's message, S_s bytes
   (positions, codes, scales, and the exact values);
2. **the collective**: one allgather of the p messages, so every rank
   holds every message;
3. **decode and sum**: every rank decodes the p messages and adds them in
   fp32 in rank order (rank 0's, plus rank 1's, ...). The same bytes, the
   same operations in the same order: every rank ends with bit-identical
   results on every transport (SimulatedCluster, Horovod over Gloo or MPI,
   the direct MPI path).

The residual is the caller's (``strategies/error_feedback.py``): with
``with_errors`` this rank's error, its payload minus what its own message
stands for once decoded (the row of the gathered messages that is its
own), is returned for it to keep.

Why an allgather. S_s is one rank's message; at the defaults (density 1/64,
2 bits) on the language model (141,312 parameters) S_s = 4,064 bytes
(``topk.py``). Bytes each rank sends per synchronisation, on that model:

====  ==========  ==========  ============  ============  ==========
p     allgather   bitmap      shared index  int4          fp32 ring
      (chosen)    allgather   (CLT-k)       a2a + ag
====  ==========  ==========  ============  ============  ==========
2     4,064       18,368      10,644        72,868        565,252
8     28,448      128,576     18,627        127,568       989,191
64    256,032     1,157,184   20,955        150,192       1,112,840
====  ==========  ==========  ============  ============  ==========

* **allgather**: (p − 1)·S_s. Exact (every rank's own top-k, summed in
  fp32, no second encoding), one call, and the fewest bytes at p = 2: 0.056
  of int4 DiLoCo's, 0.0072 of fp32's. It grows linearly with p: 0.22 of
  int4's at p = 8, and from p = 37 on it sends more than int4's dense
  alltoall + allgather (1.70 times at p = 64).
* **bitmap allgather**: positions as one bit per element (N/8 bytes)
  instead of 12 bits per kept element: more bytes below a density of 1/12.
* **shared index** (ScaleCom's cyclic local top-k, Chen et al., NeurIPS
  2020): one rank's positions are broadcast and every rank sends
  its values at them, in fp32, through the ordinary (summable) ring
  allreduce: (p−1)/p·(positions) + 2(p−1)/p·4n + flag, nearly flat in p,
  and fewer bytes than the allgather from p = 6 on. But it is another
  method: a rank sends the leader's positions, not its own largest
  elements, and values that are summed cannot carry per-rank low-bit
  codes.
* **int4** (``quantised_allreduce.py``) and **fp32**: the dense formats
  for comparison (the int4 one re-encodes the partial sums from p = 3 on).
* A reduce-scatter of sparse payloads (rank j sums everyone's chunk range
  j, then an allgather of the sums) gains nothing: the sum of p top-k sets
  holds up to p·k positions per chunk, so its allgather is as large as this
  one unless it is sparsified again, a second lossy step whose residual would
  live on the rank that owns the range.

So the allgather, for the settings it is meant for: a few sites over a slow
link (p = 2 to 8). Beyond, ``Hierarchical`` keeps the sparse payload on
the inter level, whose p is the number of hosts. The cost model charges it
as an allgather whose part does not shrink with p (``SPARSE_ALLGATHER``;
``hvd_easgd/choosing/cost_model.py``).

Message layout (uint8): the coded part (``TopKCompression.encode``), then
the exact values, float32 (``flat_payload.py``).
"""
import tensorflow as tf

from .flat_payload import FlatPayload

# The account's and the cost model's name for this allgather: its part is one rank's whole sparse message,
# the same at every p (an "allgather" part is a 1/p share of a whole: a shard, a quantised chunk).
SPARSE_ALLGATHER = "sparse_allgather"


def expected_collectives(elements, exact_values, compression, size):
    """``[(collective, payload bytes, calls, wire bytes)]`` per rank of one sparse allreduce of a payload
    of ``elements`` coded elements and ``exact_values`` one-element tensors (module docstring)."""
    message = compression.message_bytes(elements, exact_values)
    return [(SPARSE_ALLGATHER, message, 1, (size - 1) * message)]


def sparse_allreduce(comm, tensors, op, compression, record=True, with_errors=False):
    """The sum (or mean, ``op="average"``) of ``tensors`` over ``comm``'s ranks, each rank's top-k sent.

    Args:
      comm: a ``Communicator`` of more than one rank.
      tensors: tensors of static shapes, floating.
      op: ``"sum"`` or ``"average"``.
      compression: a sparse format (``TopKCompression``).
      record: whether the call goes in the account.
      with_errors: also return this rank's errors.

    Returns:
      The reduced tensors, identical on every rank; with ``with_errors``,
      ``(reduced, errors)``: also this rank's error per tensor, its tensor
      minus what its message stands for (all of it where unsent; zero for
      the exact values), the residual error feedback keeps.
    """
    size = comm.size
    payload = FlatPayload(tensors)
    chunks = compression.chunks(payload.elements)
    padded = tf.reshape(tf.pad(payload.coded, [[0, chunks * compression.chunk_size - payload.elements]]),
                        [chunks, compression.chunk_size])
    message = tf.concat([compression.encode(padded) if chunks else tf.zeros([0], tf.uint8), payload.exact_bytes()],
                        axis=0)
    if record:
        comm._record([message], collective=SPARSE_ALLGATHER)
    gathered = tf.reshape(comm._allgather(message), [size, -1])
    codes, exact_bytes = tf.split(gathered, [compression.coded_bytes(chunks), -1], axis=1)
    exact = [payload.exact_values(row) for row in tf.unstack(exact_bytes)]
    decoded = tf.unstack(tf.reshape(compression.decode_rows(codes, chunks), [size, -1])) if chunks else [
        tf.zeros([0], tf.float32)] * size
    values, exact_total = decoded[0], exact[0]
    for v, e in zip(decoded[1:], exact[1:]):  # in rank order: the same additions on every rank
        values, exact_total = values + v, exact_total + e
    if op == "average":
        values, exact_total = values / size, exact_total / size
    # This rank's own message, as every rank decoded it: what its payload stood for.
    return payload.results(values, exact_total, decoded[comm.rank] if with_errors else None)
