"""The configurations the suite compares in a custom training loop.

Every configuration gets the same model (same seed, so the same initial
weights), the same inner optimizer and the same per-rank batch. They differ
only in how ranks combine their work:

* ``no_comm``      each rank trains alone: no collective at all (the ceiling);
* ``raw_horovod``  a hand-written step calling ``hvd.grouped_allreduce`` itself;
* every other row of ``names.TABLE``: an hvd_easgd strategy, built by the
  row's factory (a Hierarchical strategy's groups are the hosts);
* a strategy a plugin registered (``worker --plugin MODULE``), by its name,
  with its defaults.

What each is expected to send is asked of its strategy
(``SyncStrategy.expected_traffic``), never worked out here.

A configuration's ``run(xs, ys)`` is one ``tf.function`` that takes
``xs.shape[0]`` training steps in a ``tf.range`` loop over pre-sharded
batches, so Python dispatch is paid once per call and equally for all.
"""

import keras
import numpy as np
import tensorflow as tf

import hvd_easgd
from hvd_easgd.strategies import GradientAccumulation, registry, walk
from hvd_easgd.strategies.base import ExpectedTraffic

from .collective_count import CollectiveCounter, TrafficAccount
from .names import ALL_CUSTOM_LOOP, BY_NAME
from .names import Configuration as Row

# Every timed run must hold whole EASGD periods and accumulation windows, or
# the measured calls per step would depend on where the window started.
STEP_MULTIPLE = 20


def lookup(name, plugins=()):
    """The table's row ``name`` (``names.TABLE``), or for a strategy registered
    by a plugin (imported from ``plugins``, e.g. ``worker --plugin``) a row
    built from the registry: the strategy with its defaults, trained by
    ``train.py --plugin ... --strategy NAME``."""
    if name in BY_NAME:
        return BY_NAME[name]
    if name in registry.available():
        flags = tuple(f for module in plugins for f in ("--plugin", module)) + ("--strategy", name)
        return Row(name, registry.available()[name], lambda: registry.create(name), train_py=flags,
                   groups=("plugin",))
    raise ValueError(f"`name` must be a configuration ({', '.join(BY_NAME)}) or a registered strategy "
                     f"(load a plugin's with --plugin). Received: name={name!r}")


def make_strategy(name, plugins=()):
    """The strategy configuration ``name`` trains with (its row's factory)."""
    row = lookup(name, plugins)
    if row.is_baseline:
        raise ValueError(f"`name` must be an hvd_easgd configuration, not a baseline. Received: name={name!r}")
    return row.make_strategy()


def needs_process_sets(names, plugins=()):
    """Whether any of ``names`` splits the ranks into groups (Horovod's dynamic process
    sets): asked of each configuration's strategy (``needs_process_groups``)."""
    return any(not lookup(n, plugins).is_baseline and make_strategy(n, plugins).needs_process_groups()
               for n in names)


def accumulation_window(strategy):
    """Micro-batches per update: the k of a GradientAccumulation in ``strategy``, else 1."""
    return next((s.k for s in walk(strategy) if isinstance(s, GradientAccumulation)), 1)


def element_count(variables):
    return int(sum(np.prod(v.shape) for v in variables))


def trainable_count(model):
    return element_count(model.trainable_variables)


NOTHING_SENT = {"bytes_per_step": 0.0, "calls_per_step": 0.0}


def _as_row(traffic):
    return {"bytes_per_step": float(traffic.bytes), "calls_per_step": float(traffic.calls)}


def expected_levels(name, model, hosts=1, ranks_per_host=1, plugins=()):
    """Configuration ``name``'s ``ExpectedTraffic`` (per rank and training step, by
    level), asked of its strategy (``SyncStrategy.expected_traffic``) from the
    model's variables; a baseline's is that of the strategy it sends like, and
    ``no_comm``'s nothing. The custom loop passes no sample count."""
    strategy = lookup(name, plugins).traffic_strategy()
    if strategy is None:
        return ExpectedTraffic()
    return strategy.expected_traffic(model.trainable_variables, model.non_trainable_variables, hosts, ranks_per_host)


def expected_traffic(name, model, hosts=1, ranks_per_host=1, plugins=()):
    """Analytic payload bytes and collective calls per training step (per rank),
    both levels together: ``{"bytes_per_step", "calls_per_step"}``. The formulas
    are each strategy's (its ``expected_traffic`` docstring)."""
    return _as_row(expected_levels(name, model, hosts, ranks_per_host, plugins).total)


def expected_for_launch(name, model, comm, hosts=None, ranks_per_host=None, plugins=()):
    """``expected_traffic`` for a launch of ``comm.size`` ranks (default: all on one
    host). At one rank hvd_easgd's communicators return a collective's inputs
    without a call (hvd_easgd.comm.Communicator), so its configurations send
    nothing, as their strategies' hooks say; the baselines' raw Horovod calls
    are still counted where they are traced, so a baseline expects at any size
    what its twin strategy sends at two ranks (a flat allreduce's traffic per
    rank does not depend on p)."""
    hosts = 1 if hosts is None else hosts
    ranks_per_host = comm.size // hosts if ranks_per_host is None else ranks_per_host
    if lookup(name, plugins).is_baseline and comm.size == 1:
        return expected_traffic(name, model, 1, 2, plugins)
    return expected_traffic(name, model, hosts, ranks_per_host, plugins)


def cross_host_bytes_per_step(name, model, hosts, ranks_per_host, plugins=()):
    """Analytic bytes per training step that cross between hosts, summed over
    the cluster, for ranks numbered host by host, from the strategy's levels,
    each collective by its own pattern (``Traffic.by_collective``).

    By level (``ExpectedTraffic``): the within-group level stays inside a host
    (the table's groups are the hosts); the across-groups level is
    ``ranks_per_group`` sets side by side (1 for a flat strategy; one per index
    within the host for Hierarchical), each a set of n ranks, n/H of them on
    each of the H hosts. For one set:

    - An allreduce of B bytes: Open MPI's recursive halving then doubling
      (Rabenseifner), nearest ranks first, which is what the hosts' counters
      show it choosing on the virtual cluster at 4 ranks for 153 KB and 21.7 MB
      alike. Its steps within a host cost nothing across; the rest move
      2(H−1)·B in all, the least any allreduce over H hosts can (each host
      sends (H−1)/H·B to scatter the sums and as much to gather them). A ring in
      rank order would move H·2(p−1)/p·B instead (3B at 2 hosts × 2 ranks).
    - An allgather, a sparse allgather, an alltoall or a reduce-scatter: each
      rank's part goes to every other rank, n − n/H of them on other hosts, so
      (n − n/H)/(n − 1) of the rank's wire bytes cross, summed over the n
      ranks. Not a ring's (H·(n − 1) parts in all): at 4 hosts × 2 ranks the
      hosts' counters measured 1.09 times this for DiLoCo's top-k allgather and
      1.05 times for int4's alltoall and allgather (2026-12-07), 8.7 and 1.86
      times the allreduce figure this once charged them.
    - A broadcast: (H − 1)·B, one copy to each other host.
    """
    if hosts < 2:
        return 0.0
    levels = expected_levels(name, model, hosts, ranks_per_host, plugins)
    across = levels.across_groups
    sets = levels.ranks_per_group
    n = hosts * ranks_per_host // sets
    off_host = n - n // hosts  # the ranks of a set on hosts other than a given rank's
    total = 0.0
    for kind, sent, _, wire in across.by_collective or (("allreduce", across.bytes, across.calls, across.wire_bytes),):
        if kind == "allreduce":
            total += 2 * (hosts - 1) * sent
        elif kind == "broadcast":
            total += (hosts - 1) * sent
        else:
            total += n * wire * off_host / (n - 1)
    return total * sets


def broadcast_like_raw_horovod(model):
    """Rank 0's weights everywhere with plain ``hvd.broadcast``, as a hand-written loop does it."""
    import horovod.tensorflow as hvd

    for v in model.variables:
        v.assign(hvd.broadcast(tf.convert_to_tensor(v), root_rank=0))


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Configuration:
    """One model trained one way; ``run`` takes many steps per call."""

    def __init__(self, name, model_name, input_shape, num_classes, batch, comm, lr=0.05, seed=0, plugins=()):
        self.name = name
        self.comm = comm
        row = lookup(name, plugins)
        keras.utils.set_random_seed(seed)  # same initial weights for every configuration
        self.model = hvd_easgd.models.build(model_name, input_shape, num_classes)
        inner = keras.optimizers.SGD(lr, momentum=0.9)
        hosts, per_host = comm.size // comm.local_size, comm.local_size
        self.expected = expected_for_launch(name, self.model, comm, hosts, per_host, plugins)
        self.expected_cross_host = cross_host_bytes_per_step(name, self.model, hosts, per_host, plugins)
        # The baselines' traffic is counted at Horovod's collectives (none
        # for no_comm); the strategies' comes from comm.account().
        self.traffic = TrafficAccount(comm, CollectiveCounter() if row.is_baseline else None)
        # Micro-batches per update: an epoch's steps are cut to whole windows.
        self.window = 1
        variables = self.model.trainable_variables
        loss_fn = _loss()
        spec = (tf.TensorSpec((None, batch, *input_shape), tf.float32), tf.TensorSpec((None, batch), tf.int64))

        if not row.is_baseline:
            strategy = row.make_strategy()
            self.window = accumulation_window(strategy)
            self.optimizer = hvd_easgd.DistributedOptimizer(inner, strategy=strategy, comm=comm)
            hvd_easgd.broadcast_initial_state(self.model, self.optimizer)
            reduce = None
        elif name == "raw_horovod":
            import horovod.tensorflow as hvd

            self.optimizer = inner
            self.optimizer.build(variables)
            # Raw Horovod: rank 0's weights everywhere, then one grouped
            # allreduce of all gradients per step, nothing else.
            broadcast_like_raw_horovod(self.model)

            def reduce(grads):
                return hvd.grouped_allreduce(grads, op=hvd.Average)
        elif name == "no_comm":
            self.optimizer = inner
            self.optimizer.build(variables)

            def reduce(grads):
                return grads
        else:
            raise ValueError(f"unknown configuration {name!r}; choose from {ALL_CUSTOM_LOOP}")

        model, optimizer = self.model, self.optimizer

        @tf.function(input_signature=spec, jit_compile=False)
        def run(xs, ys):
            loss = tf.constant(0.0)
            for i in tf.range(tf.shape(xs)[0]):
                with tf.GradientTape() as tape:
                    loss = loss_fn(ys[i], model(xs[i], training=True))
                grads = tape.gradient(loss, variables)
                if reduce is not None:
                    grads = reduce(grads)
                optimizer.apply(grads, variables)
            return loss

        self._run = run

    # --- training ------------------------------------------------------------
    def _tracing_context(self):
        """Where ``run`` may be traced: a baseline's collectives are counted."""
        return self.traffic.tracing()

    def trace(self):
        """Traces ``run`` without executing it (no collective is issued)."""
        with self._tracing_context():
            self._run.get_concrete_function()

    def run(self, xs, ys):
        """Takes ``len(xs)`` steps; returns the last loss (read it to wait)."""
        with self._tracing_context():
            return self._run(xs, ys)

    # --- communication account --------------------------------------------------
    def reset_account(self):
        self.traffic.reset()

    def account(self):
        """``{"bytes", "calls", "source"}`` since ``reset_account``, per rank."""
        return self.traffic.account()

    # --- evaluation ---------------------------------------------------------------
    def test_accuracy(self, x_test, y_test):
        """Top-1 accuracy; for EASGD on the center x̃ (the model users keep)."""
        with hvd_easgd.KeptWeights(self.model, self.optimizer):
            return _accuracy(self.model, x_test, y_test)


def _accuracy(model, x, y):
    logits = model(x, training=False)
    return float(np.mean(np.argmax(logits.numpy(), axis=1) == y))
