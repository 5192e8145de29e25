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


def training_step(model, loss, optimizer):
    """``run(x, y)``: one training step, waited for, on a copy of ``model`` with a fresh ``optimizer`` of
    the same configuration (the model's weights and the optimizer's state are untouched), no
    communication. Its first call traces it."""
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

    def run(x, y):
        step(x, y).numpy()

    return run


def compute_seconds(model, loss, optimizer, batches, warm=WARM_STEPS, timed=TIMED_STEPS):
    """This rank's seconds of one training step with no communication (``training_step``): the median
    over ``timed`` steps after ``warm`` (which trace)."""
    run = training_step(model, loss, optimizer)
    seconds = []
    for i, (x, y) in enumerate(itertools.islice(itertools.cycle(batches), warm + timed)):
        start = time.perf_counter()
        run(x, y)
        if i >= warm:
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)
