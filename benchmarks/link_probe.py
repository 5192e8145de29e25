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


# The small-message sweep for α: 8 B to 64 KB, where latency, not bandwidth, dominates.
SWEEP_BYTES = tuple(8 * 4 ** i for i in range(7)) + (65536,)


def fit_alpha(sizes, seconds, ranks):
    """α (seconds per message) and B (bytes/s) from allreduce times t(S) = 2(p−1)·α + 2(p−1)/p·S/B,
    a least-squares line through (S, t): intercept/(2(p−1)) and slope⁻¹·2(p−1)/p."""
    slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(seconds, float), 1)
    steps = 2 * (ranks - 1)
    return {"alpha": max(float(intercept), 0.0) / steps,
            "bandwidth": steps / ranks / float(slope) if slope > 0 else float("inf")}


def alpha_sweep(comm, sizes=SWEEP_BYTES, timed=TIMED):
    """Times allreduces of each of ``sizes`` bytes (the median of ``timed``, slowest rank) and fits α:
    the ``--calibration`` file of ``python -m benchmarks project`` (``{"alpha", "bandwidth", ...}``)."""
    import tensorflow as tf

    medians = []
    for size in sizes:
        tensor = tf.ones([max(size // 4, 1)], tf.float32)
        seconds = []
        for i in range(WARMUP + timed):
            comm.allreduce([tf.zeros([1])], op="sum", record=False)
            start = time.perf_counter()
            np.asarray(comm.allreduce([tensor], op="sum", record=False)[0][:1])
            if i >= WARMUP:
                seconds.append(max(comm.allgather_json(time.perf_counter() - start)))
        medians.append(float(np.median(seconds)))
    return {**fit_alpha(sizes, medians, comm.size), "bytes": list(sizes), "seconds": medians,
            "formula": "t(S) = 2(p-1)*alpha + 2(p-1)/p*S/B, least squares"}
