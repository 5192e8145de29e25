"""The communicator interface and its exact byte/call account.

Every collective of hvd_easgd goes through ``Communicator``. The account
(payload bytes handed to collectives, and the number of collective calls) is
kept in TF variables that the collectives update *inside* the traced step:
a Python counter inside ``tf.function`` would count traces, not steps.
Strategies are compared by these figures, so they must be exact.

Subclasses implement the primitives on already-compressed tensors:
``_grouped_allreduce``, ``_broadcast``, ``_allgather`` and, where the
transport has one (``has_alltoall``), ``_alltoall``; and
``_sub_communicator`` for ``split``. Formats that cannot be summed as they
travel reduce through ``quantised_allreduce`` (bf16, int8, int4), built on
the alltoall and the allgather, or ``sparse_allreduce`` (topk), one allgather.

Wire bytes: the account also keeps the bytes each rank sends under the
collective's algorithm, for a payload of S bytes handed to it at p ranks::

    allreduce          2(p−1)/p · S     (ring: reduce-scatter, then allgather)
    allgather          (p−1) · S        (S is this rank's part)
    alltoall           (p−1)/p · S      (S holds one part per rank; one stays)
    reducescatter      (p−1)/p · S
    broadcast          (p−1)/p · S      (the root's S reaches p−1 ranks: p−1
                                         sends of S, shared by the p ranks)
    sparse_allgather   (p−1) · S        (an allgather, named apart for the cost
                                         model: S, a rank's whole sparse message,
                                         does not shrink as p grows)

The account is one float64 variable: bytes and calls stay exact integers
(to 2^53), and the wire figure has the fractions these formulas give.

Started collectives (``start_allreduce`` / ``finish_allreduce``): the
allreduce of a payload is started in one step and its result taken δ steps
later (the local-update strategies' ``overlap``). The account is recorded at
the start, exactly as the blocking allreduce records it. By default (this
base class, LocalCommunicator, SimulatedCluster) the start reduces at once
(blocking) and holds the result in variables of this communicator until the
finish hands it out: the semantics, without the overlap.

The Horovod and the direct communicators reduce in the background
(``reduces_in_background``; comm/background.py). The start compresses and
records in-graph as above, then a ``tf.py_function`` hands copies of the
wire tensors to the communicator's one worker thread, which runs the
transport's blocking grouped allreduce eagerly and decompresses the result,
and returns the handle; the finish is a ``tf.py_function`` that waits for
that job (blocking only if it has not ended yet) and returns the result.
Whether a start went to the worker is asked of the worker when the finish
runs (a started format that cannot be summed is held instead, and payloads
of the same shapes may take either path). Why this design, in a traced step: a collective op inside the
graph is waited on by the step that runs it (Horovod's op completes
asynchronously, but the step does not end before its outputs exist), and a
non-blocking MPI op would need a request carried across steps in a
resource; a Python handle into a worker is the one form that works the
same over every transport, at the cost of one copy of the payload each way
and the graph's py_functions (so the step is never XLA-compiled: the
trainer and ``DistributedOptimizer`` turn XLA off). One worker per
communicator keeps the collectives in start order on every rank; Horovod
matches the background ops by an explicit name from the handle (the same
on every rank, one per collective in flight), so main-thread collectives
meanwhile are matched by their own names; the direct path runs them on a
duplicate MPI communicator of their own, so they never interleave with the
main thread's. A job that raised (a dead peer) makes the finish raise.
Formats that cannot be summed as they travel (bf16, int8, int4: the
quantised allreduce, several collectives; topk: the sparse allreduce) still
reduce at the start, blocking. ``HVD_EASGD_BACKGROUND=0`` runs the jobs on the caller's thread at
the start (the blocking twin the tests compare against; not an option).

Sub-communicators (``split``): a communicator over some of the ranks, with
its own ``rank`` and ``size`` (among those ranks) and its own account. What
a sub-communicator records is also recorded in its parent's account, so the
parent's figures stay the totals of the process and a sub-communicator's are
its part of them (Hierarchical's per-level account).

With one rank there is no one to talk to: every collective returns its
input, issues nothing and counts nothing (0 bytes, 0 calls), whichever
communicator it is. A one-rank Horovod job would otherwise pay Horovod's
cycle and negotiation for every step (it ran at 0.45 of no communication).
"""
import hashlib
import json

import numpy as np
import tensorflow as tf

from .background import BackgroundReducer, background_off
from .compression import Compression
from .quantised_allreduce import quantised_allreduce
from .sparse_allreduce import SPARSE_ALLGATHER, sparse_allreduce

REDUCE_OPS = ("average", "sum")

# Bytes each rank sends per payload byte handed to the collective, at p ranks (module docstring).
WIRE_FACTORS = {
    "allreduce": lambda p: 2 * (p - 1) / p,
    "allgather": lambda p: p - 1,
    "alltoall": lambda p: (p - 1) / p,
    "reducescatter": lambda p: (p - 1) / p,
    "broadcast": lambda p: (p - 1) / p,
    SPARSE_ALLGATHER: lambda p: p - 1,  # an allgather whose part is a rank's whole sparse message
}


def shard_length(elements, parts):
    """m = ⌈elements/parts⌉: the elements of one shard of a flat tensor cut into ``parts``
    equal shards (the last ones zero-padded): ``reducescatter``'s layout."""
    return -(-int(elements) // int(parts))


def flat_padded(tensor, parts):
    """``tensor`` flattened and zero-padded to ``parts`` · ``shard_length`` elements."""
    flat = tf.reshape(tensor, [-1])
    elements = tensor.shape.num_elements()
    padding = parts * shard_length(elements, parts) - elements
    return tf.pad(flat, [[0, padding]]) if padding else flat


class RanksDisagreeError(RuntimeError):
    """Ranks hold different values for something that must be identical."""


def _nbytes(tensor):
    """Bytes of ``tensor``: a Python int when the shape is static, else a tensor."""
    itemsize = tensor.dtype.size
    if tensor.shape.is_fully_defined():
        return int(np.prod(tensor.shape.as_list(), dtype=np.int64)) * itemsize
    return tf.size(tensor, out_type=tf.int64) * itemsize


def _signature(tensors):
    """What identifies a started allreduce's payload: its shapes and dtypes."""
    return tuple((tuple(t.shape.as_list()), t.dtype.name) for t in tensors)


class Communicator:
    rank = 0
    size = 1
    local_rank = 0
    local_size = 1
    # Which host this rank is on, among the hosts: Horovod's cross_rank (the
    # rank among the processes with the same local_rank) and cross_size.
    cross_rank = 0
    cross_size = 1
    # Every host runs the same number of ranks (Horovod's is_homogeneous).
    homogeneous = True
    # Whether the transport has an alltoall (``_alltoall``): the quantised allreduce's p > 2 form needs one.
    has_alltoall = False
    # Where the background worker and the train steps record their times (comm/timeline.py), on the
    # communicator without a parent; None records nothing.
    timeline = None
    # The worker that runs started allreduces (comm/background.py), where the transport has one.
    _background = None

    def __init__(self, parent=None):
        # [payload bytes, collective calls, wire bytes], in one variable so
        # that a step pays one update for its account. Created eagerly (not
        # in a trace) so that a step function can update it.
        with tf.init_scope():
            self._account = tf.Variable([0.0, 0.0, 0.0], dtype=tf.float64, trainable=False, name="comm_account")
        self.parent = parent
        self._ranks = None
        self._splits = {}
        # Started allreduces held for their finish: {payload signature: (handle variable, result variables)}.
        self._held = {}
        self._last_handle = None

    @property
    def ranks(self):
        """This communicator's ranks as its parent numbers them, by its own
        rank (``range(size)`` for a communicator without a parent)."""
        return self._ranks if self._ranks is not None else tuple(range(self.size))

    def _accounts(self):
        comm = self
        while comm is not None:
            yield comm._account
            comm = comm.parent

    # --- the account ------------------------------------------------------
    def account(self, wire=False):
        """``{"bytes": payload bytes handed to collectives, "calls": collective calls}`` so far;
        with ``wire``, also ``"wire_bytes"``: the bytes this rank sent under the collectives'
        algorithms (module docstring), a float."""
        sent, calls, wire_bytes = self._account.numpy().tolist()
        figures = {"bytes": int(sent), "calls": int(calls)}
        if wire:
            figures["wire_bytes"] = float(wire_bytes)
        return figures

    def reset_account(self):
        self._account.assign([0.0, 0.0, 0.0])

    def _record(self, tensors, collective="allreduce"):
        """Adds one call of ``collective`` on ``tensors`` (the payload handed to it) to the account."""
        total = 0
        for t in tensors:
            total = total + _nbytes(t)
        factor = WIRE_FACTORS[collective](self.size)
        if isinstance(total, int):  # static shapes: a constant, known at trace time
            entry = tf.constant([total, 1, total * factor], tf.float64)
        else:
            total = tf.cast(total, tf.float64)
            entry = tf.stack([total, tf.constant(1, tf.float64), total * factor])
        for account in self._accounts():  # this communicator's, and its parents' (the totals)
            account.assign_add(entry)

    # --- sub-communicators ----------------------------------------------------------
    def split(self, groups):
        """The communicator of this rank's group among ``groups``, or None if it is in none.

        Args:
          groups: disjoint lists of this communicator's ranks (they need not
            cover every rank). The sub-communicator's rank r is the r-th
            smallest rank of its group.

        Every rank must call ``split`` with the same ``groups``, in the same
        order as its other splits: under Horovod, creating a process set is
        a collective of all the ranks. The same ``groups`` twice give the
        same communicators (and create nothing new).
        """
        groups = tuple(tuple(sorted(int(r) for r in g)) for g in groups)
        seen = [r for g in groups for r in g]
        if not groups or any(not g for g in groups) or len(seen) != len(set(seen)) or not all(
                0 <= r < self.size for r in seen):
            raise ValueError(f"`groups` must be disjoint, non-empty lists of ranks in [0, {self.size}). "
                             f"Received: groups={[list(g) for g in groups]}")
        if groups not in self._splits:
            made = self._sub_communicators(groups)
            self._splits[groups] = next((made[i] for i, g in enumerate(groups) if self.rank in g), None)
        return self._splits[groups]

    def _sub_communicators(self, groups):
        """One entry per group: this rank's communicator for its own group,
        anything (None) for the others. Subclasses create what they must for
        every group (Horovod's process sets are created by all ranks)."""
        raise NotImplementedError(f"{type(self).__name__} cannot split into sub-communicators")

    def host_groups(self):
        """The ranks of each host, hosts ordered by their first rank (eager; a collective).

        From every rank's (cross_rank, local_rank): Horovod numbers hosts by
        cross_rank, and ranks need not be consecutive on a host (SLURM's
        cyclic distribution).
        """
        places = self.allgather_json([self.cross_rank, self.local_rank]) if self.size > 1 else [[0, 0]]
        hosts = {}
        for rank, (host, local) in enumerate(places):
            hosts.setdefault(host, []).append((local, rank))
        groups = [[rank for _, rank in sorted(members)] for members in hosts.values()]
        return sorted(groups, key=min)

    # --- collectives --------------------------------------------------------
    def allreduce(self, tensors, op="average", compression=Compression.none, record=True):
        """Reduces a list of tensors across ranks in ONE grouped collective call.

        ``record=False`` leaves the call out of the account (bookkeeping such
        as metric averaging, which is not training traffic). A format that
        cannot be summed as it travels (``compression.summable`` False)
        reduces through ``quantised_allreduce`` instead: one allgather, or
        an alltoall and an allgather (that module's docstring); a sparse
        one (topk) through ``sparse_allreduce``: one allgather.
        """
        return self._allreduce(tensors, op, compression, record, with_errors=False)

    def allreduce_with_errors(self, tensors, op="average", compression=Compression.none, record=True):
        """``allreduce``, and this rank's compression error per tensor.

        Returns:
          ``(reduced, errors)``: what ``allreduce`` returns, and per tensor
          the tensor minus what its compressed form stands for (zeros without
          compression, and at one rank, where nothing is compressed): the
          residual error feedback adds into the next payload.
        """
        return self._allreduce(tensors, op, compression, record, with_errors=True)

    def _allreduce(self, tensors, op, compression, record, with_errors):
        if op not in REDUCE_OPS:
            raise ValueError(f"`op` must be one of {REDUCE_OPS}. Received: op={op!r}")
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        if not tensors or self.size == 1:
            return (tensors, [tf.zeros_like(t) for t in tensors]) if with_errors else tensors
        if not compression.summable:
            reduce = sparse_allreduce if compression.sparse else quantised_allreduce
            return reduce(self, tensors, op, compression, record, with_errors)
        wire, dtypes = zip(*(compression.compress(t) for t in tensors))
        if record:
            self._record(wire)
        reduced = self._grouped_allreduce(list(wire), op)
        reduced = [compression.decompress(r, d) for r, d in zip(reduced, dtypes)]
        if not with_errors:
            return reduced
        return reduced, [t - compression.decompress(w, d) for t, w, d in zip(tensors, wire, dtypes)]

    # Whether start_allreduce runs the collective behind the caller's next steps (module docstring): the
    # Horovod and direct communicators set it on themselves. A strategy's traffic hook reports its overlapped
    # share from this, so the cost model projects hidden time only where it is hidden.
    reduces_in_background = False

    def _reduce_in_background(self, reduce):
        """Runs this communicator's started allreduces on a worker thread: ``reduce(arrays, op, handle)``
        is the transport's eager grouped allreduce (comm/background.py)."""
        self._background = BackgroundReducer(reduce, timeline=lambda: self._root().timeline,
                                             inline=background_off())
        self.reduces_in_background = not self._background.inline

    def _root(self):
        comm = self
        while comm.parent is not None:
            comm = comm.parent
        return comm

    def start_allreduce(self, tensors, op="sum", compression=Compression.none, with_errors=False):
        """Starts the allreduce of ``tensors``; ``finish_allreduce`` takes its result.

        The account is recorded here, as ``allreduce`` records it. Every rank
        must start and finish its collectives in the same order.

        Returns:
          A scalar int64 handle (> 0); with ``with_errors``, ``(handle, errors)``,
          the errors as ``allreduce_with_errors`` gives them (known at the start).
        """
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        if self._background is not None and tensors and self.size > 1 and compression.summable:
            handle, errors = self._start_in_background(tensors, op, compression)
        else:
            reduced, errors = self._allreduce(tensors, op, compression, True, with_errors=True)
            handle = self._hold(reduced)
        return (handle, errors) if with_errors else handle

    def _start_in_background(self, tensors, op, compression):
        if op not in REDUCE_OPS:
            raise ValueError(f"`op` must be one of {REDUCE_OPS}. Received: op={op!r}")
        wire, dtypes = zip(*(compression.compress(t) for t in tensors))
        self._record(wire)
        errors = [t - compression.decompress(w, d) for t, w, d in zip(tensors, wire, dtypes)]

        def decompress(reduced):  # in the worker: the finish then needs no more than the payload's shapes
            return [compression.decompress(tf.convert_to_tensor(r), d) for r, d in zip(reduced, dtypes)]

        handle = tf.py_function(lambda *arrays: self._background.submit(arrays, op, then=decompress), list(wire),
                                Tout=tf.int64, name="start_allreduce")
        handle.set_shape([])
        return handle, errors

    def finish_allreduce(self, handle, like):
        """The result of the started allreduce ``handle``, shaped as ``like`` (its payload).

        A handle that is not in flight (finished already, or never started
        with a payload of ``like``'s shapes) is an error, not a wait.
        """
        like = [tf.convert_to_tensor(t) for t in like]
        if self._background is None or self.size == 1:
            return self._finish_held(handle, like)
        # Which path the start took is known when it ran, not when this was traced (a format that cannot
        # be summed was held): asked of the worker.
        handle = tf.cast(handle, tf.int64)
        in_worker = tf.py_function(lambda h: self._background.holds(h.numpy()), [handle], Tout=tf.bool,
                                   name="started_in_background")
        in_worker.set_shape([])

        def from_worker():
            reduced = tf.py_function(lambda h: self._background.wait(h.numpy()), [handle],
                                     Tout=[t.dtype for t in like], name="finish_allreduce")
            for r, t in zip(reduced, like):
                r.set_shape(t.shape)
            return reduced

        reduced = tf.cond(in_worker, from_worker, lambda: self._finish_held(handle, like))
        return list(reduced) if isinstance(reduced, (list, tuple)) else [reduced]

    def _finish_held(self, handle, like):
        held_handle, held = self._held_for(like)
        tf.debugging.assert_equal(held_handle, tf.cast(handle, tf.int64),
                                  message="finish_allreduce: this handle is not in flight")
        with tf.control_dependencies([held_handle.assign(0)]):
            return [tf.identity(v) for v in held]

    def _held_for(self, tensors):
        key = _signature(tensors)
        if key not in self._held:
            with tf.init_scope():
                self._held[key] = (tf.Variable(0, dtype=tf.int64, trainable=False, name="held_handle"),
                                   [tf.Variable(tf.zeros(t.shape, t.dtype), trainable=False, name="held_result")
                                    for t in tensors])
                if self._last_handle is None:
                    self._last_handle = tf.Variable(0, dtype=tf.int64, trainable=False, name="last_handle")
        return self._held[key]

    def _hold(self, reduced):
        held_handle, held = self._held_for(reduced)
        for v, r in zip(held, reduced):
            v.assign(r)
        handle = self._last_handle.assign_add(1)
        held_handle.assign(handle)
        return tf.identity(handle)

    def broadcast(self, tensors, root_rank=0):
        """Returns rank ``root_rank``'s values of ``tensors`` on every rank."""
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        if self.size == 1:
            if root_rank != 0:
                raise ValueError(f"`root_rank` must be 0 with one process. Received: root_rank={root_rank}")
            return tensors
        for t in tensors:  # Horovod broadcasts tensor by tensor: one call each.
            self._record([t], collective="broadcast")
        return self._broadcast(tensors, root_rank) if tensors else []

    def allgather(self, tensor, record=True):
        """Concatenates every rank's ``tensor`` along axis 0 (sizes may differ).

        ``record=False`` leaves the call out of the account, as for ``allreduce``.
        """
        tensor = tf.convert_to_tensor(tensor)
        if self.size == 1:
            return tensor
        if record:
            self._record([tensor], collective="allgather")
        return self._allgather(tensor)

    def reducescatter(self, tensors, op="average", compression=Compression.none):
        """Reduces a list of tensors across ranks and keeps this rank's shard of each, in ONE grouped call.

        Args:
          tensors: tensors of static shape and of ONE dtype, as one Horovod
            grouped call takes (Horovod reduce-scatters int32, int64,
            float16, float32 and float64).
          op: ``"average"`` or ``"sum"``.
          compression: what the tensors cross the wire as (cast back after).

        Returns:
          Per tensor, a flat tensor of m = ``shard_length(N, p)`` elements:
          elements [rank·m, (rank+1)·m) of the reduction of the flattened,
          zero-padded tensors (module docstring). With one rank, the flattened
          tensors themselves.
        """
        if op not in REDUCE_OPS:
            raise ValueError(f"`op` must be one of {REDUCE_OPS}. Received: op={op!r}")
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        dtypes = sorted({t.dtype.name for t in tensors})
        if len(dtypes) > 1:
            raise ValueError("`tensors` must share one dtype: a grouped reduce-scatter is one call of one dtype "
                             f"(call once per dtype). Received: tensors of dtypes {dtypes}")
        if not tensors or self.size == 1:
            return [tf.reshape(t, [-1]) for t in tensors]
        wire, dtypes = zip(*(compression.compress(flat_padded(t, self.size)) for t in tensors))
        self._record(wire, collective="reducescatter")
        shards = self._grouped_reducescatter(list(wire), op)
        return [compression.decompress(tf.reshape(s, [w.shape[0] // self.size]), d)
                for s, w, d in zip(shards, wire, dtypes)]

    # --- eager helpers built on the collectives -------------------------------
    def broadcast_variables(self, variables, root_rank=0):
        """Assigns rank ``root_rank``'s values to ``variables`` on every rank (eager or traced)."""
        variables = list(variables)
        values = self.broadcast([tf.convert_to_tensor(v) for v in variables], root_rank)
        for var, value in zip(variables, values):
            var.assign(value)

    def allgather_json(self, obj):
        """Every rank's JSON-serialisable ``obj``, as a list indexed by rank (eager only)."""
        payload = np.frombuffer(json.dumps(obj, sort_keys=True).encode(), dtype=np.uint8)
        lengths = self._allgather(tf.constant([payload.size], dtype=tf.int64)).numpy()
        gathered = self._allgather(tf.constant(payload, dtype=tf.uint8)).numpy().tobytes()
        objects, start = [], 0
        for n in lengths:
            objects.append(json.loads(gathered[start : start + n].decode()))
            start += n
        return objects

    def assert_same_across_ranks(self, what, mapping):
        """Raises ``RanksDisagreeError`` naming the first differing key and the ranks involved.

        ``mapping`` is a dict of JSON-serialisable values. Only hashes travel.
        """
        digests = {k: hashlib.sha256(json.dumps(v, sort_keys=True, default=str).encode()).hexdigest()[:16]
                   for k, v in mapping.items()}
        if self.size == 1:
            return
        per_rank = self.allgather_json(digests)
        keys = sorted(set().union(*per_rank))
        for key in keys:
            seen = {}
            for rank, d in enumerate(per_rank):
                seen.setdefault(d.get(key, "<missing>"), []).append(rank)
            if len(seen) > 1:
                groups = "; ".join(f"ranks {ranks}" for ranks in sorted(seen.values()))
                raise RanksDisagreeError(
                    f"ranks disagree on {what}: `{key}` differs between {groups}"
                )

    # --- primitives for subclasses ------------------------------------------
    def _grouped_allreduce(self, tensors, op):
        raise NotImplementedError

    def _broadcast(self, tensors, root_rank):
        raise NotImplementedError

    def _allgather(self, tensor):
        raise NotImplementedError

    def _alltoall(self, tensor):
        """Rank j receives part j of every rank's ``tensor`` (p equal parts along axis 0),
        concatenated in rank order. Only where ``has_alltoall``."""
        raise NotImplementedError

    def _grouped_reducescatter(self, tensors, op):
        """Flat tensors of p·m_t elements each -> this rank's m_t-element block of each reduction."""
        raise NotImplementedError
