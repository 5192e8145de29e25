"""Hierarchical on p = 4 simulated ranks in 2 groups of 2 (SimulatedCluster's
sub-communicators), against NumPy references; per-level accounts against
their formulas (hierarchical.py's docstring)."""
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import EASGD, GradientAccumulation, Hierarchical, SyncAverage
from hvd_easgd.comm import SimulatedCluster
from hvd_easgd.strategies import registry

pytestmark = pytest.mark.unit

P, N = 4, 2  # ranks, ranks per group
WIDTH = 3
M = WIDTH * 4  # bytes of the trainable variables (fp32)
LR = 0.5
# Each rank's shard of the flattened weights: m = ceil(WIDTH/N) elements (the last one padding).
SHARD = -(-WIDTH // N) * 4


def intra_bytes(steps, syncs, columns):
    """The intra level's payload: per step the reduce-scatter of N rows of m + columns
    elements and the update's allgather of m; per weight sync an allgather of m."""
    return steps * (N * (SHARD + 4 * columns) + SHARD) + syncs * SHARD


def gathered_kept(cluster, opts):
    """Every rank's kept model (its shards gathered within its group: a collective)."""
    return cluster.run(lambda r: [np.array(k) for k in opts[r].strategy.kept_variables()])


def ranks_with(cluster, make_strategy, initial):
    """Per rank a Dense(WIDTH, no bias) on 1 input, SGD(LR), its own strategy;
    rank 0's weights ``initial`` reach every rank by the initial broadcast."""
    models, opts = [], []
    for comm in cluster.communicators:
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(WIDTH, use_bias=False)])
        model.layers[0].kernel.assign(np.reshape(initial, (1, -1)) + 100.0 * comm.rank)
        strategy = make_strategy()
        strategy.bind(comm)  # in the main thread: no collective in a simulated split
        models.append(model)
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), strategy, comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    for comm in cluster.communicators:
        comm.reset_account()
    return models, opts


def step(cluster, models, opts, grads, counts=None):
    def one(r):
        grad = tf.constant(np.reshape(grads[r], (1, -1)), tf.float32)
        opts[r].apply([grad], models[r].trainable_variables, sample_count=None if counts is None else counts[r])

    cluster.run(one)


def kernels(models):
    return np.stack([m.layers[0].kernel.numpy().ravel() for m in models])


def rank_grads(steps, seed=0):
    return np.random.default_rng(seed).normal(size=(steps, P, WIDTH)).astype(np.float32)


X0 = np.array([1.0, -2.0, 0.5], np.float32)


def easgd_reference(grads, counts, tau, alpha, groups):
    """Groups as EASGD's workers: x_G ← x_G − lr·ΣS/Σn over the group; every τ-th step
    d_G = α(x_G − x̃), x_G ← x_G − d_G, x̃ ← x̃ + Σ_G d_G."""
    x = np.tile(X0.astype(np.float64), (len(groups), 1))
    center = X0.astype(np.float64)
    for t, g in enumerate(grads, start=1):
        for i, group in enumerate(groups):
            sums = sum(counts[r] * g[r].astype(np.float64) for r in group)
            x[i] -= LR * sums / sum(counts[r] for r in group)
        if t % tau == 0:
            d = alpha * (x - center)
            x -= d
            center = center + d.sum(axis=0)
    return x, center


def sync_within_easgd_across(steps, tau=2, alpha=0.25):
    """Hierarchical(SyncAverage, EASGD) at P ranks in groups of N, trained ``steps`` steps, and its NumPy
    reference: (cluster, models, optimizers, reference weights, reference center)."""
    cluster = SimulatedCluster(P)
    models, opts = ranks_with(cluster, lambda: Hierarchical(SyncAverage(), EASGD(tau, moving_rate=alpha),
                                                            ranks_per_group=N), X0)
    grads, counts = rank_grads(steps), [3, 1, 2, 5]
    for g in grads:
        step(cluster, models, opts, g, counts)
    x, center = easgd_reference(grads, counts, tau, alpha, [[0, 1], [2, 3]])
    return cluster, models, opts, x, center


def test_sync_within_groups_easgd_across_them_matches_the_reference_and_its_account():
    tau, alpha, steps = 2, 0.25, 4
    cluster, models, opts, x, center = sync_within_easgd_across(steps, tau, alpha)
    got = kernels(models)
    np.testing.assert_array_equal(got[0], got[1])  # bit-identical within a group
    np.testing.assert_array_equal(got[2], got[3])
    np.testing.assert_allclose(got[[0, 2]], x, rtol=1e-5)
    centers = np.stack([k[0].ravel() for k in gathered_kept(cluster, opts)])
    assert all(np.array_equal(c, centers[0]) for c in centers)  # identical on every rank
    np.testing.assert_allclose(centers[0], center, rtol=1e-5)
    assert opts[0].strategy.inter.center[0].shape == (SHARD // 4,)  # each rank keeps its shard of the center
    assert not np.allclose(got[0], got[2])  # the groups differ: the check above is not vacuous
    # per rank (module docstring): intra the reduce-scatter (count and flag) and the update's allgather every
    # step, the weights' allgather every tau-th; inter the shard and the flag every tau-th step, on every rank
    elastic = steps // tau
    for r, opt in enumerate(opts):
        within = {"bytes": intra_bytes(steps, elastic, columns=2), "calls": 2 * steps + elastic}
        assert opt.strategy.account_by_level() == {"intra": within,
                                                   "inter": {"bytes": elastic * (SHARD + 4), "calls": elastic}}
        assert cluster.communicators[r].account() == {"bytes": within["bytes"] + elastic * (SHARD + 4),
                                                      "calls": within["calls"] + elastic}
    # flat SyncAverage with counts sends M + 4 per step: the inter level sends 1/tau of a shard's share of it
    assert opts[0].strategy.account_by_level()["inter"]["bytes"] == steps * (SHARD + 4) // tau
    assert [o.strategy.inter.moving_rate for o in opts] == [alpha] * P


def test_sync_within_and_across_groups_is_the_mean_over_every_rank():
    cluster = SimulatedCluster(P)
    models, opts = ranks_with(cluster, lambda: Hierarchical(SyncAverage(), SyncAverage(), ranks_per_group=N), X0)
    grads = rank_grads(3, seed=1)
    expected = X0.astype(np.float64)
    for g in grads:
        step(cluster, models, opts, g)
        expected = expected - LR * g.astype(np.float64).mean(axis=0)
    got = kernels(models)
    assert all(np.array_equal(k, got[0]) for k in got)
    np.testing.assert_allclose(got[0], expected, rtol=1e-5)
    for opt in opts:  # no counts: the reduce-scatter (with the flag) and the allgather; across, the shard
        assert opt.strategy.account_by_level() == {"intra": {"bytes": intra_bytes(3, 0, columns=1), "calls": 6},
                                                   "inter": {"bytes": 3 * SHARD, "calls": 3}}
        assert opt.strategy.kept_variables() is None


def flat_and_hierarchical(flat, hierarchical, cluster_kwargs, steps=4, counts=None):
    grads = rank_grads(steps, seed=2)
    runs = []
    for make in (flat, hierarchical):
        cluster = SimulatedCluster(P, **cluster_kwargs)
        models, opts = ranks_with(cluster, make, X0)
        for g in grads:
            step(cluster, models, opts, g, counts)
        runs.append((kernels(models), opts, cluster))
    return runs


def test_one_group_is_the_intra_strategy_alone():
    # default groups = hosts; one host of 4 ranks: SyncAverage alone, bit for bit, nothing across groups
    (flat, flat_opts, flat_cluster), (hier, opts, cluster) = flat_and_hierarchical(
        SyncAverage, lambda: Hierarchical(inter=EASGD(2)), {"ranks_per_host": 4}, counts=[1, 2, 3, 4])
    np.testing.assert_array_equal(hier, flat)
    for opt, comm, flat_comm in zip(opts, cluster.communicators, flat_cluster.communicators):
        assert opt.strategy.groups == [[0, 1, 2, 3]]
        levels = opt.strategy.account_by_level()
        assert levels["inter"] == {"bytes": 0, "calls": 0}
        assert levels["intra"] == comm.account() == flat_comm.account() == {"bytes": 4 * (M + 4), "calls": 4}
        assert opt.strategy.kept_variables() is None  # the weights, as SyncAverage keeps


def test_one_rank_per_group_is_the_inter_strategy_alone():
    (flat, flat_opts, flat_cluster), (hier, opts, cluster) = flat_and_hierarchical(
        lambda: EASGD(2, moving_rate=0.125), lambda: Hierarchical(inter=EASGD(2, moving_rate=0.125),
                                                                  ranks_per_group=1), {})
    np.testing.assert_array_equal(hier, flat)
    for opt, flat_opt, comm, flat_comm in zip(opts, flat_opts, cluster.communicators, flat_cluster.communicators):
        np.testing.assert_array_equal(opt.strategy.kept_variables()[0].numpy(),
                                      flat_opt.strategy.kept_variables()[0].numpy())
        levels = opt.strategy.account_by_level()
        assert levels["intra"] == {"bytes": 0, "calls": 0}
        assert levels["inter"] == comm.account() == flat_comm.account() == {"bytes": 2 * (M + 4), "calls": 2}


def test_groups_default_to_hosts_and_inter_sees_the_groups_as_its_ranks():
    cluster = SimulatedCluster(P, ranks_per_host=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default beta = 0.9 over 2 groups: alpha = 0.45, no warning
        strategies = [Hierarchical().bind(c) for c in cluster.communicators]
    assert [s.groups for s in strategies] == [[[0, 1], [2, 3]]] * P
    assert [s.inter.comm.size for s in strategies] == [2] * P and strategies[0].inter.moving_rate == 0.45
    assert [s.inter.comm.rank for s in strategies] == [0, 0, 1, 1]  # its group's index
    assert [s.inter.comm.ranks for s in strategies] == [(0, 2), (1, 3), (0, 2), (1, 3)]  # a set per local index
    # p * alpha < 1 is checked on the groups: alpha = 0.5 is fine at p = 4 ranks but not at 2 groups
    with pytest.warns(UserWarning, match=r"p \* alpha = 1 >= 1 at p=2"):
        Hierarchical(inter=EASGD(moving_rate=0.5)).bind(SimulatedCluster(P, ranks_per_host=2).communicators[0])


def test_groups_are_refused_when_hosts_differ_or_the_size_does_not_divide(monkeypatch):
    comm = SimulatedCluster(P).communicators[0]
    monkeypatch.setattr(type(comm), "host_groups", lambda self: [[0, 1, 2], [3]])
    with pytest.raises(ValueError, match=r"needs the same number of ranks on every host; the hosts run \[3, 1\] "
                                         r"ranks.*Received: ranks_per_group=None"):
        Hierarchical().bind(comm)
    with pytest.raises(ValueError, match=r"`ranks_per_group` must divide the number of ranks p=4\. "
                                         r"Received: ranks_per_group=3"):
        Hierarchical(ranks_per_group=3).bind(SimulatedCluster(P).communicators[0])
    for bad, message in [(dict(intra=EASGD()), "`intra` must be a SyncAverage"),
                         (dict(intra=SyncAverage(clip_norm=1.0)), "`intra` must not clip"),
                         (dict(inter=Hierarchical()), "`inter` must be a SyncStrategy other than Hierarchical"),
                         (dict(inter=GradientAccumulation(2)), "`inter` must not be a GradientAccumulation"),
                         (dict(ranks_per_group=0), "`ranks_per_group` must be an integer >= 1")]:
        with pytest.raises(ValueError, match=message):
            Hierarchical(**bad)


def test_state_resumes_bit_identically_and_the_config_round_trips():
    cluster = SimulatedCluster(P)
    make = lambda: Hierarchical(SyncAverage(), EASGD(3, moving_rate=0.25), ranks_per_group=N)  # noqa: E731
    models, opts = ranks_with(cluster, make, X0)
    grads = rank_grads(6, seed=3)
    for g in grads[:2]:
        step(cluster, models, opts, g)
    def checkpointed(m, opt):  # what checkpoint/store.py saves: the model, the optimizer, the strategy's state
        return m.weights + opt.variables + opt.strategy.state_variables()

    saved = [[v.numpy() for v in checkpointed(m, opt)] for m, opt in zip(models, opts)]
    assert all(any(v is c for v in opt.strategy.state_variables()) for opt in opts for c in opt.strategy.inter.center)
    for g in grads[2:]:  # crosses the elastic step at t = 3 and t = 6
        step(cluster, models, opts, g)
    first = kernels(models), np.stack([o.strategy.inter.center[0].numpy() for o in opts])  # the shards
    for m, opt, values in zip(models, opts, saved):
        for v, value in zip(checkpointed(m, opt), values):
            v.assign(value)
    for g in grads[2:]:
        step(cluster, models, opts, g)
    np.testing.assert_array_equal(kernels(models), first[0])
    np.testing.assert_array_equal(np.stack([o.strategy.inter.center[0].numpy() for o in opts]), first[1])
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(make()))
    assert repr(restored) == repr(make()) and isinstance(restored.inter, EASGD)
    assert restored.inter.period == 3 and restored.ranks_per_group == N
    assert [type(c) for c in restored.children()] == [SyncAverage, EASGD]


def test_a_nan_in_one_group_skips_that_group_and_never_splits_it():
    tau, alpha = 2, 0.25
    cluster = SimulatedCluster(P)
    models, opts = ranks_with(cluster, lambda: Hierarchical(SyncAverage(), EASGD(tau, moving_rate=alpha),
                                                            ranks_per_group=N), X0)
    grads = rank_grads(2, seed=4)
    nan_step = grads[0].copy()
    nan_step[1, 0] = np.nan  # rank 1, in group 0
    step(cluster, models, opts, nan_step)
    step(cluster, models, opts, grads[1])  # the elastic step
    got = kernels(models)
    assert np.isfinite(got).all() and np.array_equal(got[0], got[1]) and np.array_equal(got[2], got[3])
    # group 0 skipped step 1; group 1 took it: the reference with group 0's step-1 gradient zero
    reference_grads = np.stack([nan_step, grads[1]])
    reference_grads[0, [0, 1]] = 0.0
    x, center = easgd_reference(reference_grads, [1] * P, tau, alpha, [[0, 1], [2, 3]])
    np.testing.assert_allclose(got[[0, 2]], x, rtol=1e-5)
    np.testing.assert_allclose(gathered_kept(cluster, opts)[3][0].ravel(), center, rtol=1e-5)
    assert [int(o.strategy.inter.skipped_steps.numpy()) for o in opts] == [1, 1, 0, 0]


def test_accumulation_wraps_hierarchical():
    # k = 2 micro-batches per update: the groups' EASGD sees the window's per-sample mean
    cluster = SimulatedCluster(P)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tau = 1 warns that it communicates every update
        models, opts = ranks_with(cluster, lambda: GradientAccumulation(2, strategy=Hierarchical(
            SyncAverage(), EASGD(1, moving_rate=0.25), ranks_per_group=N)), X0)
    grads = rank_grads(2, seed=5)
    for g in grads:
        step(cluster, models, opts, g, counts=[1, 1, 1, 1])
    x, center = easgd_reference([grads.mean(axis=0)], [1] * P, 1, 0.25, [[0, 1], [2, 3]])
    np.testing.assert_allclose(kernels(models)[[0, 2]], x, rtol=1e-5)
    # one window: one reduce-scatter, the update's allgather, the weights' allgather (tau = 1)
    assert opts[0].strategy.strategy.account_by_level()["intra"]["calls"] == 3


def test_the_command_line_builds_the_inter_strategy_from_its_own_flags():
    from hvd_easgd.app import cli, errors

    strategy = cli.make_strategy(cli.parse_args(["--strategy", "hierarchical", "--tau", "10",
                                                 "--ranks-per-group", "2"]))
    assert isinstance(strategy, Hierarchical) and isinstance(strategy.inter, EASGD)
    assert strategy.inter.period == 10 and strategy.ranks_per_group == 2
    strategy = cli.make_strategy(cli.parse_args(["--strategy", "hierarchical", "--inter", "sync",
                                                 "--fp16-allreduce"]))
    assert type(strategy.inter) is SyncAverage and strategy.inter.compression_name == "fp16"
    with pytest.raises(errors.UsageError, match=r"^--tau is an option of --strategy .*, not --strategy "
                                                r"hierarchical --inter sync$"):
        cli.parse_args(["--strategy", "hierarchical", "--inter", "sync", "--tau", "3"])
    assert "hierarchical" in registry.available()


def test_split_gives_sub_communicators_whose_traffic_the_parent_also_counts():
    cluster = SimulatedCluster(P)
    with pytest.raises(ValueError, match=r"`groups` must be disjoint, non-empty lists of ranks in \[0, 4\)"):
        cluster.communicators[0].split([[0, 1], [1, 2]])
    subs = [c.split([[0, 2], [1, 3]]) for c in cluster.communicators]
    assert [(s.rank, s.size, s.ranks) for s in subs] == [(0, 2, (0, 2)), (0, 2, (1, 3)), (1, 2, (0, 2)),
                                                         (1, 2, (1, 3))]
    assert cluster.communicators[0].split([[0, 2], [1, 3]]) is subs[0]  # made once
    results = cluster.run(lambda r: subs[r].allreduce([tf.constant([float(r)])], op="sum")[0].numpy())
    assert [float(v[0]) for v in results] == [2.0, 4.0, 2.0, 4.0]
    roots = cluster.run(lambda r: subs[r].broadcast([tf.constant([float(r)])], root_rank=1)[0].numpy())
    assert [float(v[0]) for v in roots] == [2.0, 3.0, 2.0, 3.0]
    assert subs[0].account() == cluster.communicators[0].account() == {"bytes": 8, "calls": 2}


def test_the_end_of_training_merge_runs_the_active_level_only():
    # Sharded: EASGD across the 2 groups, 5 steps at tau 2: the kept model (the center's shards gathered) is
    # the groups' mean after the merge; the training state is as it was.
    cluster, models, opts, x, center = sync_within_easgd_across(steps=5)
    before = kernels(models)
    cluster.run(lambda r: hvd_easgd.merge_at_end(models[r], opts[r]))
    for r in range(P):
        np.testing.assert_allclose(hvd_easgd.kept_weights(models[r], opts[r])[0].ravel(), x.mean(axis=0),
                                   rtol=1e-5)
    np.testing.assert_array_equal(kernels(models), before)
    np.testing.assert_allclose(np.stack([k[0].ravel() for k in gathered_kept(cluster, opts)])[0], center, rtol=1e-5)
    # One group of all the ranks: the intra strategy alone, the model's own weights; an inter state left
    # from another layout is never merged into them.
    cluster = SimulatedCluster(N)
    models, opts = ranks_with(cluster, lambda: Hierarchical(SyncAverage(), EASGD(2), ranks_per_group=N), X0)
    for g in rank_grads(3):
        step(cluster, models, opts, g[:N])
    for opt in opts:
        opt.strategy.inter.center[0].assign(tf.zeros_like(opt.strategy.inter.center[0]))
    weights = kernels(models)
    cluster.run(lambda r: hvd_easgd.merge_at_end(models[r], opts[r]))
    for r in range(N):
        np.testing.assert_array_equal(hvd_easgd.kept_weights(models[r], opts[r])[0].ravel(), weights[r])
