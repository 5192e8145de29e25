"""Each strategy's p-dependent arithmetic at the mission's scale, p = 8 and p = 64 simulated ranks
(SimulatedCluster, one thread a rank, one bare variable each): SyncAverage's average, EASGD's α bound and center update,
Hierarchical's groups, DiLoCo's mean pseudo-gradient (issue 26 §5). The variables are tiny and the
numbers small integers over powers of two, so float32 is exact and the checks are equalities
against NumPy; two or three steps each keep p = 64 well under 2 s a test."""
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import EASGD, DiLoCo, Hierarchical, SyncAverage
from hvd_easgd.comm import SimulatedCluster

# slow: 64 simulated ranks: `make test-fast` leaves it out.
pytestmark = [pytest.mark.unit, pytest.mark.slow]

WIDTH = 2  # elements of the one trainable variable


def ranks_with(cluster, make_strategy, initial, lr=1.0):
    """Per rank one (1, WIDTH) variable at ``initial``, SGD(lr) and its own strategy. A bare variable
    and no initial broadcast (tested at p = 2..4 elsewhere): 64 Keras models would cost seconds."""
    variables, opts = [], []
    for comm in cluster.communicators:
        strategy = make_strategy()
        strategy.bind(comm)  # in the main thread: warnings reach pytest, no collective in a simulated split
        variables.append(keras.Variable(np.reshape(initial, (1, -1)), dtype="float32"))
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(lr), strategy, comm=comm))
    return variables, opts


def step(cluster, variables, opts, grads):
    # the first step builds each optimizer (a collective: the ranks check they hold the same variables)
    cluster.run(lambda r: opts[r].apply([tf.constant(np.reshape(grads[r], (1, -1)), tf.float32)], [variables[r]]))


def kernels(variables):
    return np.stack([np.ravel(v.numpy()) for v in variables])


def integer_grads(p, seed):
    """Small integers: their sum over p ranks and its quotient by p (a power of two) are exact in float32."""
    return np.random.default_rng(seed).integers(-8, 9, size=(p, WIDTH)).astype(np.float64)


X0 = np.array([4.0, -2.0])


# --- SyncAverage ---------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [8, 64])
def test_sync_average_applies_the_mean_over_p_ranks(p):
    cluster = SimulatedCluster(p)
    models, opts = ranks_with(cluster, SyncAverage, X0)
    expected = X0.copy()
    for seed in range(2):
        grads = integer_grads(p, seed)
        step(cluster, models, opts, grads)
        expected -= grads.mean(axis=0)
    got = kernels(models)
    np.testing.assert_array_equal(got, np.tile(expected, (p, 1)))
    assert not np.array_equal(expected, X0 - 2 * integer_grads(p, 0)[0])  # not rank 0's gradient alone
    for comm in cluster.communicators:  # one allreduce of the fp32 gradient a step
        assert comm.account() == {"bytes": 2 * 4 * WIDTH, "calls": 2}


# --- EASGD ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("p, bound, oscillating, overshooting, overshoot_product, refused",
                         [(8, "0.222222", 2 / 9, 0.15, "1.2", 0.23), (64, "0.0307692", 2 / 65, 0.02, "1.28", 0.031)])
def test_easgd_alpha_bound_refuses_and_warns_at_p(p, bound, oscillating, overshooting, overshoot_product, refused):
    comm = SimulatedCluster(p).communicators[0]  # bind needs only p
    assert float(bound) == pytest.approx(2 / (p + 1), rel=1e-5)
    with pytest.raises(ValueError, match=rf"0 < alpha <= 2/\(p\+1\) = {bound} with p={p} ranks.*"
                                         rf"Received: moving_rate={refused}"):
        EASGD(moving_rate=refused).bind(comm)
    with pytest.warns(UserWarning, match=rf"alpha = 2/\(p\+1\) = {bound} at p={p}: .* oscillates"):
        EASGD(moving_rate=oscillating).bind(comm)
    with pytest.warns(UserWarning, match=rf"p \* alpha = {overshoot_product} >= 1 at p={p}"):
        EASGD(moving_rate=overshooting).bind(comm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert EASGD().bind(comm).moving_rate == pytest.approx(0.9 / p)  # the default beta/p: inside, no warning
        assert EASGD(moving_rate=0.5 / p).bind(comm).moving_rate == 0.5 / p


@pytest.mark.parametrize("p", [8, 64])
def test_easgd_center_update_at_p(p):
    # x̃' = x̃ + Σ_i α(x_i − x̃) = (1 − pα) x̃ + pα mean(x_i), and x_i' = x_i − α(x_i − x̃); pα = 1/2
    alpha = 0.5 / p
    cluster = SimulatedCluster(p)
    models, opts = ranks_with(cluster, lambda: EASGD(period=2, moving_rate=alpha), X0)
    grads = integer_grads(p, seed=3)
    step(cluster, models, opts, grads)  # step 1: local SGD only, nothing on the wire
    xs = X0 - grads
    np.testing.assert_array_equal(kernels(models), xs)
    assert [c.account() for c in cluster.communicators] == [{"bytes": 0, "calls": 0}] * p
    step(cluster, models, opts, np.zeros((p, WIDTH)))  # step 2: the elastic step
    expected_center = (1 - p * alpha) * X0 + p * alpha * xs.mean(axis=0)
    for opt in opts:
        np.testing.assert_array_equal(opt.strategy.center[0].numpy().ravel(), expected_center)
    np.testing.assert_array_equal(kernels(models), xs - alpha * (xs - X0))
    assert not np.array_equal(expected_center, X0)
    # one grouped call: the differences and the 4-byte non-finite flag
    assert [c.account() for c in cluster.communicators] == [{"bytes": 4 * WIDTH + 4, "calls": 1}] * p


# --- Hierarchical --------------------------------------------------------------------------------
@pytest.mark.parametrize("p, per_group", [(8, 4), (64, 8)])
def test_hierarchical_groups_average_within_and_take_easgd_steps_across(p, per_group):
    # sync within each group of per_group consecutive ranks; EASGD across the G = p/per_group groups
    # (α = 1/(2G): Gα = 1/2, inside the bound 2/(G+1)), τ = 2
    groups = p // per_group
    alpha = 0.5 / groups
    cluster = SimulatedCluster(p)
    models, opts = ranks_with(cluster, lambda: Hierarchical(SyncAverage(), EASGD(2, moving_rate=alpha),
                                                            ranks_per_group=per_group), X0)
    grads = integer_grads(p, seed=4)
    step(cluster, models, opts, grads)
    step(cluster, models, opts, np.zeros((p, WIDTH)))  # the elastic step across groups
    # reference: group G's model x_G = x0 − mean of its ranks' gradients, then the elastic step
    x = np.stack([X0 - grads[g * per_group:(g + 1) * per_group].mean(axis=0) for g in range(groups)])
    d = alpha * (x - X0)
    expected = np.repeat(x - d, per_group, axis=0)
    got = kernels(models)
    np.testing.assert_array_equal(got, expected)
    assert len({tuple(k) for k in got}) == groups  # one model a group: the groups are the ones asked for
    assert [o.strategy.inter.moving_rate for o in opts] == [alpha] * p
    center = cluster.run(lambda r: [np.array(k) for k in opts[r].strategy.kept_variables()])
    for kept in center:  # the center, gathered within each group: the same on every rank
        np.testing.assert_array_equal(np.ravel(kept[0])[:WIDTH], X0 + d.sum(axis=0))


# --- DiLoCo --------------------------------------------------------------------------------------
@pytest.mark.parametrize("p", [8, 64])
def test_diloco_outer_step_takes_the_mean_pseudo_gradient_over_p(p):
    # τ = 2 local steps, then Δ = mean_i(θ − x_i) and θ ← θ − ηΔ (outer SGD(η = 1/2), no momentum)
    cluster = SimulatedCluster(p)
    models, opts = ranks_with(cluster, lambda: DiLoCo(2, outer_optimizer=keras.optimizers.SGD(0.5)), X0)
    first, second = integer_grads(p, seed=5), integer_grads(p, seed=6)
    step(cluster, models, opts, first)
    np.testing.assert_array_equal(kernels(models), X0 - first)  # local until the τ-th step
    step(cluster, models, opts, second)
    xs = X0 - first - second
    delta = (X0 - xs).mean(axis=0)
    theta = X0 - 0.5 * delta
    np.testing.assert_array_equal(kernels(models), np.tile(theta, (p, 1)))
    assert not np.array_equal(theta, X0 - (X0 - xs[0]) * 0.5)  # not rank 0's pseudo-gradient alone
    for opt in opts:
        np.testing.assert_array_equal(opt.strategy.kept_variables()[0].numpy().ravel(), theta)
    for comm in cluster.communicators:  # one sync: the weights and the non-finite flag
        assert comm.account() == {"bytes": 4 * WIDTH + 4, "calls": 1}
