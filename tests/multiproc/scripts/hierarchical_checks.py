"""Hierarchical on real ranks: horovodrun -np 4, groups of 2 as Horovod process sets;
or, with a second argument ``mpi-direct`` under mpirun, as MPI communicators
split by the direct path.

Each rank steps its own gradients (the same seeded table on every rank) in a
tf.function, with every inter strategy on its shard of the weights, and
writes its weights, kept model (gathered within its group), per-level account
and one reduce-scatter over all the ranks to OUT/rank<r>.json.
"""
import sys

from hvd_easgd import _compat

_compat.import_keras_for_ranks()  # as train.py's ranks: no galleries, no sklearn wrappers

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvd_easgd  # noqa: E402
from hvd_easgd import EASGD, DiLoCo, Hierarchical, PeriodicAverage, SyncAverage  # noqa: E402
from tests.multiproc.scripts.rank_checks import write_rank_results  # noqa: E402

WIDTH, STEPS, LR = 3, 4, 0.5
X0 = np.array([1.0, -2.0, 0.5], np.float32)
COUNTS = [3, 1, 2, 5]

out_dir = sys.argv[1]
collectives = sys.argv[2] if len(sys.argv) > 2 else "horovod"
comm = hvd_easgd.init(threads_per_rank=1, process_sets="dynamic", collectives=collectives)
grads = np.random.default_rng(0).normal(size=(STEPS, comm.size, WIDTH)).astype(np.float32)


def run(strategy, counts):
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(WIDTH, use_bias=False)])
    model.layers[0].kernel.assign(X0[None, :])
    opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), strategy, comm=comm)
    hvd_easgd.broadcast_initial_state(model, opt)
    comm.reset_account()
    strategy.reset_account()  # the groups' communicators are shared with the run before

    @tf.function
    def train_step(grad, count):
        opt.apply([grad], model.trainable_variables, sample_count=count)

    for t in range(STEPS):
        train_step(tf.constant(grads[t, comm.rank][None, :]),
                   tf.constant(counts[comm.rank] if counts else 1, tf.int64))
    kept = strategy.kept_variables()
    return {"kernel": model.layers[0].kernel.numpy().ravel().tolist(),
            "center": None if kept is None else np.ravel(kept[0]).tolist(),
            "levels": strategy.account_by_level(), "total": comm.account(), "groups": strategy.groups,
            "inter_size": strategy.inter.comm.size, "moving_rate": getattr(strategy.inter, "moving_rate", None)}



@tf.function
def scatter(floats, ints):  # one grouped call per dtype
    return comm.reducescatter([floats, floats * 2], op="sum")[:1] + comm.reducescatter([ints], op="sum")


# 7 floats and 5 int32 per rank (not multiples of p: padded to 8), rank-dependent values.
base = np.arange(7, dtype=np.float32) * 0.25
shards = scatter(tf.constant(base + comm.rank), tf.constant(np.arange(5, dtype=np.int32) * (comm.rank + 1)))
comm.reset_account()
results = {"rank": comm.rank, "size": comm.size, "reducescatter": [s.numpy().tolist() for s in shards],
           "easgd": run(Hierarchical(SyncAverage(), EASGD(2, moving_rate=0.25), ranks_per_group=2), COUNTS),
           "periodic": run(Hierarchical(SyncAverage(), PeriodicAverage(2), ranks_per_group=2), COUNTS),
           "diloco": run(Hierarchical(SyncAverage(), DiLoCo(2), ranks_per_group=2), COUNTS),
           "sync": run(Hierarchical(SyncAverage(), SyncAverage(), ranks_per_group=2), None)}
write_rank_results(out_dir, comm.rank, results)
# Every rank waits for all: a rank that exits shuts Horovod down for the ranks
# still finishing a collective in another process set.
comm.allreduce([tf.constant(0.0)], record=False)
