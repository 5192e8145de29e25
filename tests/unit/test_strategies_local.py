"""Strategy logic on one process (LocalCommunicator): hand-derived numbers,
validation, and the NumPy references at p = 1. One rank sends nothing, so
what a strategy sends is counted on two simulated ranks (SimulatedCluster)."""
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import EASGD, GradientAccumulation, LocalCommunicator, SyncAverage
from hvd_easgd.comm import SimulatedCluster
from hvd_easgd.strategies import registry
from tests import reference as ref

pytestmark = pytest.mark.unit


def scalar_setup(strategy, lr=1.0):
    """One variable w = 0 and SGD(lr): the applied update is visible as −lr·g."""
    w = tf.Variable([0.0])
    opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(lr), strategy, comm=LocalCommunicator())
    opt.build([w])
    return w, opt


def on_two_ranks(make_strategy, rank_main, lr=1.0):
    """``rank_main(w, opt)`` on two simulated ranks, each with its own
    ``w = [0.0]`` and SGD(lr); returns each rank's communicator account."""
    cluster = SimulatedCluster(2)
    ws = [tf.Variable([0.0]) for _ in range(2)]
    opts = [hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(lr), make_strategy(), comm=c)
            for c in cluster.communicators]

    def built_then(rank):
        opts[rank].build([ws[rank]])  # checks, with a collective, that the ranks agree
        rank_main(ws[rank], opts[rank])

    cluster.run(built_then)
    return [opt.comm.account() for opt in opts]


def test_accumulation_of_gradients_1_to_4_applies_their_mean():
    # optax's hand-derived case: k = 4, gradients 1..4 → mean 2.5
    w, opt = scalar_setup(GradientAccumulation(4))
    for g in [1.0, 2.0, 3.0, 4.0]:
        opt.apply([tf.constant([g])], [w])
    assert w.numpy().tolist() == [-2.5]
    assert int(opt.iterations.numpy()) == 1


def test_accumulation_sum_and_no_update_before_the_window_closes():
    w, opt = scalar_setup(GradientAccumulation(4, average=False))
    for g in [1.0, 2.0, 3.0]:
        opt.apply([tf.constant([g])], [w])
    assert w.numpy().tolist() == [0.0]
    opt.apply([tf.constant([4.0])], [w])
    assert w.numpy().tolist() == [-10.0]


def test_accumulation_weights_micro_batches_by_sample_count():
    # micro-batch means 1 (of 3 samples) and 5 (of 1 sample): per-sample mean (3 + 5) / 4 = 2
    w, opt = scalar_setup(GradientAccumulation(2))
    opt.apply([tf.constant([1.0])], [w], sample_count=3)
    opt.apply([tf.constant([5.0])], [w], sample_count=1)
    assert w.numpy().tolist() == [-2.0]


def test_a_window_with_no_samples_anywhere_is_skipped():
    w, opt = scalar_setup(GradientAccumulation(2))
    for _ in range(2):
        opt.apply([tf.constant([0.0])], [w], sample_count=0)
    assert w.numpy().tolist() == [0.0]
    assert int(opt.iterations.numpy()) == 0
    assert int(opt.strategy.strategy.skipped_steps.numpy()) == 0  # empty is not "non-finite"


def test_k_micro_batches_equal_one_batch_of_k_times_b():
    keras.utils.set_random_seed(0)
    digits = hvd_easgd.data.digits()
    x, y = digits.x_train[:48].reshape(48, -1), digits.y_train[:48]
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(10)])
    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    acc = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.3), GradientAccumulation(4), comm=LocalCommunicator())
    plain = keras.optimizers.SGD(0.3)
    for update in range(3):
        for j in range(4):
            lo = update * 16 + j * 4
            with tf.GradientTape() as tape:
                loss = loss_fn(y[lo:lo + 4], model(x[lo:lo + 4]))
            acc.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        lo = update * 16
        with tf.GradientTape() as tape:
            loss = loss_fn(y[lo:lo + 16], twin(x[lo:lo + 16]))
        plain.apply(tape.gradient(loss, twin.trainable_variables), twin.trainable_variables)
    for a, b in zip(model.get_weights(), twin.get_weights()):
        assert np.linalg.norm(a - b) / np.linalg.norm(b) <= 1e-6


def test_accumulation_counts_calls_once_per_window():
    def nine_micro_steps(w, opt):
        for _ in range(9):
            opt.apply([tf.constant([1.0])], [w])

    # three windows; each call carries the gradient (4 bytes) and the sample count (4 bytes)
    for account in on_two_ranks(lambda: GradientAccumulation(3), nine_micro_steps):
        assert account == {"bytes": 3 * 8, "calls": 3}


def test_easgd_tau_counts_accumulation_windows():
    strategies = []

    def make():
        strategies.append(GradientAccumulation(2, strategy=EASGD(period=3, moving_rate=0.25)))
        return strategies[-1]

    def twelve_micro_steps(w, opt):
        opt.comm.reset_account()
        for _ in range(12):  # 6 windows → elastic steps after windows 3 and 6
            opt.apply([tf.constant([1.0])], [w])

    for strategy, account in zip(strategies, on_two_ranks(make, twelve_micro_steps)):
        assert int(strategy.strategy.step_counter.numpy()) == 6
        assert account["calls"] == 2


@pytest.mark.parametrize("k", [0, -1, 2.5, "3", True])
def test_accumulation_rejects_bad_k(k):
    with pytest.raises(ValueError, match=r"`k` must be an integer >= 1\. Received: k="):
        GradientAccumulation(k)


def test_inner_optimizer_accumulating_itself_is_rejected():
    with pytest.raises(ValueError, match="accumulate twice"):
        hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1, gradient_accumulation_steps=2))


# --- SyncAverage -----------------------------------------------------------------------
def test_sync_none_and_indexed_slices_gradients_line_up():
    cluster = SimulatedCluster(2)
    layers = []
    for _ in range(2):
        keras.utils.set_random_seed(0)  # the same layers on both ranks (built here: the RNG is global)
        emb, dense = keras.layers.Embedding(10, 3), keras.layers.Dense(2)
        emb.build((None,))
        dense.build((None, 3))
        layers.append((emb, dense, tf.Variable(tf.ones([2]))))

    def rank_main(rank):
        emb, dense, unused = layers[rank]
        variables = [emb.embeddings, dense.kernel, dense.bias, unused]
        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.5), SyncAverage(),
                                             comm=cluster.communicators[rank])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(dense(emb(tf.constant([1, 4]))))
        grads = tape.gradient(loss, variables)
        assert isinstance(grads[0], tf.IndexedSlices) and grads[3] is None
        before = emb.embeddings.numpy().copy()
        opt.apply(grads, variables)
        return emb, before, unused

    emb, before, unused = cluster.run(rank_main)[1]
    # all four tensors travel in one call: the embedding densified, zeros for the unused variable
    for comm in cluster.communicators:
        assert comm.account() == {"bytes": 4 * (30 + 6 + 2 + 2), "calls": 1}
    changed = np.any(emb.embeddings.numpy() != before, axis=1)
    assert changed.tolist() == [i in (1, 4) for i in range(10)]
    assert unused.numpy().tolist() == [1.0, 1.0]


def test_sync_clip_norm_after_reduction():
    w, opt = scalar_setup(SyncAverage(clip_norm=1.0))
    opt.apply([tf.constant([10.0])], [w])
    assert w.numpy().tolist() == [-1.0]


def test_sync_skips_and_counts_non_finite_updates():
    w, opt = scalar_setup(SyncAverage())
    opt.apply([tf.constant([np.nan])], [w])
    opt.apply([tf.constant([np.inf])], [w])
    assert w.numpy().tolist() == [0.0]
    assert int(opt.strategy.skipped_steps.numpy()) == 2
    assert int(opt.strategy.consecutive_skips.numpy()) == 2
    opt.apply([tf.constant([1.0])], [w])
    assert w.numpy().tolist() == [-1.0]
    assert int(opt.strategy.consecutive_skips.numpy()) == 0


def test_sync_validation():
    with pytest.raises(ValueError, match="Received: reduce_op='max'"):
        SyncAverage(reduce_op="max")
    with pytest.raises(ValueError, match="Received: clip_norm=0"):
        SyncAverage(clip_norm=0)


# --- EASGD ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, message", [
    ({"communication_period": 0},
     r"`communication_period` \(tau\) must be an integer >= 1\. Received: communication_period=0"),
    ({"communication_period": 2.5}, r"Received: communication_period=2\.5"),
    ({"period": 0}, r"^`period` must be an integer >= 1\. Received: period=0$"),
    ({"period": True}, r"^`period` must be an integer >= 1\. Received: period=True$"),
    ({"moving_rate": 0.0}, r"`moving_rate` \(alpha\) must be a number > 0 or None \(then beta/p\)\. "
                           r"Received: moving_rate=0\.0"),
    ({"moving_rate": -0.1}, r"Received: moving_rate=-0\.1"),
    ({"beta": 0.0}, r"`beta` \(p \* alpha\) must be a number > 0\. Received: beta=0\.0"),
    ({"rho": -1.0}, r"`rho` must be a number >= 0\. Received: rho=-1\.0"),
    ({"warmup_steps": -2}, r"`warmup_steps` must be an integer >= 0\. Received: warmup_steps=-2"),
])
def test_easgd_rejects_bad_hyperparameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EASGD(**kwargs)


def test_easgd_refuses_a_moving_rate_whose_elastic_step_diverges():
    # at p = 1 the bound is 2/(p+1) = 1: beyond it |1 - 2 alpha| > 1
    with pytest.raises(ValueError, match=r"`moving_rate` \(alpha\) must satisfy 0 < alpha <= 2/\(p\+1\) = 1 "
                                         r"with p=1 ranks, else the elastic step diverges.*Received: moving_rate=1\.5"):
        EASGD(moving_rate=1.5).bind(LocalCommunicator())
    with pytest.raises(ValueError, match=r"`beta` \(p \* alpha\) must satisfy 0 < beta <= 2p/\(p\+1\) = 1 "
                                         r"with p=1 ranks.*Received: beta=1\.2"):
        EASGD(beta=1.2).bind(LocalCommunicator())


def test_easgd_warns_at_tau_one():
    with pytest.warns(UserWarning, match="communication_period=1"):
        EASGD(communication_period=1)
    with pytest.warns(UserWarning, match="period=1"):
        EASGD(period=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        EASGD(period=2)


def test_easgd_default_moving_rate_is_beta_over_p():
    strategy = EASGD(beta=0.8).bind(LocalCommunicator())
    assert strategy.moving_rate == pytest.approx(0.8)


@pytest.mark.parametrize("kwargs", [{}, {"overlap": True}, {"warmup_steps": 4}, {"rho": 0.05}])
def test_easgd_single_rank_matches_reference(kwargs):
    shards, w0 = ref.least_squares_shards(1)
    model = keras.Sequential([keras.Input((ref.DIM,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].kernel.assign(w0.reshape(-1, 1).astype(np.float32))
    strategy = EASGD(period=3, moving_rate=0.4, **kwargs)
    opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), strategy, comm=LocalCommunicator())
    hvd_easgd.broadcast_initial_state(model, opt)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_mean(tf.square(tf.squeeze(model(x), -1) - y))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    for t in range(20):
        x, y = ref.batch(shards[0], t, 4)
        step(tf.constant(x, tf.float32), tf.constant(y, tf.float32))
    xs, center = ref.easgd_reference(shards, w0, 0.1, 3, 0.4, 20, 4, **kwargs)
    local = model.layers[0].kernel.numpy().ravel()
    assert np.linalg.norm(local - xs[0]) / np.linalg.norm(xs[0]) <= 1e-5
    got_center = strategy.center[0].numpy().ravel()
    assert np.linalg.norm(got_center - center) / np.linalg.norm(center) <= 1e-5


def test_easgd_elastic_allreduce_carries_only_the_differences_and_the_flag():
    # BatchNorm statistics follow one rule for every strategy (hvd_easgd.statistics), outside the step.
    cluster = SimulatedCluster(2)
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)

    def rank_main(rank):
        keras.utils.set_random_seed(rank)  # rank 0's weights reach rank 1 by the broadcast
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.BatchNormalization()])
        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), EASGD(period=2),
                                             comm=cluster.communicators[rank])
        hvd_easgd.broadcast_initial_state(model, opt)
        opt.comm.reset_account()
        for _ in range(2):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(x, training=True) ** 2)
            opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return model

    model = cluster.run(rank_main)[0]
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    moving = sum(int(np.prod(v.shape)) for v in model.non_trainable_variables)
    assert moving == 6  # BatchNorm's moving mean and variance
    for comm in cluster.communicators:
        assert comm.account() == {"bytes": 4 * (trainable + 1), "calls": 1}


def test_registry_lists_strategies_once_and_creates_them():
    assert set(registry.available()) == {"sync", "easgd", "periodic", "diloco", "hierarchical"}
    assert isinstance(registry.create("easgd", period=4), EASGD)
    with pytest.raises(ValueError, match=r"^`name` must be a registered strategy, one of \[.*\] \(unknown strategy "
                                         r"'ps'\)\. Received: name='ps'$"):
        registry.get("ps")


def test_strategy_configs_round_trip_through_keras_serialisation():
    for strategy in [SyncAverage(clip_norm=2.0, compression="fp16"), EASGD(period=4, rho=0.1),
                     GradientAccumulation(3, average=False, strategy=EASGD(overlap=True))]:
        again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(strategy))
        assert type(again) is type(strategy) and again.get_config() == strategy.get_config()
        assert repr(again) == repr(strategy)


# --- the sample_count contract: grads are means over the call's samples ------------------------
def _sync():
    return SyncAverage()


def _easgd():
    return EASGD(period=10)


def _accumulate_sync():
    return GradientAccumulation(1)


def _accumulate_easgd():
    return GradientAccumulation(1, strategy=EASGD(period=10))


EVERY_STRATEGY = [_sync, _easgd, _accumulate_sync, _accumulate_easgd]


@pytest.mark.parametrize("make", EVERY_STRATEGY, ids=lambda f: f.__name__.strip("_"))
def test_sample_count_means_the_grads_are_a_mean_over_that_many_samples(make):
    # The mean gradient of 4 samples is 2: SGD(1) from w = 0 steps to w = -2, whatever the strategy.
    w, opt = scalar_setup(make())
    opt.apply([tf.constant([2.0])], [w], sample_count=4)
    assert w.numpy().tolist() == [-2.0]


@pytest.mark.parametrize("make", EVERY_STRATEGY, ids=lambda f: f.__name__.strip("_"))
def test_an_empty_call_contributes_nothing_even_when_its_mean_is_nan(make):
    # An empty batch's mean is 0/0 = NaN; with sample_count=0 it must weigh nothing and not count as a fault.
    w, opt = scalar_setup(make())
    opt.apply([tf.constant([np.nan])], [w], sample_count=0)
    assert w.numpy().tolist() == [0.0]
    assert all(int(s.skipped_steps.numpy()) == 0 for s in hvd_easgd.strategies.walk(opt.strategy))


def test_accumulation_window_with_an_empty_nan_micro_batch_applies_the_others():
    # micro-batches: mean 3 over 2 samples, then an empty one (mean NaN, 0 samples): the update is 3
    w, opt = scalar_setup(GradientAccumulation(2))
    opt.apply([tf.constant([3.0])], [w], sample_count=2)
    opt.apply([tf.constant([np.nan])], [w], sample_count=0)
    assert w.numpy().tolist() == [-3.0]


def test_center_and_accumulator_names_follow_the_keras_variable_paths():
    # Keras 3 names both kernels "kernel"; their paths differ ("mlp/dense/kernel", "mlp/dense_1/kernel").
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)], name="mlp")
    strategy = GradientAccumulation(2, strategy=EASGD(period=2))
    opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), strategy, comm=LocalCommunicator())
    hvd_easgd.broadcast_initial_state(model, opt)
    paths = [v.path for v in model.trainable_variables]
    assert len(set(paths)) == 4
    assert [c.name.split(":")[0] for c in strategy.strategy.center] == ["center/" + p for p in paths]
    assert [a.name.split(":")[0] for a in strategy.accumulators] == ["accumulator/" + p for p in paths]
