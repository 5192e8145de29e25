"""The Keras 3 optimizer wrapper: every way in, delegation, saving."""
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import EASGD, LocalCommunicator, SyncAverage
from hvd_easgd.comm import SimulatedCluster

pytestmark = pytest.mark.unit


def wrapped(inner=None, strategy=None):
    return hvd_easgd.DistributedOptimizer(inner or keras.optimizers.SGD(0.5), strategy or SyncAverage(),
                                          comm=LocalCommunicator())


def test_apply_apply_gradients_and_minimize_all_go_through_the_strategy():
    # Two simulated ranks: one rank sends nothing, so its account could not tell.
    cluster = SimulatedCluster(2)

    def rank_main(rank):
        w = tf.Variable([1.0, 2.0])
        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.5), SyncAverage(),
                                             comm=cluster.communicators[rank])
        opt.apply([tf.constant([1.0, 1.0])], [w])
        opt.apply_gradients([(tf.constant([1.0, 1.0]), w)])
        opt.minimize(lambda: tf.reduce_sum(w), [w])
        return w.numpy().tolist(), opt.comm.account()["calls"], int(opt.iterations.numpy())

    for result in cluster.run(rank_main):
        assert result == ([-0.5, 0.5], 3, 3)


def test_learning_rate_and_iterations_are_the_inner_optimizers():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    inner = keras.optimizers.SGD(schedule)
    opt = wrapped(inner)
    w = tf.Variable([0.0])
    opt.apply([tf.constant([1.0])], [w])  # lr 0.1 at step 0
    opt.apply([tf.constant([1.0])], [w])  # lr 0.05 at step 1
    assert w.numpy()[0] == pytest.approx(-0.15)
    assert opt.iterations is inner.iterations
    plain_inner = keras.optimizers.SGD(0.5)
    settable = wrapped(plain_inner)
    settable.learning_rate = 0.25
    assert float(plain_inner.learning_rate.numpy()) == 0.25


def test_get_config_round_trips_inner_optimizer_and_strategy():
    opt = wrapped(keras.optimizers.Adam(0.003), EASGD(period=7, beta=0.5))
    again = hvd_easgd.DistributedOptimizer.from_config(opt.get_config())
    assert isinstance(again.inner_optimizer, keras.optimizers.Adam)
    assert again.inner_optimizer.get_config()["learning_rate"] == pytest.approx(0.003)
    assert again.strategy.get_config() == opt.strategy.get_config()


@pytest.mark.slow  # fit, model.save, and a fresh interpreter that loads the file with plain Keras
def test_fit_trains_and_model_save_loads_with_plain_keras(tmp_path):
    digits = hvd_easgd.data.digits()
    keras.utils.set_random_seed(0)
    model = hvd_easgd.models.build("cnn", digits.input_shape, 10)
    model.compile(optimizer=wrapped(keras.optimizers.SGD(0.05, momentum=0.9)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(digits.x_train, digits.y_train, batch_size=32, epochs=3, verbose=0,
              callbacks=hvd_easgd.callbacks.defaults())
    _, accuracy = model.evaluate(digits.x_test, digits.y_test, verbose=0)
    assert accuracy >= 0.9
    path = str(tmp_path / "plain.keras")
    model.save(path)
    # A fresh interpreter that never imports hvd_easgd loads and evaluates it.
    code = ("import sys, numpy as np, keras; m = keras.models.load_model(sys.argv[1]); "
            "d = np.load(sys.argv[2]); print(m.evaluate(d['x'], d['y'], verbose=0)[1]); "
            "print(type(m.optimizer).__name__, 'hvd_easgd' in sys.modules)")
    np.savez(tmp_path / "test.npz", x=digits.x_test, y=digits.y_test)
    out = subprocess.run([sys.executable, "-c", code, path, str(tmp_path / "test.npz")], capture_output=True,
                         text=True, timeout=120, cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=""))
    assert out.returncode == 0, out.stderr[-2000:]
    loaded_accuracy, description = out.stdout.strip().splitlines()[-2:]
    assert float(loaded_accuracy) == pytest.approx(accuracy, abs=1e-6)
    assert description == "SGD False"


def test_xla_is_turned_off_with_a_warning():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=wrapped(), loss="mse")
    model._jit_compile = True  # what jit_compile="auto" resolves to on a GPU machine
    with pytest.warns(UserWarning, match="XLA"):
        model.optimizer.attach(model)
    assert model.jit_compile is False


def test_strategies_round_trip_through_keras_serialisation():
    import json

    from hvd_easgd import GradientAccumulation

    opt = wrapped(keras.optimizers.SGD(0.25, momentum=0.5),
                  GradientAccumulation(3, average=False, strategy=EASGD(4, moving_rate=0.2, overlap=True)))
    # through get_config/from_config, with a JSON text in between as in a .keras file
    again = hvd_easgd.DistributedOptimizer.from_config(json.loads(json.dumps(opt.get_config())))
    # and through Keras's own entry points, which find the class by its registered name alone
    keras_again = keras.saving.deserialize_keras_object(
        json.loads(json.dumps(keras.saving.serialize_keras_object(opt))))
    for copy in (again, keras_again):
        assert type(copy) is hvd_easgd.DistributedOptimizer
        assert isinstance(copy.strategy, GradientAccumulation) and isinstance(copy.strategy.strategy, EASGD)
        assert copy.strategy.get_config() == opt.strategy.get_config()
        assert copy.strategy.strategy.get_config() == {
            "period": 4, "moving_rate": 0.2, "beta": 0.9, "rho": 0.0, "warmup_steps": 0,
            "overlap": True}
        assert copy.inner_optimizer.get_config()["momentum"] == 0.5
    assert opt.get_config()["strategy"]["registered_name"] == "hvd_easgd>GradientAccumulation"
