"""Overlap δ of the local-update strategies (EASGD, PeriodicAverage) on SimulatedCluster p = 3,
against tests/reference.py's overlap_reference; drain; the account; the refusals."""
import numpy as np
import pytest
import keras
import tensorflow as tf

from hvd_easgd import EASGD, PeriodicAverage
from hvd_easgd.comm import SimulatedCluster
from tests import reference as ref
from tests.least_squares import least_squares_ranks, train

# slow: overlapped runs of several ranks and their resumes: `make test-fast` leaves it out.
pytestmark = [pytest.mark.unit, pytest.mark.slow]

P, TAU, LR, ALPHA, BATCH = 3, 4, 0.1, 0.2, 4


def make(strategy, delta):
    if strategy == "easgd":
        return lambda: EASGD(period=TAU, moving_rate=ALPHA, overlap=delta)
    return lambda: PeriodicAverage(period=TAU, overlap=delta)


def ranks(strategy, delta):
    shards, w0 = ref.least_squares_shards(P)
    cluster = SimulatedCluster(P, timeout=30)
    models, opts = least_squares_ranks(cluster, make(strategy, delta), lambda: keras.optimizers.SGD(LR), w0)
    return cluster, models, opts, shards, w0


def assert_matches(models, opts, xs, center):
    for model, opt, x in zip(models, opts, xs):
        np.testing.assert_allclose(model.layers[0].kernel.numpy().ravel(), x, rtol=1e-5, atol=1e-6)
        if center is not None:
            np.testing.assert_allclose(opt.strategy.center[0].numpy().ravel(), center, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["easgd", "periodic"])
@pytest.mark.parametrize("delta", [1, 2])
def test_overlap_matches_reference(strategy, delta):
    cluster, models, opts, shards, w0 = ranks(strategy, delta)
    train(cluster, models, opts, shards, 10, BATCH)  # 10 = 2τ + 2: two merges, and a start in flight at δ = 2
    xs, center = ref.overlap_reference(strategy, shards, w0, LR, TAU, 10, BATCH, delta, ALPHA)
    assert_matches(models, opts, xs, center)
    # The ranks differ by their own last steps: not a run without overlap.
    plain, _ = ref.overlap_reference(strategy, shards, w0, LR, TAU, 10, BATCH, 0, ALPHA)
    assert not np.allclose(xs[0], plain[0], rtol=1e-4)


@pytest.mark.parametrize("strategy", ["easgd", "periodic"])
def test_drain_merges_in_flight_and_training_continues_as_a_run_drained_there(strategy):
    cluster, models, opts, shards, w0 = ranks(strategy, 2)
    train(cluster, models, opts, shards, 6, BATCH)  # started after step 6 (6 ≡ −2 mod 4), merge due at 8
    assert all(int(o.strategy.pending_handle.numpy()) > 0 for o in opts)
    cluster.run(lambda r: opts[r].strategy.drain())  # what a checkpoint does first
    assert all(int(o.strategy.pending_handle.numpy()) == 0 for o in opts)
    xs, center = ref.overlap_reference(strategy, shards, w0, LR, TAU, 6, BATCH, 2, ALPHA, drain_after=6)
    assert_matches(models, opts, xs, center)
    train(cluster, models, opts, shards, 6, BATCH, start=6)  # nothing merges at 8; 10 starts, 12 merges
    xs, center = ref.overlap_reference(strategy, shards, w0, LR, TAU, 12, BATCH, 2, ALPHA, drain_after=6)
    assert_matches(models, opts, xs, center)


@pytest.mark.parametrize("strategy", ["easgd", "periodic"])
def test_overlap_sends_what_the_blocking_step_sends(strategy):
    accounts = []
    for delta in (0, 1):
        cluster, models, opts, shards, _ = ranks(strategy, delta)
        train(cluster, models, opts, shards, 2 * TAU, BATCH)
        accounts.append([c.account(wire=True) for c in cluster.communicators])
    # Two synchronisations of DIM weights + the flag (float32), one call each.
    assert accounts[0][0] == {"bytes": 2 * 4 * (ref.DIM + 1), "calls": 2, "wire_bytes": pytest.approx(2 * 4 * (ref.DIM + 1) * 4 / 3, rel=1e-12)}
    assert accounts[1] == accounts[0]


def test_finish_of_a_handle_not_in_flight_is_an_error():
    cluster = SimulatedCluster(2, timeout=30)
    tensors = [tf.constant([1.0, 2.0])]
    handles = cluster.run(lambda r: cluster.communicators[r].start_allreduce([t * (r + 1) for t in tensors]))
    sums = cluster.run(lambda r: cluster.communicators[r].finish_allreduce(handles[r], like=tensors))
    np.testing.assert_array_equal(sums[0][0].numpy(), [3.0, 6.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="not in flight"):
        cluster.communicators[0].finish_allreduce(handles[0], like=tensors)


@pytest.mark.parametrize("make_strategy, message", [
    (lambda: EASGD(period=4, overlap=4), "overlap"),
    (lambda: PeriodicAverage(period=4, overlap=-1), "overlap"),
    (lambda: PeriodicAverage(period=4, overlap=1.5), "overlap"),
    (lambda: PeriodicAverage(period=4, overlap=1, compression="int8"), "compression"),
])
def test_overlap_refusals(make_strategy, message):
    with pytest.raises(ValueError, match=message):
        make_strategy()


def test_overlap_true_is_one_and_false_zero():
    assert (EASGD(period=4, overlap=True).overlap, EASGD(period=4, overlap=False).overlap) == (1, 0)


@pytest.mark.parametrize("strategy", ["easgd", "periodic"])
def test_a_checkpoint_mid_overlap_drains_and_resumes_bit_for_bit(strategy, tmp_path):
    from hvd_easgd import checkpoint
    cluster, models, opts, shards, w0 = ranks(strategy, 2)
    train(cluster, models, opts, shards, 6, BATCH)  # in flight: started after step 6
    cluster.run(lambda r: checkpoint.save(str(tmp_path), 1, models[r], opts[r], cluster.communicators[r], {}))
    xs, center = ref.overlap_reference(strategy, shards, w0, LR, TAU, 6, BATCH, 2, ALPHA, drain_after=6)
    assert_matches(models, opts, xs, center)  # the save drained: the saved state is the drained one
    assert all(int(o.strategy.pending_handle.numpy()) == 0 for o in opts)
    manifest, directory = checkpoint.latest(str(tmp_path))
    resumed_cluster, resumed, resumed_opts, _, _ = ranks(strategy, 2)
    resumed_cluster.run(lambda r: checkpoint.restore(directory, manifest, resumed[r], resumed_opts[r],
                                                     resumed_cluster.communicators[r]))
    train(cluster, models, opts, shards, 6, BATCH, start=6)
    train(resumed_cluster, resumed, resumed_opts, shards, 6, BATCH, start=6)
    for a, b in zip(models, resumed):
        np.testing.assert_array_equal(a.layers[0].kernel.numpy(), b.layers[0].kernel.numpy())
    xs, center = ref.overlap_reference(strategy, shards, w0, LR, TAU, 12, BATCH, 2, ALPHA, drain_after=6)
    assert_matches(resumed, resumed_opts, xs, center)
