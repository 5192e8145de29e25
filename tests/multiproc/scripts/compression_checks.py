"""Runs under `horovodrun -np N` or `mpirun -np N`: the compressed collectives across real
ranks, in one launch. Each rank writes OUT/rank<r>.json; tests/multiproc/test_compression.py
asserts on them.

Usage: compression_checks.py OUT [COLLECTIVES] (as hvd_easgd.init takes them).

Every rank builds every rank's inputs from the seed, so each can compare the
result with the NumPy reference (tests/reference.py) itself.
"""
import sys

from hvd_easgd import _compat

_compat.import_keras_for_ranks()  # as train.py's ranks: no galleries, no sklearn wrappers

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvd_easgd  # noqa: E402
from hvd_easgd import DiLoCo  # noqa: E402
from hvd_easgd.comm import Compression  # noqa: E402
from tests import reference as ref  # noqa: E402
from tests.multiproc.scripts.rank_checks import gathered_max_diff, write_rank_results  # noqa: E402

OUT = sys.argv[1]
COLLECTIVES = sys.argv[2] if len(sys.argv) > 2 else "horovod"
comm = hvd_easgd.init(threads_per_rank=1, collectives=COLLECTIVES)
RANK, SIZE = comm.rank, comm.size
results = {"rank": RANK, "size": SIZE, "communicator": type(comm).__name__, "has_alltoall": comm.has_alltoall}


def inputs(rank):
    rng = np.random.default_rng(100 + rank)
    return [(rng.standard_normal((300, 3)) * 10.0 ** rng.integers(-3, 2, (300, 1))).astype(np.float32),
            np.array([rank + 1.0], np.float32)]


# 1. The quantised allreduce of each format: eagerly (the reference's bits), and traced as a
# step traces it (TF's graph optimisations may round the fp32 adds of decoded values
# differently, by an ulp; the same on every rank).
for name in ("bf16", "int8", "int4", "sign"):
    fmt = Compression.by_name(name)
    comm.reset_account()
    reduced = comm.allreduce([tf.constant(t) for t in inputs(RANK)], op="sum", compression=fmt)
    account = comm.account(wire=True)  # before the comparison's own allgathers
    step = tf.function(lambda tensors: comm.allreduce(tensors, op="sum", compression=fmt, record=False))
    traced = step([tf.constant(t) for t in inputs(RANK)])
    expected = ref.quantised_allreduce_reference([inputs(r)[0].ravel() for r in range(SIZE)], name)
    results[name] = {
        "account": account,
        "equals_reference": ref.equals_quantised_reference(reduced[0].numpy().ravel(), expected, name),
        "traced_relative_error": float(np.max(np.abs(traced[0].numpy().ravel() - expected))
                                       / np.max(np.abs(expected))),
        "exact_value": reduced[1].numpy().tolist(),
        "identical_maxdiff": max(gathered_max_diff(comm, reduced), gathered_max_diff(comm, traced)),
    }

# 1b. The sparse allreduce (topk): every rank's own top-k, one allgather, decoded and summed in rank order;
# eagerly (the reference's bits, and what this rank sent plus what it keeps is its payload, bit for bit) and
# traced. Three chunks of 4095, the last padded.
TOPK = Compression.by_name("topk", density=0.01, bits=2)


def topk_inputs(rank):
    rng = np.random.default_rng(200 + rank)
    payload = (rng.standard_normal((300, 30)) * 10.0 ** rng.integers(-3, 2, (300, 1))).astype(np.float32)
    # A position ranks 0-2 all send (each its chunk's largest, sent as 375.375, 7.5e7, -7.5e7), whose sum
    # depends on the order of the additions: the allgather must hand the messages over in rank order.
    payload[0, 0] = (500.5, 1e8, -1e8, 1.0)[min(rank, 3)]
    return [payload, np.array([rank + 1.0], np.float32)]


comm.reset_account()
reduced, kept = comm.allreduce_with_errors([tf.constant(t) for t in topk_inputs(RANK)], op="sum", compression=TOPK)
account = comm.account(wire=True)
step = tf.function(lambda tensors: comm.allreduce(tensors, op="sum", compression=TOPK, record=False))
traced = step([tf.constant(t) for t in topk_inputs(RANK)])
expected = ref.topk_allreduce_reference([topk_inputs(r)[0].ravel() for r in range(SIZE)], TOPK.density, TOPK.bits)
mine = topk_inputs(RANK)[0].ravel()
results["topk"] = {
    "account": account,
    "equals_reference": bool(np.array_equal(reduced[0].numpy().ravel(), expected)),
    "traced_relative_error": float(np.max(np.abs(traced[0].numpy().ravel() - expected)) / np.max(np.abs(expected))),
    "exact_value": reduced[1].numpy().tolist(),
    "conserved": bool(np.array_equal(ref.topk_reference(mine, TOPK.density, TOPK.bits) + kept[0].numpy().ravel(),
                                     mine)),
    "identical_maxdiff": max(gathered_max_diff(comm, reduced), gathered_max_diff(comm, traced)),
}

# 2. The alltoall primitive on bytes (what the quantised allreduce hands it), where there is one.
if comm.has_alltoall:
    mine = tf.constant(np.array([[RANK * 10 + j] * 3 for j in range(SIZE)], np.uint8).ravel())
    results["alltoall"] = comm._alltoall(mine).numpy().tolist()

# 3. DiLoCo across real ranks, int8 and topk (at k = 2 of the 6 weights: the rest of each pseudo-gradient
# waits in the residual): a few outer steps, the ranks bit-identical after each.
shards, w0 = ref.least_squares_shards(SIZE)


def diloco_run(compression):
    """Six steps of DiLoCo tau = 2 with ``compression`` from the shared initial weights: its account, the
    weights (bit-identical on every rank) and the norm of this rank's residual."""
    model = keras.Sequential([keras.Input((ref.DIM,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].kernel.assign(w0.reshape(-1, 1))
    opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), DiLoCo(period=2, compression=compression),
                                         comm=comm)
    hvd_easgd.broadcast_initial_state(model, opt)
    comm.reset_account()

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_mean(tf.square(tf.squeeze(model(x), -1) - y))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    for t in range(6):
        train_step(*(tf.constant(a, tf.float32) for a in ref.batch(shards[RANK], t, 4)))
    return {"account": comm.account(wire=True), "weights": model.layers[0].kernel.numpy().ravel().tolist(),
            "identical_maxdiff": gathered_max_diff(comm, model.trainable_variables),
            "residual_norm": float(np.linalg.norm(opt.strategy.error_feedback.residuals[0].numpy()))}


results["diloco"] = diloco_run("int8")
results["diloco_topk"] = diloco_run(Compression.by_name("topk", density=2 / 4095, bits=2))
write_rank_results(OUT, RANK, results)
