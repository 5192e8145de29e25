"""c, the seconds of one training step with no communication, timed on the job itself.

``--strategy auto`` prices its candidates with the slowest rank's c; ``--balance speed`` cuts the
global batch by every rank's own (``sample_shares``). Both time a throwaway copy of the model, so
the model trained and its optimizer are untouched.
"""
import itertools
import statistics
import time

# Steps timed: 2 that trace and warm the copy, then the median of the 5 after them.
WARM_STEPS, TIMED_STEPS = 2, 5
MEASURED_STEPS = WARM_STEPS + TIMED_STEPS


def compute_seconds(model, loss, optimizer, batches, warm=WARM_STEPS, timed=TIMED_STEPS, after_step=None):
    """This rank's seconds of one training step with no communication: the median over ``timed``
    steps after ``warm`` (which trace). On a copy of ``model`` and a fresh ``optimizer`` of the same
    configuration: the model's weights and the optimizer's state are untouched. ``after_step(x)``,
    if given, runs after each step on its batch, inside the time (a test's slow rank)."""
    import keras
    import tensorflow as tf

    clone = keras.models.clone_model(model)
    clone.set_weights(model.get_weights())
    inner = optimizer.__class__.from_config(optimizer.get_config())
    inner.build(clone.trainable_variables)  # its slots exist before the step is traced

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, clone(x, training=True))
        inner.apply(tape.gradient(value, clone.trainable_variables), clone.trainable_variables)
        return value

    seconds = []
    for i, (x, y) in enumerate(itertools.islice(itertools.cycle(batches), warm + timed)):
        start = time.perf_counter()
        step(x, y).numpy()
        if after_step is not None:
            after_step(x)
        if i >= warm:
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)
