"""The direct MPI path (``--collectives mpi-direct``) against Horovod, at np = 2.

    python -m benchmarks.studies.direct_path --out results/direct_path.json [--rounds 3]

Arms, each in its own ``mpirun -np 2`` launch (Horovod reads its
tunables once, when it starts), launched round-robin for ``--rounds`` rounds
in a rotating order so that load from elsewhere hits them alike:

* ``horovod``: HorovodCommunicator with hvd_easgd's settings (hvd_easgd.startup.tuning:
  Horovod's 1 ms cycle, Open MPI yielding): the tuned path a job gets;
* ``horovod_cycle_0.1``: the same with HOROVOD_CYCLE_TIME=0.1 (ms), the
  lowest-latency Horovod setting measured;
* ``direct``: DirectMPICommunicator (the C++ ops), Horovod not started; a rank
  that arrives first polls for 1 ms, then naps until the others arrive;
* ``direct_spin``: the same waiting inside MPI's own call, polling throughout
  (HVD_EASGD_MPI_DIRECT_WAIT=spin, the ops' first version);
* ``direct_nap_200us``: naps after 200 us of polling instead of 1 ms;
* ``direct_busy_poll``: the same with Open MPI busy-polling while it waits
  (OMPI_MCA_mpi_yield_when_idle=0) instead of yielding the core.

``--arms`` picks some (default: horovod, direct, direct_spin).

Each launch measures, on the digits CNN's gradients (153 KB in 8 tensors):

* latency: one grouped allreduce through the communicator per
  ``tf.function`` call (median per call), the same call of a function that
  only copies the tensors (TF's own dispatch cost), ``LOOP`` grouped
  allreduces inside one ``tf.function`` (per allreduce, dispatch amortised),
  the same ``LOOP`` allreduces unrolled in one graph (the direct arms only:
  Horovod's path unrolled grew a rank past 12 GB), the loop alone (identity
  ops: TF's cost per iteration), and mpi4py's ``Allreduce`` of the same bytes
  on numpy buffers in the same process;
* throughput: SyncAverage, EASGD tau=10 and no communication (each rank
  alone) on the digits CNN, ``--steps`` steps per timed repeat in
  ``tf.function`` calls of 20 steps, the three interleaved in a rotating
  order, the slowest rank's time.

The driver writes every launch's figures, the load average before and after
each, and the medians (min-max) over launches with the ratios (each a
``benchmarks.suite.runner.summary``); every launch's log goes to ``<--out>.logs/``.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from ..suite import allreduce, runner  # numpy only at import
from ..suite.runner import summary

ARMS = {"horovod": ("horovod", {}),
        "horovod_cycle_0.1": ("horovod", {"HOROVOD_CYCLE_TIME": "0.1"}),
        "direct": ("mpi-direct", {}),
        "direct_spin": ("mpi-direct", {"HVD_EASGD_MPI_DIRECT_WAIT": "spin"}),
        "direct_nap_200us": ("mpi-direct", {"HVD_EASGD_MPI_DIRECT_SPIN_US": "200"}),
        "direct_busy_poll": ("mpi-direct", {"OMPI_MCA_mpi_yield_when_idle": "0"})}
# Variables the arms set: inherited values would make "defaults" mean something else.
ARM_VARIABLES = ("HOROVOD_CYCLE_TIME", "OMPI_MCA_mpi_yield_when_idle", "HVD_EASGD_MPI_DIRECT_WAIT",
                 "HVD_EASGD_MPI_DIRECT_SPIN_US")
LATENCY_CALLS = 300
LOOP = 50
STEPS_PER_CALL = 20
RUNS = ("sync", "easgd_tau10", "no_comm")


# --- one launch ---------------------------------------------------------------------------------
def _per_call_us(call, calls, per=1, warmup=20):
    """Median µs per call of ``call``, divided by ``per`` (the collectives one call runs)."""
    return statistics.median(allreduce.call_times(call, calls, warmup)) * 1e6 / per


def _latency(comm, grads, nbytes, barrier, direct):
    import tensorflow as tf
    from mpi4py import MPI  # MPI is up already (Horovod's or mpi_direct's initialisation)

    grouped = tf.function(lambda ts: comm.allreduce(ts, op="average", record=False))
    copy = tf.function(lambda ts: [tf.identity(t) for t in ts])

    @tf.function
    def looped(ts):
        for _ in tf.range(LOOP):
            ts = comm.allreduce(ts, op="average", record=False)
        return ts

    @tf.function
    def unrolled(ts):  # LOOP allreduces in one graph, no loop: what a step with several collectives runs
        for _ in range(LOOP):
            ts = comm.allreduce(ts, op="average", record=False)
        return ts

    @tf.function
    def looped_copy(ts):  # the loop alone: TF's cost per iteration, to read in_loop_us against
        for _ in tf.range(LOOP):
            ts = [tf.identity(t) for t in ts]
        return ts

    raw_comm = MPI.COMM_WORLD.Dup()
    send = np.ones(nbytes // 4, np.float32)
    recv = np.empty_like(send)
    samples = {}
    for _ in range(2):  # interleaved
        barrier()
        samples.setdefault("comm_us", []).append(_per_call_us(lambda: grouped(grads), LATENCY_CALLS))
        barrier()
        samples.setdefault("copy_fn_us", []).append(_per_call_us(lambda: copy(grads), LATENCY_CALLS))
        barrier()
        samples.setdefault("in_loop_us", []).append(
            _per_call_us(lambda: looped(grads)[0].numpy(), LATENCY_CALLS // LOOP * 2, per=LOOP, warmup=2))
        barrier()
        # Horovod's path is not unrolled: 50 grouped allreduces in one graph grew a rank past 12 GB (OOM-killed).
        unrolled_us = (_per_call_us(lambda: unrolled(grads)[0].numpy(), LATENCY_CALLS // LOOP * 2, per=LOOP, warmup=2)
                       if direct else float("nan"))
        samples.setdefault("unrolled_us", []).append(unrolled_us)
        barrier()
        samples.setdefault("loop_copy_us", []).append(
            _per_call_us(lambda: looped_copy(grads)[0].numpy(), LATENCY_CALLS // LOOP * 2, per=LOOP, warmup=2))
        raw_comm.Barrier()
        samples.setdefault("mpi4py_us", []).append(
            _per_call_us(lambda: raw_comm.Allreduce(send, recv, op=MPI.SUM), LATENCY_CALLS))
    raw_comm.Free()
    return {k: statistics.median(v) for k, v in samples.items()}


def worker(arm, out, steps, repeats, batch=32):
    import hvd_easgd
    from hvd_easgd.startup import runtime

    collectives, _ = ARMS[arm]
    comm = hvd_easgd.init(threads_per_rank=1, collectives=collectives)
    import keras
    import tensorflow as tf

    from ..suite.worker import pre_sharded

    data = hvd_easgd.data.digits()
    barrier = lambda: comm.allreduce([tf.zeros([1])], op="sum", record=False)  # noqa: E731

    keras.utils.set_random_seed(0)
    shapes = [v.shape for v in hvd_easgd.models.build("cnn", data.input_shape, data.num_classes).trainable_variables]
    grads = [tf.ones(s, tf.float32) for s in shapes]
    nbytes = sum(4 * int(np.prod(s)) for s in shapes)
    latency = _latency(comm, grads, nbytes, barrier, collectives == "mpi-direct")

    xs, ys = pre_sharded(data, batch, comm.rank, comm.size, steps)
    chunks = [(tf.constant(xs[i:i + STEPS_PER_CALL]), tf.constant(ys[i:i + STEPS_PER_CALL]))
              for i in range(0, steps, STEPS_PER_CALL)]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def make(name):
        keras.utils.set_random_seed(0)
        model = hvd_easgd.models.build("cnn", data.input_shape, data.num_classes)
        inner = keras.optimizers.SGD(0.05, momentum=0.9)
        strategy = {"sync": hvd_easgd.SyncAverage, "easgd_tau10": lambda: hvd_easgd.EASGD(10)}.get(name)
        if strategy is not None:
            opt = hvd_easgd.DistributedOptimizer(inner, strategy(), comm=comm)
            hvd_easgd.broadcast_initial_state(model, opt)
        else:
            opt = inner
            opt.build(model.trainable_variables)
        variables = model.trainable_variables

        @tf.function(jit_compile=False)
        def run(x, y):
            loss = tf.constant(0.0)
            for i in tf.range(tf.shape(x)[0]):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y[i], model(x[i], training=True))
                opt.apply(tape.gradient(loss, variables), variables)
            return loss

        return run, (opt if strategy is not None else None)

    runs = {name: make(name) for name in RUNS}

    def timed(run, calls):
        """(the slowest rank's wall seconds, the busiest rank's CPU seconds) for ``calls``."""
        barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        for x, y in calls:
            loss = run(x, y)
        float(loss.numpy())
        seconds = comm.allgather_json([time.perf_counter() - start, time.process_time() - cpu_start])
        return max(s[0] for s in seconds), max(s[1] for s in seconds)

    for run, _ in runs.values():
        timed(run, chunks[:2])  # trace and warm up
    samples = {name: [] for name in runs}
    # Per CPU second of the busiest rank: steadier than wall time when load from
    # elsewhere takes the cores (a rank waiting by polling counts, one sleeping does not).
    cpu_samples = {name: [] for name in runs}
    comm.reset_account()
    sync_account = None
    for r in range(repeats):
        order = list(RUNS[r % len(RUNS):] + RUNS[:r % len(RUNS)])
        for name in order:
            before = comm.account()
            seconds, cpu_seconds = timed(runs[name][0], chunks)
            samples[name].append(steps * batch * comm.size / seconds)
            cpu_samples[name].append(steps * batch * comm.size / cpu_seconds)
            if name == "sync" and sync_account is None:
                after = comm.account()
                sync_account = {k: (after[k] - before[k]) / steps for k in after}
    result = {"arm": arm, "np": comm.size, "communicator": type(comm).__name__,
              "horovod_settings": runtime.horovod_settings(),
              "environment": {k: os.environ.get(k) for k in ARM_VARIABLES},
              "gradient_bytes": nbytes, "gradient_tensors": len(grads), "latency": latency,
              "samples_per_sec": samples, "samples_per_cpu_sec": cpu_samples, "sync_account_per_step": sync_account}
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


# --- the driver ----------------------------------------------------------------------------------
def _launch(arm, steps, repeats, timeout, log_path):
    """One ``mpirun -np 2`` launch of ``arm``; its figures, with the load around it."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        path = tmp.name
    # The arm's variables only: inherited values would make "defaults" mean something else.
    env = runner.launch_env(dict(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **ARMS[arm][1]),
                            drop=ARM_VARIABLES)
    cmd = runner.mpirun_launch(2) + [sys.executable, "-m", "benchmarks.studies.direct_path", "--worker", arm,
                                     "--out", path, "--steps", str(steps), "--repeats", str(repeats)]
    load_before = os.getloadavg()
    started = time.time()
    outcome = runner.run_bounded(cmd, log_path, timeout, env)
    if not outcome.ok:
        raise SystemExit(f"{arm} launch: {outcome.why} (log {log_path}):\n{runner.log_tail(log_path, 4000)}")
    with open(path) as f:
        result = json.load(f)
    os.unlink(path)
    result.update(loadavg_before=load_before, loadavg_after=os.getloadavg(), seconds=time.time() - started)
    return result


def _median_rate(launch, run):
    return statistics.median(launch["samples_per_sec"][run])


def drive(out, rounds, steps, repeats, arms, timeout=900):
    launches = []
    logs = f"{out}.logs"
    os.makedirs(logs, exist_ok=True)
    for r in range(rounds):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            result = _launch(arm, steps, repeats, timeout, os.path.join(logs, f"{arm}-round{r}.log"))
            result["round"] = r
            launches.append(result)
            lat = result["latency"]
            print(f"round {r} {arm}: per call {lat['comm_us']:.0f} us (copy fn {lat['copy_fn_us']:.0f}), in loop "
                  f"{lat['in_loop_us']:.0f} us (loop alone {lat['loop_copy_us']:.0f}), unrolled {lat['unrolled_us']:.0f} us, mpi4py {lat['mpi4py_us']:.0f} us; "
                  + ", ".join(f"{run} {_median_rate(result, run):.0f}/s "
                              f"({statistics.median(result['samples_per_cpu_sec'][run]):.0f}/cpu-s)" for run in RUNS)
                  + f"; load {result['loadavg_before'][0]:.1f} -> {result['loadavg_after'][0]:.1f}", flush=True)
    per_arm = {}
    for arm in arms:
        mine = [x for x in launches if x["arm"] == arm]
        s = per_arm[arm] = {f"{k}": summary([x["latency"][k] for x in mine]) for k in mine[0]["latency"]}
        for k in ("in_loop", "unrolled"):
            s[f"{k}_over_mpi4py"] = summary([x["latency"][f"{k}_us"] / x["latency"]["mpi4py_us"] for x in mine])
        for run in RUNS:
            s[f"{run}_samples_per_sec"] = summary([v for x in mine for v in x["samples_per_sec"][run]])
            s[f"{run}_samples_per_cpu_sec"] = summary([v for x in mine for v in x["samples_per_cpu_sec"][run]])
        for run in ("sync", "easgd_tau10"):  # within each launch: same processes, interleaved
            s[f"{run}_over_no_comm"] = summary([_median_rate(x, run) / _median_rate(x, "no_comm") for x in mine])
        s["loadavg_1min"] = summary([x["loadavg_before"][0] for x in mine] + [x["loadavg_after"][0] for x in mine])
        s["sync_account_per_step"] = mine[0]["sync_account_per_step"]
    ratios = {}
    for direct in (a for a in arms if a.startswith("direct")):
        for other in (a for a in arms if a.startswith("horovod")):
            # Paired by round (the launches of one round ran back to back): what load from elsewhere disturbs least.
            per_round = [_median_rate(d, "sync") / _median_rate(o, "sync") for r in range(rounds)
                         for d in launches if d["round"] == r and d["arm"] == direct
                         for o in launches if o["round"] == r and o["arm"] == other]
            ratios[f"sync_{direct}_over_{other}_per_round"] = per_round
            ratios[f"sync_{direct}_over_{other}"] = summary(per_round)
            ratios[f"in_loop_latency_{other}_over_{direct}"] = (per_arm[other]["in_loop_us"]["median"]
                                                                / per_arm[direct]["in_loop_us"]["median"])
            ratios[f"per_call_latency_{other}_over_{direct}"] = (per_arm[other]["comm_us"]["median"]
                                                                 / per_arm[direct]["comm_us"]["median"])
    with open(out, "w") as f:
        json.dump({"launches": launches, "summary": per_arm, "ratios": ratios, "rounds": rounds, "steps": steps,
                   "repeats_per_launch": repeats}, f, indent=1)
    print(json.dumps({"summary": per_arm, "ratios": ratios}, indent=1))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.direct_path",
                                description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--worker", choices=sorted(ARMS), help="(internal) one launch's measurements")
    p.add_argument("--arms", default="horovod,direct,direct_spin", help="comma-separated, of: " + ", ".join(ARMS))
    p.add_argument("--rounds", type=int, default=3, help="launches per arm, round-robin")
    p.add_argument("--steps", type=int, default=200, help="steps per timed throughput repeat (multiple of 20)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats of each throughput run per launch")
    args = p.parse_args(argv)
    if args.steps % STEPS_PER_CALL:
        p.error(f"--steps must be a multiple of {STEPS_PER_CALL}")
    if args.worker:
        return worker(args.worker, args.out, args.steps, args.repeats)
    arms = args.arms.split(",")
    if any(a not in ARMS for a in arms):
        p.error(f"--arms must be among {list(ARMS)}. Received: --arms {args.arms}")
    return drive(args.out, args.rounds, args.steps, args.repeats, arms)


if __name__ == "__main__":
    sys.exit(main())
