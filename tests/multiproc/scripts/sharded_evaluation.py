"""Runs under `horovodrun -np 2`: each rank evaluates its shard of a 361-sample
test set (181 and 180 samples: 4 and 3 batches of 60) with
GlobalEvaluationMetrics, through model.evaluate and through fit's validation,
and also the whole set alone, as one process would. Each rank writes
OUT/rank<r>.json; tests/multiproc/test_sharded_evaluation.py compares them.
"""
import json
import os
import sys

from hvd_easgd import _compat

_compat.import_keras_for_ranks()  # as train.py's ranks: no galleries, no sklearn wrappers

import keras  # noqa: E402

import hvd_easgd  # noqa: E402
from hvd_easgd.app import data  # noqa: E402
from hvd_easgd.callbacks import GlobalEvaluationMetrics, MetricAverage  # noqa: E402

OUT = sys.argv[1]
BATCH = 60
comm = hvd_easgd.init(threads_per_rank=1)
digits = data.digits()
dataset = data.Dataset("uneven", digits.x_train, digits.y_train, digits.x_train[:361], digits.y_train[:361],
                       num_classes=10)

keras.utils.set_random_seed(1)  # the same weights on every rank
model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(16, "relu"),
                          keras.layers.Dense(10)])
# lr 0: fit's training leaves the weights alone, so its validation must give the same figures again
model.compile(keras.optimizers.SGD(0.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])

whole = model.evaluate(data.test_dataset(dataset, BATCH), verbose=0, return_dict=True)
shard = data.test_dataset(dataset, BATCH, rank=comm.rank, size=comm.size)
own = model.evaluate(shard, verbose=0, return_dict=True)
exact = GlobalEvaluationMetrics(shard, comm)
evaluated = model.evaluate(shard, verbose=0, callbacks=[exact], return_dict=True)
train, steps = data.training_dataset(dataset, 32, seed=0, rank=comm.rank, size=comm.size, start_epoch=0, epochs=1)
history = model.fit(train, epochs=1, steps_per_epoch=steps, validation_data=shard, verbose=0,
                    callbacks=[exact, MetricAverage(comm)])
results = {
    "rank": comm.rank, "size": comm.size, "shard_batches": len(shard), "whole": whole, "own_shard": own,
    "evaluate": evaluated, "fit_validation": {k[len("val_"):]: v[0] for k, v in history.history.items()
                                              if k.startswith("val_")},
    "account": comm.account(),
}
with open(os.path.join(OUT, f"rank{comm.rank}.json"), "w") as f:
    json.dump(results, f)
