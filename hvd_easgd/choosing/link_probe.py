"""The real rate of the link between hosts, measured with one large allreduce.

An allreduce of S bytes across H hosts puts 2(H−1)/H · S bytes on each
host's link (with one rank a host, a ring's 2(n−1)/n · S per rank; with
several, Open MPI's halving/doubling does its within-host steps first). So
the link's rate, seen by the collective, is 2(H−1)/H · S · 8 / t bits/s. It includes every overhead the training steps
pay too (TCP, Horovod's and the controller's framing), which is what makes it
the rate to set against a tc rate.

The per-message latency α comes from a second measurement, a sweep of small
allreduces (8 B to 64 KB) where the bytes take next to no time on the link
(``alpha_sweep``). B and α together calibrate the cost model
(``hvd_easgd/choosing/cost_model.py``; ``python -m benchmarks validate`` checks it).

With several ranks a host, a launch that runs two-level configurations also
probes each level with its own collectives (``levels``): within a host, and
across hosts in the sets a two-level step uses. Their rates are not the flat
allreduce's, which is one pattern among several over the same link.
"""
import time

import numpy as np

WARMUP = 1
TIMED = 2


def measure(comm, megabytes, timed=TIMED, hosts=None, over=None, streams=1):
    """Times ``timed`` allreduces of ``megabytes`` MB of float32 (after ``WARMUP`` untimed ones);
    returns the rate of a host's link in bits/s at the median, with the sizes and times it came from.

    An allreduce of S puts 2(H−1)/H·S on each of ``hosts`` H hosts' links (``cost_model.allreduce_link_share``:
    its within-host steps go first); at one rank a host that is the ring's bus bandwidth, 2(n−1)/n·S.
    ``hosts`` defaults to one a rank.

    ``over``: the sub-communicator (of ``comm``) whose allreduce is timed, default ``comm``. Every rank of
    ``comm`` starts together and the slowest of them is the time, so the sub-communicators of several
    groups run at once, as a two-level step runs them (``levels``); ``streams`` of them share a host's link,
    which carries that many times the one allreduce's bytes."""
    from hvd_easgd.choosing import cost_model  # no TensorFlow

    import tensorflow as tf

    over = over or comm
    size_bytes = int(megabytes * 1e6) // 4 * 4
    tensor = tf.ones([size_bytes // 4], tf.float32)
    seconds = []
    for i in range(WARMUP + timed):
        comm.allreduce([tf.zeros([1])], op="sum", record=False)  # a barrier: start together
        start = time.perf_counter()
        result = over.allreduce([tensor], op="sum", record=False)
        np.asarray(result[0][:1])  # waits for the collective
        if i >= WARMUP:
            seconds.append(max(comm.allgather_json(time.perf_counter() - start)))
    median = float(np.median(seconds))
    hosts = hosts or over.size
    per_host_bytes = streams * cost_model.allreduce_link_share(hosts) * size_bytes
    return {"bytes": size_bytes, "seconds": seconds, "hosts": hosts, "streams": streams,
            "bytes_on_link_per_host": per_host_bytes, "bits_per_second": per_host_bytes * 8 / median,
            "formula": "streams * 2(H-1)/H * bytes * 8 / median seconds (a host's link, H hosts)"}


def levels(comm, megabytes, timed=TIMED, sweep=True):
    """Each level of a two-level step probed by its own collectives, every group at once (``measure``).

    With n ranks a host, Hierarchical's step is a reduce-scatter and an
    allgather within each host, then n allreduces across the hosts, one for
    each index within a host, on 1/n of the payload each, all at once. The
    flat probe times one allreduce over every rank; its pattern (Open MPI's
    halving/doubling, nearest ranks first) puts as many bytes on a host's
    link, but it crossed at another rate (``docs/results/link-transport``).
    So:

    * ``within_host``: an allreduce of ``megabytes`` over each host's ranks,
      every host at once. Its rate is 2(n−1)/n·S/t (``hosts`` = n: the
      reduce-scatter and allgather of the model's within-host level), with
      the ranks of all hosts sharing the cores as they do in a step; and the
      α sweep over the same communicators (no bucket: nothing crosses a
      link), each host's on its own, side by side with the others' but not
      call by call (``sweep=False``: none, ``alpha_sweep`` is None);
    * ``across_hosts``: the n sets {rank j of each host}, each allreducing
      ``megabytes``/n at once, so a host's link carries 2(H−1)/H·S as under
      the flat probe; its rate is that over t.

    None with one rank a host (there is one level), one host, or hosts of unequal ranks (no such sets)."""
    hosts = comm.host_groups()
    n = len(hosts[0])
    if n == 1 or len(hosts) == 1 or any(len(h) != n for h in hosts):
        return None
    host = comm.split(hosts)
    across = comm.split([[h[j] for h in hosts] for j in range(n)])
    within = measure(comm, megabytes, timed, hosts=n, over=host)
    return {"ranks_per_host": n,
            "within_host": dict(within, alpha_sweep=alpha_sweep(host, within["bits_per_second"] / 8, timed=timed,
                                                                 hosts=n) if sweep else None),
            "across_hosts": measure(comm, megabytes / n, timed, hosts=len(hosts), over=across, streams=n)}


# The small-message sweep for α: 8 B to 64 KB, where latency, not bandwidth, dominates.
SWEEP_BYTES = tuple(8 * 4 ** i for i in range(7)) + (65536,)


def tbf_of(qdisc):
    """(rate bytes/s, bucket bytes) of a ``tc tbf`` description ("tbf rate R burst B latency 50ms")."""
    words = qdisc.split()
    return float(words[words.index("rate") + 1]) / 8, float(words[words.index("burst") + 1])


def within_bucket(sizes, seconds, chain, hosts, bucket):
    """``(sizes, seconds)`` of the sweep's points whose chain of ``chain`` allreduces puts at most ``bucket``
    bytes on a host's link.

    A chain larger than a shaped link's token bucket drains it and then waits on the tbf's rate, which
    is the link's bandwidth, not α: at 10 Mbit/s the 32 and 64 KB chains tip the fitted intercept below
    zero. ``bucket=None`` (an unshaped link) keeps every point."""
    from hvd_easgd.choosing import cost_model  # no TensorFlow

    share = cost_model.allreduce_link_share(hosts)
    kept = [(size, t) for size, t in zip(sizes, seconds) if bucket is None or chain * share * size <= bucket]
    return [size for size, _ in kept], [t for _, t in kept]


def fit_alpha(sizes, seconds, hosts):
    """α (seconds per message) and B (bytes/s) from allreduce times across ``hosts`` hosts,
    t(S) = L·α + F·S/B with the cost model's halving/doubling allreduce (the small messages' algorithm):
    L = ``allreduce_latencies(hosts)``, F = ``allreduce_link_share(hosts)``; a least-squares line
    through (S, t): α = intercept/L and B = F/slope."""
    from hvd_easgd.choosing import cost_model  # no TensorFlow

    slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(seconds, float), 1)
    latencies, share = cost_model.allreduce_latencies(hosts), cost_model.allreduce_link_share(hosts)
    return {"alpha": max(float(intercept), 0.0) / latencies,
            "bandwidth": share / float(slope) if slope > 0 else float("inf")}


# Allreduces chained inside one tf.function call: a training step calls its collectives from a graph,
# so α is timed there too, and the call's own dispatch is spread over the chain.
CHAIN = 8
# A pause before each timed call, so that a shaped link's token bucket (tc tbf: 10 ms of its rate, at least
# 64 KB) is full again when the chain starts, as it is when a training step's burst follows its compute:
# 64 KB refill in 52 ms at 10 Mbit/s.
REFILL_SECONDS = 0.1


def _timed_chain(comm, call, tensor, timed):
    """The median over ``timed`` calls (after ``WARMUP``, which traces) of the slowest rank's call, per allreduce."""
    seconds = []
    for i in range(WARMUP + timed):
        time.sleep(REFILL_SECONDS)
        comm.allreduce([tensor[:1] * 0], op="sum", record=False)  # a barrier: start together
        start = time.perf_counter()
        np.asarray(call(tensor)[:1])  # waits for the last collective
        if i >= WARMUP:
            seconds.append(max(comm.allgather_json(time.perf_counter() - start)) / CHAIN)
    return float(np.median(seconds))


def alpha_sweep(comm, bandwidth, sizes=SWEEP_BYTES, timed=TIMED, hosts=None, bucket=None):
    """α across the link, from allreduces of ``sizes`` bytes (8 B to 64 KB) timed inside a tf.function.

    Each timed call runs ``CHAIN`` allreduces one after another (each averages
    the last one's result, so none can start early); a size's time is the
    median over ``timed`` calls of the slowest rank's call, divided by
    ``CHAIN``; each call follows a pause of ``REFILL_SECONDS``. α comes from
    the intercept of ``fit_alpha``'s line over ``hosts`` hosts, through the
    sizes whose chain fits a shaped link's ``bucket`` (``within_bucket``;
    every size if None, or if fewer than two fit). Its slope is not
    the link's B: on the virtual cluster these messages ride tc tbf's bucket
    and leave at the veth pair's own rate, recorded as ``line_bandwidth``;
    ``bandwidth`` is the link probe's B (bytes/s), as given. The result is the
    ``--calibration`` file of ``python -m benchmarks project``
    (``{"alpha", "bandwidth", ...}``).
    """
    import tensorflow as tf

    def chained(tensor):
        for _ in range(CHAIN):
            tensor = comm.allreduce([tensor], op="average", record=False)[0]
        return tensor

    medians = []
    logger, level = tf.get_logger(), tf.get_logger().level
    # One trace a size is the sweep's design, not the retracing TensorFlow warns of (on every rank's stderr).
    logger.setLevel("ERROR")
    try:
        for size in sizes:
            medians.append(_timed_chain(comm, tf.function(chained), tf.ones([max(size // 4, 1)], tf.float32), timed))
    finally:
        logger.setLevel(level)
    hosts = hosts or comm.size
    fitted, fitted_seconds = within_bucket(sizes, medians, CHAIN, hosts, bucket)
    if len(fitted) < 2:
        fitted, fitted_seconds = list(sizes), medians
    fit = fit_alpha(fitted, fitted_seconds, hosts)
    return {"alpha": fit["alpha"], "bandwidth": float(bandwidth), "line_bandwidth": fit["bandwidth"],
            "bytes": list(sizes), "seconds": medians, "fitted_bytes": fitted, "bucket": bucket,
            "ranks": comm.size, "hosts": hosts, "chain": CHAIN,
            "formula": "t(S) = 2*ceil(log2 H)*alpha + 2(H-1)/H*S/B_line, least squares over fitted_bytes "
                       "(H hosts); bandwidth: the link probe's B"}
