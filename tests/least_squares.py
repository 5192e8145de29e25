"""p ranks of one least-squares model on SimulatedCluster, each with its own optimizer and strategy.

The unit tests of strategy arithmetic (tests/reference.py holds their NumPy
side) build the ranks and step them the same way; this is that one way.
"""
import keras
import tensorflow as tf

import hvd_easgd
from tests import reference as ref


def least_squares_ranks(cluster, make_strategy, make_inner, w0):
    """One Dense(1) model per rank, its kernel off by 100·rank (the initial broadcast must
    fix it), each with ``DistributedOptimizer(make_inner(), make_strategy())``; accounts reset."""
    models, opts = [], []
    for comm in cluster.communicators:
        model = keras.Sequential([keras.Input((ref.DIM,)), keras.layers.Dense(1, use_bias=False)])
        model.layers[0].kernel.assign(w0.reshape(-1, 1) + 100.0 * comm.rank)
        models.append(model)
        opts.append(hvd_easgd.DistributedOptimizer(make_inner(), make_strategy(), comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    for comm in cluster.communicators:
        comm.reset_account()
    return models, opts


def train(cluster, models, opts, shards, micro_batches, batch, start=0):
    """Micro-batches ``start`` .. ``start + micro_batches - 1`` of each rank's shard, all ranks in lockstep."""
    for t in range(start, start + micro_batches):
        def step(r):
            x, y = (tf.constant(a, tf.float32) for a in ref.batch(shards[r], t, batch))
            with tf.GradientTape() as tape:
                loss = 0.5 * tf.reduce_mean(tf.square(tf.squeeze(models[r](x), -1) - y))
            opts[r].apply(tape.gradient(loss, models[r].trainable_variables), models[r].trainable_variables)

        cluster.run(step)
