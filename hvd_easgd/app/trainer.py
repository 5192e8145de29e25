"""The training job behind train.py: run directory, model, strategy, fit, save.

Only rank 0 prints progress and writes shared files (config.yaml,
metrics.json, tensorboard/, model.keras, checkpoint manifests); every rank
writes its own checkpoint shard.

``train`` reads top to bottom as the job's steps; each step is one function
below it.
"""
import dataclasses
import datetime
import json
import os
import socket
import sys
import time

import keras
import tensorflow as tf
import yaml

from .. import _compat, atomic, callbacks, checkpoint, compute_timing
from ..checkpoint import elastic, preemption
from ..choosing import auto_strategy
from ..startup import runtime
from ..strategies import sample_shares
from . import models
from .config import DEFAULT_WARMUP_SHARE, MAX_DEFAULT_WARMUP_UPDATES, TEXT_MODEL
from .config_compare import resume_mismatches
from .data import DataError, rest_of_epoch, rest_of_epoch_dataset, steps_per_epoch, test_dataset, training_dataset
from .errors import UsageError
from ..callbacks.run_recorder import perplexity
from ..training.kept_model import merge_at_end, save_kept_model
from .lr_scaling import auto_scales, default_epochs, lr_factor
from ..training.optimizer import DistributedOptimizer
from ..strategies import GradientAccumulation, registry, unequal_shares_refusal


def train(config, dataset, strategy):
    """Trains ``strategy`` on ``dataset`` as ``config`` says; returns the final figures.

    Args:
      config: the job's ``TrainConfig`` (``cli.parse_args``). What only the
        ranks can resolve (``epochs``, ``run_dir``) comes back as a new config;
        its ``as_dict()`` is saved with the run and compared on resume.
      dataset: a ``data.Dataset``.
      strategy: the sync strategy (``cli.make_strategy(config)``), not yet bound.

    Returns:
      ``{"test_accuracy", "test_loss", "samples_per_sec", "seconds"}``.
    """
    comm = _start_ranks(config, strategy)
    steps = _steps_per_epoch(config, dataset, comm)
    config = _resolve_epochs(config, steps, text=dataset.tokens_per_sample is not None)
    config = _resolve_warmup(config, steps)
    config, strategy = _resolve_strategy_warmup(config, strategy, comm)
    if strategy is None:  # --strategy auto, not chosen yet
        config, strategy = _choose_strategy(config, dataset, comm, steps)
    if config.balance == "speed":
        config = _balance(config, dataset, comm, strategy, steps)
    if config.elastic:
        # Every collective of the start runs inside the elastic loop, after the state is
        # synchronised: a replacement starts here while the live ranks are in that sync.
        model = _build_model(config, dataset)
        optimizer = _compile(model, config, strategy, comm, updates_per_epoch=steps // config.accumulate)
        recorder, test_ds, exact_evaluation, wall, start_epoch, steps = _fit_elastic(
            config, dataset, strategy, model, optimizer, comm, steps)
        return _finish(config, model, comm, recorder, test_ds, exact_evaluation, wall, start_epoch, steps)
    run_dir = _resolve_run_dir(config, comm)
    _check_run_dir_is_shared(run_dir, comm, create=not config.resume)
    config = dataclasses.replace(config, run_dir=run_dir)
    effective = config.as_dict()
    resume_from = _checkpoint_to_resume(config, run_dir, effective, comm, strategy)

    model = _build_model(config, dataset)
    _check_ranks_agree(comm, effective, model)
    optimizer = _compile(model, config, strategy, comm, updates_per_epoch=steps // config.accumulate)
    _record_run(config, run_dir, effective, comm, strategy, steps, resume_from)
    start_epoch, start_step, previous_epochs, samples_done = _restore(resume_from, run_dir, model, optimizer, comm,
                                                                       steps, config, len(dataset.y_train))

    recorder, test_ds, exact_evaluation, wall = _fit(config, dataset, model, comm, run_dir, effective, steps,
                                                     start_epoch, start_step, previous_epochs,
                                                     resumed=resume_from is not None, samples_done=samples_done)
    return _finish(config, model, comm, recorder, test_ds, exact_evaluation, wall, start_epoch, steps)


def _finish(config, model, comm, recorder, test_ds, exact_evaluation, wall, start_epoch, steps):
    """The final figures over the whole test set; rank 0 saves them and model.keras."""
    run_dir = config.run_dir
    # After the last checkpoint, on every rank: the kept model takes the ranks' last local steps.
    merge_at_end(model)
    final = _final_figures(model, test_ds, exact_evaluation, recorder, start_epoch, steps,
                           config.batch_size * comm.size, wall)
    if comm.rank == 0:
        recorder.save(final=final)
        _save_model(model, os.path.join(run_dir, "model.keras"))
        if "test_perplexity" in final:
            print(f"final validation loss: {final['test_loss']:.4f} nats/token, perplexity "
                  f"{final['test_perplexity']:.3f}", flush=True)
        else:
            print(f"final test accuracy: {final['test_accuracy']:.4f}", flush=True)
    return final


# --- the job's steps, in order ---------------------------------------------------------
def _start_ranks(config, strategy):
    """Starts Horovod (or, with ``--collectives mpi-direct``, MPI alone), seeds every
    random source, and binds the strategy to the ranks."""
    # A strategy that splits the ranks into groups (Hierarchical) needs Horovod's dynamic process sets;
    # --strategy auto (strategy None) may choose one.
    splits = strategy is None or strategy.needs_process_groups()
    if config.elastic:
        _check_elastic(config, strategy)
    comm = runtime.init(threads_per_rank=config.threads_per_rank, process_sets="dynamic" if splits else None,
                        collectives=config.collectives)
    # Same seed and data order give the same weights, run after run: the
    # precondition of exact resume.
    keras.utils.set_random_seed(config.seed)
    tf.config.experimental.enable_op_determinism()
    if strategy is not None:
        _bind(strategy, comm)
    return comm


def _bind(strategy, comm):
    try:
        strategy.bind(comm)  # validates what depends on the number of ranks (EASGD's alpha)
    except ValueError as err:
        raise UsageError(str(err)) from None


def _choose_strategy(config, dataset, comm, steps):
    """``--strategy auto`` (``hvd_easgd.auto``): measures this job on a throwaway copy of its model and
    its own first batches, chooses, and rank 0 prints the one line. Returns the config holding the choice
    (config.yaml keeps it, so a resume builds the same strategy) and the strategy, bound; with ``--scale-lr
    auto`` and no ``--lr``, the chosen strategy's rate rule, as if it had been given."""
    _, record = auto_strategy.auto(*_measured_on(config, dataset, comm, steps), comm, config.auto_utilisation)
    keras.utils.set_random_seed(config.seed)  # the model trained starts where a run given the choice would
    if comm.rank == 0:
        # One write, newline included: unbuffered (PYTHONUNBUFFERED, as launches set it), print() writes the
        # text and its newline apart, and the MPI launcher may tag them as two pieces of output, the line's
        # end then carrying the next tag ("... c = 21 ms[1,0]<stdout>:").
        lines = [record["reason"]] + ([record["withheld_line"]] if record.get("withheld_line") else [])
        sys.stdout.write("".join(f"train.py: {line}\n" for line in lines))
        sys.stdout.flush()
    config = dataclasses.replace(config, auto_choice=record)
    strategy = auto_strategy.strategy_of(record)
    if config.scale_lr == "auto":
        config = dataclasses.replace(config, scale_lr=auto_scales(strategy, config.optimizer, lr_given=False))
    _bind(strategy, comm)
    return config, strategy


def _measured_on(config, dataset, comm, steps):
    """What the start-up measurements step (``compute_timing``): ``(a model of this run's kind, its loss, an
    inner optimizer of this run's configuration, this rank's first batches)``; the measurements copy them."""
    model = _build_model(config, dataset)
    batches, _ = training_dataset(dataset, config.batch_size, config.seed, comm.rank, comm.size, 0, 1, steps)
    inner = _inner_optimizer(dataclasses.replace(config, scale_lr=False), comm.size, steps // config.accumulate)
    return (model, keras.losses.SparseCategoricalCrossentropy(from_logits=True), inner,
            batches.take(compute_timing.MEASURED_STEPS))


def _balance(config, dataset, comm, strategy, steps):
    """``--balance speed``: each rank's share of the global batch in proportion to its speed
    (``sample_shares``), and the strategy weighing each rank's contribution by it.

    The speeds are measured once, at start-up, as ``--strategy auto`` measures compute: a few
    steps of this rank's own first batches on a throwaway copy of the model, no communication,
    then one allgather, so every rank cuts the same shares. A resume at the same number of ranks
    takes the shares config.yaml saved (its samples are then those of the run it continues); at
    another number they are measured anew. Rank 0 prints the speeds and the shares. Returns the
    config holding the shares."""
    refusal = unequal_shares_refusal(strategy)  # cli.parse_args refused these; a caller of train() may not have
    if refusal:
        raise UsageError(f"--balance speed: {refusal}")
    if comm.size == 1:
        return config
    if config.sample_shares is not None and len(config.sample_shares) == comm.size:
        shares = tuple(config.sample_shares)
    else:
        started = time.perf_counter()
        speeds = sample_shares.measure_speeds(*_measured_on(config, dataset, comm, steps), comm)
        shares = sample_shares.from_speeds(speeds, config.batch_size * comm.size)
        keras.utils.set_random_seed(config.seed)  # the model trained starts where a run without measuring would
        if comm.rank == 0:
            sys.stdout.write(f"train.py: balance: ranks' speeds {', '.join(f'{s:.0f}' for s in speeds)} samples/s "
                             f"-> micro-batches {', '.join(map(str, shares))} of {sum(shares)} (measured in "
                             f"{time.perf_counter() - started:.1f} s)\n")
            sys.stdout.flush()
    if len(set(shares)) > 1:  # equal shares weigh every rank 1.0: the strategy has nothing to change
        try:
            strategy.set_sample_shares(shares)
        except ValueError as err:
            raise UsageError(f"--balance speed: {err}") from None
    return dataclasses.replace(config, sample_shares=list(shares))


def _check_elastic(config, strategy):
    """Refuses ``--elastic`` where it cannot work (MPI launches, the direct path, no elastic launcher)."""
    reason = elastic.refusal(config.collectives, runtime.gloo_launch(), runtime.mpi_launch(),
                             elastic.elastic_launch(), strategy)
    if reason:
        raise UsageError(reason)
    elastic.configure_environment()


def _steps_per_epoch(config, dataset, comm):
    """Micro-batches per epoch: the same on every rank, and a multiple of k, so
    accumulation windows never span an epoch boundary."""
    batch = config.batch_size
    steps = steps_per_epoch(len(dataset.y_train), batch, comm.size)
    steps -= steps % config.accumulate
    if steps < 1:
        raise UsageError(f"each of the {comm.size} ranks holds {len(dataset.y_train) // comm.size} training "
                         f"samples: fewer than one update of {batch} x {config.accumulate}")
    return steps


def _resolve_epochs(config, steps, text=False):
    """``config`` with its epochs: ``--epochs`` not given (None) is
    ``lr_scaling.default_epochs`` of this run's updates per epoch. The value is
    saved in config.yaml and the checkpoints, so a resume continues to the same epoch."""
    if config.epochs is not None:
        return config
    return dataclasses.replace(config, epochs=default_epochs(steps // config.accumulate, text=text))


def _resolve_warmup(config, steps):
    """``config`` with the cosine schedule's warm-up: ``--lr-warmup-updates`` not given is
    ``DEFAULT_WARMUP_SHARE`` of the run's updates, at most ``MAX_DEFAULT_WARMUP_UPDATES``.
    Saved with the run, so a resume keeps the same schedule."""
    if config.lr_schedule != "cosine" or config.lr_warmup_updates is not None:
        return config
    updates = _run_updates(config, steps // config.accumulate)
    return dataclasses.replace(config, lr_warmup_updates=min(int(DEFAULT_WARMUP_SHARE * updates),
                                                             MAX_DEFAULT_WARMUP_UPDATES))


def _resolve_strategy_warmup(config, strategy, comm):
    """``(config, strategy)`` with the strategy's own warm-up rule where ``--warmup-steps`` is not given
    (``SyncStrategy.default_warmup_steps``: DiLoCo's follows the learning rate's warm-up, so it needs the
    run's updates, known only here). config.yaml names the value, so a resume keeps it; a run saved before
    the rule resumes with none (``config_compare.CHANGED_DEFAULTS``)."""
    if strategy is None or config.lr_warmup_updates is None or "warmup_steps" in config.strategy_options:
        return config, strategy
    steps = registry.get(config.strategy).default_warmup_steps(config.strategy_options, config.lr_warmup_updates)
    if steps is None:
        return config, strategy
    config = dataclasses.replace(config, strategy_options={**config.strategy_options, "warmup_steps": steps})
    if steps:
        strategy = _with_warmup(strategy, steps)
        _bind(strategy, comm)
    return config, strategy


def _with_warmup(strategy, steps):
    """``strategy`` made again from its config with ``steps`` warm-up steps (GradientAccumulation's, the
    strategy it wraps), as a resume makes it from config.yaml."""
    if isinstance(strategy, GradientAccumulation):
        return GradientAccumulation(strategy.k, average=strategy.average,
                                    strategy=_with_warmup(strategy.strategy, steps))
    return type(strategy).from_config({**strategy.get_config(), "warmup_steps": steps})


def _run_updates(config, updates_per_epoch):
    """The optimizer updates of the whole run (its epochs resolved): what the cosine schedule
    decays over and its default warm-up is a share of."""
    return config.epochs * updates_per_epoch


def _build_model(config, dataset):
    """The model ``--model`` names, for the data; the transformer at ``--layers``, ``--width``, ``--heads``."""
    size = ({"layers": config.layers, "width": config.width, "heads": config.heads}
            if config.model == TEXT_MODEL else {})
    return models.build(config.model, dataset.input_shape, dataset.num_classes, **size)


def default_run_dir(strategy_name):
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"{stamp}-{strategy_name}")


def _resolve_run_dir(config, comm):
    """Rank 0 names the run directory; the other ranks take its name."""
    name = config.run_dir or default_run_dir(config.strategy)
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


def _checkpoint_to_resume(config, run_dir, effective, comm, strategy):
    """``(manifest, directory)`` of the checkpoint ``--resume`` continues, or None
    for a fresh run; refuses a fresh run over a run's checkpoints, and a
    checkpoint that does not fit this run.

    The newest *intact* checkpoint: every rank verifies what it will read before
    any rank loads anything (``checkpoint.latest``); rank 0 names each damaged or
    interrupted one skipped, in one line, and then the one resumed from."""
    if not config.resume:
        if checkpoint.complete_checkpoints(run_dir):
            # Never train over a run's checkpoints: they would be pruned as "older".
            raise UsageError(f"--run-dir {run_dir} already holds checkpoints; continue it with --resume {run_dir} "
                             "or choose another --run-dir")
        return None
    reported = []

    def report(line):  # called on every rank alike: the ranks agreed on what was skipped
        reported.append(line)
        if comm.rank == 0:
            print(f"train.py: {line}", flush=True)

    manifest, directory = checkpoint.latest(run_dir, comm, report=report)
    if reported and comm.rank == 0:
        print(f"train.py: resuming from checkpoint {os.path.basename(directory)}", flush=True)
    differs = resume_mismatches(manifest, effective, comm.size, strategy)
    if differs:
        raise UsageError(f"--resume {run_dir}: the checkpoint does not fit this run; differs: " + ", ".join(differs))
    return manifest, directory


def _variable_signature(model):
    return [[v.path, list(v.shape), str(v.dtype)] for v in model.variables]


def _check_ranks_agree(comm, effective, model):
    """Stops every rank before training when their effective configs or models differ
    (another config file on one node, a stale copy of the job script)."""
    comm.assert_same_across_ranks("the effective config", {
        **{k: v for k, v in effective.items() if k not in ("run_dir", "threads_per_rank")},
        "model_signature": _variable_signature(model),
    })


def _learning_rate(config, size, updates_per_epoch, strategy=None):
    """``(rate trained at after any warm-up, the strategy's lr_scale_factor, warm-up updates)``:
    ``--lr`` itself, or with ``--scale-lr`` (resolved by the CLI) ``--lr * factor``. ``strategy``:
    the one the run trains with (``cli.make_strategy(config)``, wrapped in GradientAccumulation
    for k > 1), whose rule may need its options (Hierarchical's); None asks the class of
    ``config.strategy`` at ``config.accumulate`` (a rule that needs no options)."""
    if not config.scale_lr:
        return config.lr, 1.0, 0
    if strategy is None:
        factor = lr_factor(registry.get(config.strategy), size, config.accumulate, config.optimizer)
    else:  # a GradientAccumulation asks what it wraps at its k
        factor = lr_factor(strategy, size, optimizer=config.optimizer)
    return config.lr * factor, factor, int(round(config.lr_warmup_epochs * updates_per_epoch))


def _learning_rate_record(config, size, updates_per_epoch, resume_from=None, strategy=None):
    """config.yaml's ``learning_rate``: the rate the run trains at (after any
    warm-up), and how it follows from ``--lr``."""
    rate, factor, warmup = _learning_rate(config, size, updates_per_epoch, strategy)
    saved_size = resume_from[0]["num_ranks"] if resume_from is not None else size
    if saved_size != size and not warmup:
        # A constant rate is a variable of the optimizer: the checkpoint's comes back with it.
        rate, factor, warmup = _learning_rate(config, saved_size, updates_per_epoch, strategy)
    record = {"rate": rate, "factor": factor, "warmup_updates": warmup}
    if config.lr_schedule == "cosine":  # rate is the peak; the schedule's own warm-up replaces the ramp
        record.update(schedule="cosine", warmup_updates=config.lr_warmup_updates, floor=rate * config.lr_floor,
                      updates=_run_updates(config, updates_per_epoch))
    return record


def _inner_optimizer(config, size, updates_per_epoch, strategy=None):
    """The Keras optimizer the strategy wraps, at ``--lr`` or, with ``--scale-lr``,
    at ``--lr`` times the strategy's ``lr_scale_factor`` (reached by linear warm-up if asked);
    with ``--lr-schedule cosine``, that rate is the peak of a warm-up and cosine decay over
    the run's ``epochs * updates_per_epoch`` updates."""
    lr = config.lr
    if config.lr_schedule == "cosine":
        peak, _, _ = _learning_rate(config, size, updates_per_epoch, strategy)
        warmup = config.lr_warmup_updates
        # Built in, so model.keras stays loadable by plain Keras: linear from 0 to the
        # peak over the warm-up, then cosine to floor x peak at the run's last update.
        lr = keras.optimizers.schedules.CosineDecay(
            0.0, decay_steps=max(_run_updates(config, updates_per_epoch) - warmup, 1), alpha=config.lr_floor,
            warmup_target=peak, warmup_steps=warmup)
    elif config.scale_lr:
        target, _, warmup = _learning_rate(config, size, updates_per_epoch, strategy)
        if warmup > 0:
            # A built-in schedule keeps model.keras loadable by plain Keras:
            # linear warm-up from lr to the target, then constant (alpha=1).
            lr = keras.optimizers.schedules.CosineDecay(config.lr, decay_steps=1, alpha=1.0,
                                                        warmup_target=target, warmup_steps=warmup)
        else:
            lr = target
    if config.optimizer == "adam":
        return keras.optimizers.Adam(lr)
    if config.optimizer == "sgd":
        return keras.optimizers.SGD(lr)
    return keras.optimizers.SGD(lr, momentum=config.momentum, nesterov=config.optimizer == "nesterov")


def _compile(model, config, strategy, comm, updates_per_epoch):
    """Compiles ``model`` with the strategy's optimizer; returns that optimizer."""
    optimizer = DistributedOptimizer(_inner_optimizer(config, comm.size, updates_per_epoch, strategy),
                                     strategy=strategy, comm=comm)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=False)
    return optimizer


def _record_run(config, run_dir, effective, comm, strategy, steps, resume_from):
    """Rank 0 writes config.yaml, with every rank's placement (a collective: every rank takes part)."""
    placement = comm.allgather_json(_placement(comm))
    if comm.rank == 0:
        _write_run_config(run_dir, effective, comm.size, placement, strategy.process_groups(),
                          learning_rate=_learning_rate_record(config, comm.size, steps // config.accumulate,
                                                              resume_from, strategy))


def _write_run_config(run_dir, effective, num_ranks, placement, groups=None, learning_rate=None):
    """config.yaml: what this run is (effective config, where each rank runs, versions;
    the strategy's groups of ranks if it has some; the learning rate it trains at)."""
    os.makedirs(run_dir, exist_ok=True)
    run = {"config": effective, "num_ranks": num_ranks, "ranks": placement, "versions": _compat.versions()}
    if learning_rate is not None:
        run["learning_rate"] = learning_rate
    if groups is not None:
        run["groups"] = [list(g) for g in groups]
    with atomic.temporary_path(os.path.join(run_dir, "config.yaml")) as tmp:
        with open(tmp, "w") as f:
            run["horovod_settings"] = runtime.horovod_settings()
            path, why = runtime.collectives_in_use()
            run["collectives_in_use"] = {"path": path, "why": why}
            yaml.safe_dump(run, f, sort_keys=True)


def _restore(resume_from, run_dir, model, optimizer, comm, steps, config, num_train):
    """Loads every rank's state from ``resume_from``; returns ``(start_epoch,
    start_step, metrics rows up to start_epoch, samples_done)``, ``(0, 0, [], None)``
    for a fresh run. ``samples_done`` is None where the epoch continues as the
    saving run laid it out, else the prefix of its order already seen: the rest
    of the epoch is split over this run's ranks (``data.rest_of_epoch``), and
    ``start_step`` is the step of an epoch at this size it starts at."""
    if resume_from is None:
        return 0, 0, [], None
    manifest, directory = resume_from
    start_epoch, start_step = manifest["epoch"], manifest.get("step_in_epoch", 0)
    resized = manifest["num_ranks"] != comm.size
    samples_done = None
    if start_step:
        # Written by a run that split this epoch as a whole: p ranks, s micro-batches of b each.
        done = manifest.get("samples_in_epoch", manifest["num_ranks"] * start_step * config.batch_size)
        if resized or done != comm.size * start_step * config.batch_size:
            try:
                left, start_step = rest_of_epoch(num_train, config.batch_size, comm.size, done,
                                                 manifest["step_in_epoch"], config.accumulate, steps)
            except DataError as err:
                raise UsageError(f"--resume {run_dir}: {err}") from None
            samples_done = done
            if not left:  # nothing left of that epoch at this size (its window, if any, was closed)
                start_epoch, start_step, samples_done = start_epoch + 1, 0, None
        elif manifest.get("steps_per_epoch") != steps:
            raise UsageError(f"--resume {run_dir}: the checkpoint was taken at micro-batch {start_step} of epochs "
                             f"of {manifest.get('steps_per_epoch')} micro-batches; this run's epochs hold {steps}")
    optimizer.attach(model)
    optimizer.build(model.trainable_variables)
    checkpoint.restore(directory, manifest, model, optimizer, comm)
    if resized and comm.rank == 0:
        print(_resize_notice(manifest, optimizer.strategy, comm.size), flush=True)
    return start_epoch, start_step, _previous_epochs(run_dir, start_epoch), samples_done


def _previous_epochs(run_dir, upto):
    """metrics.json's rows of epochs 1..``upto`` (those a continued run keeps)."""
    metrics_path = os.path.join(run_dir, "metrics.json")
    if not os.path.isfile(metrics_path):
        return []
    with open(metrics_path) as f:
        return [row for row in json.load(f).get("epochs", []) if row["epoch"] <= upto]


def _resize_notice(manifest, strategy, size):
    """One line saying what a resume at another number of ranks kept and what it changed."""
    line = (f"train.py: resuming at {size} ranks from a checkpoint of {manifest['num_ranks']} "
            f"(epoch {manifest['epoch']}): the update count continues, the data are resharded for {size} ranks")
    notice = strategy.resize_notice(manifest["num_ranks"], size)
    if notice:
        line += f"; {notice}"
    return line


def _fit(config, dataset, model, comm, run_dir, effective, steps, start_epoch, start_step, previous_epochs, resumed,
         extra_callbacks=(), samples_done=None):
    """Trains from micro-batch ``start_step`` of ``start_epoch`` to the last epoch;
    returns ``(recorder, test_ds, exact_evaluation, wall seconds)``."""
    recorder = callbacks.RunRecorder(os.path.join(run_dir, "metrics.json"), comm, config.batch_size * comm.size,
                                     steps, previous_epochs=previous_epochs, write=comm.rank == 0,
                                     tokens_per_sample=dataset.tokens_per_sample)
    stop_requests = preemption.StopRequests(_signal_names(config), config.stop_grace_seconds,
                                            stop_file=os.path.join(run_dir, preemption.STOP_FILE)).install()
    checkpointer = callbacks.PeriodicCheckpoint(
        run_dir, comm, effective, config.checkpoint_every, config.keep_checkpoints,
        every_steps=config.checkpoint_every_steps, every_minutes=config.checkpoint_every_minutes,
        steps_per_epoch=steps, initial_step=start_epoch * steps + start_step, stop_requests=stop_requests,
        check_every=config.agree_every,
        samples_in_epoch=_samples_in_epoch(config, comm, start_epoch, start_step, samples_done))
    test_ds = _test_dataset(dataset, comm)
    exact_evaluation = callbacks.GlobalEvaluationMetrics(test_ds, comm)  # sums metric state over the shards
    chosen = _callbacks(config, run_dir, comm, recorder, exact_evaluation, checkpointer,
                        resumed=resumed) + list(extra_callbacks)
    started = time.perf_counter()
    # Keras cannot start an epoch in its middle: a mid-epoch resume first fits
    # the rest of that epoch alone, then the epochs after it.
    for first_epoch, first_step in _fit_parts(start_epoch, start_step, config.epochs):
        train_ds = _training_dataset(config, dataset, comm, first_epoch, steps, first_step, samples_done)
        model.fit(train_ds, epochs=first_epoch + 1 if first_step else config.epochs, initial_epoch=first_epoch,
                  steps_per_epoch=steps - first_step, validation_data=test_ds, validation_freq=config.eval_every,
                  shuffle=False, callbacks=chosen, verbose=_verbosity(config, comm))
        checkpointer.raise_if_stopped()  # the checkpoint a signal asked for is written: exit EXIT_PREEMPTED
    wall = time.perf_counter() - started

    return recorder, test_ds, exact_evaluation, wall


def _fit_elastic(config, dataset, strategy, model, optimizer, comm, steps):
    """The job's start and ``_fit`` under Horovod's elastic loop (hvd_easgd/checkpoint/elastic.py).

    After a rank is lost or added, every rank restores the last commit and fits
    again from there at the new size. The start's collectives (the checks that
    the ranks agree, config.yaml's placement) run again at every size, after the
    state is synchronised; the resume of a checkpoint runs at the job's first
    start only (a replacement takes the live ranks' state, never the disk's).

    Returns:
      ``_fit``'s figures, then the epoch this process started at and the
      micro-batches per epoch at the final size.
    """
    run_dir, effective = config.run_dir, config.as_dict()
    optimizer.attach(model)
    optimizer.check_ranks_at_build = False  # _check_ranks_agree compares the model signature below
    optimizer.build(model.trainable_variables)
    state = elastic.ElasticState.create(model, optimizer, comm, steps)
    every = elastic.commit_period(config.elastic_commit_every, optimizer.strategy, config.accumulate)
    first = {"epoch": 0, "resumed": False}

    def fit_from_commit(state):
        now = _steps_per_epoch(config, dataset, comm)
        resume_from = None
        if state.resets == 0:  # the job's start: every rank is here together
            _check_run_dir_is_shared(run_dir, comm, create=not config.resume)
            resume_from = _checkpoint_to_resume(config, run_dir, effective, comm, strategy)
            # A checkpoint saved mid-epoch at another size continues at the same fraction of
            # the epoch here (elastic.continued_step), not through data.rest_of_epoch.
            epoch, step, _, _ = _restore(resume_from, run_dir, model, optimizer, comm, now, config,
                                         len(dataset.y_train))
            state.epoch, state.step_in_epoch, state.steps_per_epoch = epoch, step, now
            state.global_step = epoch * now + step
            state.save()
            first.update(epoch=epoch, resumed=resume_from is not None)
        _check_ranks_agree(comm, effective, model)
        _record_run(config, run_dir, effective, comm, strategy, now, resume_from)
        step = elastic.continued_step(state.step_in_epoch, state.steps_per_epoch, now)
        state.step_in_epoch, state.steps_per_epoch = step, now
        if state.resets:
            model.make_train_function(force=True)  # the traced step holds the old size
            if comm.rank == 0:
                seen = (f", {time.time() - state.failure_seen:.1f}s after this rank saw a collective fail"
                        if state.failure_seen else "")
                print(f"train.py: elastic: continuing at {comm.size} ranks from the commit at epoch {state.epoch}, "
                      f"micro-batch {step} (state mapped from {state.resized_from} ranks{seen}; "
                      f"unix time {time.time():.3f})", flush=True)
        commit = callbacks.ElasticCommit(state, every, now)
        return _fit(config, dataset, model, comm, run_dir, effective, now, state.epoch, step,
                    _previous_epochs(run_dir, state.epoch), resumed=state.resets > 0 or first["resumed"],
                    extra_callbacks=[commit])

    try:
        recorder, test_ds, exact_evaluation, wall = elastic.run(fit_from_commit, state)
    except RuntimeError as err:
        raise UsageError(str(err)) from None
    return recorder, test_ds, exact_evaluation, wall, first["epoch"], _steps_per_epoch(config, dataset, comm)


def _fit_parts(start_epoch, start_step, epochs):
    """``[(first_epoch, first_step)]``: one ``model.fit`` from an epoch start; two
    from mid-epoch (the rest of that epoch, then the epochs after it)."""
    if start_epoch >= epochs:
        return []
    if start_step == 0:
        return [(start_epoch, 0)]
    return [(start_epoch, start_step)] + ([(start_epoch + 1, 0)] if start_epoch + 1 < epochs else [])


def _training_dataset(config, dataset, comm, start_epoch, steps, start_step, samples_done=None):
    """This rank's training pipeline from micro-batch ``start_step`` of ``start_epoch`` on
    (to the end of that epoch only, when it starts mid-epoch). With ``samples_done``
    (the prefix of ``start_epoch``'s order seen before a resume that splits its
    rest anew, ``_restore``), that epoch's remaining ``steps - start_step`` micro-batches.
    Under ``--balance speed`` the rank's micro-batch is its share (``_balance``)."""
    shares, batch = config.sample_shares, _micro_batch(config, comm)
    if start_step and samples_done is not None:
        return rest_of_epoch_dataset(dataset, batch, config.seed, comm.rank, comm.size, start_epoch,
                                     samples_done, steps - start_step, shares)
    last = start_epoch + 1 if start_step else config.epochs
    train_ds, _ = training_dataset(dataset, batch, config.seed, comm.rank, comm.size, start_epoch,
                                   last, steps, start_step=start_step, shares=shares)
    return train_ds


def _samples_in_epoch(config, comm, start_epoch, start_step, samples_done):
    """For the step checkpoints: ``(epoch, step) -> the prefix of that epoch's order
    seen``, where ``samples_done`` (the seen prefix a resume started ``start_epoch``
    from, at its step ``start_step``) makes it differ from step · b · ranks; else None."""
    if samples_done is None:
        return None
    batch = config.batch_size * comm.size

    def samples(epoch, step):
        return samples_done + (step - start_step) * batch if epoch == start_epoch else step * batch

    return samples


def _test_dataset(dataset, comm):
    """This rank's shard of the test set."""
    try:
        return test_dataset(dataset, rank=comm.rank, size=comm.size)
    except DataError as err:
        raise UsageError(str(err)) from None


def _signal_names(config):
    return () if config.checkpoint_on_signal == "none" else tuple(config.checkpoint_on_signal.split(","))


def _callbacks(config, run_dir, comm, recorder, exact_evaluation, checkpointer, resumed):
    broadcast = callbacks.BroadcastInitialState()
    # A resumed rank has its own state back (EASGD's local weights differ per
    # rank); a broadcast from rank 0 would erase it.
    broadcast.skip = resumed
    # Order matters: state first, statistics and metrics averaged before anything reads them,
    # per-rank checkpoints (local weights) before any swap of the kept weights.
    chosen = [broadcast, callbacks.AdaptivePeriodLoss(), callbacks.AverageStatistics(), exact_evaluation,
              callbacks.MetricAverage(comm, share_weight=_share_weight(config, comm)), recorder,
              callbacks.AbortOnNonFinite(config.max_bad_steps),
              checkpointer,
              callbacks.SwapKeptWeights()]
    if comm.rank == 0 and config.tensorboard:
        chosen.append(keras.callbacks.TensorBoard(os.path.join(run_dir, "tensorboard"), write_graph=False,
                                                  profile_batch=0))
    if config.step_timeline:  # last: SwapKeptWeights has drained at fit's end
        chosen.append(callbacks.StepTimeline(comm, os.path.join(run_dir, "timeline.json")))
    slow = sample_shares.pacer(comm.rank)  # the test hook's slow rank (sample_shares.TEST_SLOW_RANKS)
    if slow:
        batch = _micro_batch(config, comm)
        chosen.append(keras.callbacks.LambdaCallback(on_train_batch_end=lambda step, logs: slow(batch)))
    return chosen


def _micro_batch(config, comm):
    """This rank's samples a step: ``--batch-size``, or its share of the global batch (``--balance speed``)."""
    return config.sample_shares[comm.rank] if config.sample_shares else config.batch_size


def _share_weight(config, comm):
    """p·b_r / Σ b: this rank's weight in a mean over ranks under ``--balance speed`` (1.0 at equal shares)."""
    return sample_shares.weight(config.sample_shares, comm.rank) if config.sample_shares else 1.0


def _verbosity(config, comm):
    """Keras's verbosity: rank 0 alone reports; a progress bar only on a real
    terminal, because launchers prefix every line."""
    if comm.rank != 0:
        return 0
    if config.verbose is not None:
        return config.verbose
    return 1 if sys.stdout.isatty() and not _compat.under_launcher() else 2



def _final_figures(model, test_ds, exact_evaluation, recorder, start_epoch, steps, global_batch, wall_seconds):
    """Test loss and accuracy of the model users keep (the center for EASGD) over
    the whole test set, and the throughput of the epochs this process trained."""
    test_loss, test_accuracy = model.evaluate(test_ds, verbose=0,
                                              callbacks=[callbacks.SwapKeptWeights(), exact_evaluation],
                                              return_dict=False)
    trained = [row for row in recorder.epochs if row["epoch"] > start_epoch]
    seconds = sum(row["seconds"] for row in trained)
    final = {
        "test_accuracy": float(test_accuracy),
        "test_loss": float(test_loss),
        "samples_per_sec": (len(trained) * steps * global_batch / seconds) if seconds else None,
        "seconds": wall_seconds,
    }
    if recorder.tokens_per_sample:  # a language model: its loss is in nats per token
        final["test_perplexity"] = perplexity(final["test_loss"])
        final["tokens_per_sec"] = final["samples_per_sec"] and final["samples_per_sec"] * recorder.tokens_per_sample
    return final


def _save_model(model, path):
    """model.keras: the kept model (the center for EASGD), loadable with plain keras.models.load_model."""
    with atomic.temporary_path(path) as tmp:
        save_kept_model(model, tmp)
