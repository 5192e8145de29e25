"""Exact evaluation figures over a test set sharded across ranks.

Each rank evaluates its own shard (``data.test_dataset(data, rank=r, size=p)``:
samples r, r+p, ...). A Keras metric keeps its state as sums over samples: the
loss tracker and accuracy a ``total`` and a ``count``, Precision and AUC a
confusion matrix. The state of the whole test set is therefore the sum of the
ranks' states, and ``result()`` on that sum is the figure one process would
get on the whole set (up to float32 summation order). Averaging the ranks'
``result()`` instead would weight a shard of 181 samples like one of 180.

When the sum happens matters. After the last test batch, Keras 3's
``evaluate`` reads ``result()`` of every metric, returns that dict, and
``fit`` prefixes it with ``val_`` for its epoch logs
(keras/src/backend/tensorflow/trainer.py); ``on_test_end`` receives only a
copy. So the state is summed in ``on_test_batch_end`` of this rank's last
batch: the only hook between the last step and Keras reading the results.
Every rank knows its own number of batches (its dataset's cardinality); the
shards may differ by a batch, which is fine because evaluation has no
collective per step, only this one at the end.
"""
import keras

from ..training.model_optimizers import communicator_of


# Metrics whose every variable is a sum over samples. Mean covers
# MeanMetricWrapper, so every accuracy, cross-entropy, hinge and regression
# error, and RootMeanSquaredError. (PearsonCorrelation and
# ConcordanceCorrelation are Means of per-batch values: their sum is exact for
# what they compute, a mean over batches, as in one process.)
ADDITIVE_METRICS = (
    keras.metrics.Sum, keras.metrics.Mean,
    keras.metrics.TruePositives, keras.metrics.FalsePositives, keras.metrics.TrueNegatives,
    keras.metrics.FalseNegatives, keras.metrics.Precision, keras.metrics.Recall, keras.metrics.AUC,
    keras.metrics.SensitivityAtSpecificity, keras.metrics.SpecificityAtSensitivity,
    keras.metrics.PrecisionAtRecall, keras.metrics.RecallAtPrecision,
    keras.metrics.IoU, keras.metrics.FBetaScore, keras.metrics.R2Score,
)


class GlobalEvaluationMetrics(keras.callbacks.Callback):
    """Sums every evaluation metric's state over ranks after this rank's last
    test batch, so ``model.evaluate``'s result, ``fit``'s ``val_*`` logs, the
    progress bar and History all hold the figures of the whole test set.

    Pass it to ``model.evaluate`` and to ``model.fit`` (for its validation),
    and give ``fit`` no ``validation_steps``: every rank must run its whole
    shard. ``MetricAverage`` leaves the ``val_*`` entries alone.

    A metric whose state is not a sum (a running maximum, say) cannot be
    combined this way: it is refused with a ``ValueError`` on every rank alike,
    rather than reported wrong, at the latest after the first test batch (as
    soon as ``compile()`` has built its metrics) and always before any
    collective. A custom metric whose variables are all sums over samples can
    be declared with ``additive_metrics``. With one rank there is nothing to
    combine: every metric is accepted and the callback does nothing.

    Args:
        dataset: this rank's evaluation ``tf.data.Dataset`` (known cardinality).
        comm: the communicator (default: the model's ``DistributedOptimizer``'s).
        additive_metrics: more metric classes whose variables are all sums.
    """

    # Keras may run batch-end hooks in a thread pool for callbacks marked
    # async-safe; this one must run in line, before Keras reads the results.
    async_safe = False

    def __init__(self, dataset, comm=None, additive_metrics=()):
        super().__init__()
        batches = int(dataset.cardinality())
        if batches < 1:  # also UNKNOWN (-2) and INFINITE (-1) cardinality
            raise ValueError("`dataset` must hold a known number of batches, at least 1, so that each rank "
                             f"knows its last one. Received: dataset={dataset!r} with cardinality {batches}")
        self.batches = batches
        self._comm = comm
        self._additive = ADDITIVE_METRICS + tuple(additive_metrics)
        self._batches_seen = 0

    @property
    def comm(self):
        return self._comm or communicator_of(self.model)

    def on_test_begin(self, logs=None):
        self._batches_seen = 0
        if self.comm.size > 1:
            self._state_variables()  # refuses what cannot be summed, if the metrics are built already

    def on_test_batch_end(self, batch, logs=None):
        # ``batch`` is the last step of the call (several with steps_per_execution).
        done_before, self._batches_seen = self._batches_seen, batch + 1
        if self.comm.size == 1:
            return
        if done_before == 0:
            self._state_variables()  # compile() metrics are built by the first step at the latest
        if done_before < self.batches <= self._batches_seen:
            variables = self._state_variables()
            summed = self.comm.allreduce([v.value for v in variables], op="sum", record=False)
            for variable, total in zip(variables, summed):
                variable.assign(total)

    def on_test_end(self, logs=None):
        if self.comm.size > 1 and self._batches_seen != self.batches:
            raise RuntimeError(
                f"evaluation ran {self._batches_seen} batches on rank {self.comm.rank}, but its dataset holds "
                f"{self.batches}: the metric state was summed across ranks at the wrong point. Evaluate the "
                "whole dataset the callback was built with (no `steps` or `validation_steps`).")

    def _state_variables(self):
        variables = []
        for metric in self.model.metrics:
            for leaf in _leaf_metrics(metric):
                if not leaf.variables:  # no state (yet): nothing to combine
                    continue
                if not isinstance(leaf, self._additive):
                    raise ValueError(
                        "`model.metrics` must keep states that are sums over samples, so that sharded evaluation "
                        f"combines them exactly across ranks; metric `{leaf.name}` ({type(leaf).__name__}) keeps a "
                        "state that is not a sum over samples. Use metrics built on Sum, Mean or a confusion "
                        "matrix, or declare its class with "
                        f"GlobalEvaluationMetrics(..., additive_metrics=[{type(leaf).__name__}]) if all its "
                        f"variables are sums. Received: metric={leaf.name!r}")
                variables.extend(leaf.variables)
        return variables


def _leaf_metrics(metric):
    """The metrics that hold ``metric``'s state: itself, or, for a container
    whose whole state lies in the sub-metrics it lists in ``.metrics`` (Keras's
    CompileMetrics, built by ``compile(metrics=...)``), those sub-metrics."""
    members = getattr(metric, "metrics", None)
    if isinstance(members, (list, tuple)) and members:
        held = {id(v) for member in members for v in member.variables}
        if all(id(v) in held for v in metric.variables):
            return [leaf for member in members for leaf in _leaf_metrics(member)]
    return [metric]
