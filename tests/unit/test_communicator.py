import numpy as np
import pytest
import tensorflow as tf

from hvd_easgd.comm import Compression, LocalCommunicator

pytestmark = pytest.mark.unit


def test_account_counts_payload_bytes_and_calls_inside_tf_function():
    comm = LocalCommunicator()
    tensors = [tf.ones([10, 3]), tf.ones([7], tf.float64)]

    @tf.function
    def step():
        return comm.allreduce(tensors)

    for _ in range(4):  # traced once, run four times: the account counts runs
        step()
    assert comm.account() == {"bytes": 4 * (30 * 4 + 7 * 8), "calls": 4}


def test_fp16_halves_float32_bytes_and_casts_back():
    comm = LocalCommunicator()
    out = comm.allreduce([tf.fill([100], 1.5)], compression=Compression.fp16)
    assert out[0].dtype == tf.float32
    assert comm.account() == {"bytes": 200, "calls": 1}


def test_dynamic_shapes_are_counted_at_run_time():
    comm = LocalCommunicator()

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def step(x):
        return comm.allreduce([x])

    step(tf.ones([5]))
    step(tf.ones([11]))
    assert comm.account() == {"bytes": 64, "calls": 2}


def test_unrecorded_calls_and_reset():
    comm = LocalCommunicator()
    comm.allreduce([tf.ones([4])], record=False)
    assert comm.account() == {"bytes": 0, "calls": 0}
    comm.allreduce([tf.ones([4])])
    comm.reset_account()
    assert comm.account() == {"bytes": 0, "calls": 0}


def test_broadcast_counts_one_call_per_tensor():
    comm = LocalCommunicator()
    variables = [tf.Variable(np.arange(3, dtype=np.float32)), tf.Variable(np.zeros(2, np.int64))]
    comm.broadcast_variables(variables)
    assert comm.account() == {"bytes": 12 + 16, "calls": 2}


def test_bad_arguments_are_named():
    comm = LocalCommunicator()
    with pytest.raises(ValueError, match="`op` must be one of"):
        comm.allreduce([tf.ones(1)], op="max")
    with pytest.raises(ValueError, match="Received: compression='int8'"):
        Compression.by_name("int8")
    with pytest.raises(ValueError, match="root_rank"):
        comm.broadcast([tf.ones(1)], root_rank=1)


def test_allgather_json_and_agreement_on_one_rank():
    comm = LocalCommunicator()
    assert comm.allgather_json({"a": [1, 2]}) == [{"a": [1, 2]}]
    comm.assert_same_across_ranks("anything", {"k": 1})  # one rank always agrees
