"""The end-of-training merge (``SyncStrategy.merge_at_end``, ``hvd_easgd.merge_at_end``) on p
simulated ranks, after a step count that is not a multiple of τ: DiLoCo's outer step on the
partial period (fragments too), PeriodicAverage's average, EASGD's center onto the workers'
mean, each against a NumPy reference from the update equations; nothing moves where nothing
is pending, or in a warm-up; and the public merge gives the kept model while leaving the
training state as it was, so training on continues bit for bit."""
import keras
import numpy as np
import pytest

import hvd_easgd
from hvd_easgd import DiLoCo, EASGD, PeriodicAverage, SyncAverage
from hvd_easgd.comm import SimulatedCluster
from tests import least_squares, reference as ref
from tests.least_squares import least_squares_ranks
from tests.unit.test_periodic_diloco import diloco_reference, momentum_sgd, momentum_sgd_ref, periodic_reference

pytestmark = pytest.mark.unit
BATCH = 4
TAU = 4


def ranks(p, make_strategy):
    shards, w0 = ref.least_squares_shards(p)
    cluster = SimulatedCluster(p)
    models, opts = least_squares_ranks(cluster, make_strategy, momentum_sgd, w0)
    return shards, w0, cluster, models, opts


def weights(models):
    return [m.layers[0].kernel.numpy().ravel() for m in models]


def merge(cluster, models, opts):
    """The strategies' own merge (``SyncStrategy.merge_at_end``), which changes the training state;
    ``hvd_easgd.merge_at_end`` runs it and puts the state back (the last tests)."""
    cluster.run(lambda r: opts[r].strategy.merge_at_end())


def assert_close(got, expected):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) <= 1e-5, (got, expected)


def diloco_with_outer(shards, w0, updates):
    """``diloco_reference``'s local weights and θ, with its outer optimizer (its momentum) too."""
    p = len(shards)
    xs, inner = [w0.copy() for _ in range(p)], [momentum_sgd_ref() for _ in range(p)]
    theta, outer = w0.copy(), ref.SGDRef(0.7, 0.7, nesterov=True)
    for step in range(updates):
        xs = [inner[i].step(xs[i], ref.grad(xs[i], *ref.batch(shards[i], step, BATCH))) for i in range(p)]
        if (step + 1) % TAU == 0:
            theta = outer.step(theta, np.mean([theta - x for x in xs], axis=0))
            xs = [theta.copy() for _ in range(p)]
    return xs, theta, outer


@pytest.mark.parametrize("p", [2, 3])
def test_diloco_takes_an_outer_step_on_the_partial_period(p):
    shards, w0, cluster, models, opts = ranks(p, lambda: DiLoCo(TAU))
    least_squares.train(cluster, models, opts, shards, 10, BATCH)  # 2 outer steps, then 2 local steps
    xs, theta, outer = diloco_with_outer(shards, w0, 10)
    assert_close(weights(models)[0], xs[0])
    assert not np.allclose(xs[0], theta)  # the last 2 steps are in the local weights only
    merge(cluster, models, opts)
    expected = outer.step(theta, np.mean([theta - x for x in xs], axis=0))
    for o, got in zip(opts, weights(models)):
        assert_close(o.strategy.kept_variables()[0].numpy().ravel(), expected)
        assert np.array_equal(got, o.strategy.kept_variables()[0].numpy().ravel())  # every rank restarts from θ
    assert all(int(o.strategy.skipped_outer_steps.numpy()) == 0 for o in opts)


def test_diloco_takes_no_step_where_every_fragment_just_synchronised():
    # At a multiple of τ the mean pseudo-gradient is zero; an outer step on it would still move θ
    # by its momentum (μ·m ≠ 0 after 2 outer steps).
    shards, w0, cluster, models, opts = ranks(2, lambda: DiLoCo(TAU))
    least_squares.train(cluster, models, opts, shards, 8, BATCH)
    before = [o.strategy.kept_variables()[0].numpy().copy() for o in opts]
    momentum = [v.numpy().copy() for v in opts[0].strategy.outer_optimizers[0].variables]
    merge(cluster, models, opts)
    assert all(np.array_equal(b, o.strategy.kept_variables()[0].numpy()) for b, o in zip(before, opts))
    assert all(np.array_equal(m, v.numpy()) for m, v in zip(momentum, opts[0].strategy.outer_optimizers[0].variables))


def two_fragment_ranks(make_strategy, p=2):
    """p ranks of a Dense(1) with its bias: two variables, so DiLoCo(fragments=2) puts one in each fragment."""
    shards, _ = ref.least_squares_shards(p)
    cluster = SimulatedCluster(p)
    models, opts = [], []
    for comm in cluster.communicators:
        models.append(keras.Sequential([keras.Input((ref.DIM,)), keras.layers.Dense(1)]))
        opts.append(hvd_easgd.DistributedOptimizer(momentum_sgd(), make_strategy(), comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    return shards, cluster, models, opts


def outer_state(strategy, f=0):
    """Fragment f's θ, outer optimizer variables and error-feedback residuals, copied."""
    residuals = strategy.error_feedbacks[f].residuals if strategy.error_feedbacks[f] is not None else []
    return [v.numpy().copy() for v in [*(strategy.synced[i] for i in strategy.fragment_indices[f]),
                                       *strategy.outer_optimizers[f].variables, *residuals]]


@pytest.mark.parametrize("compression", ["int8", "int4", "topk"])
def test_compressed_diloco_takes_no_step_on_its_residual_where_it_just_synchronised(compression):
    # At a multiple of τ every rank's Δ is zero but its residual e is not: Δ + e would still travel,
    # and an outer step on it would move θ by its mean and by the momentum's μ²·m.
    shards, w0, cluster, models, opts = ranks(2, lambda: DiLoCo(TAU, compression=compression))
    least_squares.train(cluster, models, opts, shards, 8, BATCH)
    assert all(np.any(e.numpy() != 0) for o in opts for e in o.strategy.error_feedbacks[0].residuals)
    before = [outer_state(o.strategy) for o in opts]
    accounts = [comm.account() for comm in cluster.communicators]
    merge(cluster, models, opts)
    for b, o in zip(before, opts):
        assert all(np.array_equal(x, y) for x, y in zip(b, outer_state(o.strategy)))
    assert [comm.account() for comm in cluster.communicators] == accounts  # nothing sent


@pytest.mark.parametrize("overlap", [0, 1], ids=["fragments", "streaming"])
def test_a_fragment_that_just_synchronised_keeps_its_weights_beside_one_that_steps(overlap):
    # F = 2, τ = 4, offsets 0 and 2, int8: after 6 steps fragment 1 synchronised (or started) at the
    # last step and fragment 0 at 4. With overlap, fragment 1's collective in flight is merged
    # first (drain), and that merge is all it gets.
    shards, cluster, models, opts = two_fragment_ranks(lambda: DiLoCo(TAU, fragments=2, overlap=overlap,
                                                                       compression="int8"))
    least_squares.train(cluster, models, opts, shards, 6, BATCH)
    cluster.run(lambda r: opts[r].strategy.drain())
    strategy = opts[0].strategy
    assert [strategy.just_synchronised(f) for f in range(2)] == [False, True]
    before = [outer_state(strategy, f) for f in range(2)]
    merge(cluster, models, opts)
    after = [outer_state(strategy, f) for f in range(2)]
    assert all(np.array_equal(x, y) for x, y in zip(before[1], after[1]))
    assert not np.array_equal(before[0][0], after[0][0])  # fragment 0's θ took its partial period's step


def test_compressed_diloco_steps_on_the_partial_period_with_its_residual():
    # After 10 steps (τ = 4) the partial period's Δ + e travels as int8; θ takes the outer step on
    # the decoded mean, the same on every rank, and the residual becomes this send's error.
    shards, w0, cluster, models, opts = ranks(2, lambda: DiLoCo(TAU, compression="int8"))
    least_squares.train(cluster, models, opts, shards, 10, BATCH)
    strategy = opts[0].strategy
    theta = strategy.synced[0].numpy().copy()
    sent = [theta - m.layers[0].kernel.numpy() + o.strategy.error_feedbacks[0].residuals[0].numpy()
            for m, o in zip(models, opts)]
    momentum = strategy.outer_optimizers[0].variables[2].numpy().copy()
    merge(cluster, models, opts)
    residuals = [o.strategy.error_feedbacks[0].residuals[0].numpy() for o in opts]
    decoded = np.mean([s - e for s, e in zip(sent, residuals)], axis=0)
    m = 0.7 * momentum - 0.7 * decoded
    for o, model in zip(opts, models):
        assert_close(o.strategy.synced[0].numpy(), theta + 0.7 * m - 0.7 * decoded)
        assert np.array_equal(model.layers[0].kernel.numpy(), o.strategy.synced[0].numpy())
    assert np.abs(np.mean(sent, axis=0) - decoded).max() > 0  # int8 did round: the residual is in play


def test_diloco_fragments_each_merge_their_own_partial_period():
    # Two variables (kernel and bias) in two fragments: F = 2, τ = 4, offsets 0 and 2. After 7 steps
    # fragment 0 synchronised at 4 (3 steps pending), fragment 1 at 2 and 6 (1 step pending): both move.
    shards, cluster, models, opts = two_fragment_ranks(lambda: DiLoCo(TAU, fragments=2))
    least_squares.train(cluster, models, opts, shards, 7, BATCH)
    strategy = opts[0].strategy
    assert [len(indices) for indices in strategy.fragment_indices] == [1, 1]
    before = [s.numpy().copy() for s in strategy.synced]
    locals_ = [[v.numpy().copy() for v in m.trainable_variables] for m in models]
    # Each fragment's own Nesterov optimizer (slots: iteration, learning rate, the momentum).
    momenta = [o.variables[2].numpy().copy() for o in strategy.outer_optimizers]
    assert all(np.any(m != 0) for m in momenta)  # both fragments have stepped before
    merge(cluster, models, opts)
    for (i,), momentum in zip(strategy.fragment_indices, momenta):
        delta = np.mean([before[i] - x[i] for x in locals_], axis=0)
        m = 0.7 * momentum - 0.7 * delta
        assert_close(strategy.synced[i].numpy(), before[i] + 0.7 * m - 0.7 * delta)
        assert all(np.array_equal(model.trainable_variables[i].numpy(), strategy.synced[i].numpy())
                   for model in models)


@pytest.mark.parametrize("p", [2, 3])
def test_periodic_average_averages_the_steps_since_its_last_average(p):
    shards, w0, cluster, models, opts = ranks(p, lambda: PeriodicAverage(TAU))
    least_squares.train(cluster, models, opts, shards, 10, BATCH)
    xs = periodic_reference(shards, w0, momentum_sgd_ref, TAU, 10)
    assert len({tuple(w) for w in weights(models)}) == p
    merge(cluster, models, opts)
    got = weights(models)
    assert all(np.array_equal(got[0], w) for w in got[1:])
    assert_close(got[0], np.mean(xs, axis=0))


@pytest.mark.parametrize("p", [2, 3])
def test_easgd_moves_the_center_onto_the_workers_mean(p):
    alpha = 0.9 / p
    shards, w0, cluster, models, opts = ranks(p, lambda: EASGD(TAU))
    least_squares.train(cluster, models, opts, shards, 10, BATCH)
    xs, center = ref.easgd_reference(shards, w0, 0.05, TAU, alpha, 10, BATCH, momentum=0.9)
    assert_close(opts[0].strategy.center[0].numpy().ravel(), center)
    merge(cluster, models, opts)
    # One elastic step at α = 1/p: the center lands on the mean, each worker moves 1/p toward the center.
    mean = np.mean(xs, axis=0)
    for o, x, got in zip(opts, xs, weights(models)):
        assert_close(o.strategy.center[0].numpy().ravel(), mean)
        assert_close(got, x - (x - center) / p)


@pytest.mark.parametrize("make_strategy", [lambda: DiLoCo(TAU, warmup_steps=6), lambda: EASGD(TAU, warmup_steps=6),
                                           lambda: PeriodicAverage(TAU, warmup_steps=6), SyncAverage],
                         ids=["diloco", "easgd", "periodic", "sync"])
def test_nothing_moves_in_a_warmup_or_under_sync_average(make_strategy):
    shards, w0, cluster, models, opts = ranks(2, make_strategy)
    least_squares.train(cluster, models, opts, shards, 5, BATCH)
    before = weights(models)
    accounts = [comm.account() for comm in cluster.communicators]
    merge(cluster, models, opts)
    assert all(np.array_equal(b, a) for b, a in zip(before, weights(models)))
    assert accounts == [comm.account() for comm in cluster.communicators]  # nothing was sent


def test_fit_merges_when_it_ends_with_the_default_callbacks():
    assert isinstance(hvd_easgd.callbacks.defaults()[-1], hvd_easgd.callbacks.MergeAtEnd)
    assert not any(isinstance(c, hvd_easgd.callbacks.MergeAtEnd)
                   for c in hvd_easgd.callbacks.defaults(merge_at_end=False))


def state(models, opts):
    return [[v.numpy().copy() for v in list(m.variables) + o.strategy.state_variables()] for m, o in zip(models, opts)]


def test_the_public_merge_keeps_the_merged_model_and_leaves_the_training_state_as_it_was():
    shards, w0, cluster, models, opts = ranks(2, lambda: DiLoCo(TAU))
    least_squares.train(cluster, models, opts, shards, 10, BATCH)
    xs, theta, outer = diloco_with_outer(shards, w0, 10)
    before = state(models, opts)
    cluster.run(lambda r: hvd_easgd.merge_at_end(models[r], opts[r]))
    after = state(models, opts)
    assert all(np.array_equal(b, a) for rank_b, rank_a in zip(before, after) for b, a in zip(rank_b, rank_a))
    merged = outer.step(theta, np.mean([theta - x for x in xs], axis=0))
    for m, o in zip(models, opts):  # the kept model: the merged θ, swapped in for evaluation and saving
        assert_close(hvd_easgd.kept_weights(m, o)[0].ravel(), merged)
        with hvd_easgd.KeptWeights(m, o):
            assert_close(m.layers[0].kernel.numpy().ravel(), merged)
    # Training on: the same steps as a run never merged, and the kept model is θ again.
    least_squares.train(cluster, models, opts, shards, 2, BATCH, start=10)
    for m, o in zip(models, opts):
        np.testing.assert_array_equal(hvd_easgd.kept_weights(m, o)[0], o.strategy.synced[0].numpy())
    shards, _, straight_cluster, straight_models, straight_opts = ranks(2, lambda: DiLoCo(TAU))
    least_squares.train(straight_cluster, straight_models, straight_opts, shards, 12, BATCH)
    for got, expected in zip(state(models, opts), state(straight_models, straight_opts)):
        assert all(np.array_equal(g, e) for g, e in zip(got, expected))
