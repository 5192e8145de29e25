"""Runs under `horovodrun -np 2`: DiLoCo with overlap across real ranks, each rank on its own
least-squares shard (tests/reference.py), the step a tf.function. Each rank writes OUT/rank<r>.json
with its weights, θ and the fragment layout per case; tests/multiproc/test_overlap.py compares them
with tests/reference.py's DiLoCoOverlapReference.

Usage: diloco_overlap_checks.py OUT [COLLECTIVES] (default "horovod").
"""
import json
import os
import sys

from hvd_easgd import _compat

_compat.import_keras_for_ranks()  # as train.py's ranks: no galleries, no sklearn wrappers

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvd_easgd  # noqa: E402
from hvd_easgd import DiLoCo  # noqa: E402
from tests import reference as ref  # noqa: E402

OUT = sys.argv[1]
COLLECTIVES = sys.argv[2] if len(sys.argv) > 2 else "horovod"
comm = hvd_easgd.init(threads_per_rank=1, collectives=COLLECTIVES)
SIZES, BATCH = (2, 2, 2), 4
# (τ, F, δ, compression, steps, merge): F = 3 not dividing τ, merges at 5, 8, 12, 15 and one in flight
# at the end (drained), the default merge; int8 with F = 2 and error feedback, merges at 3, 5, 7, 9, 11,
# the α-mix.
CASES = {"tau10_f3_delta2": (10, 3, 2, "none", 17, None), "tau4_f2_delta1_int8_mix": (4, 2, 1, "int8", 11, "mix")}


class Pieces(keras.layers.Layer):
    """x @ w with w split into whole variables of the given sizes."""

    def __init__(self, sizes, **kwargs):
        super().__init__(**kwargs)
        self.pieces = [self.add_weight(shape=(n,), initializer="zeros", name=f"w{k}") for k, n in enumerate(sizes)]

    def call(self, x):
        return tf.linalg.matvec(x, tf.concat(self.pieces, 0))


def run(tau, fragments, delta, compression, steps, merge):
    shards, w0 = ref.least_squares_shards(comm.size)
    model = keras.Sequential([keras.Input((ref.DIM,)), Pieces(SIZES)])
    for v, part in zip(model.trainable_variables, np.split(w0 + 100.0 * comm.rank, np.cumsum(SIZES)[:-1])):
        v.assign(part)  # off by rank: the initial broadcast must fix it
    strategy = DiLoCo(tau, fragments=fragments, overlap=delta, compression=compression, overlap_merge=merge)
    opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.05), strategy, comm=comm)
    hvd_easgd.broadcast_initial_state(model, opt)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_mean(tf.square(model(x) - y))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    for t in range(steps):
        x, y = ref.batch(shards[comm.rank], t, BATCH)
        step(tf.constant(x, tf.float32), tf.constant(y, tf.float32))
    in_flight = int(strategy.pending_handle.numpy()) > 0
    strategy.drain()  # what a checkpoint does first
    return {"weights": np.concatenate([v.numpy() for v in model.trainable_variables]).tolist(),
            "theta": np.concatenate([v.numpy() for v in strategy.synced]).tolist(),
            "fragment_indices": strategy.fragment_indices, "in_flight_at_end": in_flight,
            "pending_after_drain": int(strategy.pending_handle.numpy())}


results = {"rank": comm.rank, "size": comm.size, **{name: run(*case) for name, case in CASES.items()}}
with open(os.path.join(OUT, f"rank{comm.rank}.json"), "w") as f:
    json.dump(results, f, indent=1)
