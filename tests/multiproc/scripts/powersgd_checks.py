"""Runs under `horovodrun -np 2`: SyncAverage with PowerSGD on real ranks, in
traced steps (tf.function), in one launch. Each rank writes OUT/rank<r>.json;
tests/multiproc/test_powersgd.py asserts on them.

1. Hand-made gradients (every rank can make every rank's, from their seeds)
   on a Dense(12 -> 8): the weights against tests/reference.py's PowerSGD step.
2. The CNN on digits, each rank its own shard: bit-identical weights and Q,
   per-rank residuals, and the byte and call account.

Usage: powersgd_checks.py OUT
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
from tests import reference as ref  # noqa: E402

OUT = sys.argv[1]
comm = hvd_easgd.init(threads_per_rank=1)
RANK, SIZE = comm.rank, comm.size
WARMUP, STEPS, LR = 3, 8, 0.25
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
results = {"rank": RANK, "size": SIZE}


def gathered_max_diff(arrays):
    worst = 0.0
    for a in arrays:
        allv = comm.allgather(tf.reshape(tf.convert_to_tensor(a), [1, -1])).numpy()
        worst = max(worst, float(np.max(np.abs(allv - allv[0]))))
    return worst


def powersgd(rank=4):
    return hvd_easgd.SyncAverage(compression="powersgd", powersgd_rank=rank, powersgd_warmup_steps=WARMUP)


# --- 1. against the NumPy reference ---------------------------------------------------
def rank_grads(rank, step):
    return np.random.default_rng([rank, step]).standard_normal((12, 8))


model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, use_bias=False)])
opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), powersgd(rank=2), comm=comm)
hvd_easgd.broadcast_initial_state(model, opt)
w = model.get_weights()[0].astype(np.float64)
q = opt.strategy.powersgd.factors[0].numpy().astype(np.float64)
residuals = [np.zeros((12, 8)) for _ in range(SIZE)]


@tf.function
def apply(grad):
    opt.apply([grad], model.trainable_variables)


for t in range(STEPS):
    apply(tf.constant(rank_grads(RANK, t), tf.float32))
    grads = [rank_grads(r, t).astype(np.float32).astype(np.float64) for r in range(SIZE)]
    if t < WARMUP:
        total = sum(grads)
    else:
        total, residuals, q = ref.powersgd_step(grads, residuals, q)
    w = w - LR * total / SIZE
got = model.get_weights()[0]
results["reference_relerr"] = float(np.max(np.abs(got - w)) / np.max(np.abs(w)))
results["reference_residual_relerr"] = float(
    np.max(np.abs(opt.strategy.powersgd.residuals[0].numpy() - residuals[RANK])) / np.max(np.abs(residuals[RANK])))

# --- 2. the CNN on digits: identical ranks, the account ---------------------------------
digits = hvd_easgd.data.digits()
keras.utils.set_random_seed(100 + RANK)  # different init per rank: the broadcast must fix it
cnn = hvd_easgd.models.build("cnn", digits.input_shape, 10)
opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), powersgd(), comm=comm)
hvd_easgd.broadcast_initial_state(cnn, opt)


@tf.function
def cnn_step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, cnn(x, training=True))
    opt.apply(tape.gradient(loss, cnn.trainable_variables), cnn.trainable_variables)


comm.reset_account()
for t in range(STEPS):
    idx = np.arange(t * 16, t * 16 + 16) * SIZE + RANK  # each rank its own shard
    cnn_step(digits.x_train[idx], digits.y_train[idx])
account = comm.account()
state = opt.strategy.powersgd
results["cnn_weights_maxdiff"] = gathered_max_diff(cnn.trainable_variables)
results["cnn_q_maxdiff"] = gathered_max_diff(list(state.factors.values()))
results["cnn_residuals_maxdiff"] = gathered_max_diff(list(state.residuals.values()))
results["cnn_shapes"] = [list(v.shape) for v in cnn.trainable_variables]
results["cnn_bytes"], results["cnn_calls"] = account["bytes"], account["calls"]
results["cnn_skipped"] = int(opt.strategy.skipped_steps.numpy())

os.makedirs(OUT, exist_ok=True)
with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
    json.dump(results, f, indent=1)
print(f"rank {RANK}: powersgd checks done", flush=True)
