"""Baseline: TensorFlow's own MultiWorkerMirroredStrategy, RING collectives.

Keras 3's ``model.fit`` fails under MWMS, so this baseline runs the same
digits CNN in ``tf_keras`` (Keras 2). ``tf_keras`` is installed into the
running venv on first use with ``pip install --no-deps`` (its ``tensorflow``
requirement would pull the full GPU package over our ``tensorflow-cpu``),
and ``TF_USE_LEGACY_KERAS=1`` is set only in the MWMS worker processes.

Workers are plain processes started here with ``TF_CONFIG`` naming
127.0.0.1 ports; each writes its figures to a JSON file. Same data shards
(hvd_easgd's sharding), same per-rank batch, same SGD and learning rate, one
intra-op thread per worker, and the same timing rule as ``fit_variants``
(from the end of the first execution to the end of the epoch).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

from hvd_easgd import _compat, atomic

from . import runner

TF_KERAS = _compat.tf_keras_requirement(_compat.installed_tensorflow_version())


# --- installing tf_keras ------------------------------------------------------------------
def ensure_tf_keras(python=sys.executable, timeout=600):
    """Installs ``tf_keras`` into ``python``'s environment if missing.

    Returns None when it is available, else the reason it is not.
    """
    check = [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('tf_keras') is None)"]
    if subprocess.run(check, timeout=120).returncode == 0:
        return None
    print(f"[mwms] installing {TF_KERAS} with --no-deps (the MWMS baseline needs Keras 2)", flush=True)
    try:
        proc = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--quiet", TF_KERAS],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"pip install {TF_KERAS} timed out after {timeout} s"
    if proc.returncode != 0:
        return f"pip install {TF_KERAS} failed: {proc.stderr.strip()[-500:]}"
    return None


# --- launching workers ------------------------------------------------------------------
def free_ports(count):
    """Ports the kernel just handed out on 127.0.0.1 (released again for the workers)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def launch(num_workers, out_dir, log_path, timeout, worker_args, python=sys.executable):
    """Runs ``num_workers`` MWMS workers on loopback; returns their JSON results.

    Raises RuntimeError (with the log's tail) when a worker fails or the
    launch exceeds ``timeout`` seconds; every worker is ended either way.
    """
    os.makedirs(out_dir, exist_ok=True)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(num_workers)]}
    jobs = [([python, "-m", "benchmarks.suite.mwms", "--worker", "--index", str(index), "--out-dir", out_dir, *worker_args],
             runner.launch_env({"TF_USE_LEGACY_KERAS": "1", "TF_CONFIG": json.dumps(
                 {"cluster": cluster, "task": {"type": "worker", "index": index}})}))
            for index in range(num_workers)]
    outcome = runner.run_bounded(jobs, log_path, timeout)
    if not outcome.ok:
        why = (f"MWMS launch exceeded its {timeout} s timeout" if outcome.status is None
               else "an MWMS worker failed")
        raise RuntimeError(f"{why}; log tail:\n{runner.log_tail(log_path)}")
    return [json.load(open(os.path.join(out_dir, f"worker{i}.json"))) for i in range(num_workers)]


def merge(workers):
    """Per repeat/epoch the slowest worker's time counts, as for Horovod."""
    first = workers[0]
    size = len(workers)
    batch = first["batch_per_rank"]
    timed_steps = first["timed_steps_per_repeat"]
    seconds = [max(w["repeat_seconds"][i] for w in workers) for i in range(len(first["repeat_seconds"]))]
    merged = {"np": size, "samples_per_sec": [timed_steps * batch * size / s for s in seconds],
              "batch_per_rank": batch, "steps_per_repeat": first["steps_per_repeat"],
              "steps_per_execution": first["steps_per_execution"], "timed_steps_per_repeat": timed_steps,
              "trainable_params": first["trainable_params"], "versions": first["versions"],
              "threads": first["threads"], "time_to_accuracy": None, "tta_lr": first.get("tta_lr")}
    if first.get("tta"):
        runs = []
        for s, run in enumerate(first["tta"]):
            epoch_seconds = [max(w["tta"][s]["epoch_seconds"][e] for w in workers)
                             for e in range(len(run["epoch_seconds"]))]
            wall = 0.0
            curve = []
            for e, (sec, acc) in enumerate(zip(epoch_seconds, run["accuracy"])):
                wall += sec
                curve.append({"epoch": e + 1, "seconds": wall, "accuracy": acc})
            runs.append({"seed": run["seed"], "curve": curve})
        merged["time_to_accuracy"] = runs
    return merged


# --- the worker (runs with TF_USE_LEGACY_KERAS=1) ---------------------------------------------
def worker(args):
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    import tf_keras as keras

    from hvd_easgd.app.data import digits, epoch_indices, steps_per_epoch
    from hvd_easgd.app.models import cnn

    from .machine import versions

    rank = args.index
    size = strategy.num_replicas_in_sync
    batch = args.batch
    data = digits()
    n = len(data.y_train)
    per_epoch = steps_per_epoch(n, batch, size)

    def shard(seed, epochs, steps):
        index = np.concatenate([epoch_indices(n, seed, e, rank, size, per_epoch, batch) for e in range(epochs)])
        index = index[: steps * batch]
        return data.x_train[index], data.y_train[index]

    def distributed(x, y):
        # Every worker feeds its own shard: no auto-sharding, batch = per-rank batch.
        return strategy.distribute_datasets_from_function(
            lambda ctx: tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
            .repeat().prefetch(4))

    def build(seed, lr):
        keras.utils.set_random_seed(seed)
        with strategy.scope():
            model = cnn(data.input_shape, data.num_classes, keras_api=keras)
            model.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          steps_per_execution=args.steps_per_call)
        return model

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.started = None

        def on_train_batch_end(self, batch, logs=None):
            if self.started is None:
                self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds = time.perf_counter() - self.started

    out = {"index": rank, "batch_per_rank": batch, "steps_per_repeat": args.steps,
           "steps_per_execution": args.steps_per_call, "timed_steps_per_repeat": args.steps - args.steps_per_call,
           "threads": {"intra_op": 1, "inter_op": args.inter_op_threads}, "versions": versions()}

    # --- throughput: warm-up fit, then timed fits ---
    model = build(0, args.lr)
    out["trainable_params"] = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    ds = distributed(*shard(0, -(-args.steps // per_epoch) + 1, args.steps))
    seconds = []
    for r in range(args.repeats + 1):
        timer = Timer()
        model.fit(ds, epochs=1, steps_per_epoch=args.steps, verbose=0, callbacks=[timer])
        if r:  # the first fit traces: discarded
            seconds.append(timer.seconds)
    out["repeat_seconds"] = seconds

    # --- time to accuracy: trace first, then restore the initial state ---
    if args.tta_seeds:
        evaluator = cnn(data.input_shape, data.num_classes, keras_api=keras)
        out["tta"] = []
        out["tta_lr"] = args.tta_lr
        for seed in range(args.tta_seeds):
            model = build(seed, args.tta_lr)
            initial = model.get_weights()
            model.fit(distributed(*shard(seed, 1, args.steps_per_call)), epochs=1,
                      steps_per_epoch=args.steps_per_call, verbose=0)
            model.set_weights(initial)
            for v in model.optimizer.variables:  # momentum and iterations back to a fresh optimizer's zeros
                v.assign(tf.zeros_like(v))
            accuracy, epoch_seconds = [], []

            class EpochClock(keras.callbacks.Callback):
                def on_epoch_begin(self, epoch, logs=None):
                    self.started = time.perf_counter()

                def on_epoch_end(self, epoch, logs=None):
                    epoch_seconds.append(time.perf_counter() - self.started)  # before evaluating
                    evaluator.set_weights(self.model.get_weights())
                    logits = evaluator(data.x_test, training=False).numpy()
                    accuracy.append(float(np.mean(np.argmax(logits, axis=1) == data.y_test)))

            x, y = shard(seed, args.tta_epochs, args.tta_epochs * per_epoch)
            model.fit(distributed(x, y), epochs=args.tta_epochs, steps_per_epoch=per_epoch, verbose=0,
                      callbacks=[EpochClock()])
            out["tta"].append({"seed": seed, "epoch_seconds": epoch_seconds, "accuracy": accuracy})
            if rank == 0:
                print(f"[mwms] seed {seed}: accuracy {accuracy[-1]:.3f}", flush=True)

    path = os.path.join(args.out_dir, f"worker{rank}.json")
    atomic.write_json(path, out)
    if rank == 0:
        print(f"[mwms] np={size}: repeats {[round(s, 3) for s in seconds]} s", flush=True)
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="MWMS baseline worker (started by benchmarks.suite.compare)")
    p.add_argument("--worker", action="store_true", required=True)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--steps-per-call", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--tta-seeds", type=int, default=0)
    p.add_argument("--tta-epochs", type=int, default=20)
    p.add_argument("--tta-lr", type=float, default=None,
                   help="time-to-accuracy learning rate (compare.py passes SyncAverage's)")
    p.add_argument("--inter-op-threads", type=int, default=1)
    args = p.parse_args(argv)
    if args.tta_seeds and args.tta_lr is None:
        p.error("--tta-seeds needs --tta-lr")
    return args


if __name__ == "__main__":
    sys.exit(worker(parse_args()))
