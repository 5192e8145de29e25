"""Coming from TF1's ElasticAverageOptimizer: its values are understood or refused
clearly, and its own unit tests' expected numbers come out here."""
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import EASGD, LocalCommunicator

pytestmark = pytest.mark.unit


def test_tf1s_none_rho_gets_a_value_error_that_says_what_it_meant():
    with pytest.raises(ValueError, match=r"`rho` must be a number >= 0.*rho = moving_rate / learning_rate.*"
                                         r"Received: rho=None"):
        EASGD(rho=None)


def test_a_string_moving_rate_gets_a_value_error():
    with pytest.raises(ValueError, match=r"`moving_rate` \(alpha\) must be a number > 0 or None.*"
                                         r"Received: moving_rate='0.5'"):
        EASGD(moving_rate="0.5")


def test_numpy_integers_are_integers():
    strategy = EASGD(communication_period=np.int64(3), warmup_steps=np.int32(2), moving_rate=np.float32(0.25))
    assert strategy.communication_period == 3 and type(strategy.communication_period) is int
    assert strategy.warmup_steps == 2 and type(strategy.warmup_steps) is int
    assert strategy.get_config()["moving_rate"] == 0.25
    assert hvd_easgd.GradientAccumulation(np.int64(4)).k == 4


def test_tf1_one_worker_two_period():
    """TF1's test1Workers2Period: p = 1, tau = 2, alpha = 1, SGD(1), every gradient -1.

    By hand, inner update then elastic step (d = alpha (x - center)):
      step 1: x = (0, 1) + 1 = (1, 2)                     t = 1, no elastic step
      step 2: x = (2, 3); d = (2, 3) - (0, 1) = (2, 2); x = (0, 1); center = (2, 3)
      step 3: x = (1, 2)
      step 4: x = (2, 3); d = (2, 3) - (2, 3) = 0;       x = center = (2, 3)
    At p = 1, alpha = 1 = 2/(p+1): the elastic step swaps x and the center (it oscillates, it does not grow).
    """
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.set_weights([np.array([[0.0]], np.float32), np.array([1.0], np.float32)])
    with pytest.warns(UserWarning, match=r"oscillates"):
        strategy = EASGD(communication_period=2, moving_rate=1.0)
        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(1.0), strategy, comm=LocalCommunicator())
        hvd_easgd.broadcast_initial_state(model, opt)

    def step():
        opt.apply([tf.constant([[-1.0]]), tf.constant([-1.0])], model.trainable_variables)

    def weights(variables):
        return [float(np.asarray(v).ravel()[0]) for v in variables]

    step()
    assert weights(model.get_weights()) == [1.0, 2.0]
    step()
    assert weights(model.get_weights()) == [0.0, 1.0]
    assert weights(strategy.center) == [2.0, 3.0]
    step()
    assert weights(model.get_weights()) == [1.0, 2.0]
    step()
    assert weights(strategy.center) == [2.0, 3.0]


def test_the_kept_model_is_the_center_after_tf1s_four_steps(tmp_path):
    # As TF1's swapping_saver: the saved model holds the center, the local weights are left as they were.
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.set_weights([np.array([[0.0]], np.float32), np.array([1.0], np.float32)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        strategy = EASGD(communication_period=2, moving_rate=1.0)
        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(1.0), strategy, comm=LocalCommunicator())
        hvd_easgd.broadcast_initial_state(model, opt)

    def saved_after(steps):
        for _ in range(steps):
            opt.apply([tf.constant([[-1.0]]), tf.constant([-1.0])], model.trainable_variables)
        path = str(tmp_path / f"after{int(opt.iterations.numpy())}.keras")
        hvd_easgd.save_kept_model(model, path, opt)  # the model was never compiled: name the optimizer
        return [float(w.ravel()[0]) for w in keras.models.load_model(path).get_weights()]

    # after step 2 the center (2, 3) and the local weights (0, 1) differ: the file holds the center
    assert saved_after(2) == [2.0, 3.0]
    assert [float(w.ravel()[0]) for w in model.get_weights()] == [0.0, 1.0]
    assert saved_after(2) == [2.0, 3.0]  # TF1's step 4


def test_tf1_two_workers_alpha_one_half_is_stable_and_warns_that_the_center_jumps_to_the_mean():
    # TF1's two-worker test used alpha = 0.5: 0.5 < 2/(p+1) = 2/3 converges; p * alpha = 1 lands x̃ on mean(x_i).
    from hvd_easgd.comm import SimulatedCluster

    cluster = SimulatedCluster(2)
    models, opts = [], []
    for comm in cluster.communicators:
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(2, use_bias=False)])
        model.layers[0].kernel.assign([[0.0, 1.0]])
        with pytest.warns(UserWarning, match=r"p \* alpha = 1 >= 1 at p=2: each elastic step moves the center onto"):
            strategy = EASGD(communication_period=2, moving_rate=0.5).bind(comm)
        models.append(model)
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(1.0), strategy, comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    grads = [[-1.0, -1.0], [-3.0, 2.0]]  # different gradients: the workers drift apart

    def step(r, grad):
        opts[r].apply([tf.constant([grad])], models[r].trainable_variables)

    for _ in range(2):  # tau = 2: the second step is elastic
        cluster.run(lambda r: step(r, grads[r]))
    # before the elastic step: x_0 = (0, 1) + 2 (1, 1) = (2, 3); x_1 = (0, 1) + 2 (3, -2) = (6, -3); x̃ = (0, 1)
    # x̃' = x̃ + 0.5 ((2, 3) - (0, 1)) + 0.5 ((6, -3) - (0, 1)) = (4, 0) = mean(x_i)
    # x_i' = x_i - 0.5 (x_i - x̃): (1, 2) and (3, -1); the gap e = mean(x) - x̃ goes (4, -1) -> (-2, 0.5) = -0.5 e
    for opt in opts:
        assert opt.strategy.center[0].numpy().ravel().tolist() == [4.0, 0.0]
    assert [m.layers[0].kernel.numpy().ravel().tolist() for m in models] == [[1.0, 2.0], [3.0, -1.0]]
