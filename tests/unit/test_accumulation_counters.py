"""GradientAccumulation's two counters, as optax's MultiSteps has them: ``micro_steps``
counts micro-batches, ``step_counter`` optimizer steps (windows), and ``has_updated()``
says whether the last call closed a window."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import EASGD, GradientAccumulation, LocalCommunicator, checkpoint

pytestmark = pytest.mark.unit


def scalar_setup(strategy):
    w = tf.Variable([0.0])
    opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(1.0), strategy, comm=LocalCommunicator())
    opt.build([w])
    return w, opt


def test_step_counter_counts_optimizer_steps_not_micro_batches():
    # k = 3, gradients 1..7: windows close after micro-batches 3 and 6 (means 2 and 5)
    strategy = GradientAccumulation(3)
    w, opt = scalar_setup(strategy)
    counts, updated = [], []
    for g in range(1, 8):
        opt.apply([tf.constant([float(g)])], [w])
        counts.append((int(strategy.micro_steps.numpy()), int(strategy.step_counter.numpy())))
        updated.append(bool(strategy.has_updated().numpy()))
    assert counts == [(1, 0), (2, 0), (3, 1), (4, 1), (5, 1), (6, 2), (7, 2)]
    assert updated == [False, False, True, False, False, True, False]
    assert w.numpy().tolist() == [-(2.0 + 5.0)]
    # one optimizer step of the accumulation is one of the strategy it wraps, and of the inner optimizer
    assert int(strategy.strategy.step_counter.numpy()) == int(opt.iterations.numpy()) == 2


def test_has_updated_inside_a_traced_step():
    strategy = GradientAccumulation(2)
    w, opt = scalar_setup(strategy)

    @tf.function
    def step(g):
        opt.apply([g], [w])
        return strategy.has_updated()

    assert [bool(step(tf.constant([1.0])).numpy()) for _ in range(4)] == [False, True, False, True]
    assert int(strategy.step_counter.numpy()) == 2 and int(strategy.micro_steps.numpy()) == 4


def test_k_of_one_counts_each_micro_batch_as_an_optimizer_step():
    strategy = GradientAccumulation(1)
    w, opt = scalar_setup(strategy)
    assert not bool(strategy.has_updated().numpy())  # no call yet
    for g in (1.0, 2.0):
        opt.apply([tf.constant([g])], [w])
        assert bool(strategy.has_updated().numpy())
    assert int(strategy.step_counter.numpy()) == int(strategy.micro_steps.numpy()) == 2


def test_a_checkpoint_written_when_step_counter_counted_micro_batches_restores_it_as_optimizer_steps(tmp_path):
    # Before the fix step_counter advanced with micro_steps: a checkpoint then held them equal.
    def trained(steps):
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                             GradientAccumulation(2, strategy=EASGD(period=2, moving_rate=0.3)),
                                             comm=LocalCommunicator())
        hvd_easgd.broadcast_initial_state(model, opt)
        x = np.ones((4, 2), np.float32)
        for _ in range(steps):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(x) ** 2)
            opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return model, opt

    model, opt = trained(5)
    strategy = opt.strategy
    assert (int(strategy.micro_steps.numpy()), int(strategy.step_counter.numpy())) == (5, 2)
    strategy.step_counter.assign(5)  # what the old code had saved
    checkpoint.save(str(tmp_path), 1, model, opt, opt.comm, {})
    fresh, fresh_opt = trained(0)
    manifest, directory = checkpoint.latest(str(tmp_path))
    checkpoint.restore(directory, manifest, fresh, fresh_opt, fresh_opt.comm)
    restored = fresh_opt.strategy
    assert (int(restored.micro_steps.numpy()), int(restored.step_counter.numpy())) == (5, 2)
    assert int(restored.strategy.step_counter.numpy()) == 2  # EASGD's tau phase, untouched
    # A checkpoint written after the fix restores as it was.
    checkpoint.save(str(tmp_path), 2, fresh, fresh_opt, fresh_opt.comm, {})
    again, again_opt = trained(0)
    manifest, directory = checkpoint.latest(str(tmp_path))
    checkpoint.restore(directory, manifest, again, again_opt, again_opt.comm)
    assert int(again_opt.strategy.step_counter.numpy()) == 2
