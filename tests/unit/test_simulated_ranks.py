"""Strategy code that depends on p, on p simulated ranks in one process
(SimulatedCluster): each rank has its own model, optimizer and strategy, and
the ranks step in lockstep. Numbers are chosen exact in float32, so the
checks are equalities."""
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import EASGD, GradientAccumulation, SyncAverage
from hvd_easgd.comm import SimulatedCluster

pytestmark = pytest.mark.unit


def ranks_with(cluster, make_strategy, initial, lr=1.0):
    """One Dense(len(initial), no bias) model per rank, rank 0's weights ``initial``
    (the others start elsewhere: the broadcast must fix it), wrapped SGD(lr)."""
    models, opts = [], []
    for comm in cluster.communicators:
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(len(initial), use_bias=False)])
        model.layers[0].kernel.assign(np.reshape(initial, (1, -1)) + 100.0 * comm.rank)
        strategy = make_strategy()
        strategy.bind(comm)  # in the main thread, so warnings reach pytest
        models.append(model)
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(lr), strategy, comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    for comm in cluster.communicators:
        comm.reset_account()
    return models, opts


def kernels(models):
    return np.stack([m.layers[0].kernel.numpy().ravel() for m in models])


def apply_per_rank(cluster, models, opts, grads_by_rank, sample_counts=None):
    def step(r):
        count = None if sample_counts is None else sample_counts[r]
        grad = tf.constant(np.reshape(grads_by_rank[r], (1, -1)), tf.float32)
        opts[r].apply([grad], models[r].trainable_variables, sample_count=count)

    cluster.run(step)


# --- SyncAverage ---------------------------------------------------------------------------
def test_sync_average_divides_the_sum_by_p():
    # param = rank's gradient: every rank applies mean(range(4)) = 1.5, as in PyTorch's averager tests
    cluster = SimulatedCluster(4)
    models, opts = ranks_with(cluster, SyncAverage, [0.0, 0.0, 0.0])
    apply_per_rank(cluster, models, opts, [[float(r)] * 3 for r in range(4)])
    np.testing.assert_array_equal(kernels(models), np.full((4, 3), -1.5))
    for comm in cluster.communicators:
        assert comm.account() == {"bytes": 3 * 4, "calls": 1}


def test_sync_average_weights_each_rank_by_its_sample_count():
    # rank 0: mean 1 over 3 samples; rank 1: mean 5 over 1 sample -> per-sample mean (3 + 5) / 4 = 2
    cluster = SimulatedCluster(2)
    models, opts = ranks_with(cluster, SyncAverage, [0.0])
    apply_per_rank(cluster, models, opts, [[1.0], [5.0]], sample_counts=[3, 1])
    np.testing.assert_array_equal(kernels(models), [[-2.0], [-2.0]])
    # the count travels in the gradients' call: 4 bytes more, no extra call
    assert [c.account() for c in cluster.communicators] == [{"bytes": 8, "calls": 1}] * 2
    # an empty rank (mean NaN over 0 samples) weighs nothing: rank 0's mean 2 is applied, nothing is skipped
    apply_per_rank(cluster, models, opts, [[2.0], [np.nan]], sample_counts=[2, 0])
    np.testing.assert_array_equal(kernels(models), [[-4.0], [-4.0]])
    assert [int(o.strategy.skipped_steps.numpy()) for o in opts] == [0, 0]


def test_accumulation_over_sync_weights_windows_by_samples_across_ranks():
    # k = 2; rank 0: means 1 (2 samples), 3 (2 samples); rank 1: mean 7 (1 sample), then an empty call
    # update = (2*1 + 2*3 + 1*7 + 0) / (2 + 2 + 1 + 0) = 15 / 5 = 3, one call per window
    cluster = SimulatedCluster(2)
    models, opts = ranks_with(cluster, lambda: GradientAccumulation(2), [0.0])
    apply_per_rank(cluster, models, opts, [[1.0], [7.0]], sample_counts=[2, 1])
    apply_per_rank(cluster, models, opts, [[3.0], [np.nan]], sample_counts=[2, 0])
    np.testing.assert_array_equal(kernels(models), [[-3.0], [-3.0]])
    assert [c.account()["calls"] for c in cluster.communicators] == [1, 1]


# --- EASGD ---------------------------------------------------------------------------------
def test_easgd_refuses_beyond_two_over_p_plus_one_and_warns_at_oscillation_and_overshoot():
    comm = SimulatedCluster(4).communicators[0]  # bind needs only p
    with pytest.raises(ValueError, match=r"0 < alpha <= 2/\(p\+1\) = 0\.4 with p=4 ranks.*Received: moving_rate=0\.45"):
        EASGD(moving_rate=0.45).bind(comm)
    with pytest.warns(UserWarning, match=r"alpha = 2/\(p\+1\) = 0\.4 at p=4: .* oscillates"):
        EASGD(moving_rate=0.4).bind(comm)
    with pytest.warns(UserWarning, match=r"p \* alpha = 1\.2 >= 1 at p=4"):
        EASGD(moving_rate=0.3).bind(comm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert EASGD(moving_rate=0.2).bind(comm).moving_rate == 0.2
        assert EASGD().bind(comm).moving_rate == pytest.approx(0.9 / 4)  # the default beta/p never warns
    with pytest.raises(ValueError, match=r"`beta` \(p \* alpha\) must satisfy 0 < beta <= 2p/\(p\+1\) = 1\.6 "
                                         r"with p=4 ranks.*Received: beta=1\.7"):
        EASGD(beta=1.7).bind(comm)


@pytest.mark.parametrize("alpha, factor", [(0.125, 0.5), (0.25, 0.0), (0.5, -1.0)])
def test_easgd_gap_between_mean_and_center_scales_by_one_minus_p_plus_one_alpha(alpha, factor):
    # p = 3: e' = (1 - 4 alpha) e at every elastic step; alpha = 2/(p+1) = 0.5 oscillates without growing
    cluster = SimulatedCluster(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tau = 1 and the oscillation warn; tested elsewhere
        models, opts = ranks_with(cluster, lambda: EASGD(period=1, moving_rate=alpha), [8.0, -8.0])
    for model, x in zip(models, [[0.0, 0.0], [4.0, -4.0], [32.0, -32.0]]):
        model.layers[0].kernel.assign([x])  # different workers; the center stays at rank 0's (8, -8)

    def gap_times_p():  # p (mean(x_i) - x̃) = Σ x_i - p x̃, exact in floating point here
        return kernels(models).sum(axis=0) - 3 * opts[0].strategy.center[0].numpy().ravel()

    gaps = [gap_times_p()]
    for _ in range(3):
        apply_per_rank(cluster, models, opts, [[0.0, 0.0]] * 3)  # zero gradients: the elastic step alone
        gaps.append(gap_times_p())
    for before, after in zip(gaps, gaps[1:]):
        np.testing.assert_array_equal(after, factor * before)
    assert np.all(gaps[0] != 0)


def test_easgd_conserves_center_plus_workers_so_a_common_drift_moves_everyone_at_p_over_p_plus_one():
    # Identical gradients on p = 2 ranks, tau = 2, SGD(1), default alpha = 0.9/p: the elastic step conserves
    # x̃ + Σ x_i, so each period adds exactly p·δ to it (δ = 2 local steps of +1), and once the gap has
    # settled (|1 - (p+1)α| = 0.35 a period) the center and the workers all move p/(p+1)·δ = 4/3 a period:
    # two thirds of what SyncAverage moves (the module docstring's "drag", the language model's EASGD row).
    p, tau = 2, 2
    cluster = SimulatedCluster(p)
    models, opts = ranks_with(cluster, lambda: EASGD(period=tau), [0.0])

    def center():
        return float(opts[0].strategy.center[0].numpy().ravel()[0])

    def total():
        return center() + float(kernels(models).sum())

    totals, centers, workers = [total()], [center()], [kernels(models)[0, 0]]
    for _ in range(40):
        for _ in range(tau):
            apply_per_rank(cluster, models, opts, [[-1.0]] * p)
        totals.append(total())
        centers.append(center())
        workers.append(kernels(models)[0, 0])
    np.testing.assert_allclose(np.diff(totals), p * tau, rtol=1e-6)
    np.testing.assert_allclose(np.diff(centers)[-5:], p / (p + 1) * tau, rtol=1e-5)
    np.testing.assert_allclose(np.diff(workers)[-5:], p / (p + 1) * tau, rtol=1e-5)
    # Where: S = x̃ + p·m and the settled gap e = m − x̃ = cδ/(1 − c), c = 1 − (p+1)α (the center overshoots the
    # workers' mean at pα = 0.9 > p/(p+1)), so x̃ = (S − p·e)/(p+1): 53.68 where SyncAverage would be at 80.
    c = 1 - (p + 1) * 0.9 / p
    gap = c * tau / (1 - c)
    assert centers[-1] == pytest.approx((totals[-1] - p * gap) / (p + 1), abs=1e-3)
    assert centers[-1] == pytest.approx(53.68, abs=0.01)


def test_easgd_center_update_at_p4_with_a_different_x_per_rank():
    # x̃' = (1 - p alpha) x̃ + p alpha mean(x_i) and x_i' = x_i - alpha (x_i - x̃), exactly
    p, alpha = 4, 0.125
    cluster = SimulatedCluster(p)
    x0 = np.array([8.0, 16.0, -4.0, 0.0])
    models, opts = ranks_with(cluster, lambda: EASGD(period=2, moving_rate=alpha), x0)
    grads = [np.array([2.0 * r, -r, 0.5 * r, 4.0 - r]) for r in range(p)]
    apply_per_rank(cluster, models, opts, grads)  # step 1: local SGD only, nothing on the wire
    xs = np.stack([x0 - g for g in grads])
    np.testing.assert_array_equal(kernels(models), xs)
    assert [c.account() for c in cluster.communicators] == [{"bytes": 0, "calls": 0}] * p
    apply_per_rank(cluster, models, opts, [np.zeros(4)] * p)  # step 2: the elastic step
    expected_center = (1 - p * alpha) * x0 + p * alpha * xs.mean(axis=0)
    for opt in opts:
        np.testing.assert_array_equal(opt.strategy.center[0].numpy().ravel(), expected_center)
    np.testing.assert_array_equal(kernels(models), xs - alpha * (xs - x0))
    assert not np.array_equal(expected_center, x0) and len({tuple(x) for x in kernels(models)}) == p
    # one grouped call: the 4 differences and the 4-byte non-finite flag
    assert [c.account() for c in cluster.communicators] == [{"bytes": 4 * 4 + 4, "calls": 1}] * p
