"""The sharded Hierarchical and its collective: ``reducescatter`` exact against NumPy
at p = 3, and Hierarchical with every inter strategy at p = 4 and 6 (2 and 3 ranks
per host) against tests/reference.py's decomposition, with its account per level
against the module docstring's formulas and ``expected_traffic``."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import EASGD, DiLoCo, Hierarchical, PeriodicAverage, SyncAverage
from hvd_easgd.comm import SimulatedCluster
from tests.reference import hierarchical_reference

# slow: every inter strategy on shards of several groups: `make test-fast` leaves it out.
pytestmark = [pytest.mark.unit, pytest.mark.slow]

WIDTH = 5  # N elements: shards of 3 at n = 2 and of 2 at n = 3, each layout with one element of padding
LR, TAU, ALPHA, STEPS = 0.5, 2, 0.2, 4
X0 = np.array([1.0, -2.0, 0.5, 3.0, -1.0], np.float32)
COUNTS = [3, 1, 2, 5, 4, 2]
INTERS = {"sync": SyncAverage, "easgd": lambda: EASGD(TAU, moving_rate=ALPHA),
          "periodic": lambda: PeriodicAverage(TAU), "diloco": lambda: DiLoCo(TAU)}


# --- reducescatter -----------------------------------------------------------------------
@pytest.mark.parametrize("op", ["sum", "average"])
def test_reducescatter_is_each_ranks_block_of_the_padded_reduction(op):
    p = 3
    cluster = SimulatedCluster(p)
    rng = np.random.default_rng(0)
    floats = rng.normal(size=(p, 2, 2)).astype(np.float32)  # 4 elements: m = 2, padded to 6
    ints = rng.integers(-50, 50, size=(p, 7)).astype(np.int32)  # 7 elements: m = 3, padded to 9
    got = cluster.run(lambda r: [t.numpy() for t in cluster.communicators[r].reducescatter([floats[r]], op=op)
                                 + cluster.communicators[r].reducescatter([ints[r]], op=op)])
    for r in range(p):
        for inputs, m, shard in ((floats, 2, got[r][0]), (ints, 3, got[r][1])):
            padded = np.zeros((p, p * m), inputs.dtype)
            padded[:, :inputs[0].size] = inputs.reshape(p, -1)
            total = padded.sum(axis=0)  # rank-order sums: exact for these small integers and bit-equal for floats
            expected = total if op == "sum" else (total / p if inputs.dtype.kind == "f" else total // p)
            np.testing.assert_array_equal(shard, expected[r * m:(r + 1) * m].astype(inputs.dtype))
        # one call per dtype; the padded payloads: 6 floats, 9 int32
        assert cluster.communicators[r].account() == {"bytes": 6 * 4 + 9 * 4, "calls": 2}


def test_reducescatter_takes_one_dtype_per_call():
    cluster = SimulatedCluster(2)
    with pytest.raises(ValueError, match=r"`tensors` must share one dtype.*\['float32', 'int32'\]"):
        cluster.communicators[0].reducescatter([tf.zeros([2]), tf.zeros([2], tf.int32)])


def test_reducescatter_on_one_rank_returns_the_flat_tensors_and_counts_nothing():
    comm = hvd_easgd.comm.LocalCommunicator()
    (shard,) = comm.reducescatter([tf.constant([[1.0, 2.0], [3.0, 4.0]])], op="sum")
    np.testing.assert_array_equal(shard.numpy(), [1.0, 2.0, 3.0, 4.0])
    assert comm.account() == {"bytes": 0, "calls": 0}


# --- Hierarchical on shards ----------------------------------------------------------------
def hierarchical_ranks(p, ranks_per_host, inter):
    cluster = SimulatedCluster(p, ranks_per_host=ranks_per_host)
    models, opts = [], []
    for comm in cluster.communicators:
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(WIDTH, use_bias=False)])
        model.layers[0].kernel.assign(np.reshape(X0, (1, -1)) + 100.0 * comm.rank)
        strategy = Hierarchical(SyncAverage(), INTERS[inter]())  # a group is a simulated host
        strategy.bind(comm)
        models.append(model)
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), strategy, comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    for comm in cluster.communicators:
        comm.reset_account()
    return cluster, models, opts


def train(cluster, models, opts, grads, counts):
    for g in grads:
        cluster.run(lambda r: opts[r].apply([tf.constant(np.reshape(g[r], (1, -1)), tf.float32)],
                                            models[r].trainable_variables, sample_count=counts[r]))


def kernels(models):
    return np.stack([m.layers[0].kernel.numpy().ravel() for m in models])


@pytest.mark.parametrize("inter", sorted(INTERS))
@pytest.mark.parametrize("p, ranks_per_host", [(4, 2), (6, 2), (6, 3)])
def test_every_inter_strategy_on_shards_matches_the_decomposition_and_its_account(p, ranks_per_host, inter):
    n, group_count = ranks_per_host, p // ranks_per_host
    groups = [list(range(g * n, (g + 1) * n)) for g in range(group_count)]
    cluster, models, opts = hierarchical_ranks(p, ranks_per_host, inter)
    grads = np.random.default_rng(p + n).normal(size=(STEPS, p, WIDTH)).astype(np.float32)
    counts = COUNTS[:p]
    train(cluster, models, opts, grads, counts)

    weights, kept = hierarchical_reference(grads, counts, groups, LR, X0, inter, TAU, ALPHA)
    got = kernels(models)
    for g, group in enumerate(groups):
        for r in group:  # bit-identical within a group
            np.testing.assert_array_equal(got[r], got[group[0]])
        np.testing.assert_allclose(got[group[0]], weights[g], rtol=1e-5, atol=1e-6)
    m = -(-WIDTH // n)
    strategy = opts[0].strategy
    state = {"easgd": lambda: strategy.inter.center, "diloco": lambda: strategy.inter.synced,
             "periodic": lambda: strategy.inter.averaged_variables, "sync": lambda: [strategy.shard]}[inter]()
    assert [tuple(v.shape) for v in state] == [(m,)]  # the inter strategy's state: 1/n of the model
    gathered = cluster.run(lambda r: opts[r].strategy.kept_variables())
    if kept is None:
        assert all(k is None for k in gathered)
    else:
        for k in gathered:
            np.testing.assert_allclose(np.ravel(k[0]), kept, rtol=1e-5, atol=1e-6)

    # The account per level (module docstring), and expected_traffic agrees with it.
    syncs = 0 if inter == "sync" else STEPS // TAU
    intra = {"bytes": STEPS * (n * (m + 2) * 4 + m * 4) + syncs * m * 4, "calls": 2 * STEPS + syncs}
    across = ({"bytes": STEPS * (m * 4 + 4), "calls": STEPS} if inter == "sync" else
              {"bytes": syncs * (m * 4 + 4), "calls": syncs})
    expected = opts[0].strategy.expected_traffic(models[0].trainable_variables, hosts=group_count,
                                                 ranks_per_host=n, sample_counts=True)
    assert expected.ranks_per_group == n
    assert (expected.within_group.bytes * STEPS, expected.within_group.calls * STEPS) == (
        intra["bytes"], intra["calls"])
    assert (expected.across_groups.bytes * STEPS, expected.across_groups.calls * STEPS) == (
        across["bytes"], across["calls"])
    for r, opt in enumerate(opts):
        assert opt.strategy.account_by_level() == {"intra": intra, "inter": across}
        assert cluster.communicators[r].account() == {"bytes": intra["bytes"] + across["bytes"],
                                                      "calls": intra["calls"] + across["calls"]}


def test_the_two_level_allreduce_is_flat_sync_averages_mean_to_float_tolerance():
    # Not bit for bit: the group's sum is added first, then the groups' (another order than flat's).
    grads = np.random.default_rng(9).normal(size=(3, 4, WIDTH)).astype(np.float32)
    results = []
    for make in (SyncAverage, lambda: Hierarchical(SyncAverage(), SyncAverage())):
        cluster = SimulatedCluster(4, ranks_per_host=2)
        models = [keras.Sequential([keras.Input((1,)), keras.layers.Dense(WIDTH, use_bias=False)]) for _ in range(4)]
        opts = []
        for model, comm in zip(models, cluster.communicators):
            model.layers[0].kernel.assign(np.reshape(X0, (1, -1)))
            strategy = make()
            strategy.bind(comm)
            opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), strategy, comm=comm))
        train(cluster, models, opts, grads, COUNTS[:4])
        results.append(kernels(models))
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6, atol=1e-6)
    mean = sum(COUNTS[r] * grads[:, r].astype(np.float64) for r in range(4)).sum(axis=0) / sum(COUNTS[:4])
    np.testing.assert_allclose(results[1][0], X0 - LR * mean, rtol=1e-5)


def test_a_nan_on_one_rank_skips_the_two_level_step_on_every_rank():
    cluster, models, opts = hierarchical_ranks(4, 2, "sync")
    grads = np.random.default_rng(3).normal(size=(2, 4, WIDTH)).astype(np.float32)
    grads[0, 1, 4] = np.nan  # rank 1's last element: it falls in shard 1 of group 0 alone
    train(cluster, models, opts, grads, [1] * 4)
    got = kernels(models)
    expected = X0 - LR * grads[1].astype(np.float64).mean(axis=0)  # step 1 skipped everywhere
    assert all(np.array_equal(k, got[0]) for k in got)
    np.testing.assert_allclose(got[0], expected, rtol=1e-5)
    assert [int(o.strategy.inter.skipped_steps.numpy()) for o in opts] == [1] * 4


def test_a_checkpoint_cut_for_other_shards_is_refused_in_one_sentence():
    cluster, models, opts = hierarchical_ranks(4, 2, "easgd")
    strategy = opts[0].strategy
    strategy.shard_layout.assign([3, 0, 2, WIDTH])  # as saved by groups of 3
    with pytest.raises(ValueError, match=r"cut as .* = \[3, 0, 2, 5\], and this run cuts them as \[2, 0, 3, 5\]"):
        strategy.on_state_restored()


def test_the_inter_strategy_must_not_clip_on_shards():
    cluster = SimulatedCluster(4, ranks_per_host=2)
    with pytest.raises(ValueError, match="`inter` must not clip by the global norm"):
        Hierarchical(SyncAverage(), SyncAverage(clip_norm=1.0)).bind(cluster.communicators[0])


@pytest.mark.parametrize("merge", ["progress", "mix"])
def test_an_overlapped_inter_diloco_merges_on_the_shard_and_keeps_each_group_identical(merge):
    # Streaming DiLoCo's overlap across the groups, on Hierarchical's flat shard, with either merge (progress is
    # the default): each group's ranks stay identical, the groups keep their own progress between merges, and
    # the ranks that hold the same shard (the same index within their groups) hold the same synced weights.
    p = 4
    cluster = SimulatedCluster(p, ranks_per_host=2)
    models, opts = [], []
    for comm in cluster.communicators:
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(WIDTH, use_bias=False)])
        model.layers[0].kernel.assign(np.reshape(X0, (1, -1)) + 100.0 * comm.rank)
        strategy = Hierarchical(SyncAverage(), DiLoCo(4, overlap=1, **({} if merge == "progress" else
                                                                        {"overlap_merge": "mix"})))
        strategy.bind(comm)
        models.append(model)
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), strategy, comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    assert opts[0].strategy.inter.overlap_merge == merge
    grads = np.random.default_rng(0).normal(size=(9, p, WIDTH))  # merges at 5 and 9
    train(cluster, models, opts, grads, [1] * p)
    weights = [m.layers[0].kernel.numpy().ravel() for m in models]
    np.testing.assert_array_equal(weights[0], weights[1])
    np.testing.assert_array_equal(weights[2], weights[3])
    assert not np.allclose(weights[0], weights[2])
    synced = [np.concatenate([v.numpy().ravel() for v in o.strategy.inter.synced]) for o in opts]
    np.testing.assert_array_equal(synced[0], synced[2])
    np.testing.assert_array_equal(synced[1], synced[3])
    assert not np.array_equal(synced[0], synced[1])  # two shards
