"""Callbacks: NaN abort and the center swap."""
import keras
import numpy as np
import pytest

import hvd_easgd
from hvd_easgd import EASGD, LocalCommunicator, SyncAverage
from hvd_easgd.callbacks import AbortOnNonFinite, NonFiniteTrainingError, SwapKeptWeights

pytestmark = pytest.mark.unit


def compiled(strategy, lr=0.1):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(lr), strategy, comm=LocalCommunicator()),
                  loss="mse")
    return model


def test_training_aborts_after_n_consecutive_non_finite_steps():
    model = compiled(SyncAverage())
    x = np.full((64, 3), np.nan, np.float32)
    y = np.zeros((64, 1), np.float32)
    with pytest.raises(NonFiniteTrainingError, match=r"10 consecutive optimizer steps had NaN/Inf.*--max-bad-steps=5"):
        model.fit(x, y, batch_size=2, epochs=1, verbose=0,
                  callbacks=hvd_easgd.callbacks.defaults() + [AbortOnNonFinite(max_consecutive=5, check_every=10)])
    assert np.all(np.isfinite(model.layers[0].kernel.numpy()))  # nothing non-finite was applied


def test_swap_kept_weights_evaluates_on_the_center_and_restores_local_weights():
    model = compiled(EASGD(period=1000, moving_rate=0.5))
    x = np.random.default_rng(0).standard_normal((32, 3)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=hvd_easgd.callbacks.defaults(merge_at_end=False))
    local = [v.numpy().copy() for v in model.trainable_variables]
    center = [c.numpy().copy() for c in model.optimizer.strategy.center]
    assert any(not np.array_equal(a, b) for a, b in zip(local, center))  # no elastic step yet: they differ
    seen = {}

    class Spy(keras.callbacks.Callback):
        def on_test_batch_begin(self, batch, logs=None):
            seen["weights"] = [v.numpy().copy() for v in self.model.trainable_variables]

    model.evaluate(x, y, verbose=0, callbacks=[SwapKeptWeights(), Spy()])
    for a, b in zip(seen["weights"], center):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(model.trainable_variables, local):
        np.testing.assert_array_equal(a.numpy(), b)


def _nan_data(n):
    return np.full((n, 3), np.nan, np.float32), np.zeros((n, 1), np.float32)


def test_short_epochs_of_non_finite_steps_abort_although_no_epoch_reaches_check_every():
    # 4 steps per epoch, checked every 10: Keras's batch index never reaches 10, the global count does.
    model = compiled(SyncAverage())
    x, y = _nan_data(8)
    with pytest.raises(NonFiniteTrainingError, match=r"\d+ consecutive optimizer steps had NaN/Inf.*--max-bad-steps=5"):
        model.fit(x, y, batch_size=2, epochs=6, verbose=0,
                  callbacks=hvd_easgd.callbacks.defaults() + [AbortOnNonFinite(max_consecutive=5, check_every=10)])
    # the epoch-end check stops it after epoch 2 (8 bad steps), before the 10th step's check
    assert int(model.optimizer.iterations.numpy()) == 0
    assert int(model.optimizer.strategy.skipped_steps.numpy()) == 8


def test_non_finite_steps_during_easgd_warmup_abort():
    # The warm-up runs through EASGD's own SyncAverage, reached through children().
    model = compiled(EASGD(period=2, warmup_steps=1000))
    x, y = _nan_data(64)
    with pytest.raises(NonFiniteTrainingError, match=r"10 consecutive optimizer steps had NaN/Inf.*--max-bad-steps=5"):
        model.fit(x, y, batch_size=2, epochs=1, verbose=0,
                  callbacks=hvd_easgd.callbacks.defaults() + [AbortOnNonFinite(max_consecutive=5, check_every=10)])
