"""Where the time of one small grouped allreduce goes, from Horovod's timeline.

``horovodrun -np 2 --mpi|--gloo python -m benchmarks.studies.collective_timeline --out FILE``

Each rank calls hvd_easgd's ``comm.allreduce`` of the digits CNN's gradients
(153 KB in 8 tensors, one grouped call) in a ``tf.function``, with
``HOROVOD_TIMELINE`` and ``HOROVOD_TIMELINE_MARK_CYCLES=1`` set (Horovod
writes the timeline on rank 0 only). Rank 0 then matches each call, by wall
clock, with the timeline: the cycle that handled it (``CYCLE_START``), the
``ALLREDUCE`` of its first tensor and the activities inside it, and splits
the call into

* call → start of the cycle that handles it: TF's dispatch of the ops, the
  enqueue, and the wait for the background thread's next cycle (and for
  the other rank's tensors, if they missed that cycle: ``cycles_begun``
  counts the cycles begun from the call to the one that handled it);
* negotiation: cycle start → ``ALLREDUCE`` begins (the response-cache
  bit-vector allreduce every cycle runs, and the fusion of the responses);
* ``MEMCPY_IN_FUSION_BUFFER``, the MPI/Gloo allreduce, ``MEMCPY_OUT_FUSION_BUFFER``;
* completion: ``ALLREDUCE`` ends → the call returns (the op's callback,
  TF's executor, the return to Python).

A ``tf.function`` returning ``tf.identity`` of the same 8 tensors gives TF's
own dispatch cost for comparison. Settings are hvd_easgd's defaults unless
the environment sets Horovod's variables.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ACTIVITIES = ("MEMCPY_IN_FUSION_BUFFER", "MPI_ALLREDUCE", "GLOO_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER")


def _events(path):
    with open(path) as f:
        events = json.load(f)
    start = next(e["args"]["start_time_since_epoch_in_micros"] for e in events
                 if e.get("pid") == 0 and e.get("name") == "process_name")
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name" and e.get("pid")}
    return events, start, names


def breakdown(timeline_path, calls):
    """Per-call phase durations (µs) from the timeline and the calls' wall-clock spans.

    ``calls``: ``[(start_epoch_us, end_epoch_us)]`` of the timed calls.
    """
    events, start, names = _events(timeline_path)
    cycles = sorted(start + e["ts"] for e in events if e.get("ph") == "i" and e.get("name") == "CYCLE_START")
    first = min(pid for pid, name in names.items() if "grouped_allreduce" in name.lower()
                or "allreduce" in name.lower())
    spans, stack = [], []
    for e in events:  # one tensor's B/E events nest: ALLREDUCE > activity
        if e.get("pid") != first or e.get("ph") not in ("B", "E"):
            continue
        if e["ph"] == "B":
            stack.append((e["name"], start + e["ts"]))
        elif stack:
            name, began = stack.pop()
            spans.append((name, began, start + e["ts"]))
    allreduces = sorted((b, end) for name, b, end in spans if name == "ALLREDUCE")
    rows = []
    for call_start, call_end in calls:
        inside = [(b, e) for b, e in allreduces if call_start <= b and e <= call_end]
        if not inside:
            continue
        b, e = inside[0]
        cycle = max((c for c in cycles if c <= b), default=None)
        if cycle is None or cycle < call_start:
            continue
        # Cycles that began between the call and the one that handled it: more
        # than one means a rank's tensors missed a cycle (the other rank was late).
        waited = sum(1 for c in cycles if call_start <= c <= b)
        row = {"cycles_begun": waited, "call_to_cycle_start": cycle - call_start, "negotiation": b - cycle,
               "completion": call_end - e, "total": call_end - call_start}
        for name, sb, se in spans:
            if name in ACTIVITIES and b <= sb and se <= e:
                row["allreduce_call" if name.endswith("_ALLREDUCE") else name.lower()] = se - sb
        row["allreduce_other"] = (e - b) - sum(row.get(k, 0) for k in ("allreduce_call", "memcpy_in_fusion_buffer",
                                                                          "memcpy_out_fusion_buffer"))
        rows.append(row)
    gaps = [b - a for a, b in zip(cycles, cycles[1:])]
    keys = sorted({k for r in rows for k in r})
    return {"calls_matched": len(rows), "calls": len(calls),
            # Means add up to the mean total (each call's phases add up to its time); medians do not.
            "mean_us": {k: statistics.fmean(r.get(k, 0.0) for r in rows) for k in keys} if rows else {},
            "median_us": {k: statistics.median(r.get(k, 0.0) for r in rows) for k in keys} if rows else {},
            "cycle_period_us": statistics.median(gaps) if gaps else None}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.collective_timeline",
                                description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--iterations", type=int, default=300)
    args = p.parse_args(argv)
    timeline = os.path.join(tempfile.mkdtemp(prefix="hvd-timeline-"), "timeline.json")
    os.environ["HOROVOD_TIMELINE"] = timeline
    os.environ["HOROVOD_TIMELINE_MARK_CYCLES"] = "1"

    import hvd_easgd
    from hvd_easgd.startup import runtime

    comm = hvd_easgd.init(threads_per_rank=1)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    model = hvd_easgd.models.build("cnn", (8, 8, 1), 10)
    grads = [tf.ones(v.shape) for v in model.trainable_variables]
    reduce = tf.function(lambda ts: comm.allreduce(ts, op="average", record=False), jit_compile=False)
    identity = tf.function(lambda ts: [tf.identity(t) for t in ts], jit_compile=False)
    for _ in range(20):
        reduce(grads)
        identity(grads)
    calls, identity_us = [], []
    for _ in range(args.iterations):
        t0 = time.time()
        reduce(grads)
        calls.append((t0 * 1e6, time.time() * 1e6))
        s = time.perf_counter()
        identity(grads)
        identity_us.append((time.perf_counter() - s) * 1e6)
    settings = runtime.horovod_settings()
    hvd.shutdown()  # flushes the timeline
    if comm.rank == 0:
        result = breakdown(timeline, calls)
        result.update(identity_function_us=statistics.median(identity_us), horovod_settings=settings,
                      loadavg=os.getloadavg(), timeline=timeline)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print("mean", json.dumps({k: round(v) for k, v in result["mean_us"].items()}),
              "median", json.dumps({k: round(v) for k, v in result["median_us"].items()}), "cycle period", result["cycle_period_us"], "identity",
              result["identity_function_us"], "matched", result["calls_matched"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
