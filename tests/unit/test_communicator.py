import threading

import numpy as np
import pytest
import tensorflow as tf

from hvd_easgd.comm import (CollectiveMismatchError, Communicator, Compression, LocalCommunicator,
                             RanksDisagreeError, SimulatedCluster)

pytestmark = pytest.mark.unit


class MirroredPair(Communicator):
    """Rank 0 of two ranks that hold the same values: every collective's
    result is known without a peer, so it traces into a ``tf.function``
    (a ``SimulatedCluster`` is eager only) while the account counts as at p = 2."""

    size = 2

    def _grouped_allreduce(self, tensors, op):
        return [t if op == "average" else t + t for t in tensors]

    def _broadcast(self, tensors, root_rank):
        return [tf.identity(t) for t in tensors]

    def _allgather(self, tensor):
        return tf.concat([tensor, tensor], axis=0)


def test_account_counts_payload_bytes_and_calls_inside_tf_function():
    comm = MirroredPair()
    tensors = [tf.ones([10, 3]), tf.ones([7], tf.float64)]

    @tf.function
    def step():
        return comm.allreduce(tensors, op="sum")

    for _ in range(4):  # traced once, run four times: the account counts runs
        out = step()
    assert comm.account() == {"bytes": 4 * (30 * 4 + 7 * 8), "calls": 4}
    assert out[1].numpy().tolist() == [2.0] * 7


def test_fp16_halves_float32_bytes_and_casts_back():
    cluster = SimulatedCluster(2)
    outs = cluster.run(lambda r: cluster.communicators[r].allreduce([tf.fill([100], 1.5 + 0.001 * r)],
                                                                    compression=Compression.fp16)[0])
    for comm, out in zip(cluster.communicators, outs):
        assert out.dtype == tf.float32
        assert out.numpy()[0] == np.float32(np.float16(np.float16(1.5) + np.float16(1.501)) / np.float16(2))
        assert comm.account() == {"bytes": 200, "calls": 1}


def test_dynamic_shapes_are_counted_at_run_time():
    comm = MirroredPair()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def step(x):
        return comm.allreduce([x])

    step(tf.ones([5]))
    step(tf.ones([11]))
    assert comm.account() == {"bytes": 64, "calls": 2}


def test_unrecorded_calls_and_reset():
    comm = MirroredPair()
    comm.allreduce([tf.ones([4])], record=False)
    assert comm.account() == {"bytes": 0, "calls": 0}
    comm.allreduce([tf.ones([4])])
    assert comm.account() == {"bytes": 16, "calls": 1}
    comm.reset_account()
    assert comm.account() == {"bytes": 0, "calls": 0}


def test_broadcast_counts_one_call_per_tensor():
    cluster = SimulatedCluster(2)
    variables = [[tf.Variable(np.arange(3, dtype=np.float32) + r), tf.Variable(np.full(2, r, np.int64))]
                 for r in range(2)]
    cluster.run(lambda r: cluster.communicators[r].broadcast_variables(variables[r]))
    assert [v.numpy().tolist() for v in variables[1]] == [[0.0, 1.0, 2.0], [0, 0]]
    for comm in cluster.communicators:
        assert comm.account() == {"bytes": 12 + 16, "calls": 2}


# --- one rank: no one to talk to --------------------------------------------------------------
@pytest.mark.parametrize("make", [LocalCommunicator, lambda: SimulatedCluster(1).communicators[0]],
                         ids=["local", "simulated-p1"])
def test_one_rank_returns_its_tensors_and_sends_nothing(make):
    comm = make()
    x, y = tf.constant([1.0, 2.0]), tf.constant([3], tf.int64)

    @tf.function
    def step():
        return (comm.allreduce([x, y], op="sum", compression=Compression.fp16) + comm.broadcast([x])
                + [comm.allgather(y)])

    # fp16 would round 1.0001; one rank sends nothing, so nothing is rounded either
    assert comm.allreduce([tf.constant(1.0001)], compression=Compression.fp16)[0].numpy() == np.float32(1.0001)
    for _ in range(3):
        out = step()
    assert [t.numpy().tolist() for t in out] == [[1.0, 2.0], [3], [1.0, 2.0], [3]]
    assert comm.account() == {"bytes": 0, "calls": 0}


def test_bad_arguments_are_named():
    comm = LocalCommunicator()
    with pytest.raises(ValueError, match="`op` must be one of"):
        comm.allreduce([tf.ones(1)], op="max")
    with pytest.raises(ValueError, match="Received: compression='int2'"):  # int8 is a format now (issue 24)
        Compression.by_name("int2")
    with pytest.raises(ValueError, match="root_rank"):
        comm.broadcast([tf.ones(1)], root_rank=1)


def test_allgather_json_on_one_rank():
    assert LocalCommunicator().allgather_json({"a": [1, 2]}) == [{"a": [1, 2]}]


# --- p simulated ranks in one process --------------------------------------------------------
def test_simulated_collectives_combine_each_ranks_own_values():
    cluster = SimulatedCluster(3)

    def collectives(rank):
        comm = cluster.communicators[rank]
        value = tf.fill([2], float(rank))
        summed, averaged = comm.allreduce([value], op="sum")[0], comm.allreduce([value], op="average")[0]
        from_root = comm.broadcast([tf.constant([10.0 * rank])], root_rank=2)[0]
        gathered = comm.allgather(tf.fill([rank + 1], rank))  # ranks send 1, 2, 3 elements
        return summed.numpy().tolist(), averaged.numpy().tolist(), from_root.numpy().tolist(), gathered.numpy().tolist()

    for rank, (summed, averaged, from_root, gathered) in enumerate(cluster.run(collectives)):
        assert summed == [3.0, 3.0] and averaged == [1.0, 1.0]
        assert from_root == [20.0]
        assert gathered == [0, 1, 1, 2, 2, 2]
        # each rank's own account: 2 allreduces of 8 bytes, a 4-byte broadcast, its own (rank+1) int32s gathered
        assert cluster.communicators[rank].account() == {"bytes": 8 + 8 + 4 + 4 * (rank + 1), "calls": 4}


def test_simulated_ranks_calling_different_collectives_fail_instead_of_hanging():
    cluster = SimulatedCluster(2, timeout=5)

    def mismatched(rank):
        comm = cluster.communicators[rank]
        return comm.allreduce([tf.ones([3 + rank])], op="sum")

    with pytest.raises(CollectiveMismatchError, match=r"ranks \[0\]: .*\(3,\).*; ranks \[1\]: .*\(4,\)"):
        cluster.run(mismatched)


def test_a_simulated_rank_that_never_arrives_fails_the_run_within_the_timeout():
    cluster = SimulatedCluster(2, timeout=1)

    def rank_one_skips(rank):
        if rank == 0:
            cluster.communicators[0].allreduce([tf.ones([1])])

    with pytest.raises(RuntimeError, match="did not all reach this collective within 1 s"):
        cluster.run(rank_one_skips)
    # an error on one rank releases the others at once, and the cluster is usable again afterwards
    def rank_zero_fails(rank):
        if rank == 0:
            raise KeyError("rank 0's own error")
        cluster.communicators[1].allreduce([tf.ones([1])])

    with pytest.raises(KeyError, match="rank 0's own error"):
        cluster.run(rank_zero_fails)
    assert cluster.run(lambda rank: rank) == [0, 1]


def test_simulated_collectives_outside_run_are_refused():
    with pytest.raises(RuntimeError, match=r"inside SimulatedCluster\.run"):
        SimulatedCluster(2).communicators[0].allreduce([tf.ones([1])])


def test_ranks_that_disagree_are_named_and_ranks_that_agree_pass():
    cluster = SimulatedCluster(3)

    def check(values):
        def rank_main(rank):
            cluster.communicators[rank].assert_same_across_ranks("the model", {"shape": values[rank], "seed": 1})
        return rank_main

    cluster.run(check([[4, 3], [4, 3], [4, 3]]))  # agree: no error
    with pytest.raises(RanksDisagreeError, match=r"ranks disagree on the model: `shape` differs between "
                                                 r"ranks \[0, 2\]; ranks \[1\]"):
        cluster.run(check([[4, 3], [4, 5], [4, 3]]))


def test_a_simulated_run_that_outlives_its_deadline_fails():
    cluster = SimulatedCluster(2)
    release = threading.Event()
    with pytest.raises(TimeoutError, match=r"simulated ranks \[1\] did not finish within 0\.5 s"):
        cluster.run(lambda rank: rank == 1 and release.wait(10), timeout=0.5)
    release.set()


def test_a_one_rank_horovod_job_issues_no_collective():
    """np = 1 under Horovod: the step no longer pays Horovod's cycle and negotiation."""
    from unittest import mock

    from hvd_easgd.comm import horovod_comm

    fake = mock.MagicMock(name="horovod.tensorflow")
    fake.is_initialized.return_value = True
    for name in ("rank", "local_rank", "cross_rank"):
        getattr(fake, name).return_value = 0
    for name in ("size", "local_size", "cross_size"):
        getattr(fake, name).return_value = 1
    fake.global_process_set.rank.return_value = 0  # the global set: this rank alone
    fake.global_process_set.size.return_value = 1
    with mock.patch.object(horovod_comm, "hvd", fake):
        comm = horovod_comm.HorovodCommunicator()
        x = tf.constant([1.5, -2.0])
        step = tf.function(lambda: comm.allreduce([x], compression=Compression.fp16) + comm.broadcast([x])
                           + [comm.allgather(x)])
        out = step()
    assert [t.numpy().tolist() for t in out] == [[1.5, -2.0]] * 3
    assert not (fake.grouped_allreduce.called or fake.broadcast.called or fake.allgather.called)
    assert comm.account() == {"bytes": 0, "calls": 0}


def test_a_cluster_sums_right_again_after_a_run_a_rank_broke():
    # The sum is made once per collective and shared: a run that a failing rank broke must leave
    # nothing behind that the next run's first collective could return.
    cluster = SimulatedCluster(3)

    def broken(rank):
        total = cluster.communicators[rank].allreduce([tf.constant([float(rank)])], op="sum")
        if rank == 2:
            raise ValueError("rank 2 fails between two collectives")
        return cluster.communicators[rank].allreduce([total[0] + rank], op="sum")

    with pytest.raises(ValueError, match="rank 2 fails"):
        cluster.run(broken)
    got = cluster.run(lambda rank: cluster.communicators[rank].allreduce([tf.constant([10.0 * rank])], op="sum"))
    assert [g[0].numpy().tolist() for g in got] == [[30.0]] * 3
