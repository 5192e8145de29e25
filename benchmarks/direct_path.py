"""The direct MPI path (``--collectives mpi-direct``) against Horovod, at np = 2.

    python -m benchmarks.direct_path --out results/direct_path.json [--rounds 3]

Three variants, each in its own ``mpirun -np 2`` launch (HOROVOD_CYCLE_TIME
is read once, when Horovod starts), launched round-robin for ``--rounds``
rounds in a rotating order so that load from elsewhere hits them alike:

* ``horovod_default``: HorovodCommunicator, Horovod's defaults;
* ``horovod_tuned``: HorovodCommunicator with HOROVOD_CYCLE_TIME=0.1 (ms);
* ``direct``: DirectMPICommunicator, Horovod not started.

Each launch measures, on the digits CNN's gradients (153 KB in 8 tensors):

* latency: one grouped allreduce through the communicator inside a
  ``tf.function`` (median of per-call times), and mpi4py's ``Allreduce`` of
  the same bytes on numpy buffers in the same process (under Horovod its
  background thread shares that MPI);
* throughput: SyncAverage and no communication (each rank alone) on the
  digits CNN, ``--steps`` steps per timed repeat in ``tf.function`` calls of
  20 steps, the two interleaved, the slowest rank's time.

The driver writes every launch's figures, the load average before and after
each, and the medians (min-max) over launches with the ratios the issue asks
for.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

VARIANTS = {"horovod_default": ("horovod", {}),
            "horovod_tuned": ("horovod", {"HOROVOD_CYCLE_TIME": "0.1"}),
            "direct": ("mpi-direct", {})}
LATENCY_CALLS = 300
STEPS_PER_CALL = 20


# --- one launch ---------------------------------------------------------------------------------
def _per_call_us(call, calls, warmup=20):
    for _ in range(warmup):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def worker(variant, out, steps, repeats, batch=32):
    import hvd_easgd

    collectives, _ = VARIANTS[variant]
    comm = hvd_easgd.init(threads_per_rank=1, collectives=collectives)
    import keras
    import tensorflow as tf
    from mpi4py import MPI  # MPI is up already (Horovod's or mpi_direct's initialisation)

    from benchmarks.worker import pre_sharded

    data = hvd_easgd.data.digits()
    barrier = lambda: comm.allreduce([tf.zeros([1])], op="sum", record=False)  # noqa: E731

    # latency: the CNN's gradients in one grouped allreduce, and mpi4py on the same bytes
    keras.utils.set_random_seed(0)
    shapes = [v.shape for v in hvd_easgd.models.build("cnn", data.input_shape, data.num_classes).trainable_variables]
    grads = [tf.ones(s, tf.float32) for s in shapes]
    nbytes = sum(4 * int(np.prod(s)) for s in shapes)
    grouped = tf.function(lambda ts: comm.allreduce(ts, op="average", record=False))
    raw_comm = MPI.COMM_WORLD.Dup()
    send = np.ones(nbytes // 4, np.float32)
    recv = np.empty_like(send)
    latency = {}
    for _ in range(2):  # interleaved: communicator, mpi4py, communicator, mpi4py
        barrier()
        latency.setdefault("comm_us", []).append(_per_call_us(lambda: grouped(grads), LATENCY_CALLS))
        raw_comm.Barrier()
        latency.setdefault("mpi4py_us", []).append(
            _per_call_us(lambda: raw_comm.Allreduce(send, recv, op=MPI.SUM), LATENCY_CALLS))
    latency = {k: statistics.median(v) for k, v in latency.items()}

    # throughput: SyncAverage against each rank alone
    xs, ys = pre_sharded(data, batch, comm.rank, comm.size, steps)
    chunks = [(tf.constant(xs[i:i + STEPS_PER_CALL]), tf.constant(ys[i:i + STEPS_PER_CALL]))
              for i in range(0, steps, STEPS_PER_CALL)]
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def make(name):
        keras.utils.set_random_seed(0)
        model = hvd_easgd.models.build("cnn", data.input_shape, data.num_classes)
        inner = keras.optimizers.SGD(0.05, momentum=0.9)
        if name == "sync":
            opt = hvd_easgd.DistributedOptimizer(inner, hvd_easgd.SyncAverage(), comm=comm)
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

        return run

    runs = {name: make(name) for name in ("sync", "no_comm")}

    def timed(run, calls):
        barrier()
        start = time.perf_counter()
        for x, y in calls:
            loss = run(x, y)
        float(loss.numpy())
        return max(comm.allgather_json(time.perf_counter() - start))

    for run in runs.values():
        timed(run, chunks[:2])  # trace and warm up
    samples = {name: [] for name in runs}
    comm.reset_account()
    for r in range(repeats):
        for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
            seconds = timed(runs[name], chunks)
            samples[name].append(steps * batch * comm.size / seconds)
    account = comm.account()
    result = {"variant": variant, "np": comm.size, "communicator": type(comm).__name__,
              "horovod_cycle_time": os.environ.get("HOROVOD_CYCLE_TIME"), "gradient_bytes": nbytes,
              "gradient_tensors": len(grads), "latency": latency, "samples_per_sec": samples,
              "sync_bytes_per_step": account["bytes"] / (steps * repeats),
              "sync_calls_per_step": account["calls"] / (steps * repeats)}
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


# --- the driver ----------------------------------------------------------------------------------
def _summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def _median_sync(launches, round_, variant):
    return statistics.median(next(x for x in launches if x["round"] == round_ and x["variant"] == variant)
                             ["samples_per_sec"]["sync"])


def drive(out, rounds, steps, repeats, timeout=600):
    launches = []
    names = list(VARIANTS)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for variant in order:
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
                path = tmp.name
            env = {k: v for k, v in os.environ.items() if k != "HOROVOD_CYCLE_TIME"}  # defaults mean defaults
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", TF_CPP_MIN_LOG_LEVEL="2",
                       PYTHONPATH=os.getcwd(), **VARIANTS[variant][1])
            cmd = ["mpirun", "-np", "2", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo",
                   sys.executable, "-m", "benchmarks.direct_path", "--worker", variant, "--out", path,
                   "--steps", str(steps), "--repeats", str(repeats)]
            load_before = os.getloadavg()
            started = time.time()
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                                  start_new_session=True)
            if proc.returncode:
                raise SystemExit(f"{variant} launch failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
            with open(path) as f:
                result = json.load(f)
            os.unlink(path)
            result.update(round=r, loadavg_before=load_before, loadavg_after=os.getloadavg(),
                          seconds=time.time() - started)
            launches.append(result)
            print(f"round {r} {variant}: comm {result['latency']['comm_us']:.0f} us, mpi4py "
                  f"{result['latency']['mpi4py_us']:.0f} us, sync {statistics.median(result['samples_per_sec']['sync']):.0f}"
                  f"/s, no_comm {statistics.median(result['samples_per_sec']['no_comm']):.0f}/s, "
                  f"load {load_before[0]:.1f}", flush=True)
    summary = {}
    for variant in names:
        mine = [x for x in launches if x["variant"] == variant]
        summary[variant] = {
            "comm_latency_us": _summary([x["latency"]["comm_us"] for x in mine]),
            "mpi4py_latency_us": _summary([x["latency"]["mpi4py_us"] for x in mine]),
            "comm_over_mpi4py": _summary([x["latency"]["comm_us"] / x["latency"]["mpi4py_us"] for x in mine]),
            "sync_samples_per_sec": _summary([v for x in mine for v in x["samples_per_sec"]["sync"]]),
            "no_comm_samples_per_sec": _summary([v for x in mine for v in x["samples_per_sec"]["no_comm"]]),
            "loadavg_1min": _summary([x["loadavg_before"][0] for x in mine] + [x["loadavg_after"][0] for x in mine]),
        }
        s = summary[variant]
        s["sync_over_no_comm"] = s["sync_samples_per_sec"]["median"] / s["no_comm_samples_per_sec"]["median"]
    direct = summary["direct"]
    ratios = {
        "direct_latency_over_mpi4py_in_direct_process": direct["comm_over_mpi4py"]["median"],
        "sync_direct_over_horovod_tuned": direct["sync_samples_per_sec"]["median"]
        / summary["horovod_tuned"]["sync_samples_per_sec"]["median"],
        "sync_direct_over_horovod_default": direct["sync_samples_per_sec"]["median"]
        / summary["horovod_default"]["sync_samples_per_sec"]["median"],
        "latency_horovod_tuned_over_direct": summary["horovod_tuned"]["comm_latency_us"]["median"]
        / direct["comm_latency_us"]["median"],
    }
    # Paired by round (launches of one round ran back to back): the ratio the
    # load from elsewhere disturbs least.
    ratios["sync_direct_over_horovod_tuned_per_round"] = [
        _median_sync(launches, r, "direct") / _median_sync(launches, r, "horovod_tuned") for r in range(rounds)]
    with open(out, "w") as f:
        json.dump({"launches": launches, "summary": summary, "ratios": ratios, "rounds": rounds, "steps": steps,
                   "repeats_per_launch": repeats}, f, indent=1)
    print(json.dumps({"summary": summary, "ratios": ratios}, indent=1))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--worker", choices=sorted(VARIANTS), help="(internal) one launch's measurements")
    p.add_argument("--rounds", type=int, default=3, help="launches per variant, round-robin")
    p.add_argument("--steps", type=int, default=200, help="steps per timed throughput repeat (multiple of 20)")
    p.add_argument("--repeats", type=int, default=4, help="timed repeats of each throughput run per launch")
    args = p.parse_args(argv)
    if args.steps % STEPS_PER_CALL:
        p.error(f"--steps must be a multiple of {STEPS_PER_CALL}")
    if args.worker:
        return worker(args.worker, args.out, args.steps, args.repeats)
    return drive(args.out, args.rounds, args.steps, args.repeats)


if __name__ == "__main__":
    sys.exit(main())
