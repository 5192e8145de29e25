"""p simulated ranks in one process, for unit tests of the code that depends on p.

``SimulatedCluster(p)`` hands out p communicators (``cluster.communicators[r]``
has rank r and size p) that share one rendezvous. ``cluster.run(fn)`` calls
``fn(rank)`` for every rank at once, one thread per rank, and returns the
results by rank. A collective waits until all p ranks have called it, then
returns to each rank the combination of the p inputs: the allreduce adds
them in rank order (so every rank gets the same bits, as from a real ring),
broadcast returns the root's, allgather concatenates them, alltoall hands
rank j part j of every rank's input. Each
communicator keeps its own exact byte/call account, as a real rank does.
``comm.split(groups)`` gives sub-communicators whose collectives meet only
their group's ranks (as Horovod's process sets), and ``ranks_per_host``
lays the ranks out on simulated hosts (Hierarchical's default groups).

Example (each rank its own variable, optimizer and strategy)::

    cluster = SimulatedCluster(4)
    opts = [DistributedOptimizer(SGD(1.0), SyncAverage(), comm=c) for c in cluster.communicators]
    ws = [tf.Variable([0.0]) for _ in range(4)]
    cluster.run(lambda r: opts[r].apply([tf.constant([float(r)])], [ws[r]]))   # every w is -1.5

Why threads: strategy code uses a collective's result at once (a ``tf.cond``
on a reduced flag, the reduced gradients), so a rank cannot pause in the
middle of a step without a call stack of its own; a thread is that stack.
Every wait is bounded by ``timeout``, and a rank that fails breaks the
rendezvous so the others fail at once instead of waiting.

Eager only: inside a ``tf.function`` a collective would see symbolic tensors
at trace time. Call the steps eagerly (``run_eagerly=True`` for ``fit``).
"""
import threading
import time

import tensorflow as tf

from .. import validation
from .communicator import Communicator


class CollectiveMismatchError(RuntimeError):
    """The ranks called different collectives, or the same one on different tensors."""


class SimulatedCluster:
    """``size`` simulated ranks stepped in lockstep (see the module docstring).

    Args:
      size: p, the number of ranks (int ≥ 1).
      timeout: seconds a rank waits for the others at a collective; past it
        the run fails instead of hanging.
      ranks_per_host: simulated hosts of this many consecutive ranks (the
        communicators' ``local_rank``/``local_size``, ``cross_rank``/
        ``cross_size`` and ``host_groups()``); default one host.

    ``comm.split(groups)`` gives sub-communicators whose collectives meet the
    ranks of the group only (a rendezvous of their own), as a Horovod
    process set does.
    """

    def __init__(self, size, timeout=60.0, ranks_per_host=None):
        validation.integer("size", size, minimum=1)
        validation.number("timeout", timeout, minimum=0, min_inclusive=False, condition=" seconds")
        ranks_per_host = size if ranks_per_host is None else ranks_per_host
        condition = f" that divides size={size}"
        validation.integer("ranks_per_host", ranks_per_host, minimum=1, condition=condition)
        if size % ranks_per_host:
            raise validation.refusal("ranks_per_host", "an integer >= 1" + condition, ranks_per_host)
        self.size = int(size)
        self.timeout = float(timeout)
        self.ranks_per_host = int(ranks_per_host)
        self._lock = threading.Lock()
        self._rendezvous = {}
        self._running = False
        self.communicators = [SimulatedCommunicator(self, rank) for rank in range(self.size)]

    def rendezvous(self, ranks):
        """The meeting point of the ranks ``ranks`` (one per group, made on first use)."""
        ranks = tuple(ranks)
        with self._lock:
            if ranks not in self._rendezvous:
                self._rendezvous[ranks] = _Rendezvous(self, len(ranks))
            return self._rendezvous[ranks]

    def _barriers(self):
        with self._lock:
            return [r.barrier for r in self._rendezvous.values()]

    def run(self, fn, timeout=300.0):
        """Calls ``fn(rank)`` for every rank, each on its own thread; returns
        ``[fn(0), ..., fn(p-1)]``. Re-raises the first rank's own error (not
        the "another rank failed" errors it caused elsewhere), and fails if
        the ranks are not all done within ``timeout`` seconds."""
        if self._running:
            raise RuntimeError("SimulatedCluster.run is already running: a rank function cannot call it again")
        results, errors = [None] * self.size, [None] * self.size

        def rank_main(rank):
            try:
                results[rank] = fn(rank)
            except BaseException as err:  # noqa: B902 -- handed to the caller below
                errors[rank] = err
                self._abort()  # releases the ranks waiting for this one, in every group

        for barrier in self._barriers():
            barrier.reset()
        with self._lock:
            for rendezvous in self._rendezvous.values():
                rendezvous.clear()
        self._running = True
        threads = [threading.Thread(target=rank_main, args=(rank,), name=f"simulated-rank-{rank}", daemon=True)
                   for rank in range(self.size)]
        try:
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + timeout
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            stuck = [rank for rank, thread in enumerate(threads) if thread.is_alive()]
            if stuck:
                self._abort()
                raise TimeoutError(f"simulated ranks {stuck} did not finish within {timeout:g} s")
        finally:
            self._running = False
        failures = [err for err in errors if err is not None]
        if failures:
            own = [err for err in failures if not isinstance(err, _PeerFailed)]
            raise (own or failures)[0]
        return results

    def _abort(self):
        for barrier in self._barriers():
            barrier.abort()

    def exchange(self, rank, signature, payload):
        """Rank ``rank``'s collective among all the ranks (see ``_Rendezvous.exchange``)."""
        return self.rendezvous(range(self.size)).exchange(rank, signature, payload)


class _Rendezvous:
    """Where the ``size`` ranks of one group meet for their collectives."""

    def __init__(self, cluster, size):
        self._cluster = cluster
        self.size = size
        self.barrier = threading.Barrier(size, timeout=cluster.timeout)
        self._deposits = [None] * size
        # A round's combined result, made once by whichever rank gets there first (see ``exchange``).
        self._combine_lock = threading.Lock()
        self._combined = None

    def exchange(self, rank, signature, payload, combine=None):
        """Deposits rank ``rank``'s ``payload`` (``rank`` among this group's
        ranks) and returns every rank's, in rank order; with ``combine``,
        ``combine(payloads)`` instead, the same object on every rank.

        ``signature`` names the collective and what must agree across ranks
        (op, root, shapes, dtypes); ranks that disagree get a
        ``CollectiveMismatchError`` instead of a wrong result.

        ``combine`` runs once per collective, not once per rank: a sum over p
        ranks made by each of the p would cost p² additions (at p = 64 most
        of a test's time), and every rank would compute the same bits anyway.
        """
        if not self._cluster._running:
            raise RuntimeError("a SimulatedCommunicator's collectives must be called inside SimulatedCluster.run(fn), "
                               "which runs every rank at once")
        self._deposits[rank] = (signature, payload)
        self._wait()
        deposits = list(self._deposits)
        try:
            self._check_signatures(deposits)
            if combine is None:
                return [p for _, p in deposits]
            with self._combine_lock:
                if self._combined is None:
                    self._combined = (combine([p for _, p in deposits]),)
                return self._combined[0]
        finally:
            # No rank deposits its next input before every rank has read this one; past this
            # barrier every rank has its result, so any of them may clear it for the next round
            # (and a round a failed rank broke leaves no result behind for the cluster's next run).
            try:
                self._wait()
            finally:
                self._combined = None

    def clear(self):
        """Forgets a combined result a run that timed out may have left (``SimulatedCluster.run``)."""
        self._combined = None

    @staticmethod
    def _check_signatures(deposits):
        signatures = [s for s, _ in deposits]
        if any(s != signatures[0] for s in signatures):
            ranks_by_call = {}
            for r, s in enumerate(signatures):
                ranks_by_call.setdefault(repr(s), []).append(r)
            calls = "; ".join(f"ranks {ranks}: {call}" for call, ranks in ranks_by_call.items())
            raise CollectiveMismatchError(f"the ranks called different collectives: {calls}")

    def _wait(self):
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            raise _PeerFailed("another simulated rank failed, or the ranks did not all reach this collective "
                              f"within {self._cluster.timeout:g} s") from None


class _PeerFailed(RuntimeError):
    """This rank stopped because another one failed or never arrived."""


def _reduce_in_rank_order(op):
    """``combine`` for ``exchange``: each tensor's sum over the ranks' payloads, added in rank order
    (rank 0's, plus rank 1's, ...), the order the NumPy references add in; for ``"average"``
    divided by the number of ranks (floor division for integers)."""
    def combine(per_rank):
        size, reduced = len(per_rank), []
        for i in range(len(per_rank[0])):
            total = per_rank[0][i]
            for inputs in per_rank[1:]:
                total = total + inputs[i]
            if op == "average":
                total = total / size if total.dtype.is_floating else total // size
            reduced.append(total)
        return reduced
    return combine


def _signature(tensors):
    return tuple((tuple(t.shape.as_list()), t.dtype.name) for t in tensors)


class SimulatedCommunicator(Communicator):
    """One rank of a ``SimulatedCluster``; get it from ``cluster.communicators``
    (or ``split`` one of those)."""

    has_alltoall = True

    def __init__(self, cluster, rank, ranks=None, parent=None):
        super().__init__(parent=parent)
        self._cluster = cluster
        global_rank = rank if ranks is None else ranks[rank]
        per_host = cluster.ranks_per_host
        self.local_rank, self.local_size = global_rank % per_host, per_host
        self.cross_rank, self.cross_size = global_rank // per_host, cluster.size // per_host
        self._global_ranks = tuple(range(cluster.size)) if ranks is None else tuple(ranks)
        self._rendezvous = cluster.rendezvous(self._global_ranks)
        self.rank = rank
        self.size = len(self._global_ranks)
        if parent is not None:
            self._ranks = tuple(parent._global_ranks.index(g) for g in self._global_ranks)

    def host_groups(self):
        # The cluster's layout; no collective, so it works outside run() too.
        per_host = self._cluster.ranks_per_host
        return [list(range(start, start + per_host)) for start in range(0, self._cluster.size, per_host)]

    def _sub_communicators(self, groups):
        # Nothing to create on the other ranks: a group's rendezvous is made by its first user.
        made = []
        for group in groups:
            if self.rank in group:
                global_ranks = [self._global_ranks[r] for r in group]
                made.append(SimulatedCommunicator(self._cluster, group.index(self.rank), global_ranks, parent=self))
            else:
                made.append(None)
        return made

    def _exchange(self, signature, payload, combine=None):
        return self._rendezvous.exchange(self.rank, signature, payload, combine)

    def _grouped_allreduce(self, tensors, op):
        # A list of its own per rank (a caller may edit it); the tensors, immutable, are shared.
        return list(self._exchange(("allreduce", op, _signature(tensors)), tensors, _reduce_in_rank_order(op)))

    def _broadcast(self, tensors, root_rank):
        if not 0 <= root_rank < self.size:
            raise ValueError(f"`root_rank` must be in [0, {self.size}). Received: root_rank={root_rank}")
        per_rank = self._exchange(("broadcast", root_rank, _signature(tensors)), tensors)
        return [tf.identity(t) for t in per_rank[root_rank]]

    def _allgather(self, tensor):
        # Only the leading dimension may differ between ranks.
        signature = ("allgather", tuple(tensor.shape.as_list()[1:]), tensor.dtype.name)
        return tf.concat(self._exchange(signature, tensor), axis=0)

    def _alltoall(self, tensor):
        signature = ("alltoall", tuple(tensor.shape.as_list()), tensor.dtype.name)
        per_rank = self._exchange(signature, tensor)
        part = int(tensor.shape[0]) // self.size
        return tf.concat([t[self.rank * part:(self.rank + 1) * part] for t in per_rank], axis=0)
    def _grouped_reducescatter(self, tensors, op):
        # The allreduce's rank-order sum, made once, then this rank's block of each (its block alone: a
        # split would copy every rank's on every rank). An element's sum is the same additions in the
        # same order whether the blocks are cut before or after.
        totals = self._exchange(("reducescatter", op, _signature(tensors)), tensors, _reduce_in_rank_order(op))
        blocks = []
        for total in totals:
            m = total.shape[0] // self.size
            blocks.append(total[self.rank * m:(self.rank + 1) * m])
        return blocks
