"""Runs under `horovodrun -np 2`: Keras's mixed-precision guide, distributed.

A tiny BatchNorm model trained for 50 steps with model.fit:
* fp32 (the reference curve),
* mixed_float16 with the LossScaleOptimizer inside (``DistributedOptimizer(
  LossScaleOptimizer(opt))``, ``auto_scale_loss=False``),
* mixed_float16 with the layout Keras builds (``compile`` wraps the
  DistributedOptimizer in a LossScaleOptimizer),
* then one fp16 overflow on rank 1 only (a huge sample weight in one batch),
  under SyncAverage and under EASGD.
Each rank writes OUT/rank<r>.json; tests/multiproc/test_keras_guides.py asserts.
"""
import os
import sys
import traceback

import keras
import numpy as np

import hvd_easgd
from tests.multiproc.scripts.rank_checks import gathered_max_diff, write_rank_results

OUT = sys.argv[1]
comm = hvd_easgd.init(threads_per_rank=1)
RANK, SIZE = comm.rank, comm.size
results = {"rank": RANK}
STEPS, BATCH, OVERFLOW_STEP = 50, 16, 10

rng = np.random.default_rng(0)
x_all = rng.standard_normal((SIZE * STEPS * BATCH, 8)).astype(np.float32) * 2 + 1
y_all = (x_all[:, :4].sum(axis=1) > 4).astype(np.int64) + 2 * (x_all[:, 4] > 1)
x, y = x_all[RANK::SIZE], y_all[RANK::SIZE]  # this rank's shard: STEPS batches



def build_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.BatchNormalization(),
                             keras.layers.Activation("relu"), keras.layers.Dense(4),
                             keras.layers.Activation("linear", dtype="float32")])


class LossCurve(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def train(name, policy, layout, strategy=None, sample_weight=None):
    """Fits STEPS steps; records the loss curve, weights, loss scale and state under ``name``."""
    keras.mixed_precision.set_global_policy(policy)
    model = build_model()
    inner = keras.optimizers.SGD(0.05)
    if layout == "inside":
        optimizer = hvd_easgd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(inner), strategy=strategy)
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      auto_scale_loss=False)
    else:
        model.compile(optimizer=hvd_easgd.DistributedOptimizer(inner, strategy=strategy),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    curve = LossCurve()
    record = {"error": None}
    try:
        model.fit(x, y, sample_weight=sample_weight, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=hvd_easgd.callbacks.defaults() + [curve])
    except Exception as err:  # noqa: BLE001 - recorded for the test to assert on
        record["error"] = f"{type(err).__name__}: {err}"
        traceback.print_exc()
    keras.mixed_precision.set_global_policy("float32")
    if record["error"] is not None:
        results[name] = record
        return model
    optimizer = model.optimizer
    loss_scaler = next((o for o in [optimizer, getattr(optimizer, "inner_optimizer", None)]
                        if isinstance(o, keras.optimizers.LossScaleOptimizer)), None)
    record.update(
        losses=curve.losses,
        weights=[w.numpy().astype(np.float64).ravel().tolist() for w in model.trainable_weights],
        weights_maxdiff=gathered_max_diff(comm, model.trainable_weights),
        statistics_maxdiff=gathered_max_diff(comm, hvd_easgd.statistics.floating_state(model)),
        loss_scale=float(loss_scaler.dynamic_scale.numpy()) if loss_scaler is not None else None,
        iterations=int(optimizer.iterations.numpy()),
    )
    strategy = getattr(optimizer, "strategy", None)
    if strategy is not None:
        record["strategy_steps"] = int(strategy.step_counter.numpy())
        record["skipped_steps"] = int(strategy.skipped_steps.numpy())
        record["consecutive_skips"] = int(strategy.consecutive_skips.numpy())
        if hasattr(strategy, "center"):
            record["center_maxdiff"] = gathered_max_diff(comm, strategy.center)
            record["center_moved"] = float(max(np.max(np.abs(c.numpy() - s)) for c, s in
                                               zip(strategy.center, START_WEIGHTS)))
            record["steps_per_rank"] = comm.allgather_json(record["strategy_steps"])
            record["loss_scale_per_rank"] = comm.allgather_json(record["loss_scale"])
    results[name] = record
    return model


START_WEIGHTS = [w.numpy() for w in build_model().trainable_weights]
fp32 = train("fp32", "float32", "plain")
inside = train("inside", "mixed_float16", "inside")
outside = train("outside", "mixed_float16", "outside")

# BatchNorm statistics: identical on every rank after fit, and what rank 0 saves holds them.
if results["outside"]["error"] is None:
    path = os.path.join(OUT, "bn.keras")
    if RANK == 0:
        hvd_easgd.save_kept_model(outside, path)
    comm.allgather_json("saved")  # a barrier: the file exists on every rank after this
    saved = keras.models.load_model(path, compile=False)
    results["saved_statistics_diff"] = float(max(
        np.max(np.abs(a.numpy().astype(np.float64) - b.numpy()))
        for a, b in zip(hvd_easgd.statistics.floating_state(saved), hvd_easgd.statistics.floating_state(outside))))

# One overflow, on rank 1 only: a sample weight that the loss scale turns into inf in the fp16 backward pass.
weights = np.ones(len(y), np.float32)
if RANK == 1:
    weights[OVERFLOW_STEP * BATCH:(OVERFLOW_STEP + 1) * BATCH] = 1e4
train("overflow_sync", "mixed_float16", "outside", sample_weight=weights)
train("overflow_easgd", "mixed_float16", "inside", strategy=hvd_easgd.EASGD(period=5),
      sample_weight=weights)

write_rank_results(OUT, RANK, results)
