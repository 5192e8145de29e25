"""Allreduce microbenchmark: Horovod against raw MPI (mpi4py) and a memcpy.

Two questions, two measurements:

* bandwidth: ``hvd.allreduce`` of 1, 16 and 64 MB inside a ``tf.function``,
  as bus bandwidth in nccl-tests' definition, busbw = size/time × 2(n−1)/n
  (what each link of a ring carries, comparable across n);
* latency: one model's gradients (the digits CNN's, ~150 KB in 8 tensors)
  in ONE grouped allreduce inside a ``tf.function``, raw and through
  hvd_easgd's communicator.

Both against mpi4py's ``Allreduce`` on numpy buffers of the same sizes and
``np.copyto`` of the same sizes on one rank. Those references run in their
own small MPI launch (``python -m benchmarks.suite.allreduce --raw``) holding
neither Horovod nor TensorFlow: inside a Horovod process, Horovod's
background thread enters MPI every cycle and would slow mpi4py down.

Each figure is the median of per-call times after warm-up calls;
consecutive collectives line the ranks up, so no barrier runs inside the
timed loop.
"""
import argparse
import sys
import time

import numpy as np

from hvd_easgd import atomic
from hvd_easgd.choosing import cost_model

from .runner import scaled, summary

SIZES_MB = (1, 16, 64)
MB = 1 << 20
# Timed calls per size: enough for a stable median, about a second per size.
ITERATIONS = {1: 60, 16: 20, 64: 10}
QUICK_ITERATIONS = {1: 20, 16: 8, 64: 4}
LATENCY_ITERATIONS, QUICK_LATENCY_ITERATIONS = 200, 60


def busbw(nbytes, seconds, n):
    """nccl-tests' bus bandwidth of an allreduce, in bytes/s (0 for one rank): the algorithm's rate times
    what a ring allreduce puts on each link over its size, the cost model's ``allreduce_link_share``."""
    return nbytes / seconds * cost_model.allreduce_link_share(n)


def call_times(call, iterations, warmup):
    """Seconds of each of ``iterations`` calls of ``call``, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def _us(times):
    """A ``summary`` of call times in µs."""
    return scaled(summary(times), 1e6)


# --- Horovod, inside the benchmark worker ------------------------------------------------------
def horovod(comm, controller, gradient_shapes, quick=False):
    """hvd.allreduce bandwidth and one model's grouped-allreduce latency."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    n = comm.size
    barrier = lambda: comm.allreduce([tf.zeros([1])], op="sum", record=False)  # noqa: E731
    result = {"n": n, "controller": controller, "sizes": [], "gradients": None}
    hvd_sum = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum), jit_compile=False)
    for mb in SIZES_MB:
        nbytes = mb * MB
        x = tf.ones([nbytes // 4], tf.float32)
        barrier()
        t = summary(call_times(lambda: hvd_sum(x), (QUICK_ITERATIONS if quick else ITERATIONS)[mb], warmup=2))
        result["sizes"].append({"mbytes": mb, "bytes": nbytes,
                                "hvd": dict(t, busbw_gbs=busbw(nbytes, t["median"], n) / 1e9)})

    barrier()
    result["gradients"] = gradient_latency(comm, gradient_shapes,
                                           QUICK_LATENCY_ITERATIONS if quick else LATENCY_ITERATIONS)
    return result


def gradient_latency(comm, gradient_shapes, iterations=LATENCY_ITERATIONS, warmup=10):
    """One model's gradients in ONE grouped allreduce inside a ``tf.function``:
    per-call µs raw (``hvd.grouped_allreduce``) and through ``comm.allreduce``
    (which adds the communicator's own ops: compression hooks, no account).

    The two alternate in blocks of ten calls, so that a burst of load from
    elsewhere hits both alike.
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    grads = [tf.ones(shape, tf.float32) for shape in gradient_shapes]
    grouped = tf.function(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Average), jit_compile=False)
    through_comm = tf.function(lambda ts: comm.allreduce(ts, op="average", record=False), jit_compile=False)
    calls = {"hvd_grouped_allreduce_us": lambda: grouped(grads),
             "hvd_easgd_comm_allreduce_us": lambda: through_comm(grads)}
    times = {name: call_times(call, 0, warmup) for name, call in calls.items()}  # warm-up only
    block = 10
    for _ in range(max(1, iterations // block)):
        for name, call in calls.items():
            times[name] += call_times(call, block, 0)
    return dict({"bytes": int(sum(4 * np.prod(shape) for shape in gradient_shapes)), "tensors": len(grads)},
                **{name: _us(t) for name, t in times.items()})


# --- the references, in their own MPI launch ------------------------------------------------------
def raw(gradient_bytes, quick=False):
    """mpi4py Allreduce and rank 0's memcpy at the same sizes (MPI launch, no Horovod)."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    n = world.Get_size()
    out = {"n": n, "mpi_library": MPI.Get_library_version().splitlines()[0].strip(), "sizes": {}, "gradients": {}}

    def measure(nbytes, iterations):
        send = np.ones(nbytes // 4, np.float32)
        recv = np.empty_like(send)
        world.Barrier()
        mpi = summary(call_times(lambda: world.Allreduce(send, recv, op=MPI.SUM), iterations, warmup=2))
        world.Barrier()
        copy = (summary(call_times(lambda: np.copyto(recv, send), iterations, warmup=2)) if world.Get_rank() == 0
                else None)
        world.Barrier()
        return mpi, world.bcast(copy, root=0)  # one process's copy; the others waited

    for mb in SIZES_MB:
        nbytes = mb * MB
        mpi, copy = measure(nbytes, (QUICK_ITERATIONS if quick else ITERATIONS)[mb])
        out["sizes"][str(mb)] = {"mpi4py": dict(mpi, busbw_gbs=busbw(nbytes, mpi["median"], n) / 1e9),
                                 "memcpy": dict(copy, gbs=nbytes / copy["median"] / 1e9)}
    mpi, copy = measure(gradient_bytes, QUICK_LATENCY_ITERATIONS if quick else LATENCY_ITERATIONS)
    out["gradients"] = {"bytes": gradient_bytes,
                        "mpi4py_allreduce_us": scaled(mpi, 1e6), "memcpy_us": scaled(copy, 1e6)}
    return out


def combine(hvd_result, raw_result):
    """Horovod's figures next to the references, with the fractions."""
    combined = dict(hvd_result, sizes=[], mpi4py="measured" if raw_result else "not measured")
    for row in hvd_result["sizes"]:
        row = dict(row)
        ref = (raw_result or {}).get("sizes", {}).get(str(row["mbytes"]))
        if ref:
            row.update(ref)
            row["hvd_fraction_of_mpi4py"] = row["hvd"]["busbw_gbs"] / ref["mpi4py"]["busbw_gbs"]
            row["hvd_fraction_of_memcpy"] = row["hvd"]["busbw_gbs"] / ref["memcpy"]["gbs"]
        combined["sizes"].append(row)
    if raw_result and raw_result["gradients"]["bytes"] == hvd_result["gradients"]["bytes"]:
        combined["gradients"] = dict(hvd_result["gradients"], **{k: raw_result["gradients"][k]
                                                                 for k in ("mpi4py_allreduce_us", "memcpy_us")})
    return combined


def main(argv=None):
    p = argparse.ArgumentParser(description="Raw MPI and memcpy references (run under an MPI launch)")
    p.add_argument("--raw", action="store_true", required=True)
    p.add_argument("--gradient-bytes", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    result = raw(args.gradient_bytes, args.quick)
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        atomic.write_json(args.out, result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
