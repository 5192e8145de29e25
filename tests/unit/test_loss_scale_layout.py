"""The safe loss-scale layout, made by one function on every documented path (issue 23, section 3).

Safe: ``DistributedOptimizer(LossScaleOptimizer(opt))``, so the overflow
decision is taken on the reduced gradients. ``move_loss_scaling_inside``
makes it from what Keras's ``compile`` builds under ``mixed_float16``;
``broadcast_initial_state`` and the ``BroadcastInitialState`` callback call it;
a DistributedOptimizer still wrapped when it is built refuses in one line.
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import LocalCommunicator, callbacks
from hvd_easgd.comm import SimulatedCluster
from hvd_easgd.training.initial_state import move_loss_scaling_inside

pytestmark = pytest.mark.unit
OUTSIDE = (r"`optimizer` must hold the LossScaleOptimizer inside the DistributedOptimizer.*"
           r"Received: optimizer=LossScaleOptimizer\(DistributedOptimizer\(SGD\)\)$")
TWICE = (r"`optimizer` must hold one LossScaleOptimizer.*scaled twice.*auto_scale_loss=False.*"
         r"Received: optimizer=LossScaleOptimizer\(DistributedOptimizer\(LossScaleOptimizer\(SGD\)\)\)$")


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def tiny_model():
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1, dtype="float32")])


def compiled(comm=None, inside=False, **compile_kwargs):
    """A mixed_float16 model compiled with a DistributedOptimizer of SGD; with
    ``inside`` the LossScaleOptimizer is put inside by hand."""
    inner = keras.optimizers.SGD(0.01)
    if inside:
        inner = keras.optimizers.LossScaleOptimizer(inner)
    distributed = hvd_easgd.DistributedOptimizer(inner, comm=comm or LocalCommunicator())
    model = tiny_model()
    model.compile(optimizer=distributed, loss="mse", **compile_kwargs)
    return model, distributed


def assert_safe(model, distributed):
    """The safe object graph: model -> DistributedOptimizer -> LossScaleOptimizer -> SGD, connected."""
    loss_scaler = distributed.inner_optimizer
    assert model.optimizer is distributed
    assert isinstance(loss_scaler, keras.optimizers.LossScaleOptimizer)
    assert type(loss_scaler.inner_optimizer) is keras.optimizers.SGD
    assert distributed.loss_scale_layout_problem() is None
    if distributed.built:  # the strategy reads the scale it must multiply its own terms by
        assert float(distributed.strategy.loss_scale()) == float(loss_scaler.dynamic_scale.numpy())


def fit_briefly(model, use_callbacks):
    model.fit(np.full((8, 3), 0.1, np.float32), np.zeros((8, 1), np.float32), batch_size=4, verbose=0,
              callbacks=callbacks.defaults() if use_callbacks else None)


# --- every documented path ends in the safe layout ----------------------------------------------------
@pytest.mark.parametrize("path", ["broadcast_initial_state", "broadcast_with_model_optimizer",
                                  "callbacks_defaults", "resumed_callback"])
def test_every_path_turns_the_layout_compile_builds_into_the_safe_one(mixed_float16, path):
    model, distributed = compiled()
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)  # what Keras builds
    assert model.optimizer.inner_optimizer is distributed
    assert distributed.wrapped_by_loss_scale
    if path == "broadcast_initial_state":  # the user's own flow, then fit without callbacks.defaults()
        hvd_easgd.broadcast_initial_state(model, distributed)
        assert distributed.built and distributed.initial_state_synced
        fit_briefly(model, use_callbacks=False)
    elif path == "broadcast_with_model_optimizer":  # model.optimizer as compile left it
        hvd_easgd.broadcast_initial_state(model, model.optimizer)
        fit_briefly(model, use_callbacks=False)
    elif path == "callbacks_defaults":
        fit_briefly(model, use_callbacks=True)
    else:  # a resume that restored per-rank state skips the broadcast, not the layout
        broadcast = callbacks.BroadcastInitialState()
        broadcast.skip = True
        model.fit(np.zeros((4, 3)), np.zeros((4, 1)), batch_size=4, verbose=0, callbacks=[broadcast])
    assert_safe(model, distributed)
    assert int(distributed.strategy.step_counter.numpy()) == (1 if path == "resumed_callback" else 2)


def test_the_move_keeps_the_objects_and_remakes_a_train_function_made_for_the_old_layout(mixed_float16):
    model, distributed = compiled()
    loss_scaler = model.optimizer
    old_function = model.make_train_function()
    assert move_loss_scaling_inside(model, [distributed]) is True
    assert_safe(model, distributed)
    assert distributed.inner_optimizer is loss_scaler  # the same objects: no state lost
    assert model.train_function is not None and model.train_function is not old_function
    assert move_loss_scaling_inside(model, [distributed]) is False  # already safe: nothing to do


def test_the_move_connects_the_strategy_to_the_scale_of_an_optimizer_built_before_compile(mixed_float16):
    model = tiny_model()
    sgd = keras.optimizers.SGD(0.01, momentum=0.9)
    distributed = hvd_easgd.DistributedOptimizer(sgd, comm=LocalCommunicator())
    hvd_easgd.broadcast_initial_state(model, distributed)  # built first, with no loss scaling in sight
    sgd.momentums[0].assign(np.full((3, 2), 7.0))
    model.compile(optimizer=distributed, loss="mse")  # then compile wraps it
    assert distributed.strategy.loss_scale is None
    move_loss_scaling_inside(model)
    assert_safe(model, distributed)
    assert float(distributed.strategy.loss_scale()) == 2.0**15
    assert sgd.momentums[0].numpy().tolist() == [[7.0, 7.0]] * 3  # the inner state is kept
    fit_briefly(model, use_callbacks=False)
    assert int(distributed.strategy.step_counter.numpy()) == 2


def test_the_explicit_inside_layout_is_left_as_it_is(mixed_float16):
    model, distributed = compiled(inside=True, auto_scale_loss=False)
    loss_scaler = distributed.inner_optimizer
    assert move_loss_scaling_inside(model, [distributed]) is False
    hvd_easgd.broadcast_initial_state(model, distributed)
    fit_briefly(model, use_callbacks=False)
    assert_safe(model, distributed)
    assert distributed.inner_optimizer is loss_scaler


def test_a_model_without_loss_scaling_is_not_touched():
    model, distributed = compiled()  # float32: compile adds no LossScaleOptimizer
    assert move_loss_scaling_inside(model, [distributed]) is False
    assert model.optimizer is distributed and type(distributed.inner_optimizer) is keras.optimizers.SGD
    assert distributed.loss_scale_layout_problem() is None


# --- layouts that cannot be made safe are refused in one line -----------------------------------------
def test_fit_without_broadcast_or_callbacks_is_refused_at_the_first_apply(mixed_float16):
    model, distributed = compiled()
    with pytest.raises(ValueError, match=OUTSIDE) as err:
        fit_briefly(model, use_callbacks=False)
    assert "\n" not in str(err.value) and "broadcast_initial_state" in str(err.value)
    assert not distributed.built  # refused before any collective


def test_broadcast_before_compile_then_fit_without_callbacks_is_refused_at_the_first_apply(mixed_float16):
    model = tiny_model()
    distributed = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.01), comm=LocalCommunicator())
    hvd_easgd.broadcast_initial_state(model, distributed)  # built here: the wrapper comes later
    model.compile(optimizer=distributed, loss="mse")
    with pytest.raises(ValueError, match=OUTSIDE):
        fit_briefly(model, use_callbacks=False)
    assert int(distributed.strategy.step_counter.numpy()) == 0


def test_a_custom_loop_with_the_loss_scale_optimizer_outside_is_refused():
    model = tiny_model()
    distributed = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.01), comm=LocalCommunicator())
    loss_scaler = keras.optimizers.LossScaleOptimizer(distributed)  # the user's own wrapper
    with pytest.raises(ValueError, match=OUTSIDE):
        hvd_easgd.broadcast_initial_state(model, distributed)
    with pytest.raises(ValueError, match=OUTSIDE):
        hvd_easgd.broadcast_initial_state(model, loss_scaler)
    with pytest.raises(ValueError, match=OUTSIDE):  # without the broadcast: its first apply builds it
        loss_scaler.apply([tf.zeros_like(v) for v in model.trainable_variables], model.trainable_variables)
    assert not distributed.built


def test_compile_adding_a_second_loss_scale_optimizer_is_refused(mixed_float16):
    model, distributed = compiled(inside=True)  # auto_scale_loss left on: compile wraps it again
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    with pytest.raises(ValueError, match=TWICE):
        hvd_easgd.broadcast_initial_state(model, distributed)
    with pytest.raises(ValueError, match=TWICE):
        fit_briefly(model, use_callbacks=True)
    model, distributed = compiled(inside=True)
    with pytest.raises(ValueError, match=TWICE):  # and at the first apply, without either
        fit_briefly(model, use_callbacks=False)


# --- at p = 2: one rank overflows, both skip -------------------------------------------------------------
def test_one_rank_overflow_after_broadcast_initial_state_skips_the_step_on_both_ranks(mixed_float16):
    size, batch = 2, 4
    cluster = SimulatedCluster(size)
    models, optimizers = [], []
    for comm in cluster.communicators:  # built here: Keras's dtype policy is per thread
        keras.utils.set_random_seed(comm.rank)  # different starts: the broadcast makes them agree
        model, distributed = compiled(comm=comm, run_eagerly=True)
        models.append(model)
        optimizers.append(distributed)
    x = np.full((3 * batch, 3), 0.1, np.float32)
    y = np.ones((3 * batch, 1), np.float32)

    class WeightsAfterEachStep(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.weights = []

        def on_train_batch_end(self, batch_index, logs=None):
            self.weights.append([w.numpy().copy() for w in self.model.trainable_weights])

    def user_flow(rank):
        xs = x.copy()
        if rank == 1:
            xs[batch:2 * batch] = 1e4  # step 1 overflows float16 on rank 1 only (scaled by 2**15)
        hvd_easgd.broadcast_initial_state(models[rank], optimizers[rank])
        recorder = WeightsAfterEachStep()
        models[rank].fit(xs, y, batch_size=batch, shuffle=False, verbose=0, callbacks=[recorder])
        return recorder.weights

    weights = cluster.run(user_flow)
    for model, distributed, steps in zip(models, optimizers, weights):
        assert_safe(model, distributed)
        assert float(distributed.inner_optimizer.dynamic_scale.numpy()) == 2.0**15 / 2  # halved on both
        assert int(distributed.strategy.skipped_steps.numpy()) == 1
        assert int(distributed.iterations.numpy()) == 2 and int(distributed.strategy.step_counter.numpy()) == 3
        for before, after in zip(steps[0], steps[1]):
            np.testing.assert_array_equal(after, before)  # the overflow step applied nothing
    for mine, theirs in zip(weights[0], weights[1]):  # every step, bit-identical across ranks
        for a, b in zip(mine, theirs):
            np.testing.assert_array_equal(a, b)
