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
import keras
import tensorflow as tf

from .. import resize, validation
from .base import ExpectedTraffic, SyncStrategy, as_dense, count_as, state_variable_name
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

    Two counters with two names, as optax's ``MultiSteps`` keeps them:
    ``micro_steps`` counts micro-batches (every call), ``step_counter``
    optimizer steps, i.e. windows handed to the wrapped strategy (what it
    means on every strategy). ``has_updated()`` says whether the last call
    closed a window. ``optimizer.iterations`` (the inner optimizer's) counts
    the updates applied, unlike Keras 3's ``gradient_accumulation_steps``
    which counts micro-batches.
    """

    name = "accumulate"
    description = "k micro-batches per update, composed with another strategy"
    contained_config_keys = ("strategy",)

    takes_sample_shares = False
    sample_shares_refusal = ("its windows (--accumulate K) weigh their sums by their sample counts, and a share "
                             "is not a count of samples.")

    def __init__(self, k, average=True, strategy=None):
        super().__init__()
        self.k = validation.integer("k", k, minimum=1)
        if strategy is not None and not isinstance(strategy, SyncStrategy):
            raise validation.refusal("strategy", "a SyncStrategy or None", strategy)
        if isinstance(strategy, GradientAccumulation):
            raise validation.refusal("strategy", "a strategy other than GradientAccumulation (to accumulate k1 "
                                     "then k2 micro-batches, accumulate k1 * k2 once)", strategy)
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
        # An open window's partial sums count once at another number of ranks (resize_refusal).
        self.set_resize_rule(resize.SUM_ON_FIRST, self.accumulators + [self.accumulated_samples])
        self.strategy.build(trainable_variables, non_trainable_variables)

    def _extra_state(self):
        return self.accumulators + [self.accumulated_samples, self.micro_steps]

    def kept_variables(self):
        return self.strategy.kept_variables()

    def step(self, grad_sums, variables, apply_update, sample_count=None, mean=True):
        count = count_as(sample_count, tf.int64)
        for acc, s, v in zip(self.accumulators, grad_sums, variables):
            acc.assign_add(as_dense(s, v))
        self.accumulated_samples.assign_add(count)
        self.micro_steps.assign_add(1)

        def update():
            self.strategy.step([a.value() for a in self.accumulators], variables, apply_update,
                               sample_count=self.accumulated_samples.value(), mean=self.average)
            for acc in self.accumulators:
                acc.assign(tf.zeros_like(acc))
            self.accumulated_samples.assign(0)
            # One optimizer step per window, whether the wrapped strategy applied it or skipped it.
            self.step_counter.assign_add(1)
            return tf.no_op()

        tf.cond(self.has_updated(), update, tf.no_op)

    def has_updated(self):
        """Whether the last call closed a window (and handed it to the wrapped
        strategy): a bool tensor, False before the first call. The wrapped
        strategy may still have skipped it (no samples anywhere, NaN/Inf)."""
        return tf.logical_and(self.micro_steps > 0, tf.equal(self.micro_steps % self.k, 0))

    def on_state_restored(self):
        """Reads a checkpoint written while ``step_counter`` advanced on every
        micro-batch (it then equalled ``micro_steps``): windows are closed
        every k micro-batches, so the optimizer steps are ``micro_steps // k``.
        A checkpoint written since holds exactly that, and is left as it is."""
        super().on_state_restored()
        windows = self.micro_steps // self.k
        if int(self.step_counter.numpy()) > int(windows.numpy()):
            self.step_counter.assign(windows)

    # --- the hooks (base.py): the wrapped strategy's answers, at k micro-batches per update ----
    def lr_scale_factor(self, size, accumulate=1, adaptive=False):
        """The wrapped strategy's rule at ``accumulate · k`` micro-batches per update."""
        return self.strategy.lr_scale_factor(size, accumulate * self.k, adaptive=adaptive)

    def resize_refusal(self, saved_ranks, ranks):
        """The wrapped strategy's verdict. The window's rule at p -> q ranks: a
        checkpoint inside a window (micro_steps mod k = j > 0) holds on each
        rank the partial sums S_r and counts n_r of its j micro-batches. Rank 0
        resumes with ΣS_r and Σn_r over the p ranks, the other ranks with zeros
        (``resize.SUM_ON_FIRST``), and ``micro_steps`` (the same everywhere)
        is kept, so the window closes after k − j more micro-batches. Every
        sample of the window then counts exactly once: for SyncAverage the
        window's update is ΣS/Σn over all the samples it saw at p and at q
        alike; a local strategy's rank 0 applies the p ranks' partial window
        with its own rest of it. At an epoch end (windows never span one) the
        sums are zero and stay zero."""
        return self.strategy.resize_refusal(saved_ranks, ranks)

    def expected_traffic(self, trainable_variables, non_trainable_variables=(), hosts=1, ranks_per_host=1,
                         sample_counts=False):
        """The wrapped strategy's, once every k micro-batches, with the window's sample count."""
        inner = self.strategy.expected_traffic(trainable_variables, non_trainable_variables, hosts, ranks_per_host,
                                               sample_counts=True)
        return ExpectedTraffic(inner.within_group.per(self.k), inner.across_groups.per(self.k),
                               inner.ranks_per_group, inner.overlapped)

    def get_config(self):
        return {"k": self.k, "average": self.average, **self.contained_config()}

    def __repr__(self):
        return f"GradientAccumulation(k={self.k}, average={self.average}, strategy={self.strategy!r})"
