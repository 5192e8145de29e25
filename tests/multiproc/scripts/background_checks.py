"""Runs under `horovodrun -np 2`: started allreduces on the communicator's worker thread, under real ranks,
against tests/reference.py's overlap_reference (EASGD and PeriodicAverage at δ = 1 and 2, traced steps).
Each rank writes OUT/rank<r>.json; tests/multiproc/test_background.py asserts on them.

Usage: background_checks.py OUT [COLLECTIVES] (as hvd_easgd.init takes them; default "horovod").
"""
import json
import os
import sys
import threading

from hvd_easgd import _compat

_compat.import_keras_for_ranks()  # as train.py's ranks: no galleries, no sklearn wrappers

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvd_easgd  # noqa: E402
from hvd_easgd.comm.timeline import Timeline  # noqa: E402
from tests import reference as ref  # noqa: E402

OUT = sys.argv[1]
COLLECTIVES = sys.argv[2] if len(sys.argv) > 2 else "horovod"
comm = hvd_easgd.init(threads_per_rank=1, collectives=COLLECTIVES)
RANK, SIZE = comm.rank, comm.size
results = {"rank": RANK, "communicator": type(comm).__name__, "reduces_in_background": comm.reduces_in_background}
shards, w0 = ref.least_squares_shards(SIZE)
X, Y = shards[RANK]
LR, TAU, ALPHA, STEPS, BATCH = 0.1, 4, 0.2, 10, 4


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def run(strategy_name, delta):
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
    out = {"local_relerr": rel_err(model.layers[0].kernel.numpy().ravel(), xs[RANK]),
           "account": comm.account(), "in_flight_after_step": in_flight_after_step,
           "timeline": comm.timeline.as_dict(), "in_flight_at_end": comm._background.in_flight()}
    if center is not None:
        out["center_relerr"] = rel_err(strategy.center[0].numpy().ravel(), center)
    comm.timeline = None
    return out


for name in ("easgd", "periodic"):
    for delta in (1, 2):
        results[f"{name}_{delta}"] = run(name, delta)
results["worker_threads"] = sorted(t.name for t in threading.enumerate() if t.name.startswith("hvd_easgd-"))

os.makedirs(OUT, exist_ok=True)
with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
    json.dump(results, f, indent=1)
print(f"rank {RANK}: background checks done", flush=True)
