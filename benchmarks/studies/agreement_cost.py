"""What the stop-request agreement costs: training throughput with it on, divided by without.

``--checkpoint-on-signal TERM`` makes the ranks sum their signal notes in one allreduce of two
float32 every ``--agree-every N`` micro-batches (``callbacks.PeriodicCheckpoint._agree``, the code
``train.py`` runs). Per controller (MPI, Gloo) this starts ONE ``horovodrun -np 2`` job whose ranks
train train.py's default model and data (the digits CNN, SyncAverage, batch 32) with
``model.fit`` three ways: the agreement off, every 10 micro-batches (the default) and every 1,
``--repeats`` times, interleaved (each repeat runs every way once, in a rotated order) in the same
processes, so all ways meet the same load. No checkpoint is written (``every=0``), so only the
agreement differs. Then each rank times the agreement alone, 300 calls. Each configuration's figure is its samples/s divided by that of the run without
the agreement in the same repeat: median (min-max) over the repeats. The machine's load
(``/proc/loadavg``) is printed around each job: the figures are only as good as the machine was quiet.

Usage (root: it enters a loopback-only network namespace, as the tests do)::

    python -m benchmarks.studies.agreement_cost --repeats 5 --epochs 3
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from .digits_cnn import sync_average_cnn
from ..suite.runner import local_launch, log_tail, run_local, spread, summary

VARIANTS = {"off": None, "agree every 10": 10, "agree every 1": 1}
BATCH = 32
AGREEMENT_CALLS = 300


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# --- the worker (one rank of the horovodrun job) -------------------------------------
def worker(out_path, repeats, epochs):
    import hvd_easgd
    from hvd_easgd import callbacks
    from hvd_easgd.startup import runtime
    from hvd_easgd.app.data import steps_per_epoch, training_dataset
    from hvd_easgd.checkpoint.preemption import StopRequests

    comm = runtime.init(threads_per_rank=1)
    data, model, optimizer = sync_average_cnn(comm, 0.02)
    hvd_easgd.broadcast_initial_state(model, optimizer)
    steps = steps_per_epoch(len(data.y_train), BATCH, comm.size)
    run_dir = tempfile.mkdtemp(prefix="agreement-cost-")

    def fit(every):
        # every=0: no checkpoint at epoch ends; the stop requests (never signalled) only switch the agreement on
        checkpointer = callbacks.PeriodicCheckpoint(
            run_dir, comm, {}, every=0, steps_per_epoch=steps,
            stop_requests=StopRequests(("TERM",)) if every else None, check_every=every or 10)
        ds, _ = training_dataset(data, BATCH, 1, comm.rank, comm.size, 0, epochs, steps)
        comm.allgather_json(0)  # both ranks start the clock together
        started = time.perf_counter()
        model.fit(ds, epochs=epochs, steps_per_epoch=steps, callbacks=[checkpointer], verbose=0)
        seconds = time.perf_counter() - started
        return epochs * steps * BATCH * comm.size / seconds

    fit(None)  # warm-up: traces the step
    rows = []
    names = list(VARIANTS)
    for repeat in range(repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            rows.append({"repeat": repeat, "variant": name, "samples_per_sec": fit(VARIANTS[name])})
    # The agreement alone, as the callback runs it between steps: one eager allreduce of 2 float32.
    agreeing = callbacks.PeriodicCheckpoint(run_dir, comm, {}, every=0, steps_per_epoch=steps,
                                            stop_requests=StopRequests(("TERM",)))
    calls = []
    for _ in range(AGREEMENT_CALLS):
        if len(calls) % 50 == 0:
            comm.allgather_json(0)  # re-align the ranks now and then
        started = time.perf_counter()
        agreeing._agree()
        calls.append(time.perf_counter() - started)
    if comm.rank == 0:
        with open(out_path, "w") as f:
            json.dump({"rows": rows, "steps_per_epoch": steps, "agreement_seconds": calls}, f)


# --- the driver ----------------------------------------------------------------------
def one_job(controller, repeats, epochs, timeout):
    work = tempfile.mkdtemp(prefix="agreement-cost-")
    out, log_path = os.path.join(work, "rows.json"), os.path.join(work, "log")
    cmd = local_launch(2, controller) + [sys.executable, "-m", "benchmarks.studies.agreement_cost", "--worker", out,
                                         "--repeats", str(repeats), "--epochs", str(epochs)]
    outcome = run_local(cmd, log_path, timeout)
    if not outcome.ok:
        raise RuntimeError(f"{' '.join(cmd)}: {outcome.why} (log {log_path}):\n{log_tail(log_path, 4000)}")
    with open(out) as f:
        return json.load(f)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.studies.agreement_cost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--worker", metavar="OUT_JSON", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per timed fit")
    parser.add_argument("--controllers", default="mpi,gloo")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per horovodrun job")
    parser.add_argument("--out", default=None, help="also write the raw figures as JSON here")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.repeats, args.epochs)
    from tools import loopback_network

    print(f"network: {loopback_network.enter()}", flush=True)
    results = {}
    for controller in args.controllers.split(","):
        before = load()
        started = time.time()
        results[controller] = one_job(controller, args.repeats, args.epochs, args.timeout)
        results[controller].update(load_before=before, load_after=load(), seconds=time.time() - started)
        print(f"{controller}: {time.time() - started:.0f}s, load {before} -> {load()}", flush=True)
        for row in results[controller]["rows"]:
            print(f"  repeat {row['repeat'] + 1} {row['variant']:15s} {row['samples_per_sec']:8.0f} samples/s",
                  flush=True)
    steps = next(iter(results.values()))["steps_per_epoch"]
    print(f"\nsamples/s with the agreement / without, np=2, digits CNN, {args.epochs} epochs of {steps} "
          f"micro-batches per timed fit, median (min-max) of {args.repeats} interleaved repeats:")
    for controller, result in results.items():
        rows = result["rows"]
        base = {r["repeat"]: r["samples_per_sec"] for r in rows if r["variant"] == "off"}
        line = [f"off {statistics.median(base.values()):.0f} samples/s"]
        for name in list(VARIANTS)[1:]:
            ratios = [r["samples_per_sec"] / base[r["repeat"]] for r in rows if r["variant"] == name]
            line.append(f"{name}: {spread(summary(ratios), 3)}")
        print(f"  {controller}: " + "; ".join(line) + f" (load {result['load_before']} -> {result['load_after']})")
    print(f"\none agreement alone (rank 0, {AGREEMENT_CALLS} calls), against the median micro-batch of the runs "
          "without it; the cost fraction at --agree-every N is about agreement / (N x micro-batch):")
    for controller, result in results.items():
        base = [r["samples_per_sec"] for r in result["rows"] if r["variant"] == "off"]
        step = BATCH * 2 / statistics.median(base)
        calls = sorted(result["agreement_seconds"])
        agreement = statistics.median(calls)
        print(f"  {controller}: agreement median {agreement * 1e6:.0f} us (p10 {calls[len(calls) // 10] * 1e6:.0f}, "
              f"p90 {calls[9 * len(calls) // 10] * 1e6:.0f}); micro-batch {step * 1e3:.1f} ms; "
              f"fraction at N=10: {agreement / (10 * step):.4f}, at N=1: {agreement / step:.4f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
