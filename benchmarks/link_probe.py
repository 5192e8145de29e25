"""The real rate of the link between hosts, measured with one large allreduce.

A ring allreduce of S bytes over n ranks makes every rank send, and receive,
2(n−1)/n · S bytes; with one rank per host all of it crosses the host's link.
So the link's rate, seen by the collective, is 2(n−1)/n · S · 8 / t bits/s,
the allreduce's bus bandwidth. It includes every overhead the training steps
pay too (TCP, Horovod's and the controller's framing), which is what makes it
the rate to set against a tc rate.
"""
import time

import numpy as np

WARMUP = 1
TIMED = 2


def measure(comm, megabytes, timed=TIMED):
    """Times ``timed`` allreduces of ``megabytes`` MB of float32 (after ``WARMUP`` untimed ones);
    returns the median's bus bandwidth in bits/s, with the sizes and times it came from."""
    import tensorflow as tf

    size_bytes = int(megabytes * 1e6) // 4 * 4
    tensor = tf.ones([size_bytes // 4], tf.float32)
    seconds = []
    for i in range(WARMUP + timed):
        comm.allreduce([tf.zeros([1])], op="sum", record=False)  # a barrier: start together
        start = time.perf_counter()
        result = comm.allreduce([tensor], op="sum", record=False)
        np.asarray(result[0][:1])  # waits for the collective
        if i >= WARMUP:
            seconds.append(max(comm.allgather_json(time.perf_counter() - start)))
    median = float(np.median(seconds))
    per_rank_bytes = 2 * (comm.size - 1) / comm.size * size_bytes
    return {"bytes": size_bytes, "seconds": seconds, "bytes_on_link_per_rank": per_rank_bytes,
            "bits_per_second": per_rank_bytes * 8 / median,
            "formula": "2(n-1)/n * bytes * 8 / median seconds (ring allreduce bus bandwidth)"}
