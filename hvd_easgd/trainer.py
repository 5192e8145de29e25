"""The training job behind train.py: run directory, model, strategy, fit, save.

Only rank 0 prints progress and writes shared files (config.yaml,
metrics.json, tensorboard/, model.keras, checkpoint manifests); every rank
writes its own checkpoint shard.
"""
import json
import os
import socket
import sys
import time

import keras
import tensorflow as tf
import yaml

from . import _compat, callbacks, checkpoint, models, runtime
from .cli import UsageError, config_differences, default_run_dir, make_strategy
from .data import DataError, steps_per_epoch, test_dataset, training_dataset
from .kept_model import save_kept_model
from .optimizer import DistributedOptimizer


def _inner_optimizer(args, size, updates_per_epoch):
    lr = args.lr
    if args.scale_lr:
        target = args.lr * size
        warmup = int(round(args.lr_warmup_epochs * updates_per_epoch))
        if warmup > 0:
            # A built-in schedule keeps model.keras loadable by plain Keras:
            # linear warm-up from lr to lr*size, then constant (alpha=1).
            lr = keras.optimizers.schedules.CosineDecay(args.lr, decay_steps=1, alpha=1.0,
                                                        warmup_target=target, warmup_steps=warmup)
        else:
            lr = target
    if args.optimizer == "adam":
        return keras.optimizers.Adam(lr)
    if args.optimizer == "sgd":
        return keras.optimizers.SGD(lr)
    return keras.optimizers.SGD(lr, momentum=args.momentum, nesterov=args.optimizer == "nesterov")


def _resolve_run_dir(args, comm):
    """Rank 0 names the run directory; the other ranks take its name."""
    name = args.run_dir or default_run_dir(args.strategy)
    return comm.allgather_json(name)[0] if comm.size > 1 else name


SHARED_CHECK_SECONDS = 5  # how long a rank looks for rank 0's token (network file systems cache lookups)


def _check_run_dir_is_shared(run_dir, comm, create):
    """Stops the run, before any checkpoint, unless every rank sees what rank 0 writes in ``run_dir``.

    Why: with a node-local run directory (scratch on each host) the run splits
    silently: rank 0's manifests list shards that exist only on other hosts,
    their checkpoints are never pruned, and --resume fails late. Rank 0 writes
    a token there; every rank looks for it.
    """
    if comm.size == 1:
        return
    token = None
    if comm.rank == 0 and (create or os.path.isdir(run_dir)):  # a missing --resume dir is reported later
        os.makedirs(run_dir, exist_ok=True)
        token = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"
        with open(os.path.join(run_dir, f".shared-check-{token}"), "w") as f:
            f.write(token)
    token = comm.allgather_json(token)[0]  # also a barrier: the token exists before anyone looks
    if token is None:
        return
    path = os.path.join(run_dir, f".shared-check-{token}")
    deadline = time.monotonic() + SHARED_CHECK_SECONDS
    while not (sees := os.path.isfile(path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    seen = comm.allgather_json({"sees": sees, "hostname": socket.gethostname()})
    if comm.rank == 0:
        os.remove(path)
    blind = [f"rank {rank} on {view['hostname']}" for rank, view in enumerate(seen) if not view["sees"]]
    if blind:
        raise UsageError(f"--run-dir {run_dir} is not shared by every host: {', '.join(blind)} cannot see the file "
                         f"rank 0 wrote there; HINT: put the run directory on a file system that every host mounts "
                         "at the same path (NFS, Lustre, ...), not on node-local scratch")


def _placement(comm):
    """Where this rank runs: its host and its place among the hosts (config.yaml's ``ranks``)."""
    return {"rank": comm.rank, "hostname": socket.gethostname(), "local_rank": comm.local_rank,
            "local_size": comm.local_size, "cross_rank": comm.cross_rank, "cross_size": comm.cross_size}


def _variable_signature(model):
    return [[v.path, list(v.shape), str(v.dtype)] for v in model.variables]


def train(args, config, dataset):
    strategy = make_strategy(args)  # bad hyperparameters fail before Horovod starts
    comm = runtime.init(threads_per_rank=args.threads_per_rank)
    is_chief = comm.rank == 0
    # Same seed and data order give the same weights, run after run: the
    # precondition of exact resume.
    keras.utils.set_random_seed(args.seed)
    tf.config.experimental.enable_op_determinism()
    try:
        strategy.bind(comm)  # validates what depends on the number of ranks (EASGD's alpha)
    except ValueError as err:
        raise UsageError(str(err)) from None

    # --- steps: every rank takes the same number, a multiple of k ------------
    batch = args.batch_size
    steps = steps_per_epoch(len(dataset.y_train), batch, comm.size)
    steps -= steps % args.accumulate  # windows never span an epoch boundary
    if steps < 1:
        raise UsageError(f"each of the {comm.size} ranks holds {len(dataset.y_train) // comm.size} training "
                         f"samples: fewer than one update of {batch} x {args.accumulate}")
    updates_per_epoch = steps // args.accumulate
    try:
        test_ds = test_dataset(dataset, rank=comm.rank, size=comm.size)  # this rank's shard of the test set
    except DataError as err:
        raise UsageError(str(err)) from None
    exact_evaluation = callbacks.GlobalEvaluationMetrics(test_ds, comm)  # sums metric state over the shards

    # --- run directory --------------------------------------------------------
    run_dir = _resolve_run_dir(args, comm)
    _check_run_dir_is_shared(run_dir, comm, create=not args.resume)
    config = dict(config, run_dir=run_dir)
    if args.resume and not os.path.isdir(run_dir):
        raise UsageError(f"--resume {run_dir}: no such run directory")
    manifest = None
    if not args.resume and checkpoint.complete_checkpoints(run_dir):
        # Never train over a run's checkpoints: they would be pruned as "older".
        raise UsageError(f"--run-dir {run_dir} already holds checkpoints; continue it with --resume {run_dir} "
                         "or choose another --run-dir")
    if args.resume:
        manifest, ckpt_dir = checkpoint.latest(run_dir)
        differs = config_differences(manifest["config"], config)
        if manifest["num_ranks"] != comm.size:
            differs = [f"number of ranks ({manifest['num_ranks']} saved, {comm.size} now)"] + differs
        if differs:
            raise UsageError(f"--resume {run_dir}: the checkpoint does not fit this run; differs: "
                             + ", ".join(differs))

    model = models.build(args.model, dataset.input_shape, dataset.num_classes)
    comm.assert_same_across_ranks("the effective config", {
        **{k: v for k, v in config.items() if k not in ("run_dir", "threads_per_rank")},
        "model_signature": _variable_signature(model),
    })
    optimizer = DistributedOptimizer(_inner_optimizer(args, comm.size, updates_per_epoch), strategy=strategy,
                                     comm=comm)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)

    placement = comm.allgather_json(_placement(comm))  # a collective: every rank takes part
    if is_chief:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.yaml"), "w") as f:
            yaml.safe_dump({"config": config, "num_ranks": comm.size, "ranks": placement,
                            "versions": _compat.versions()}, f, sort_keys=True)

    broadcast = callbacks.BroadcastInitialState()
    start_epoch, previous = 0, []
    if manifest is not None:
        optimizer.attach(model)
        optimizer.build(model.trainable_variables)
        checkpoint.restore(ckpt_dir, manifest, model, optimizer, comm)
        broadcast.skip = True  # each rank has its own state back; a broadcast would erase it
        start_epoch = manifest["epoch"]
        metrics_path = os.path.join(run_dir, "metrics.json")
        if os.path.isfile(metrics_path):
            with open(metrics_path) as f:
                previous = [row for row in json.load(f).get("epochs", []) if row["epoch"] <= start_epoch]

    recorder = callbacks.RunRecorder(os.path.join(run_dir, "metrics.json"), comm, batch * comm.size, steps,
                                     previous_epochs=previous, write=is_chief)
    # Order matters: state first, statistics and metrics averaged before anything reads them,
    # per-rank checkpoints (local weights) before any swap of the kept weights.
    cbs = [broadcast, callbacks.AverageStatistics(), exact_evaluation, callbacks.MetricAverage(comm), recorder,
           callbacks.AbortOnNonFinite(args.max_bad_steps),
           callbacks.PeriodicCheckpoint(run_dir, comm, config, args.checkpoint_every, args.keep_checkpoints),
           callbacks.SwapKeptWeights()]
    if is_chief and args.tensorboard:
        cbs.append(keras.callbacks.TensorBoard(os.path.join(run_dir, "tensorboard"), write_graph=False,
                                               profile_batch=0))
    verbose = 0
    if is_chief:
        # A progress bar only on a real terminal: launchers prefix every line.
        interactive = sys.stdout.isatty() and not _compat.under_launcher()
        verbose = args.verbose if args.verbose is not None else (1 if interactive else 2)

    train_ds, _ = training_dataset(dataset, batch, args.seed, comm.rank, comm.size, start_epoch, args.epochs, steps)

    started = time.perf_counter()
    if start_epoch < args.epochs:
        model.fit(train_ds, epochs=args.epochs, initial_epoch=start_epoch, steps_per_epoch=steps,
                  validation_data=test_ds, validation_freq=args.eval_every, callbacks=cbs, verbose=verbose,
                  shuffle=False)
    wall = time.perf_counter() - started

    # --- final figures, on the center for EASGD ------------------------------------
    test_loss, test_accuracy = model.evaluate(test_ds, verbose=0, callbacks=[callbacks.SwapKeptWeights(),
                                                                             exact_evaluation], return_dict=False)
    train_rows = [r for r in recorder.epochs if r["epoch"] > start_epoch]
    seconds = sum(r["seconds"] for r in train_rows)
    final = {
        "test_accuracy": float(test_accuracy),
        "test_loss": float(test_loss),
        "samples_per_sec": (len(train_rows) * steps * batch * comm.size / seconds) if seconds else None,
        "seconds": wall,
    }
    if is_chief:
        recorder.save(final=final)
        _save_model(model, optimizer, os.path.join(run_dir, "model.keras"))
        print(f"final test accuracy: {test_accuracy:.4f}", flush=True)
    return final


def _save_model(model, optimizer, path):
    """model.keras: the kept model (the center for EASGD), loadable with plain keras.models.load_model."""
    tmp = path[: -len(".keras")] + ".tmp.keras"
    save_kept_model(model, tmp)
    os.replace(tmp, path)
