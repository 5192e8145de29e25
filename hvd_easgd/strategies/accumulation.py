"""Gradient accumulation: k backward passes per optimizer update.

It wraps another strategy instead of being a combined class: the wrapped
strategy sees one update per window of k micro-batches (SyncAverage then
allreduces once per window; EASGD's τ counts these updates).

Each micro-batch j arrives, as every strategy's input does (base.py), as a
sum S_j = n_j g_j over its n_j samples (g_j the gradient of the loss averaged
over the micro-batch; n_j = 1 when the caller gives no ``sample_count``).
The window keeps S = Σ_j S_j and n = Σ_j n_j and hands (S, n) to the wrapped
strategy, which applies ΣS / Σn over ranks (``average=True``) or the sum. So
k micro-batches of size b equal one batch of k·b, and variable-size inputs
(one image per micro-batch, the TF1 recipe) are weighted by their sample
counts when ``sample_count`` is passed.

Uneven work: a rank with no data left calls the step with zero gradients and
``sample_count=0`` so that every rank reaches every collective; windows do
not span epoch boundaries when the caller counts windows per epoch
(``hvd_easgd.app.data.accumulation_windows``).
"""
import numbers

import keras
import tensorflow as tf

from .base import ExpectedTraffic, SyncStrategy, as_dense, state_variable_name
from .sync_average import SyncAverage


@keras.saving.register_keras_serializable(package="hvd_easgd")
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
        if not isinstance(k, numbers.Integral) or isinstance(k, bool) or k < 1:
            raise ValueError(f"`k` must be an integer >= 1. Received: k={k!r}")
        if strategy is not None and not isinstance(strategy, SyncStrategy):
            raise ValueError(f"`strategy` must be a SyncStrategy or None. Received: strategy={strategy!r}")
        if isinstance(strategy, GradientAccumulation):
            raise ValueError("GradientAccumulation cannot wrap another GradientAccumulation; multiply the k's")
        self.k = int(k)
        self.average = bool(average)
        self.strategy = strategy if strategy is not None else SyncAverage()
        self.name = f"{self.strategy.name}+accumulate"

    def children(self):
        return (self.strategy,)

    def _build_state(self, trainable_variables, non_trainable_variables):
        self.accumulators = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                                         name=state_variable_name("accumulator", v))
                             for v in trainable_variables]
        self.accumulated_samples = tf.Variable(0, dtype=tf.int64, trainable=False, name="accumulated_samples")
        self.micro_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="micro_steps")
        self.strategy.build(trainable_variables, non_trainable_variables)

    def _extra_state(self):
        return self.accumulators + [self.accumulated_samples, self.micro_steps]

    def kept_variables(self):
        return self.strategy.kept_variables()

    def step(self, grad_sums, variables, apply_update, sample_count=None, mean=True):
        count = tf.constant(1, tf.int64) if sample_count is None else tf.cast(sample_count, tf.int64)
        for acc, s, v in zip(self.accumulators, grad_sums, variables):
            acc.assign_add(as_dense(s, v))
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

    # --- the hooks (base.py): the wrapped strategy's answers, at k micro-batches per update ----
    def lr_scale_factor(self, size, accumulate=1):
        """The wrapped strategy's rule at ``accumulate · k`` micro-batches per update."""
        return self.strategy.lr_scale_factor(size, accumulate * self.k)

    def resize_refusal(self, saved_ranks, ranks):
        return self.strategy.resize_refusal(saved_ranks, ranks)

    def expected_traffic(self, trainable_variables, non_trainable_variables=(), hosts=1, ranks_per_host=1,
                         sample_counts=False):
        """The wrapped strategy's, once every k micro-batches, with the window's sample count."""
        inner = self.strategy.expected_traffic(trainable_variables, non_trainable_variables, hosts, ranks_per_host,
                                               sample_counts=True)
        return ExpectedTraffic(inner.within_group.per(self.k), inner.across_groups.per(self.k),
                               inner.ranks_per_group)

    def get_config(self):
        return {"k": self.k, "average": self.average,
                "strategy": keras.saving.serialize_keras_object(self.strategy)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["strategy"] = keras.saving.deserialize_keras_object(config["strategy"])
        return cls(**config)

    def __repr__(self):
        return f"GradientAccumulation(k={self.k}, average={self.average}, strategy={self.strategy!r})"
