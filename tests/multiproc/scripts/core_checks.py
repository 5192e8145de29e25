"""Runs under `horovodrun -np 2` (or `mpirun -np 2`): every strategy check that
needs real ranks, in one launch so TF start-up is paid once. Each rank writes
OUT/rank<r>.json; tests/multiproc/test_strategies.py asserts on them, and
tests/multiproc/test_background.py on what background_checks.py adds under "background".

Usage: core_checks.py OUT [COLLECTIVES], COLLECTIVES as hvd_easgd.init takes
them (default "horovod").

All ranks run the same checks in the same order, so collectives line up.
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
from hvd_easgd.comm import RanksDisagreeError  # noqa: E402
from tests import reference as ref  # noqa: E402
from tests.multiproc.scripts.background_checks import background_checks  # noqa: E402

OUT = sys.argv[1]
COLLECTIVES = sys.argv[2] if len(sys.argv) > 2 else "horovod"
comm = hvd_easgd.init(threads_per_rank=1, collectives=COLLECTIVES)
RANK, SIZE = comm.rank, comm.size
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
results = {"rank": RANK, "size": SIZE, "communicator": type(comm).__name__}


def gathered_max_diff(arrays):
    """Max |a_rank − a_0| over ranks, for a list of arrays."""
    worst = 0.0
    for a in arrays:
        a = tf.convert_to_tensor(a)
        allv = comm.allgather(tf.reshape(a, [1, -1])).numpy()
        worst = max(worst, float(np.max(np.abs(allv - allv[0]))))
    return worst


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def linear_model(w0):
    model = keras.Sequential([keras.Input((ref.DIM,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].kernel.assign(w0.reshape(-1, 1).astype(np.float32))
    return model


def classifier_step_fn(model, opt):
    """One tf.function step of the classification loss; works for plain Keras optimizers too."""
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return step


def lsq_step_fn(model, opt):
    @tf.function
    def step(x, y, sample_count=None):
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_mean(tf.square(tf.squeeze(model(x), -1) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables, sample_count=sample_count)
    return step


# --- 1. rank-dependent values: average and sum --------------------------------------
value = tf.fill([3], float(RANK))
results["avg_of_rank"] = comm.allreduce([value], op="average")[0].numpy().tolist()
results["sum_of_rank"] = comm.allreduce([value], op="sum")[0].numpy().tolist()

# --- 2. SyncAverage: bit-identical weights on different shards; bytes and calls ------
digits = hvd_easgd.data.digits()
keras.utils.set_random_seed(100 + RANK)  # different init per rank: the broadcast must fix it
cnn = hvd_easgd.models.build("cnn", digits.input_shape, 10)
opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9), hvd_easgd.SyncAverage(), comm=comm)
hvd_easgd.broadcast_initial_state(cnn, opt)
cnn_step = classifier_step_fn(cnn, opt)
comm.reset_account()
for t in range(20):
    idx = np.arange(t * 16, t * 16 + 16) * SIZE + RANK  # each rank its own shard
    cnn_step(digits.x_train[idx], digits.y_train[idx])
account = comm.account()
results["sync_identical_maxdiff"] = gathered_max_diff(cnn.trainable_variables)
results["sync_params"] = int(sum(np.prod(v.shape) for v in cnn.trainable_variables))
results["sync_bytes_20_steps"] = account["bytes"]
results["sync_calls_20_steps"] = account["calls"]

# fp16 on the wire: half the bytes
opt16 = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.05), hvd_easgd.SyncAverage(compression="fp16"),
                                       comm=comm)
model16 = hvd_easgd.models.build("cnn", digits.input_shape, 10)
hvd_easgd.broadcast_initial_state(model16, opt16)
step16 = classifier_step_fn(model16, opt16)
comm.reset_account()
for t in range(5):
    step16(digits.x_train[t * 8:(t + 1) * 8], digits.y_train[t * 8:(t + 1) * 8])
results["fp16_bytes_5_steps"] = comm.account()["bytes"]
results["fp16_identical_maxdiff"] = gathered_max_diff(model16.trainable_variables)

# --- 3. SyncAverage on 2 ranks × b == one process on the concatenated 2b batch ------
keras.utils.set_random_seed(5)
mlp = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(10)])
single = keras.models.clone_model(mlp)
single.set_weights(mlp.get_weights())  # same seed on every rank: identical starts
opt_mlp = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), comm=comm)
opt_single = keras.optimizers.SGD(0.1)
xs = digits.x_train.reshape(-1, 64)
b = 8
dist_step, single_step = classifier_step_fn(mlp, opt_mlp), classifier_step_fn(single, opt_single)
for t in range(10):
    lo = t * b * SIZE
    dist_step(xs[lo + RANK * b: lo + (RANK + 1) * b], digits.y_train[lo + RANK * b: lo + (RANK + 1) * b])
    single_step(xs[lo: lo + SIZE * b], digits.y_train[lo: lo + SIZE * b])
results["sync_vs_single_relerr"] = [rel_err(a, b_) for a, b_ in zip(mlp.get_weights(), single.get_weights())]


# --- 4. a custom train_step calling self.optimizer.apply is reduced too ----------------
class CustomStepModel(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(16, activation="relu")
        self.out = keras.layers.Dense(10)

    def call(self, x):
        return self.out(self.hidden(x))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = loss_fn(y, self(x, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}


keras.utils.set_random_seed(200 + RANK)
custom = CustomStepModel()
custom(xs[:1])  # creates the variables (a subclassed model has none until called)
custom.compile(optimizer=hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.05), comm=comm))
shard = slice(RANK * 200, RANK * 200 + 200)
custom.fit(xs[shard], digits.y_train[shard], batch_size=20, epochs=1, verbose=0, shuffle=False,
           callbacks=hvd_easgd.callbacks.defaults())
results["custom_train_step_maxdiff"] = gathered_max_diff(custom.trainable_variables)
results["custom_train_step_iterations"] = int(custom.optimizer.iterations.numpy())

# --- 5. ranks that disagree on the variables fail with an error, not a hang ---------------
keras.utils.set_random_seed(1)
odd = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3 + RANK)])
try:
    hvd_easgd.broadcast_initial_state(odd, hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), comm=comm))
    results["disagree_error"] = None
except RanksDisagreeError as err:
    results["disagree_error"] = str(err)

# --- 6. EASGD against the NumPy reference -------------------------------------------------
shards, w0 = ref.least_squares_shards(SIZE)
X, Y = shards[RANK]
LR, TAU, STEPS, BATCH = 0.1, 3, 25, 4


def run_easgd(steps=STEPS, momentum=0.0, nesterov=False, record_bytes=False, **easgd_kwargs):
    model = linear_model(w0)
    inner = keras.optimizers.SGD(LR, momentum=momentum, nesterov=nesterov)
    strategy = hvd_easgd.EASGD(period=TAU, **easgd_kwargs)
    opt = hvd_easgd.DistributedOptimizer(inner, strategy, comm=comm)
    hvd_easgd.broadcast_initial_state(model, opt)
    step = lsq_step_fn(model, opt)
    center_maxdiff, per_step_bytes = 0.0, []
    for t in range(steps):
        before = comm.account()["bytes"]
        x, y = ref.batch((X, Y), t, BATCH)
        step(tf.constant(x, tf.float32), tf.constant(y, tf.float32))
        per_step_bytes.append(comm.account()["bytes"] - before)
        done = t + 1 - easgd_kwargs.get("warmup_steps", 0)
        if done > 0 and done % TAU == 0:
            center_maxdiff = max(center_maxdiff, gathered_max_diff(strategy.center))
    local = model.layers[0].kernel.numpy().ravel()
    center = strategy.center[0].numpy().ravel()
    expected_local, expected_center = ref.easgd_reference(
        shards, w0, LR, TAU, strategy.moving_rate, steps, BATCH, momentum=momentum, nesterov=nesterov,
        overlap=easgd_kwargs.get("overlap", False), warmup_steps=easgd_kwargs.get("warmup_steps", 0),
        rho=easgd_kwargs.get("rho", 0.0))
    out = {"local_relerr": rel_err(local, expected_local[RANK]), "center_relerr": rel_err(center, expected_center),
           "center_maxdiff": center_maxdiff, "moving_rate": strategy.moving_rate}
    if record_bytes:
        out["per_step_bytes"] = per_step_bytes
    return out


results["easgd"] = run_easgd(record_bytes=True)
results["easgd_overlap"] = run_easgd(overlap=True)
results["easgd_warmup"] = run_easgd(warmup_steps=4)
results["eamsgd"] = run_easgd(momentum=0.9, nesterov=True)
results["easgd_rho"] = run_easgd(rho=0.05)

# --- 7. accumulation: k micro-batches on 2 ranks == one process on 2·k·b ------------------
K, B = 3, 2
model = linear_model(w0)
acc_opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), hvd_easgd.GradientAccumulation(K), comm=comm)
hvd_easgd.broadcast_initial_state(model, acc_opt)
step = lsq_step_fn(model, acc_opt)
comm.reset_account()
micro = 12
for t in range(micro):
    x, y = ref.batch((X, Y), t, B)
    step(tf.constant(x, tf.float32), tf.constant(y, tf.float32))
account = comm.account()
w = w0.copy()
for window in range(micro // K):
    g = np.mean([ref.grad(w, *ref.batch(s, window * K + j, B)) for s in shards for j in range(K)], axis=0)
    w = w - LR * g
results["accumulate_relerr"] = rel_err(model.layers[0].kernel.numpy().ravel(), w)
results["accumulate_calls"] = account["calls"]
results["accumulate_bytes"] = account["bytes"]
results["accumulate_micro_batches"] = micro

# --- 8. uneven shards: 9 samples on rank 0, 3 on rank 1, b = 1, k = 4 -------------------
K = 4
n_local = [9, 3][RANK] if SIZE == 2 else 9
windows = hvd_easgd.data.accumulation_windows([9, 3][:SIZE], K)
model = linear_model(w0)
uneven_opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), hvd_easgd.GradientAccumulation(K), comm=comm)
hvd_easgd.broadcast_initial_state(model, uneven_opt)
step = lsq_step_fn(model, uneven_opt)
for j in range(windows * K):
    has_data = j < n_local
    x, y = (X[j:j + 1], Y[j:j + 1]) if has_data else (np.zeros((1, ref.DIM)), np.zeros(1))
    step(tf.constant(x, tf.float32), tf.constant(y, tf.float32), tf.constant(1.0 if has_data else 0.0))
w = w0.copy()
counts = [9, 3][:SIZE]
for window in range(windows):
    total, n = np.zeros(ref.DIM), 0
    for r in range(SIZE):
        for j in range(window * K, min((window + 1) * K, counts[r])):
            total += ref.grad(w, shards[r][0][j:j + 1], shards[r][1][j:j + 1])
            n += 1
    if n:
        w = w - LR * total / n
results["uneven_relerr"] = rel_err(model.layers[0].kernel.numpy().ravel(), w)
results["uneven_windows"] = windows
results["uneven_updates"] = int(uneven_opt.iterations.numpy())

# --- 8b. the sample_count contract: rank r's grads are a mean over its n_r samples -----------
# SyncAverage applies the per-sample mean over all ranks, Σ n_r g_r / Σ n_r: the gradient of
# one process on the concatenated samples.
counts = ([3, 1] + [2] * SIZE)[:SIZE]
model = linear_model(w0)
weighted_opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), hvd_easgd.SyncAverage(), comm=comm)
hvd_easgd.broadcast_initial_state(model, weighted_opt)
step = lsq_step_fn(model, weighted_opt)
comm.reset_account()
for t in range(3):
    rows = slice(4 * t, 4 * t + counts[RANK])
    step(tf.constant(X[rows], tf.float32), tf.constant(Y[rows], tf.float32), tf.constant(counts[RANK]))
account = comm.account()
w = w0.copy()
for t in range(3):
    x_all = np.concatenate([shards[r][0][4 * t:4 * t + counts[r]] for r in range(SIZE)])
    y_all = np.concatenate([shards[r][1][4 * t:4 * t + counts[r]] for r in range(SIZE)])
    w = w - LR * ref.grad(w, x_all, y_all)
results["weighted_relerr"] = rel_err(model.layers[0].kernel.numpy().ravel(), w)
results["weighted_bytes"] = account["bytes"]
results["weighted_calls"] = account["calls"]

# --- 9. a NaN gradient on one rank ------------------------------------------------------------
model = linear_model(w0)
nan_opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), hvd_easgd.SyncAverage(), comm=comm)
hvd_easgd.broadcast_initial_state(model, nan_opt)
step = lsq_step_fn(model, nan_opt)
for t in range(6):
    x, y = ref.batch((X, Y), t, BATCH)
    if t == 2 and RANK == SIZE - 1:
        y = y * np.nan
    step(tf.constant(x, tf.float32), tf.constant(y, tf.float32))
results["nan_sync"] = {"skipped": int(nan_opt.strategy.skipped_steps.numpy()),
                       "maxdiff": gathered_max_diff(model.trainable_variables),
                       "finite": bool(np.all(np.isfinite(model.layers[0].kernel.numpy())))}

model = linear_model(w0)
easgd_nan = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), hvd_easgd.EASGD(period=TAU),
                                           comm=comm)
hvd_easgd.broadcast_initial_state(model, easgd_nan)
step = lsq_step_fn(model, easgd_nan)
for t in range(2 * TAU):
    x, y = ref.batch((X, Y), t, BATCH)
    if t == 0 and RANK == SIZE - 1:
        y = y * np.nan  # a local step: this rank skips its own update
    if t == TAU - 1 and RANK == SIZE - 1:
        model.layers[0].kernel.assign(np.full((ref.DIM, 1), np.nan, np.float32))  # a bad elastic difference
    step(tf.constant(x, tf.float32), tf.constant(y, tf.float32))
strategy = easgd_nan.strategy
results["nan_easgd"] = {
    "local_skipped": int(strategy.skipped_steps.numpy()),
    "elastic_skipped": int(strategy.skipped_elastic_steps.numpy()),
    "center_finite": bool(np.all(np.isfinite(strategy.center[0].numpy()))),
    "center_maxdiff": gathered_max_diff(strategy.center),
    "steps": int(strategy.step_counter.numpy()),
}

# --- 10. variable-size images: accumulated without a retrace per shape ----------------------
keras.utils.set_random_seed(3)
fcn = hvd_easgd.models.build("fcn", (None, None, 3), 4)
fcn_opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.05), hvd_easgd.GradientAccumulation(3), comm=comm)
hvd_easgd.broadcast_initial_state(fcn, fcn_opt)
traces = []


@tf.function(reduce_retracing=True)
def image_step(x, y):
    traces.append(1)  # Python side effect: runs once per trace
    with tf.GradientTape() as tape:
        loss = loss_fn(y, fcn(x, training=True))
    fcn_opt.apply(tape.gradient(loss, fcn.trainable_variables), fcn.trainable_variables)


rng = np.random.default_rng(RANK)
shapes = [(20, 24), (31, 17), (28, 28), (12, 40), (33, 9), (16, 16), (25, 30), (19, 21), (40, 12)]
for h, w_ in shapes:
    image_step(rng.random((1, h, w_, 3), dtype=np.float32), np.array([rng.integers(4)]))
results["image_traces"] = len(traces)
results["image_updates"] = int(fcn_opt.iterations.numpy())
results["image_identical_maxdiff"] = gathered_max_diff(fcn.trainable_variables)

# --- 10b. started allreduces on the background worker (test_background.py): here, not a launch of their own ---
results["background"] = background_checks(comm)

# --- 11. the direct communicator: every rank issued the same collectives in the same order ---------
if hasattr(comm, "order_digest"):
    results["collective_order"] = list(comm.order_digest())  # read before the gather below adds to it
    results["collective_orders"] = comm.allgather_json(results["collective_order"])

os.makedirs(OUT, exist_ok=True)
with open(os.path.join(OUT, f"rank{RANK}.json"), "w") as f:
    json.dump(results, f, indent=1)
print(f"rank {RANK}: core checks done", flush=True)
