"""The benchmark's count of what a hand-written step hands to Horovod.

A stand-in for ``horovod.tensorflow`` (collectives that return their input)
is injected, so the count is checked in one process against hand-counted bytes.
"""
import types

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.suite.collective_count import CollectiveCounter

pytestmark = pytest.mark.unit


def fake_horovod():
    return types.SimpleNamespace(grouped_allreduce=lambda tensors, op=None: list(tensors),
                                 broadcast=lambda tensor, root_rank: tensor, Average="average")


def test_counts_every_executed_call_and_the_bytes_actually_passed():
    hvd = fake_horovod()
    counter = CollectiveCounter(hvd)
    a = tf.ones([2, 3], tf.float32)  # 24 bytes
    b = tf.ones([4], tf.float64)  # 32 bytes

    @tf.function
    def steps(n):
        total = tf.constant(0.0, tf.float64)
        for _ in tf.range(n):
            x, y = hvd.grouped_allreduce([a, b], op=hvd.Average)
            total += tf.reduce_sum(y) + tf.cast(tf.reduce_sum(x), tf.float64)
        return hvd.broadcast(total, root_rank=0)  # one more call, 8 bytes

    with counter.counting():
        np.testing.assert_allclose(steps(tf.constant(3)).numpy(), 3 * (4 + 6))
    assert counter.account()["calls"] == 4 and counter.account()["bytes"] == 3 * (24 + 32) + 8
    steps(tf.constant(2))  # runs the traced step again: counted, though outside the block
    assert counter.account() == {"bytes": 5 * (24 + 32) + 2 * 8, "calls": 5 + 2,
                                 "source": "counted at horovod.tensorflow's collectives"}
    counter.reset()
    assert (counter.account()["bytes"], counter.account()["calls"]) == (0, 0)


def test_a_step_without_collectives_counts_zero_and_the_module_is_restored():
    hvd = fake_horovod()
    original = hvd.grouped_allreduce
    counter = CollectiveCounter(hvd)

    @tf.function
    def local(x):
        return x * 2.0

    with counter.counting():
        assert hvd.grouped_allreduce is not original
        local(tf.ones([3]))
    assert hvd.grouped_allreduce is original
    hvd.grouped_allreduce([tf.ones([5])])  # eager, outside counting(): not a step's traffic
    assert (counter.account()["bytes"], counter.account()["calls"]) == (0, 0)
