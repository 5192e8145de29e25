"""Checkpoints: complete (every rank's state), atomic, and refused when they do not fit."""
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import EASGD, GradientAccumulation, LocalCommunicator, SyncAverage, checkpoint
from hvd_easgd.comm.simulated_comm import SimulatedCluster

pytestmark = pytest.mark.unit


def trained(strategy, steps=5, seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), strategy, comm=LocalCommunicator())
    hvd_easgd.broadcast_initial_state(model, opt)
    x = np.random.default_rng(seed).standard_normal((8, 4)).astype(np.float32)
    for _ in range(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x) ** 2)
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return model, opt


def test_round_trip_restores_model_optimizer_and_strategy_state(tmp_path):
    # 5 micro-batches with k = 2: the save happens mid-window, with a non-empty accumulator
    model, opt = trained(GradientAccumulation(2, strategy=EASGD(period=2, moving_rate=0.3)))
    comm = opt.comm
    checkpoint.save(str(tmp_path), 1, model, opt, comm, {"strategy": "easgd"})
    fresh, fresh_opt = trained(GradientAccumulation(2, strategy=EASGD(period=2, moving_rate=0.3)),
                               steps=0, seed=1)
    manifest, directory = checkpoint.latest(str(tmp_path))
    checkpoint.restore(directory, manifest, fresh, fresh_opt, comm)
    for group in ("model", "optimizer", "strategy"):
        saved = checkpoint.state_groups(model, opt)[group]
        loaded = checkpoint.state_groups(fresh, fresh_opt)[group]
        assert len(saved) == len(loaded) > 0
        for a, b in zip(saved, loaded):
            np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))
    assert float(np.abs(opt.strategy.accumulators[0].numpy()).sum()) > 0  # mid-window state was there to save
    assert manifest["num_ranks"] == 1 and manifest["config"] == {"strategy": "easgd"}
    assert manifest["format"] == checkpoint.FORMAT_VERSION == 2


def test_a_write_killed_midway_leaves_the_previous_checkpoint_usable(tmp_path, monkeypatch):
    model, opt = trained(EASGD(period=2, moving_rate=0.3))
    checkpoint.save(str(tmp_path), 1, model, opt, opt.comm, {})

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed during the write")

    monkeypatch.setattr(checkpoint.store.np, "savez", killed)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(str(tmp_path), 2, model, opt, opt.comm, {})
    assert os.listdir(tmp_path / "checkpoints" / "epoch-000002") == []  # not even a temporary file
    manifest, directory = checkpoint.latest(str(tmp_path))
    assert manifest["epoch"] == 1
    checkpoint.restore(directory, manifest, model, opt, opt.comm)


def test_keeps_the_last_k(tmp_path):
    model, opt = trained(EASGD(period=2, moving_rate=0.3), steps=1)
    for epoch in range(1, 6):
        checkpoint.save(str(tmp_path), epoch, model, opt, opt.comm, {}, keep=2)
    assert [e for e, _ in checkpoint.complete_checkpoints(str(tmp_path))] == [4, 5]


def test_step_checkpoints_are_pruned_like_epoch_ones(tmp_path):
    model, opt = trained(SyncAverage(), steps=1)
    positions = [(1, 0), (1, 5), (2, 0), (2, 5), (3, 0)]  # (epochs done, micro-batches since), in order
    for epoch, step in positions:
        checkpoint.save(str(tmp_path), epoch, model, opt, opt.comm, {}, keep=2, step_in_epoch=step,
                        steps_per_epoch=10)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["epoch-000002-step-000005", "epoch-000003"]


def test_every_host_prunes_its_own_run_directory(tmp_path):
    # Two simulated ranks, each the first rank of its own host, each writing to its own
    # node-local run directory: rank 1 sees its shards but never rank 0's manifests.
    cluster = SimulatedCluster(2)
    for rank, comm in enumerate(cluster.communicators):  # one rank per host, as on two nodes
        comm.local_rank, comm.local_size, comm.cross_rank, comm.cross_size = 0, 1, rank, 2
    run_dirs = [str(tmp_path / f"host{r}") for r in range(2)]
    pairs = []
    for comm in cluster.communicators:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        pairs.append((model, hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), SyncAverage(), comm=comm)))

    def save_five_epochs(rank):
        model, opt = pairs[rank]
        for epoch in range(1, 6):
            checkpoint.save(run_dirs[rank], epoch, model, opt, opt.comm, {}, keep=2)

    cluster.run(save_five_epochs)
    for rank, run_dir in enumerate(run_dirs):
        assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["epoch-000004", "epoch-000005"], rank
    assert os.listdir(os.path.join(run_dirs[1], "checkpoints", "epoch-000005")) == ["rank-00001.npz"]


class RankOf(LocalCommunicator):
    """What ``checkpoint.restore`` reads of a communicator: this rank and the number of ranks."""

    def __init__(self, rank, size):
        super().__init__()
        self.rank, self.size = rank, size


def test_another_rank_count_loads_the_saved_shard_and_another_model_is_refused(tmp_path):
    model, opt = trained(EASGD(period=2, moving_rate=0.3), steps=1)
    checkpoint.save(str(tmp_path), 1, model, opt, opt.comm, {})
    manifest, directory = checkpoint.latest(str(tmp_path))
    # written by 1 rank, read by rank 3 of 4 (config_compare.resize_refusal says where that is allowed)
    checkpoint.restore(directory, manifest, model, opt, RankOf(3, 4))
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    other_opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                               EASGD(period=2, moving_rate=0.3), comm=opt.comm)
    hvd_easgd.broadcast_initial_state(other, other_opt)
    with pytest.raises(checkpoint.CheckpointError, match="does not fit"):
        checkpoint.restore(directory, manifest, other, other_opt, opt.comm)
    with pytest.raises(checkpoint.CheckpointError, match="no complete checkpoint"):
        checkpoint.latest(str(tmp_path / "elsewhere"))


def _resized_strategy(name, alpha):
    from hvd_easgd.strategies import registry

    return registry.create(name, **({} if alpha is None else {"moving_rate": alpha}))


@pytest.mark.parametrize("strategy, step, alpha, reason", [
    ("sync", 0, None, None),
    ("easgd", 0, None, None),
    ("easgd", 0, 0.3, None),  # 3 * 0.3 < 1
    # 3 * 0.45 >= 1 only warns, as EASGD(moving_rate=0.45) at 3 ranks does: 0.45 <= 2/(3+1) is stable
    ("easgd", 0, 0.45, None),
    # mid-epoch too: the rest of the epoch is split over the new ranks (test_resize.py)
    ("sync", 5, None, None),
    ("easgd", 5, None, None),
    ("easgd", 0, 0.6, "--moving-rate 0.6 was fixed for 2 ranks, and at 3 ranks alpha > 2/(q+1) = 0.5: the elastic "
                      "step diverges"),
    ("easgd", 5, 0.6, "--moving-rate 0.6 was fixed for 2 ranks, and at 3 ranks alpha > 2/(q+1) = 0.5: the elastic "
                      "step diverges"),
    # every built-in strategy declares its rule (test_resize.py)
    # one group per host: the saved group size is read from the shards (test_resize_groups.py)
    ("hierarchical", 0, None, None),
    ("periodic", 5, None, None),
    ("diloco", 5, None, None),
])
def test_resize_is_refused_only_for_a_fixed_alpha_too_big(strategy, step, alpha, reason):
    from hvd_easgd.app.config_compare import resize_refusal, resume_mismatches
    from hvd_easgd.strategies import GradientAccumulation

    config = {"strategy": strategy, "moving_rate": alpha}
    manifest = {"epoch": 2, "step_in_epoch": step, "num_ranks": 2, "config": config}
    made = _resized_strategy(strategy, alpha)
    refusal = resize_refusal(manifest, made, 3)
    assert (refusal is None) if reason is None else refusal.startswith(reason), refusal
    differs = resume_mismatches(manifest, config, 3, made)
    assert differs == ([] if reason is None else [f"number of ranks (2 saved, 3 now): {refusal}"])
    assert resume_mismatches(manifest, config, 2, made) == []
    # accumulation resizes as the strategy it wraps does
    assert resize_refusal(manifest, GradientAccumulation(4, strategy=made), 3) == refusal
    if alpha == 0.6:
        assert refusal.endswith("resume at 2 ranks or fewer, or start a new run with --beta (alpha = beta/q)")
        assert resize_refusal(manifest, made, 1) is None
        # the one rule: EASGD itself refuses this alpha at 3 ranks, and accepts it at 2
        with pytest.raises(ValueError, match=r"alpha <= 2/\(p\+1\) = 0\.5 with p=3 ranks, else the elastic step "
                                             r"diverges"):
            made.bind(SimulatedCluster(3).communicators[0])
    if alpha == 0.45:
        with pytest.warns(UserWarning, match=r"p \* alpha = 1\.35 >= 1 at p=3"):
            made.bind(SimulatedCluster(3).communicators[0])


def test_resized_arrays_keep_what_every_rank_shares_and_average_what_differs():
    shards = [{"same": np.float32([0.1, 0.2]), "slot": np.float32([1.0, 3.0]), "skips": np.int64([2, 1])},
              {"same": np.float32([0.1, 0.2]), "slot": np.float32([2.0, 0.0]), "skips": np.int64([0, 0])},
              {"same": np.float32([0.1, 0.2]), "slot": np.float32([0.5, 0.0]), "skips": np.int64([5, 0])}]
    got = checkpoint.resized_arrays(shards, ["same", "slot", "skips"])
    assert got["same"] is shards[0]["same"]  # exactly, not a float mean of three equal values
    np.testing.assert_array_equal(got["slot"], np.float32([3.5 / 3, 1.0]))
    assert got["slot"].dtype == np.float32
    np.testing.assert_array_equal(got["skips"], [2, 1])  # integers that differ: rank 0's


def test_easgd_saved_at_2_ranks_resumes_at_1_and_3_from_the_center_with_the_mean_slots(tmp_path):
    cluster = SimulatedCluster(2)
    pairs = []
    for comm in cluster.communicators:
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
        pairs.append((model, hvd_easgd.DistributedOptimizer(
            keras.optimizers.SGD(0.1, momentum=0.9), EASGD(period=2), comm=comm)))

    def train_and_save(rank):  # 5 steps on each rank's own data: the local weights and slots differ
        model, opt = pairs[rank]
        hvd_easgd.broadcast_initial_state(model, opt)
        x = np.random.default_rng(rank).standard_normal((8, 4)).astype(np.float32)
        for _ in range(5):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(x) ** 2)
            opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        checkpoint.save(str(tmp_path), 1, model, opt, opt.comm, {"strategy": "easgd"})

    cluster.run(train_and_save)
    saved = [checkpoint.state_groups(*pair) for pair in pairs]
    values = [{g: [np.asarray(v.numpy()) for v in vs] for g, vs in groups.items()} for groups in saved]
    center = [c.numpy() for c in pairs[0][1].strategy.center]
    assert not np.array_equal(values[0]["model"][0], values[1]["model"][0])
    assert not np.array_equal(values[0]["model"][0], center[0])
    manifest, directory = checkpoint.latest(str(tmp_path))
    for size in (1, 3):
        keras.utils.set_random_seed(7)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])
        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), EASGD(period=2),
                                             comm=LocalCommunicator())
        hvd_easgd.broadcast_initial_state(model, opt)
        checkpoint.restore(directory, manifest, model, opt, RankOf(size - 1, size))
        for variable, c in zip(model.trainable_variables, center):  # local weights restart from the center
            np.testing.assert_array_equal(variable.numpy(), c)
        for variable, c in zip(opt.strategy.center, center):
            np.testing.assert_array_equal(variable.numpy(), c)
        assert int(opt.strategy.step_counter.numpy()) == 5  # the tau phase continues
        assert int(opt.iterations.numpy()) == 5
        for variable, a, b in zip(opt.variables, values[0]["optimizer"], values[1]["optimizer"]):
            if np.array_equal(a, b):
                np.testing.assert_array_equal(variable.numpy(), a)
            else:  # the momentum slots: their mean over the 2 saved ranks
                assert a.dtype == np.float32
                np.testing.assert_allclose(variable.numpy(), (a.astype(np.float64) + b) / 2, rtol=1e-6)
        assert sum(not np.array_equal(a, b) for a, b in zip(values[0]["optimizer"], values[1]["optimizer"])) == 4
