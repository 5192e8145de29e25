"""Gradient accumulation: k backward passes per optimizer update.

It wraps another strategy instead of being a combined class: the wrapped
strategy sees one update per window of k micro-batches (SyncAverage then
allreduces once per window; EASGD's τ counts these updates).

Per micro-batch j of n_j samples with gradient g_j (of a loss averaged over
the micro-batch), the window keeps S = Σ_j n_j g_j and n = Σ_j n_j, then
hands (S, n) to the wrapped strategy, which applies S_total / n_total
(``average=True``) or the sum. So k micro-batches of size b equal one batch
of k·b, and variable-size inputs (one image per micro-batch, the TF1 recipe)
are weighted by their sample counts. ``n_j`` defaults to 1 per micro-batch;
pass ``sample_count`` to weight by samples when micro-batches differ in size.

Uneven work: a rank with no data left calls the step with zero gradients and
``sample_count=0`` so that every rank reaches every collective; windows do
not span epoch boundaries when the caller counts windows per epoch
(``hvd_easgd.data.accumulation_windows``).
"""
import tensorflow as tf

from .base import SyncStrategy, as_dense
from .sync_average import SyncAverage


class GradientAccumulation(SyncStrategy):
    """Accumulates ``k`` micro-batches per update of the wrapped ``strategy``.

    Args:
      k: micro-batches per update (int ≥ 1).
      average: apply the mean over the samples accumulated (default, as Keras 3
        and optax do) or, if False, their sum. Horovod's own accumulation sums.
      strategy: the strategy that combines the windows across ranks
        (default ``SyncAverage()``).

    ``optimizer.iterations`` (the inner optimizer's) counts updates, i.e.
    windows, unlike Keras 3's ``gradient_accumulation_steps`` which counts
    micro-batches; ``micro_steps`` counts micro-batches here.
    """

    name = "accumulate"
    description = "k micro-batches per update, composed with another strategy"

    def __init__(self, k, average=True, strategy=None):
        super().__init__()
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"`k` must be an integer >= 1. Received: k={k!r}")
        self.k = k
        self.average = bool(average)
        self.strategy = strategy if strategy is not None else SyncAverage()
        if isinstance(self.strategy, GradientAccumulation):
            raise ValueError("GradientAccumulation cannot wrap another GradientAccumulation; multiply the k's")
        self.name = f"{self.strategy.name}+accumulate"

    def bind(self, comm):
        super().bind(comm)
        self.strategy.bind(comm)
        return self

    def build(self, trainable_variables, non_trainable_variables=()):
        super().build(trainable_variables, non_trainable_variables)
        self.strategy.build(trainable_variables, non_trainable_variables)

    def _build_state(self, trainable_variables, non_trainable_variables):
        self.accumulators = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                         name="accumulator/" + v.name.replace(":", "_"))
                             for v in trainable_variables]
        self.accumulated_samples = tf.Variable(0, dtype=tf.int64, trainable=False, name="accumulated_samples")
        self.micro_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="micro_steps")

    def _extra_state(self):
        return self.accumulators + [self.accumulated_samples, self.micro_steps] + self.strategy.state_variables()

    def per_rank_state(self):
        # Accumulators always differ per rank.
        return True

    def on_initial_state_synced(self):
        self.strategy.on_initial_state_synced()

    def kept_variables(self):
        return self.strategy.kept_variables()

    def step(self, grads, variables, apply_update, sample_count=None, mean=True):
        count = tf.constant(1, tf.int64) if sample_count is None else tf.cast(sample_count, tf.int64)
        for acc, g, v in zip(self.accumulators, grads, variables):
            acc.assign_add(as_dense(g, v) * tf.cast(count, acc.dtype))
        self.accumulated_samples.assign_add(count)
        self.micro_steps.assign_add(1)
        self.step_counter.assign_add(1)

        def update():
            self.strategy.step([a.value() for a in self.accumulators], variables, apply_update,
                               sample_count=self.accumulated_samples.value(), mean=self.average)
            for acc in self.accumulators:
                acc.assign(tf.zeros_like(acc))
            self.accumulated_samples.assign(0)
            return tf.no_op()

        tf.cond(tf.equal(self.micro_steps % self.k, 0), update, tf.no_op)

    def get_config(self):
        from .registry import serialize_strategy

        return {"k": self.k, "average": self.average, "strategy": serialize_strategy(self.strategy)}

    @classmethod
    def from_config(cls, config):
        from .registry import deserialize_strategy

        config = dict(config)
        config["strategy"] = deserialize_strategy(config["strategy"])
        return cls(**config)
