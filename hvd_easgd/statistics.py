"""One rule for a model's floating non-trainable state (BatchNorm moving statistics).

Data parallelism keeps the trainable weights in step (SyncAverage: bit-identical;
EASGD: through the center), but each rank's moving statistics follow its own
batches. The rule, the same under every strategy: they are averaged across
ranks at the end of every epoch, at the end of training, and before every
evaluation or prediction in ``fit`` (``hvd_easgd.callbacks.AverageStatistics``),
or after every step with ``every_step=True``. So what rank 0 saves, and what
any rank evaluates, holds every rank's statistics.

This is bookkeeping, not training traffic: its allreduce is left out of
``comm.account()`` (``record=False``), so the strategies' analytic byte
formulas (gradient bytes per step, elastic differences every τ steps) stay
exact. (Before this rule EASGD averaged the statistics inside its elastic
allreduce, and counted them.)
"""
import tensorflow as tf


def floating(variables):
    """The floating ones among ``variables``: what counts as statistics
    (integer state, such as seed-generator counters, is left alone)."""
    return [v for v in variables if tf.as_dtype(v.dtype).is_floating]


def floating_state(model):
    """The model's floating non-trainable variables."""
    return floating(model.non_trainable_variables)


def average_statistics(model, comm):
    """Replaces the model's floating non-trainable variables by their mean over
    ranks. Every rank must call it (it is a collective). Not counted in
    ``comm.account()``."""
    variables = floating_state(model)
    if comm.size == 1 or not variables:
        return
    by_dtype = {}
    for v in variables:  # Horovod groups one dtype per call
        by_dtype.setdefault(tf.as_dtype(v.dtype), []).append(v)
    for group in by_dtype.values():
        averaged = comm.allreduce([tf.convert_to_tensor(v) for v in group], op="average", record=False)
        for v, value in zip(group, averaged):
            v.assign(value)
