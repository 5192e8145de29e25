"""Runs under `horovodrun -np 2`: a functional model with an Embedding
(IndexedSlices gradients), fed by the user's own tf.data pipeline of uneven
length, sharded with hvd_easgd.shard_dataset.

Each rank writes OUT/rank<r>.json; tests/multiproc/test_keras_guides.py asserts.
"""
import sys

import keras
import numpy as np
import tensorflow as tf

import hvd_easgd
from tests.multiproc.scripts.rank_checks import gathered_max_diff, write_rank_results

OUT = sys.argv[1]
comm = hvd_easgd.init(threads_per_rank=1)
RANK, SIZE = comm.rank, comm.size
results = {"rank": RANK}
VOCAB, LENGTH, SAMPLES = 50, 6, 1001  # odd: a plain .shard() gives rank 0 one sample more



rng = np.random.default_rng(2)
tokens = rng.integers(0, VOCAB, size=(SAMPLES, LENGTH))
labels = (tokens < VOCAB // 2).sum(axis=1) > LENGTH // 2  # mostly low tokens -> class 1

# The user's pipeline; the filter hides its length from tf.data (cardinality unknown).
dataset = tf.data.Dataset.from_tensor_slices((tokens, labels.astype(np.int64))).filter(lambda t, l: True)
results["plain_shard_batches"] = comm.allgather_json(
    int(dataset.shard(SIZE, RANK).batch(10).reduce(0, lambda c, _: c + 1)))
dataset = hvd_easgd.shard_dataset(dataset).batch(10)
results["shard_dataset_batches"] = comm.allgather_json(int(dataset.reduce(0, lambda c, _: c + 1)))

keras.utils.set_random_seed(40 + RANK)  # different per rank: the broadcast must fix them
inputs = keras.Input((LENGTH,), dtype="int32")
embedded = keras.layers.Embedding(VOCAB, 8)(inputs)
outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(embedded))
model = keras.Model(inputs, outputs)
model.compile(optimizer=hvd_easgd.DistributedOptimizer(keras.optimizers.Adam(0.01)),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
history = model.fit(dataset, epochs=4, verbose=0, callbacks=hvd_easgd.callbacks.defaults())
results["losses"] = history.history["loss"]
results["accuracy"] = history.history["accuracy"]
results["weights_maxdiff"] = gathered_max_diff(comm, model.trainable_variables)
results["optimizer_maxdiff"] = gathered_max_diff(comm, model.optimizer.variables)
results["iterations"] = int(model.optimizer.iterations.numpy())

write_rank_results(OUT, RANK, results)
