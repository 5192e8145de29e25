"""Started allreduces on a worker thread (comm/background.py) through the communicator's traced
start/finish (communicator.py), on SimulatedCluster p = 3 against tests/reference.py's overlap_reference;
the worker's order and errors; the timeline's overlap share (comm/timeline.py), worked out by hand."""
import functools
import operator
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from hvd_easgd import EASGD, PeriodicAverage
from hvd_easgd.comm import SimulatedCluster
from hvd_easgd.comm.background import BackgroundReducer, background_off
from hvd_easgd.comm.timeline import Timeline, computing_intervals, overlap_share
from tests import reference as ref
from tests.least_squares import least_squares_ranks, train

pytestmark = pytest.mark.unit

P, TAU, LR, ALPHA, BATCH = 3, 4, 0.1, 0.2, 4


class Wire:
    """Where the ranks' workers meet: each deposits its arrays and gets the rank-ordered sum (a transport
    of the test's own; SimulatedCluster's collectives belong to its ``run``, which the workers outlive)."""

    def __init__(self, size):
        self.barrier = threading.Barrier(size, timeout=30)
        self.deposits = [None] * size

    def allreduce(self, rank, arrays, op):
        self.deposits[rank] = arrays
        self.barrier.wait()
        got = list(self.deposits)
        self.barrier.wait()  # no rank deposits its next arrays before every rank has read these
        sums = [functools.reduce(operator.add, (per_rank[i] for per_rank in got)) for i in range(len(arrays))]
        return sums if op == "sum" else [s / len(got) for s in sums]


def in_background(cluster, threads):
    """Each simulated rank's starts reduce on its own worker, as the Horovod and direct communicators' do;
    ``threads`` collects the worker threads' names."""
    wire = Wire(cluster.size)
    for comm in cluster.communicators:
        def reduce(arrays, op, handle, rank=comm.rank):
            threads.add(threading.current_thread().name)
            return wire.allreduce(rank, arrays, op)

        comm._reduce_in_background(reduce)
        comm.timeline = Timeline()


@pytest.mark.parametrize("strategy", ["easgd", "periodic"])
def test_started_in_background_matches_the_reference_and_accounts_as_blocking(strategy):
    shards, w0 = ref.least_squares_shards(P)
    cluster = SimulatedCluster(P, timeout=30)
    threads = set()
    in_background(cluster, threads)
    make = ((lambda: EASGD(period=TAU, moving_rate=ALPHA, overlap=2)) if strategy == "easgd" else
            (lambda: PeriodicAverage(period=TAU, overlap=2)))
    models, opts = least_squares_ranks(cluster, make, lambda: keras.optimizers.SGD(LR), w0)
    train(cluster, models, opts, shards, 10, BATCH)  # starts after steps 2, 6, 10; merges after 4, 8
    assert threads == {"hvd_easgd-background-allreduce"}  # the collectives ran on the workers
    assert [c.reduces_in_background for c in cluster.communicators] == [True] * P
    cluster.run(lambda r: opts[r].strategy.drain())  # the start of step 10 is merged now
    xs, center = ref.overlap_reference(strategy, shards, w0, LR, TAU, 10, BATCH, 2, ALPHA, drain_after=10)
    for model, opt, x in zip(models, opts, xs):
        np.testing.assert_allclose(model.layers[0].kernel.numpy().ravel(), x, rtol=1e-5, atol=1e-6)
        if center is not None:
            np.testing.assert_allclose(opt.strategy.center[0].numpy().ravel(), center, rtol=1e-5, atol=1e-6)
    for comm in cluster.communicators:
        # 3 starts of (DIM floats + the 4-byte non-finite flag), recorded at the start, as blocking
        assert comm.account() == {"bytes": 3 * (4 * ref.DIM + 4), "calls": 3}
        events = comm.timeline.as_dict()
        assert [c["handle"] for c in events["collectives"]] == [1, 2, 3]
        assert sorted(w["handle"] for w in events["waits"]) == [1, 2, 3]
        assert comm._background.in_flight() == []


def test_the_worker_runs_jobs_in_submission_order_and_hands_back_their_results():
    seen = []

    def reduce(arrays, op, handle):
        time.sleep(0.02 if handle == 1 else 0.0)  # a slow first job must not be overtaken
        seen.append(handle)
        return [a * 10 for a in arrays]

    reducer = BackgroundReducer(reduce)
    source = np.arange(3.0)
    handles = [reducer.submit([source], "sum") for _ in range(3)]
    source[:] = -1  # the job holds a copy, not the caller's buffer
    assert handles == [1, 2, 3]
    assert [reducer.wait(h)[0].tolist() for h in reversed(handles)] == [[0.0, 10.0, 20.0]] * 3
    assert seen == [1, 2, 3]
    with pytest.raises(KeyError, match="allreduce 2 is not in flight"):
        reducer.wait(2)  # waited for already: an error, not a wait


def test_a_job_that_raised_makes_its_wait_raise_and_the_next_jobs_still_run():
    def reduce(arrays, op, handle):
        if handle == 1:
            raise RuntimeError("peer 1 is gone")
        return arrays

    reducer = BackgroundReducer(reduce)
    first, second = reducer.submit([np.ones(2)], "sum"), reducer.submit([np.ones(2)], "sum")
    with pytest.raises(RuntimeError, match="peer 1 is gone"):
        reducer.wait(first)
    assert reducer.wait(second)[0].tolist() == [1.0, 1.0]


def test_a_raised_job_fails_the_traced_finish():
    cluster = SimulatedCluster(2, timeout=30)
    for comm in cluster.communicators:
        comm._reduce_in_background(lambda arrays, op, handle: (_ for _ in ()).throw(RuntimeError("gone")))
    x = tf.ones([2])
    handles = cluster.run(lambda r: cluster.communicators[r].start_allreduce([x]))
    with pytest.raises(tf.errors.OpError, match="gone"):
        cluster.communicators[0].finish_allreduce(handles[0], like=[x])


def test_the_inline_twin_runs_at_the_start_and_records_the_wait_over_the_whole_collective():
    timeline = Timeline()
    reducer = BackgroundReducer(lambda arrays, op, handle: arrays, timeline=lambda: timeline, inline=True)
    handle = reducer.submit([np.ones(1)], "sum")
    events = timeline.as_dict()
    assert events["collectives"][0]["end"] <= events["waits"][0]["end"]
    assert events["waits"][0]["begin"] <= events["collectives"][0]["start"]
    assert reducer.wait(handle)[0].tolist() == [1.0] and len(timeline.waits) == 1  # no second wait record
    assert background_off({"HVD_EASGD_BACKGROUND": "0"}) and not background_off({})


def test_overlap_share_counts_collective_time_while_a_step_computes_outside_its_waits():
    timeline = {
        "steps": [{"begin": 0.0, "end": 10.0}, {"begin": 11.0, "end": 20.0}],
        "waits": [{"handle": 1, "begin": 18.0, "end": 20.0}],
        # runs 5..19: computing in 5..10 and 11..18 (12 of 14); the second runs 30..32, no step (0 of 2)
        "collectives": [{"handle": 1, "submit": 4.0, "start": 5.0, "end": 19.0},
                        {"handle": 2, "submit": 29.0, "start": 30.0, "end": 32.0}],
    }
    assert computing_intervals(timeline) == [[0.0, 10.0], [11.0, 18.0]]
    assert overlap_share(timeline) == pytest.approx(12.0 / 16.0)
    # the blocking path: the step waits over the whole collective
    blocking = {"steps": [{"begin": 0.0, "end": 10.0}], "waits": [{"handle": 1, "begin": 2.0, "end": 6.0}],
                "collectives": [{"handle": 1, "submit": 2.0, "start": 2.0, "end": 6.0}]}
    assert overlap_share(blocking) == 0.0
    assert overlap_share({"steps": [], "waits": [], "collectives": []}) == 0.0


def test_a_compressed_start_travels_compressed_and_its_errors_are_known_at_the_start():
    from hvd_easgd.comm import Compression

    cluster = SimulatedCluster(P, timeout=30)
    in_background(cluster, set())
    values = [np.array([1.0001, -2.5, 3.3333], np.float32) * (r + 1) for r in range(P)]
    started = cluster.run(lambda r: cluster.communicators[r].start_allreduce(
        [tf.constant(values[r])], compression=Compression.fp16, with_errors=True))
    like = [tf.zeros([3])]
    sums = cluster.run(lambda r: cluster.communicators[r].finish_allreduce(started[r][0], like=like))
    halves = [v.astype(np.float16) for v in values]
    expected = (halves[0] + halves[1] + halves[2]).astype(np.float32)  # summed as fp16, in rank order
    for r in range(P):
        assert sums[r][0].dtype == tf.float32
        np.testing.assert_array_equal(sums[r][0].numpy(), expected)
        np.testing.assert_array_equal(started[r][1][0].numpy(), values[r] - halves[r].astype(np.float32))
        assert cluster.communicators[r].account() == {"bytes": 3 * 2, "calls": 1}  # 3 fp16 elements


def test_a_held_start_and_a_background_start_of_the_same_shapes_each_finish_their_own():
    # int8 cannot be summed as it travels: its start reduces at once and is held; the plain start of the
    # same shapes goes to the worker. Each finish takes its own (the path is asked of the worker at run time).
    from hvd_easgd.comm import Compression

    cluster = SimulatedCluster(P, timeout=30)
    in_background(cluster, set())
    values = [tf.constant(np.arange(1.0, 5.0, dtype=np.float32) * (r + 1)) for r in range(P)]

    def both(r):
        comm = cluster.communicators[r]
        held = comm.start_allreduce([values[r]], compression=Compression.int8)
        moving = comm.start_allreduce([values[r]])
        assert comm._background.in_flight() == [int(moving.numpy())]
        return (comm.finish_allreduce(moving, like=[values[r]])[0].numpy(),
                comm.finish_allreduce(held, like=[values[r]])[0].numpy())

    for moving, held in cluster.run(both):
        np.testing.assert_array_equal(moving, np.arange(1.0, 5.0) * 6)  # 1 + 2 + 3 times each
        np.testing.assert_allclose(held, np.arange(1.0, 5.0) * 6, atol=0.2)  # int8's rounding, per rank
