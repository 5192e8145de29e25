"""The configurations the suite compares in a custom training loop.

Every configuration gets the same model (same seed, so the same initial
weights), the same inner optimizer and the same per-rank batch. They differ
only in how ranks combine their work:

* ``no_comm``      each rank trains alone: no collective at all (the ceiling);
* ``raw_horovod``  a hand-written step calling ``hvd.grouped_allreduce`` itself;
* ``sync``, ``easgd_tau4``, ``easgd_tau10``, ``easgd_tau10_overlap``,
  ``accum4_sync``: hvd_easgd;
* ``sync_two_level``, ``hier_easgd_tau10``, ``periodic_tau10``,
  ``diloco_tau10``: hvd_easgd's strategies for several hosts (a
  Hierarchical strategy's groups are the hosts).

A configuration's ``run(xs, ys)`` is one ``tf.function`` that takes
``xs.shape[0]`` training steps in a ``tf.range`` loop over pre-sharded
batches, so Python dispatch is paid once per call and equally for all.
"""

import keras
import numpy as np
import tensorflow as tf

import hvd_easgd
from hvd_easgd.statistics import floating_state

from .collective_count import CollectiveCounter, TrafficAccount
from .names import ALL_CUSTOM_LOOP, BASELINES, HIERARCHICAL, STRATEGIES, TOPOLOGY

# Every timed run must hold whole EASGD periods and accumulation windows, or
# the measured calls per step would depend on where the window started.
STEP_MULTIPLE = 20

DESCRIPTIONS = {
    "no_comm": "each rank trains alone, no communication (ceiling)",
    "raw_horovod": "hand-written step, hvd.grouped_allreduce inside the tf.function",
    "sync": "hvd_easgd SyncAverage",
    "easgd_tau4": "hvd_easgd EASGD tau=4",
    "easgd_tau10": "hvd_easgd EASGD tau=10",
    "easgd_tau10_overlap": "hvd_easgd EASGD tau=10, overlap=True (allreduce issued before the inner update)",
    "accum4_sync": "hvd_easgd GradientAccumulation k=4 over SyncAverage",
    "sync_two_level": "hvd_easgd Hierarchical(SyncAverage, SyncAverage): the two-level allreduce",
    "hier_easgd_tau10": "hvd_easgd Hierarchical(SyncAverage within a host, EASGD tau=10 across hosts)",
    "periodic_tau10": "hvd_easgd PeriodicAverage tau=10 (local SGD)",
    "diloco_tau10": "hvd_easgd DiLoCo tau=10 (outer Nesterov SGD, hvd_easgd's defaults)",
}


def easgd_settings(name):
    """``easgd_tau10_overlap`` → (10, True)."""
    tau, _, variant = name[len("easgd_tau"):].partition("_")
    return int(tau), variant == "overlap"


# What train.py is given to train like each strategy: (--strategy, --accumulate).
# The time-to-accuracy rows scale --lr as ``train.py --scale-lr`` would for it.
# Hierarchical has no rule of its own: both of its configurations average
# the gradients or the weights of all p ranks, so they take the flat rule of
# their inter strategy at p ranks. DiLoCo has none (train.py refuses
# --scale-lr for it): it trains at --lr, with its outer defaults.
TRAIN_PY_EQUIVALENT = {"sync": ("sync", 1), "easgd_tau4": ("easgd", 1), "easgd_tau10": ("easgd", 1),
                       "easgd_tau10_overlap": ("easgd", 1), "accum4_sync": ("sync", 4),
                       "sync_two_level": ("sync", 1), "hier_easgd_tau10": ("easgd", 1),
                       "periodic_tau10": ("periodic", 1), "diloco_tau10": ("diloco", 1)}


def make_strategy(name):
    if name == "sync":
        return hvd_easgd.SyncAverage()
    if name.startswith("easgd_tau"):
        tau, overlap = easgd_settings(name)
        return hvd_easgd.EASGD(period=tau, overlap=overlap)
    if name == "accum4_sync":
        return hvd_easgd.GradientAccumulation(4, strategy=hvd_easgd.SyncAverage())
    if name == "sync_two_level":
        return hvd_easgd.Hierarchical(intra=hvd_easgd.SyncAverage(), inter=hvd_easgd.SyncAverage())
    if name == "hier_easgd_tau10":
        return hvd_easgd.Hierarchical(intra=hvd_easgd.SyncAverage(), inter=hvd_easgd.EASGD(period=10))
    if name == "periodic_tau10":
        return hvd_easgd.PeriodicAverage(period=10)
    if name == "diloco_tau10":
        return hvd_easgd.DiLoCo(period=10)
    raise ValueError(f"not an hvd_easgd configuration: {name!r}")


def needs_process_sets(names):
    """Whether any of ``names`` splits the ranks into groups (Horovod's dynamic process sets)."""
    return any(name in HIERARCHICAL for name in names)


def element_count(variables):
    return int(sum(np.prod(v.shape) for v in variables))


def trainable_count(model):
    return element_count(model.trainable_variables)


NOTHING_SENT = {"bytes_per_step": 0.0, "calls_per_step": 0.0}


def expected_traffic(name, model, hosts=1, ranks_per_host=1):
    """Analytic payload bytes and collective calls per training step (per rank).

    SyncAverage: all gradients (4·P bytes) in one call every step.
    EASGD τ: the elastic differences (4·P) and a 4-byte non-finite flag in
      one call every τ-th step (BatchNorm statistics are averaged by the
      AverageStatistics callback, outside the account).
    Accumulation k over SyncAverage: the gradient sums and a 4-byte sample
      count in one call every k-th micro-step.
    PeriodicAverage τ: the weights and floating non-trainable state (4·(P + S))
      and the flag, in one call every τ-th step.
    DiLoCo τ: the pseudo-gradient (4·P) and the flag, in one call every τ-th step.
    Hierarchical, G = ``hosts`` groups of n = ``ranks_per_host``: the intra
      level sends 4·P in one call every step when n > 1; the inter level
      sends what its strategy sends alone when G > 1 (SyncAverage: 4·P every
      step; EASGD τ: 4·P + 4 every τ-th step).
    """
    weights = 4 * trainable_count(model)
    if name == "no_comm":
        return dict(NOTHING_SENT)
    if name in ("raw_horovod", "sync"):
        return {"bytes_per_step": float(weights), "calls_per_step": 1.0}
    if name.startswith("easgd_tau"):
        tau, _ = easgd_settings(name)
        return {"bytes_per_step": (weights + 4) / tau, "calls_per_step": 1.0 / tau}
    if name == "accum4_sync":
        return {"bytes_per_step": (weights + 4) / 4, "calls_per_step": 0.25}
    if name == "periodic_tau10":
        state = 4 * element_count(floating_state(model))
        return {"bytes_per_step": (weights + state + 4) / 10, "calls_per_step": 0.1}
    if name == "diloco_tau10":
        return {"bytes_per_step": (weights + 4) / 10, "calls_per_step": 0.1}
    if name in HIERARCHICAL:
        intra = (float(weights), 1.0) if ranks_per_host > 1 else (0.0, 0.0)
        if hosts == 1:
            inter = (0.0, 0.0)
        else:
            inter = (float(weights), 1.0) if name == "sync_two_level" else ((weights + 4) / 10, 0.1)
        return {"bytes_per_step": intra[0] + inter[0], "calls_per_step": intra[1] + inter[1]}
    raise ValueError(name)


def expected_for_launch(name, model, comm, hosts=1, ranks_per_host=1):
    """``expected_traffic`` for a launch of ``comm.size`` ranks. At one rank, hvd_easgd's
    communicators return a collective's inputs without a call (hvd_easgd.comm.Communicator), so
    its configurations send nothing; the baselines' raw Horovod calls are still counted where
    they are traced."""
    if comm.size == 1 and name not in BASELINES:
        return dict(NOTHING_SENT)
    return expected_traffic(name, model, hosts, ranks_per_host)


def cross_host_bytes_per_step(name, model, hosts, ranks_per_host):
    """Analytic bytes per training step that cross between hosts, summed over
    the cluster, for ranks numbered host by host.

    A flat allreduce of B bytes: Open MPI's recursive halving then doubling
    (Rabenseifner), nearest ranks first, which is what the hosts' counters
    show it choosing on the virtual cluster at 4 ranks for 153 KB and
    21.7 MB alike. Its steps within a host cost nothing across; the rest move
    2(H−1)·B in all, the least any allreduce over H hosts can (each host
    sends (H−1)/H·B to scatter the sums and as much to gather them). A ring
    in rank order would move H·2(p−1)/p·B instead (3B at 2 hosts × 2 ranks).
    Hierarchical: the intra level stays inside a host; the inter level is n
    allreduces (one per index within the host) over G = H ranks, one per
    host, each moving 2(G−1)·B: 2n(G−1)·B of the inter payload.
    """
    if hosts < 2:
        return 0.0
    if name in HIERARCHICAL:
        inter_only = expected_traffic(name, model, hosts, 1)["bytes_per_step"]
        return inter_only * 2 * ranks_per_host * (hosts - 1)
    payload = expected_traffic(name, model, hosts, ranks_per_host)["bytes_per_step"]
    return payload * 2 * (hosts - 1)


def broadcast_like_raw_horovod(model):
    """Rank 0's weights everywhere with plain ``hvd.broadcast``, as a hand-written loop does it."""
    import horovod.tensorflow as hvd

    for v in model.variables:
        v.assign(hvd.broadcast(tf.convert_to_tensor(v), root_rank=0))


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


class Configuration:
    """One model trained one way; ``run`` takes many steps per call."""

    def __init__(self, name, model_name, input_shape, num_classes, batch, comm, lr=0.05, seed=0):
        self.name = name
        self.comm = comm
        keras.utils.set_random_seed(seed)  # same initial weights for every configuration
        self.model = hvd_easgd.models.build(model_name, input_shape, num_classes)
        inner = keras.optimizers.SGD(lr, momentum=0.9)
        hosts, per_host = comm.size // comm.local_size, comm.local_size
        self.expected = expected_for_launch(name, self.model, comm, hosts, per_host)
        self.expected_cross_host = cross_host_bytes_per_step(name, self.model, hosts, per_host)
        # The baselines' traffic is counted at Horovod's collectives (none
        # for no_comm); the strategies' comes from comm.account().
        self.traffic = TrafficAccount(comm, CollectiveCounter() if name in BASELINES else None)
        variables = self.model.trainable_variables
        loss_fn = _loss()
        spec = (tf.TensorSpec((None, batch, *input_shape), tf.float32), tf.TensorSpec((None, batch), tf.int64))

        if name in STRATEGIES or name in TOPOLOGY:
            self.optimizer = hvd_easgd.DistributedOptimizer(inner, strategy=make_strategy(name), comm=comm)
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
