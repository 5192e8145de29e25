"""Training through a dead rank: Horovod's elastic mode around hvd_easgd's state.

Under ``horovodrun --gloo -np N --min-np M --host-discovery-script S``, a
rank that dies no longer ends the job. The survivors' next collective fails;
Horovod shuts down and re-initialises with the ranks that remain (and any a
discovery script adds); every rank then restores the last *commit* and the
job continues at the new size. A replacement that joins later gets the state
from the live ranks over the network, never from disk.

What a commit is
----------------
An in-memory copy of a rank's whole state (``checkpoint.state_groups``: the
model, the optimizer's slots, the strategy's state: what a checkpoint shard
holds) and its position (epoch, micro-batch), taken every
``commit_every`` micro-batches and at every epoch end. It costs a copy of
the variables to host memory and one small broadcast (Horovod's check for
host updates); no disk. Commits fall only where the strategy has just
synchronised (``synchronisation_period``), so a local-update strategy
(EASGD, PeriodicAverage, DiLoCo) rewinds to its last synchronisation and
SyncAverage, which synchronises every update, to its last commit.

What a membership change does
-----------------------------
Every change (a rank lost, a rank added) is a resize, mapped as a
checkpoint resize maps p shards to q ranks (``checkpoint.resized_arrays``,
through the one call site ``resized_state``): the ranks whose commit is the
newest (a newcomer has none) send their committed state to all, every rank
takes the same mapped state, and an EASGD rank's local weights restart from
the center. The strategy is bound again, so what depends on the size
(EASGD's α = β/q) follows the new size, exactly as on a resumed checkpoint.
A commit mid-epoch continues at the same fraction of the epoch's
micro-batches at the new size (``continued_step``).

Horovod 0.28.1's defects this module works around (all of them here)
-------------------------------------------------------------------
1. ``horovod.tensorflow.elastic.TensorFlowKerasState`` calls
   ``optimizer.variables()``, a list (not a method) in Keras 3, and raises
   ``TypeError`` at construction. ``ElasticState`` subclasses Horovod's
   ``ObjectState`` with hvd_easgd's own state instead.
2. ``hvd.elastic.run``'s wrapper (horovod/tensorflow/elastic.py) turns a
   failed collective into ``HorovodInternalError`` only when the error names
   ``HorovodAllreduce``, ``HorovodAllgather`` or ``HorovodBroadcast``; any
   other error it *swallows, returning None*, so survivors whose grouped
   allreduce (``HorovodGroupedAllreduce``, hvd_easgd's step) failed would end
   "successfully" mid-training. ``as_internal_error`` converts every failed
   Horovod op before the wrapper sees it, and ``run`` refuses a None return.
3. Horovod's elastic reset re-initialises Horovod, but the objects made
   before it (hvd_easgd's communicator) keep the rank and size they read;
   ``ElasticState.sync`` refreshes the communicator in place
   (``HorovodCommunicator.refresh_membership``) and binds the strategy again.
   Keras's compiled train step captured the old size: it is traced again.
4. One setting, ``HOROVOD_GLOO_TIMEOUT_SECONDS``, bounds both a collective's
   wait for a dead peer and a reset's rendezvous, and a rendezvous that times
   out *aborts the process* (``std::terminate`` on ``gloo::IoException`` from
   http_store.cc: "Wait timeout after 15 seconds for key(s): 2") instead of
   raising. Horovod's driver starts a newcomer only once the live ranks wait at
   the rendezvous, so they wait for its whole start-up. The timeout is set per
   reset (``_timeout_for``): short when a rank failed, long when the job grows.
5. ``hvd.elastic.run`` skips ``state.sync()`` after a host update that Horovod
   classes as "removed" only (``HostsUpdatedInterrupt.skip_sync``), assuming the
   live ranks' state needs no exchange. Seen here: a grow-back announced as such
   left the live ranks training while the newcomer waited in its sync
   ("Mismatched data types: One rank had type int32, but another rank had type
   int64": two different collectives met). Any change of the ranks is a resize
   here, so ``check_host_updates`` always asks for the sync.

Scope: Gloo launches only. Under an MPI launch (``mpirun``, ``srun``,
``horovodrun --mpi``) and on the direct path, MPI cannot lose a process and
continue; there a dead rank stops the job fast, as it always did
(``refusal``). Horovod's elastic driver binds its servers to every network
interface: see docs/elastic.md.

With startup/runtime.py and comm/horovod_comm.py, the only module that imports Horovod.
"""
import math
import os
import re
import time

import numpy as np

from ..strategies.base import walk
from . import store

# Micro-batches between commits when train.py's --elastic-commit-every is not
# given: a copy of a small model's state costs well under a millisecond per
# variable, and 50 micro-batches bound the work lost to seconds on the models
# this project trains; rounded up to the strategy's synchronisation period.
DEFAULT_COMMIT_EVERY = 50

# Horovod's elastic launcher sets this in every worker it starts.
ELASTIC_MARKER = "HOROVOD_ELASTIC"

# Seconds a Gloo collective waits for a peer before failing (Horovod's default
# is 30). A rank that is not a direct neighbour of the dead one in the ring sees
# its death only through this timeout, so it bounds the time to recovery. 15 s
# leaves room for ranks that are briefly uneven (an evaluation, a checkpoint
# write of a small model) and keeps recovery within 30 s; a job whose ranks
# legitimately wait longer sets HOROVOD_GLOO_TIMEOUT_SECONDS (or horovodrun's
# --gloo-timeout-seconds) itself. A false alarm costs a reset, not the job.
GLOO_TIMEOUT_SECONDS = 15
# The same setting bounds the rendezvous of a reset (defect 4): when hosts are
# added, the live ranks wait there for the newcomer, which must start Python and
# TensorFlow first. A reset that grows the job therefore re-initialises with this
# longer timeout, which then also bounds failure detection until the next reset.
GLOO_TIMEOUT_GROWING_SECONDS = 120
_GLOO_TIMEOUT = "HOROVOD_GLOO_TIMEOUT_SECONDS"

# Test-only hook (tests/multiproc/test_elastic.py): the rank started on the host
# named in HVD_EASGD_TEST_DIE_ON_HOST kills itself with SIGKILL once it has
# trained HVD_EASGD_TEST_DIE_AT_STEP micro-batches in all, so a failure falls
# at a step chosen in advance. Never set outside tests.
TEST_DIE_AT_STEP = "HVD_EASGD_TEST_DIE_AT_STEP"
TEST_DIE_ON_HOST = "HVD_EASGD_TEST_DIE_ON_HOST"
# Test-only hook: "N:SECONDS" makes every micro-batch sleep SECONDS while the job
# runs below N ranks. Survivors at 2 otherwise finish digits' epochs in about 2 s,
# which can be less than Horovod's driver takes to discover an added host (it
# looks every second) and the ranks to reach their next commit. Never set outside tests.
TEST_PACE_BELOW_SIZE = "HVD_EASGD_TEST_PACE_BELOW_SIZE"

# The op names horovod/tensorflow/elastic.py's wrapper recognises (defect 2).
_HOROVOD_OP = re.compile(r"Horovod[A-Za-z]+")


def elastic_launch(environ=None):
    """True when Horovod's elastic launcher started this process."""
    environ = os.environ if environ is None else environ
    return environ.get(ELASTIC_MARKER, "") not in ("", "0")


def configure_environment(environ=None):
    """Sets the Horovod settings elastic training needs where the user set none
    (``GLOO_TIMEOUT_SECONDS``); call it before Horovod starts."""
    environ = os.environ if environ is None else environ
    environ.setdefault(_GLOO_TIMEOUT, str(GLOO_TIMEOUT_SECONDS))
    environ.setdefault(_GLOO_TIMEOUT_CHOSEN, environ[_GLOO_TIMEOUT])


# The Gloo timeout in force when the job started (the user's, or ours): failures reset with it.
_GLOO_TIMEOUT_CHOSEN = "HVD_EASGD_ELASTIC_GLOO_TIMEOUT_SECONDS"


def _timeout_for(growing, environ=None):
    """Sets the Gloo timeout the next re-initialisation takes (defect 4): the job's
    own after a failure, at least ``GLOO_TIMEOUT_GROWING_SECONDS`` when hosts were added."""
    environ = os.environ if environ is None else environ
    chosen = int(environ.get(_GLOO_TIMEOUT_CHOSEN, GLOO_TIMEOUT_SECONDS))
    environ[_GLOO_TIMEOUT] = str(max(chosen, GLOO_TIMEOUT_GROWING_SECONDS) if growing else chosen)


def refusal(collectives, gloo, mpi, elastic, strategy):
    """Why ``--elastic`` cannot run here, in one line, or None when it can.

    Args:
      collectives: the ``--collectives`` choice.
      gloo: whether this is a Gloo launch (``runtime.gloo_launch``).
      mpi: whether this is an MPI launch (``runtime.mpi_launch``).
      elastic: whether Horovod's elastic launcher started it (``elastic_launch``).
      strategy: the (unbound) strategy.

    Returns:
      The reason, or None.
    """
    if mpi or collectives == "mpi-direct":
        return ("`--elastic` needs horovodrun's elastic mode over Gloo (horovodrun --gloo -np N --min-np M "
                "--host-discovery-script S): an MPI launch (mpirun, srun, horovodrun --mpi) or the mpi-direct "
                "path cannot continue without a lost process, and stops the job at once instead. "
                f"Received: --elastic with collectives={collectives!r}{' under an MPI launch' if mpi else ''}")
    if not (gloo and elastic):
        return ("`--elastic` needs horovodrun's elastic mode over Gloo (horovodrun --gloo -np N --min-np M "
                "--host-discovery-script S); this process was not started by it. Received: --elastic")
    if strategy.needs_process_groups():
        return ("`--elastic` cannot rebuild a strategy's process groups at a new size. "
                f"Received: --elastic with --strategy {strategy.name}")
    return None


def synchronisation_period(strategy, accumulate=1):
    """Micro-batches between the points where every rank holds what the strategy
    last agreed: ``accumulate`` times the least common multiple of the periods
    of the strategies in the tree (SyncAverage: 1; EASGD, PeriodicAverage,
    DiLoCo: their ``period``)."""
    periods = [getattr(s, "period", 1) or 1 for s in walk(strategy)]
    return accumulate * math.lcm(*periods)


def commit_period(requested, strategy, accumulate=1):
    """Micro-batches between commits: ``requested`` (``None``: ``DEFAULT_COMMIT_EVERY``;
    0: epoch ends only) rounded up to a multiple of ``synchronisation_period``."""
    if requested is None:
        requested = DEFAULT_COMMIT_EVERY
    if requested == 0:
        return 0
    period = synchronisation_period(strategy, accumulate)
    return -(-requested // period) * period


def continued_step(step_in_epoch, old_steps_per_epoch, new_steps_per_epoch):
    """The micro-batch a commit at ``step_in_epoch`` of an epoch of
    ``old_steps_per_epoch`` continues from in an epoch of ``new_steps_per_epoch``:
    the same fraction of the epoch, rounded down."""
    if not step_in_epoch or old_steps_per_epoch == new_steps_per_epoch:
        return step_in_epoch
    return min(new_steps_per_epoch - 1, step_in_epoch * new_steps_per_epoch // old_steps_per_epoch)


def resized_state(shards, keys):
    """The state every rank takes after a membership change, from the committed
    ``shards`` (mappings key -> array) of the ranks that hold the newest commit.

    The one call site of the resize mapping (today ``checkpoint.resized_arrays``),
    so a mapping over in-memory per-rank states can replace it in one place.
    """
    return store.resized_arrays(shards, keys)


def as_internal_error(error):
    """``error`` as ``HorovodInternalError`` when it is a failed Horovod collective
    (defect 2 of the module docstring), else None."""
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    if isinstance(error, (HorovodInternalError, HostsUpdatedInterrupt)):
        return None
    if _HOROVOD_OP.search(str(error)) or type(error).__name__ == "UnknownError":
        return HorovodInternalError(error)
    return None


class ElasticState:
    """Factory of the Horovod ``ObjectState`` holding hvd_easgd's state (defect 1).

    Use ``ElasticState.create(model, optimizer, comm)``; the class is made on
    first use so that importing this module never imports Horovod.
    """

    @staticmethod
    def create(model, optimizer, comm, steps_per_epoch):
        """A committed state at epoch 0, micro-batch 0.

        Args:
          model: the compiled Keras model (its optimizer attached and built).
          optimizer: its ``DistributedOptimizer``.
          comm: the job's ``HorovodCommunicator`` (refreshed after every reset).
          steps_per_epoch: micro-batches per epoch at the starting size.

        Returns:
          The state: attributes ``epoch``, ``step_in_epoch``, ``steps_per_epoch``,
          ``global_step`` (micro-batches trained, over all epochs), ``resets``
          (Horovod resets this rank went through, or joined after) and ``failure_seen``
          (when this rank last saw a collective fail, by its clock, or None).
        """
        return _state_class()(model, optimizer, comm, steps_per_epoch)


def _state_class():
    import horovod.tensorflow as hvd
    from horovod.common.elastic import ObjectState
    from horovod.common.exceptions import HostsUpdatedInterrupt

    class _HvdEasgdState(ObjectState):
        def __init__(self, model, optimizer, comm, steps_per_epoch):
            self._model, self._optimizer, self._comm = model, optimizer, comm
            self._groups = store.state_groups(model, optimizer)
            self._keys = [f"{name}/{i:05d}" for name, vs in self._groups.items() for i in range(len(vs))]
            self._arrays = None
            self.resets = 0
            self.failure_seen = None
            self.resized_from = None
            super().__init__(bcast_object=hvd.broadcast_object, get_rank=hvd.rank, epoch=0, step_in_epoch=0,
                             steps_per_epoch=steps_per_epoch, global_step=0)
            self._copy_variables()

        def _variables(self):
            return [v for vs in self._groups.values() for v in vs]

        def _copy_variables(self):
            self._arrays = {key: np.array(v.numpy()) for key, v in zip(self._keys, self._variables())}

        def _assign(self, arrays):
            for key, variable in zip(self._keys, self._variables()):
                variable.assign(arrays[key])

        def save(self):
            self._copy_variables()
            super().save()

        def restore(self):
            # Horovod calls this when a collective failed: the moment the failure was seen.
            self.failure_seen = time.time()
            _timeout_for(growing=False)
            self._assign(self._arrays)
            super().restore()

        def check_host_updates(self):
            try:
                super().check_host_updates()
            except HostsUpdatedInterrupt as interrupt:
                self.failure_seen = None  # hosts changed; nothing failed
                _timeout_for(growing=not interrupt.skip_sync)  # skip_sync: hosts were only removed
                # Never skip the sync (defect 5): every change of the ranks is a resize.
                raise HostsUpdatedInterrupt(skip_sync=False) from interrupt

        def reset(self):
            # Horovod re-initialised (defect 3): everything that read the ranks reads them again,
            # and what depends on the size (EASGD's alpha) follows it, as on a resumed checkpoint.
            self.resets += 1
            self._comm.refresh_membership()
            self._optimizer.strategy.bind(self._comm)

        def sync(self):
            # Two gathers: every rank's position (small), then the state of the ranks holding the
            # newest commit only (a newcomer holds none: its resets count is behind).
            position = (self.global_step, self.epoch, self.step_in_epoch, self.steps_per_epoch)
            positions = hvd.allgather_object((self.resets, position))
            resets = max(r for r, _ in positions)
            if resets == 0:
                return  # the job's start: the trainer's initial broadcast gives every rank rank 0's state
            newest = max(p for r, p in positions if r == resets)
            holds = self.resets == resets and position == newest
            shards = [arrays for arrays in hvd.allgather_object(self._arrays if holds else None)
                      if arrays is not None]
            self._assign(resized_state(shards, self._keys))
            strategy = self._optimizer.strategy
            strategy.bind(self._comm)
            strategy.on_state_restored()
            kept = strategy.kept_variables()
            if kept is not None:  # as a resized checkpoint: local weights restart from the center
                for variable, center in zip(self._model.trainable_variables, kept):
                    variable.assign(center)
            self.resets = resets
            self.global_step, self.epoch, self.step_in_epoch, self.steps_per_epoch = newest
            self.resized_from = len(shards)
            self._copy_variables()
            ObjectState.save(self)

    return _HvdEasgdState


def run(train, state):
    """Runs ``train(state)`` under Horovod's elastic loop (``hvd.elastic.run``),
    with every failed Horovod collective handed to it as ``HorovodInternalError``
    (defect 2); returns what ``train`` returns.

    Raises:
      RuntimeError: when Horovod's loop returned None (it swallowed an error).
    """
    import horovod.tensorflow.elastic as hvd_elastic

    @hvd_elastic.run
    def wrapped(state):
        try:
            return train(state)
        except Exception as err:  # noqa: BLE001 (only failed collectives are converted)
            converted = as_internal_error(err)
            if converted is None:
                raise
            raise converted from err

    result = wrapped(state)
    if result is None:
        raise RuntimeError("Horovod's elastic loop returned without finishing the training (it swallowed an error)")
    return result


def maybe_pace_for_test():
    """The test-only hook (``TEST_PACE_BELOW_SIZE``): sleep while the job is below its size."""
    setting = os.environ.get(TEST_PACE_BELOW_SIZE)
    if setting:
        import horovod.tensorflow as hvd

        size, seconds = setting.split(":")
        if hvd.size() < int(size):
            time.sleep(float(seconds))


def maybe_die_for_test(global_step):
    """The test-only hook (``TEST_DIE_AT_STEP``): SIGKILL this process at that step."""
    at = os.environ.get(TEST_DIE_AT_STEP)
    if at and int(at) == global_step and os.environ.get("HOROVOD_HOSTNAME") == os.environ.get(TEST_DIE_ON_HOST):
        import signal
        import sys

        print(f"hvd_easgd elastic test hook: killing this rank at micro-batch {global_step} "
              f"(unix time {time.time():.3f})", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
