"""Started allreduces on the communicator's worker thread, under real ranks, against
tests/reference.py's overlap_reference (EASGD and PeriodicAverage at δ = 1 and 2, traced steps).

Not a launch of its own: core_checks.py calls ``background_checks(comm)`` in its launch (one TF start-up
per rank for both sets of checks) and records the result under "background";
tests/multiproc/test_background.py asserts on it.
"""
import threading

import keras
import numpy as np
import tensorflow as tf

import hvd_easgd
from hvd_easgd.comm.timeline import Timeline
from tests import reference as ref

LR, TAU, ALPHA, STEPS, BATCH = 0.1, 4, 0.2, 10, 4


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run(comm, strategy_name, delta):
    shards, w0 = ref.least_squares_shards(comm.size)
    X, Y = shards[comm.rank]
    model = keras.Sequential([keras.Input((ref.DIM,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].kernel.assign(w0.reshape(-1, 1).astype(np.float32))
    strategy = (hvd_easgd.EASGD(period=TAU, moving_rate=ALPHA, overlap=delta) if strategy_name == "easgd" else
                hvd_easgd.PeriodicAverage(period=TAU, overlap=delta))
    opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), strategy, comm=comm)
    hvd_easgd.broadcast_initial_state(model, opt)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_mean(tf.square(tf.squeeze(model(x), -1) - y))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    comm.timeline = Timeline()
    comm.reset_account()
    in_flight_after_step = []
    for t in range(STEPS):
        x, y = ref.batch((X, Y), t, BATCH)
        step(tf.constant(x, tf.float32), tf.constant(y, tf.float32))
        in_flight_after_step.append(comm._background.in_flight())
    strategy.drain()  # what fit's end does: the start of the last steps is merged
    xs, center = ref.overlap_reference(strategy_name, shards, w0, LR, TAU, STEPS, BATCH, delta, ALPHA,
                                       drain_after=STEPS)
    out = {"local_relerr": rel_err(model.layers[0].kernel.numpy().ravel(), xs[comm.rank]),
           "account": comm.account(), "in_flight_after_step": in_flight_after_step,
           "timeline": comm.timeline.as_dict(), "in_flight_at_end": comm._background.in_flight()}
    if center is not None:
        out["center_relerr"] = rel_err(strategy.center[0].numpy().ravel(), center)
    comm.timeline = None
    return out


def background_checks(comm):
    """This rank's results: the communicator, whether it reduces in the background, each (strategy, δ)
    run, and the hvd_easgd threads alive after them (its background worker)."""
    results = {"communicator": type(comm).__name__, "reduces_in_background": comm.reduces_in_background}
    for name in ("easgd", "periodic"):
        for delta in (1, 2):
            results[f"{name}_{delta}"] = run(comm, name, delta)
    results["worker_threads"] = sorted(t.name for t in threading.enumerate() if t.name.startswith("hvd_easgd-"))
    return results
