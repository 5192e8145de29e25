"""Runs under `horovodrun -np 2`: the "customizing fit" guide's CustomModel
(its train_step calls self.optimizer.apply) under EASGD, as users write it:

* fit for 2 epochs, then fit again for 2 with new callbacks, against one fit
  for 4 (shuffle=False): bit for bit in weights, center and optimizer slots;
* the model you keep: saved with save_kept_model after fit's end-of-training
  merge, its predictions are the merged center's (the workers' mean), not the
  local weights';
* a custom loop that forgot broadcast_initial_state is refused at build.
Each rank writes OUT/rank<r>.json; tests/multiproc/test_keras_guides.py asserts.
"""
import os
import sys
import traceback

import keras
import numpy as np
import tensorflow as tf

import hvd_easgd
from tests.multiproc.scripts.rank_checks import gathered_max_diff, write_rank_results
from hvd_easgd.comm import RanksDisagreeError

OUT = sys.argv[1]
comm = hvd_easgd.init(threads_per_rank=1)
RANK, SIZE = comm.rank, comm.size
results = {"rank": RANK}


class CustomModel(keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}



def make_model():
    keras.utils.set_random_seed(20 + RANK)  # different per rank: the broadcast must fix them
    inputs = keras.Input((6,))
    outputs = keras.layers.Dense(1)(keras.layers.Dense(8, activation="tanh")(inputs))
    model = CustomModel(inputs, outputs)
    optimizer = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                               strategy=hvd_easgd.EASGD(period=3))
    model.compile(optimizer=optimizer, loss="mse")
    return model


rng = np.random.default_rng(1)
x_all = rng.standard_normal((2 * 240, 6)).astype(np.float32)
y_all = (np.sin(x_all[:, :1]) + 0.5 * x_all[:, 1:2]).astype(np.float32)
x, y = x_all[RANK::SIZE], y_all[RANK::SIZE]
FIT = dict(batch_size=16, shuffle=False, verbose=0)


def state(model):
    optimizer = model.optimizer
    return {"weights": [v.numpy() for v in model.trainable_variables],
            "center": [v.numpy() for v in optimizer.strategy.center],
            "optimizer": [v.numpy() for v in optimizer.variables]}


# --- repeated fit: 2 + 2 epochs == 4 epochs, bit for bit --------------------------------
once = make_model()
history = once.fit(x, y, epochs=4, callbacks=hvd_easgd.callbacks.defaults(), **FIT)
results["losses"] = history.history["loss"]
twice = make_model()
twice.fit(x, y, epochs=2, callbacks=hvd_easgd.callbacks.defaults(), **FIT)
twice.fit(x, y, epochs=2, callbacks=hvd_easgd.callbacks.defaults(), **FIT)
a, b = state(once), state(twice)
results["repeat_fit_maxdiff"] = {k: float(max(np.max(np.abs(p - q)) for p, q in zip(a[k], b[k]))) for k in a}
results["center_maxdiff"] = gathered_max_diff(comm, once.optimizer.strategy.center)
results["local_maxdiff"] = gathered_max_diff(comm, once.trainable_variables)

# --- the model you keep -------------------------------------------------------------------------
x_test = rng.standard_normal((64, 6)).astype(np.float32)
path = os.path.join(OUT, "kept.keras")
results["kept_error"] = None
try:
    if RANK == 0:
        hvd_easgd.save_kept_model(once, path)
    comm.allgather_json("saved")  # barrier: the file is complete on every rank after this
    loaded = keras.models.load_model(path, custom_objects={"CustomModel": CustomModel})
    saved_predictions = loaded.predict(x_test, verbose=0)
    # Reference: the same network computed in NumPy from the center that the end-of-fit merge
    # (callbacks.defaults' MergeAtEnd) gives: one elastic step at alpha = 1/p puts it on the
    # workers' mean, which is the mean of every rank's local weights, gathered here.
    k1, b1, k2, b2 = (
        np.mean(comm.allgather(tf.reshape(tf.cast(v, tf.float64), [1, -1])).numpy(), axis=0).reshape(v.shape)
        for v in once.trainable_variables)
    reference = np.tanh(x_test @ k1 + b1) @ k2 + b2
    local = once.predict(x_test, verbose=0)
    swapped = once.predict(x_test, verbose=0, callbacks=[hvd_easgd.callbacks.SwapKeptWeights()])
    results["saved_vs_center"] = float(np.max(np.abs(saved_predictions - reference)))
    results["saved_vs_local"] = float(np.max(np.abs(saved_predictions - local)))
    results["swapped_predict_vs_center"] = float(np.max(np.abs(swapped - reference)))
    results["local_back_after_predict"] = float(np.max(np.abs(once.predict(x_test, verbose=0) - local)))
except Exception as err:  # noqa: BLE001 - recorded for the test to assert on
    results["kept_error"] = f"{type(err).__name__}: {err}"
    traceback.print_exc()

# --- a custom loop without broadcast_initial_state is refused at build ----------------------------
def custom_loop_first_step(**kwargs):
    keras.utils.set_random_seed(30 + RANK)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
    optimizer = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), **kwargs)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x[:8]) - y[:8]) ** 2)
    optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)


try:
    custom_loop_first_step()
    results["no_broadcast_error"] = None
except RanksDisagreeError as err:
    results["no_broadcast_error"] = str(err)
try:
    custom_loop_first_step(check_initial_state=False)
    results["check_off_error"] = None
except RanksDisagreeError as err:
    results["check_off_error"] = str(err)

write_rank_results(OUT, RANK, results)
