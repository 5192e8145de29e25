"""Runs under `horovodrun -np 2`: the user's own flow under mixed precision, with
an fp16 overflow on one rank (issue 23, section 3).

Usage: loss_scale_layout.py OUT COLLECTIVES.

``mixed_float16``, ``compile`` with a DistributedOptimizer (Keras wraps it in a
LossScaleOptimizer), ``hvd_easgd.broadcast_initial_state(model, opt)``, then
``model.fit`` *without* ``callbacks.defaults()``. At step OVERFLOW_STEP rank 1's
inputs are large enough that its scaled gradients overflow float16. Left as
Keras builds it (before the fix), rank 1 skipped the update, and its
allreduce, while rank 0 waited in that allreduce: the job stalled. Each rank
writes OUT/rank<r>.json with its weights, loss scale and counters; no
collective runs after fit, so a rank that fell out of step cannot hide behind
a mismatched one.
"""
import sys

from hvd_easgd import _compat

_compat.import_keras_for_ranks()  # as train.py's ranks: no galleries, no sklearn wrappers

import keras  # noqa: E402
import numpy as np  # noqa: E402

import hvd_easgd  # noqa: E402
import hvd_easgd.startup.runtime  # noqa: E402
from tests.multiproc.scripts.rank_checks import write_rank_results  # noqa: E402

OUT, COLLECTIVES = sys.argv[1], sys.argv[2]
STEPS, BATCH, OVERFLOW_STEP = 6, 4, 2

comm = hvd_easgd.init(threads_per_rank=1, collectives=COLLECTIVES)
RANK = comm.rank

rng = np.random.default_rng(RANK)
# Small values: at the initial scale (2**15) the scaled gradients stay finite in float16...
x = 0.1 * rng.standard_normal((STEPS * BATCH, 3)).astype(np.float32)
y = x.sum(axis=1, keepdims=True)
if RANK == 1:
    # ...but not on rank 1 at one step: |x| ~ 1e3 is finite in float16, while the
    # squared error's gradient times the scale is far above its largest value, 65504.
    x[OVERFLOW_STEP * BATCH:(OVERFLOW_STEP + 1) * BATCH] *= 1e4

keras.mixed_precision.set_global_policy("mixed_float16")
keras.utils.set_random_seed(RANK)  # different initial weights: the broadcast makes them agree
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1, dtype="float32")])
opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.01))
model.compile(optimizer=opt, loss="mse")
hvd_easgd.broadcast_initial_state(model, opt)
model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)

loss_scaler = next(o for o in [model.optimizer, model.optimizer.inner_optimizer]
                   if isinstance(o, keras.optimizers.LossScaleOptimizer))
write_rank_results(OUT, RANK, {
    "collectives": hvd_easgd.startup.runtime.collectives_in_use()[0],
    "layout": [type(o).__name__ for o in [model.optimizer, model.optimizer.inner_optimizer,
                                            model.optimizer.inner_optimizer.inner_optimizer]],
    "weights": [w.numpy().astype(np.float64).ravel().tolist() for w in model.trainable_weights],
    "loss_scale": float(loss_scaler.dynamic_scale.numpy()),
    "iterations": int(model.optimizer.iterations.numpy()),
    "strategy_steps": int(opt.strategy.step_counter.numpy()),
    "skipped_steps": int(opt.strategy.skipped_steps.numpy()),
})
