"""Keras code as people write it, in one process (issue 13): the parts that need no launcher."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import EASGD, LocalCommunicator, SyncAverage, callbacks, checkpoint
from hvd_easgd.comm import RanksDisagreeError, SimulatedCluster
from hvd_easgd.statistics import average_statistics

pytestmark = pytest.mark.unit


def test_fit_without_any_distributed_optimizer_says_what_to_do():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    with pytest.raises(ValueError, match=r"found no DistributedOptimizer.*Wrap each optimizer"):
        model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0, callbacks=callbacks.defaults())


def test_overflow_reaches_the_loss_scale_and_counts_only_once_the_scale_is_at_most_one():
    # SGD(1) inside LossScaleOptimizer(initial_scale=4), inside the DistributedOptimizer.
    w = tf.Variable([1.0])
    inner = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4.0)
    opt = hvd_easgd.DistributedOptimizer(inner, SyncAverage(), comm=LocalCommunicator())
    assert float(opt.scale_loss(tf.constant(1.0))) == 4.0  # passed on to the inner optimizer
    runs = []
    for _ in range(4):  # NaN gradients: the scale goes 4 -> 2 -> 1 -> 0.5 -> 0.25
        opt.apply([tf.constant([np.nan])], [w])
        runs.append(int(opt.strategy.consecutive_skips.numpy()))
    assert float(inner.dynamic_scale.numpy()) == 0.25
    # Steps taken at scale 4 and 2 were fp16 overflows the scale could cure; at 1 and 0.5 they count.
    assert runs == [0, 0, 1, 2]
    assert int(opt.strategy.skipped_steps.numpy()) == 4
    assert w.numpy().tolist() == [1.0]
    opt.apply([tf.constant([0.5])], [w])  # a finite (scaled) gradient: 0.5 / 0.25 = 2, so w = 1 - 2
    assert w.numpy().tolist() == [-1.0]
    assert int(opt.strategy.consecutive_skips.numpy()) == 0


def test_keras_outer_loss_scale_optimizer_is_moved_inside_before_the_first_step():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1, dtype="float32")])
        distributed = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), comm=LocalCommunicator())
        model.compile(optimizer=distributed, loss="mse")
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)  # what Keras builds
        model.fit(np.ones((8, 3)), np.zeros((8, 1)), batch_size=4, verbose=0, callbacks=callbacks.defaults())
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.optimizer is distributed
    assert isinstance(distributed.inner_optimizer, keras.optimizers.LossScaleOptimizer)
    assert int(distributed.strategy.step_counter.numpy()) == 2  # both steps went through the strategy


def easgd_model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=hvd_easgd.DistributedOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9), EASGD(period=3, moving_rate=0.5),
        comm=LocalCommunicator()), loss="mse")
    return model


def everything(model):
    opt = model.optimizer
    return [v.numpy() for v in model.variables + opt.variables + opt.strategy.state_variables()]


def test_per_rank_checkpoints_hold_local_weights_even_after_a_swap_so_resume_is_exact(tmp_path):
    x = np.random.default_rng(0).standard_normal((48, 4)).astype(np.float32)
    y = np.sin(x[:, :1])
    fit = dict(batch_size=8, shuffle=False, verbose=0)
    straight = easgd_model()
    straight.fit(x, y, epochs=3, callbacks=callbacks.defaults(), **fit)

    first = easgd_model()
    comm = first.optimizer.comm
    # The wrong order on purpose: the kept weights are swapped in before the checkpoint is taken.
    swap_then_save = [callbacks.BroadcastInitialState(), callbacks.SwapKeptWeights(swap_on_epoch=True),
                      callbacks.PeriodicCheckpoint(str(tmp_path), comm, {"run": 1})]
    first.fit(x, y, epochs=2, callbacks=swap_then_save, **fit)

    resumed = easgd_model(seed=1)
    resumed.optimizer.attach(resumed)
    resumed.optimizer.build(resumed.trainable_variables)
    manifest, directory = checkpoint.latest(str(tmp_path))
    checkpoint.restore(directory, manifest, resumed, resumed.optimizer, comm)
    broadcast = callbacks.BroadcastInitialState()
    broadcast.skip = True
    resumed.fit(x, y, epochs=3, initial_epoch=2, callbacks=[broadcast] + callbacks.defaults()[1:], **fit)
    for a, b in zip(everything(straight), everything(resumed)):
        np.testing.assert_array_equal(a, b)


def test_kept_weights_is_the_center_under_easgd_and_the_weights_under_sync_average():
    x = np.random.default_rng(1).standard_normal((16, 4)).astype(np.float32)
    model = easgd_model()
    # Between the end-of-training merges: the kept model is the center.
    model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0, callbacks=callbacks.defaults(merge_at_end=False))
    center = [c.numpy() for c in model.optimizer.strategy.center]
    local = [v.numpy() for v in model.trainable_variables]
    for kept, c, v in zip(hvd_easgd.kept_weights(model), center, local):
        np.testing.assert_array_equal(kept, c)
        assert not np.array_equal(kept, v)
    with hvd_easgd.KeptWeights(model):
        for v, c in zip(model.trainable_variables, center):
            np.testing.assert_array_equal(v.numpy(), c)
    for v, saved in zip(model.trainable_variables, local):
        np.testing.assert_array_equal(v.numpy(), saved)
    # After the merge: the workers' mean (the one worker, at one rank), the center itself left as it was.
    hvd_easgd.merge_at_end(model)
    for kept, v, c in zip(hvd_easgd.kept_weights(model), local, model.optimizer.strategy.center):
        np.testing.assert_allclose(kept, v, rtol=1e-6, atol=1e-7)
        assert not np.allclose(c.numpy(), v)

    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    plain.compile(optimizer=hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), comm=LocalCommunicator()),
                  loss="mse")
    plain.fit(x, x[:, :1], verbose=0, callbacks=callbacks.defaults())
    for kept, v in zip(hvd_easgd.kept_weights(plain), plain.trainable_variables):
        np.testing.assert_array_equal(kept, v.numpy())


def test_statistics_are_averaged_across_ranks_and_left_out_of_the_account():
    cluster = SimulatedCluster(3)
    models = [keras.Sequential([keras.Input((2,)), keras.layers.BatchNormalization()]) for _ in range(3)]
    for r, model in enumerate(models):
        model.layers[0].moving_mean.assign([r, 2.0 * r])
        model.layers[0].moving_variance.assign([1.0 + r, 1.0])
    cluster.run(lambda r: average_statistics(models[r], cluster.communicators[r]))
    for model, comm in zip(models, cluster.communicators):
        assert model.layers[0].moving_mean.numpy().tolist() == [1.0, 2.0]  # mean of 0, 1, 2 and of 0, 2, 4
        assert model.layers[0].moving_variance.numpy().tolist() == [2.0, 1.0]
        assert comm.account() == {"bytes": 0, "calls": 0}  # bookkeeping, not training traffic


def test_ranks_with_different_initial_weights_are_refused_at_build_unless_told_otherwise():
    cluster = SimulatedCluster(2)

    def first_step(rank, check):
        w = tf.Variable([float(rank)])  # a different start on each rank, and no broadcast
        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), comm=cluster.communicators[rank],
                                             check_initial_state=check)
        opt.apply([tf.constant([1.0])], [w])
        return w.numpy().tolist()

    with pytest.raises(RanksDisagreeError, match=r"different initial weights.*broadcast_initial_state"):
        cluster.run(lambda r: first_step(r, True))
    cluster = SimulatedCluster(2)
    np.testing.assert_allclose(cluster.run(lambda r: first_step(r, False)), [[-0.1], [0.9]], rtol=1e-6)


@pytest.mark.parametrize("known_length", [True, False])
def test_shard_dataset_gives_every_rank_as_many_elements_as_the_shortest_shard(known_length):
    cluster = SimulatedCluster(3)
    dataset = tf.data.Dataset.range(11)  # shards of 4, 4 and 3
    if not known_length:
        dataset = dataset.filter(lambda x: True)  # tf.data no longer knows the length

    def elements(rank):
        return [int(x) for x in hvd_easgd.shard_dataset(dataset, cluster.communicators[rank])]

    assert cluster.run(elements) == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]


def test_clip_norm_applies_to_the_unscaled_gradients_under_loss_scaling():
    # True gradient 2, loss scale 4: the strategy receives 8. clip_norm=1 must clip the true
    # gradient to 1 (the scaled one to 4), so SGD(1) moves w from 1 to 0 (clipping the scaled 8 to 1 would give 0.75).
    w = tf.Variable([1.0])
    inner = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=4.0)
    opt = hvd_easgd.DistributedOptimizer(inner, SyncAverage(clip_norm=1.0), comm=LocalCommunicator())
    opt.apply([tf.constant([8.0])], [w])
    assert w.numpy().tolist() == [0.0]
