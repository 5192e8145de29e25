"""One horovodrun launch of the suite: every configuration, interleaved.

``benchmarks.suite.compare`` starts it as
``horovodrun -np N --gloo|--mpi python -m benchmarks.suite.worker --out FILE ...``.
Start-up and tracing are paid once per launch; then repeats run
round-robin over the configurations in a balanced order (each round a row
of a Williams design, ``benchmarks.suite.order``), so a burst of noise from
elsewhere on the machine, or a configuration's after-effects, hits them
alike. Rank 0 writes everything measured to ``--out`` as JSON.

Throughput is samples/s over a fixed number of steps after a discarded
warm-up run (the trace, the first collective), timed on every rank between
a barrier and the end of its last step; the slowest rank's time counts.
"""
import argparse
import os
import statistics
import socket
import sys
import time

import numpy as np

import hvd_easgd
from hvd_easgd import atomic
from hvd_easgd.startup import runtime
from hvd_easgd.app.data import epoch_indices, steps_per_epoch
from hvd_easgd.app import cli
from hvd_easgd.app.lr_scaling import DEFAULT_LR
from hvd_easgd.strategies import registry
from hvd_easgd.strategies.base import NoScaleRule

from hvd_easgd.choosing import link_probe

from . import allreduce, configurations, curves, fit_variants, host_traffic, machine
from .names import ALL_CUSTOM_LOOP, BY_NAME, CUSTOM_LOOP, FIT, STRATEGIES
from .order import default_repeats, design_length, interleaved_repeats, is_whole_design
from .runner import summary


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file rank 0 writes")
    p.add_argument("--controller", required=True, choices=("gloo", "mpi"))
    p.add_argument("--binding", default="none", help="process binding of this launch (recorded as given)")
    p.add_argument("--models", default="cnn", help="comma-separated: cnn (digits) and/or resnet (synthetic 32x32x3)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed repeats per configuration (default: whole Williams designs of each group, "
                        "at least benchmarks.suite.order.MIN_REPEATS)")
    p.add_argument("--steps", type=int, default=200, help="digits-CNN steps per timed repeat")
    p.add_argument("--resnet-steps", type=int, default=20, help="ResNet steps per timed repeat")
    p.add_argument("--wide-mlp-steps", type=int, default=20, help="wide-MLP (5.4 M parameters) steps per timed repeat")
    p.add_argument("--configs",
                   help=f"comma-separated custom-loop configurations, from {','.join(ALL_CUSTOM_LOOP)}, or the "
                        "name of a strategy a --plugin registers (with its defaults); default: "
                        f"{','.join(CUSTOM_LOOP)} and every strategy the --plugin modules register")
    p.add_argument("--plugin", metavar="MODULE", action="append", default=[],
                   help="import MODULE first (as train.py --plugin does): its strategies become configurations")
    p.add_argument("--interface", metavar="NAME",
                   help="count the bytes every host transmits on this interface during each timed run "
                        "(the traffic between hosts of a virtual cluster)")
    p.add_argument("--link-probe-mb", type=float, default=0.0,
                   help="before anything else, time allreduces of this many MB to measure the link (0: skip)")
    p.add_argument("--alpha-sweep", action="store_true",
                   help="after the link probe, time small allreduces (8 B to 64 KB) for the latency α "
                        "(and, in the level probes, within each host)")
    p.add_argument("--link-bucket", type=float, default=None, metavar="BYTES",
                   help="the shaped link's token bucket (tc tbf's burst): α is fitted from the sizes whose "
                        "chain of allreduces fits in it (default: every size, an unshaped link)")
    p.add_argument("--steps-per-call", type=int, default=20,
                   help="steps per tf.function call (custom loop) and steps_per_execution (model.fit)")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--fit", action="store_true", help="also compare SyncAverage and raw Horovod through model.fit")
    p.add_argument("--tta-seeds", type=int, default=0, help="time-to-accuracy seeds (0: skip)")
    p.add_argument("--tta-epochs", type=int, default=20)
    p.add_argument("--tta-target", type=float, default=0.95)
    p.add_argument("--tta-configs",
                   help=f"comma-separated configurations the time to accuracy trains (default: {','.join(STRATEGIES)} "
                        "and the --plugin strategies)")
    p.add_argument("--tta-model", default="cnn", choices=tuple(TTA_DATA),
                   help="the time-to-accuracy workload: cnn (digits) or student_mlp (--data teacher)")
    p.add_argument("--tta-batch", type=int, default=None, help="time-to-accuracy per-rank batch (default: --batch)")
    p.add_argument("--tta-cap", type=float, default=0.0,
                   help="training seconds a configuration gets per seed; one that hits it stops there "
                        "(and counts as not reaching the target if it had not); 0: no cap")
    p.add_argument("--tta-lr", type=float, default=None,
                   help="time-to-accuracy base learning rate, scaled as train.py --scale-lr does "
                        "(default: train.py's --lr)")
    p.add_argument("--allreduce", action="store_true", help="run the allreduce microbenchmark (np > 1)")
    p.add_argument("--quick", action="store_true", help="fewer microbenchmark iterations")
    # Horovod's path by default: raw Horovod's rows and the allreduce microbenchmark call Horovod in this
    # process, which the direct path does not start. compare.py runs a second, default-path launch.
    p.add_argument("--collectives", default="horovod", choices=runtime.COLLECTIVES,
                   help="hvd_easgd's collectives in this launch (auto: what a job gets by default)")
    args = p.parse_args(argv)
    multiple = configurations.STEP_MULTIPLE
    if args.steps_per_call % multiple:
        p.error(f"--steps-per-call must be a multiple of {multiple} (whole EASGD periods and accumulation windows)")
    args.plugin = registry.plugin_modules(args.plugin)
    try:
        registry.import_plugins(args.plugin)
    except ValueError as err:
        p.error(f"--plugin: {err}")
    plugged = [name for name in registry.available() if name not in BY_NAME]
    # Run by default: the suite's own configurations and what the plugins brought (not the bare
    # built-in strategy names, which the suite already runs under their configurations' names).
    from_plugins = [name for name in plugged if not registry.get(name).__module__.startswith("hvd_easgd.")]
    if args.configs is None:
        args.configs = ",".join(CUSTOM_LOOP + tuple(from_plugins))
    if args.tta_configs is None:
        args.tta_configs = ",".join(STRATEGIES + tuple(from_plugins))
    args.config_list = args.configs.split(",")
    if not args.config_list or set(args.config_list) - set(ALL_CUSTOM_LOOP + tuple(plugged)):
        p.error(f"--configs must be chosen from {','.join(ALL_CUSTOM_LOOP + tuple(plugged))}. "
                f"Received: --configs={args.configs}")
    args.tta_config_list = args.tta_configs.split(",")
    strategies = [c for c in ALL_CUSTOM_LOOP if BY_NAME[c].train_py] + plugged
    if not args.tta_config_list or set(args.tta_config_list) - set(strategies):
        p.error(f"--tta-configs must be chosen from {','.join(strategies)}. Received: --tta-configs={args.tta_configs}")
    for flag in ("steps", "resnet_steps", "wide_mlp_steps"):
        if getattr(args, flag) % args.steps_per_call:
            p.error(f"--{flag.replace('_', '-')} must be a multiple of --steps-per-call")
    if args.steps < 2 * args.steps_per_call:
        p.error("--steps must be at least twice --steps-per-call (model.fit times all but the first execution)")
    return args


class Launch:
    """The launch's communicator and the small eager collectives around timed runs."""

    def __init__(self, comm, interface=None):
        self.comm = comm
        self.rank, self.size = comm.rank, comm.size
        self.started = time.perf_counter()
        # One rank per host reads the host's counter (its ranks share the interface).
        self.counting = interface is not None
        self.interface = interface if comm.local_rank == 0 else None
        self._sent_before = 0

    def _all_arrived(self):
        import tensorflow as tf

        self.comm.allreduce([tf.zeros([1])], op="sum", record=False)

    def barrier(self):
        self._all_arrived()
        if self.interface:
            self._sent_before = host_traffic.transmitted_bytes(self.interface)

    def slowest(self, seconds):
        return self.finish(seconds)[0]

    def finish(self, seconds):
        """(the slowest rank's seconds, the bytes all hosts transmitted since ``barrier``, or None without
        --interface). The counters are read after a barrier: a rank that has finished its own last
        collective may read while another rank of its host still sends its part of a different one."""
        if self.counting:
            self._all_arrived()
        sent = host_traffic.transmitted_bytes(self.interface) - self._sent_before if self.interface else 0
        gathered = self.comm.allgather_json([seconds, sent])
        return max(g[0] for g in gathered), (sum(g[1] for g in gathered) if self.counting else None)

    def say(self, message):
        if self.rank == 0:
            print(f"[worker np={self.size} {time.perf_counter() - self.started:5.0f}s] {message}", flush=True)


def rotated(items, by):
    by %= len(items)
    return items[by:] + items[:by]


def repeats_of(args, configs):
    """``--repeats``, or whole Williams designs of this group of configurations."""
    return args.repeats or default_repeats(len(configs))


def order_record(configs, repeats):
    """What a row says about its group's run order."""
    n = len(configs)
    return {"group_size": n, "design_rounds": design_length(n), "repeats": repeats,
            "whole_designs": is_whole_design(n, repeats)}


def summed_traffic(accounts):
    """One configuration's communication account over all its repeats."""
    cross_host = [a.get("cross_host_bytes") for a in accounts]
    return {"bytes": sum(a["bytes"] for a in accounts), "calls": sum(a["calls"] for a in accounts),
            "source": accounts[-1]["source"],
            "cross_host_bytes": None if None in cross_host else sum(cross_host)}


def pre_sharded(data, batch, rank, size, steps, seed=0):
    """``steps`` batches of this rank's shard as arrays of shape (steps, batch, ...):
    successive epochs of hvd_easgd's own sharding until there are enough."""
    n = len(data.y_train)
    per_epoch = steps_per_epoch(n, batch, size)
    if per_epoch < 1:
        raise SystemExit(f"{n} training samples cannot give {size} ranks a batch of {batch}")
    parts, epoch = [], 0
    while sum(len(p) for p in parts) < steps * batch:
        parts.append(epoch_indices(n, seed, epoch, rank, size, per_epoch, batch))
        epoch += 1
    index = np.concatenate(parts)[: steps * batch]
    return (data.x_train[index].reshape(steps, batch, *data.x_train.shape[1:]),
            data.y_train[index].reshape(steps, batch))


def _row(launch, args, name, model_name, loop, batch, steps, samples_per_sec, traffic, expected, order,
         expected_cross_host=None):
    per_sample = traffic["bytes"] / traffic["samples"]
    cross_host = traffic.get("cross_host_bytes")
    all_samples = traffic["samples"] * launch.size  # traffic["samples"] counts one rank's
    return {
        "config": name, "model": model_name, "loop": loop, "np": launch.size,
        "controller": args.controller, "binding": args.binding,
        "batch_per_rank": batch, "steps_per_repeat": steps, "steps_per_call": args.steps_per_call,
        "order": order,
        "samples_per_sec": summary(samples_per_sec),
        "bytes_per_sample": per_sample,
        "calls_per_step": traffic["calls"] / traffic["steps"],
        "expected_bytes_per_sample": expected["bytes_per_step"] / batch,
        "expected_calls_per_step": expected["calls_per_step"],
        "account_source": traffic["source"],
        # Bytes that crossed between hosts (every host's transmit counter, --interface), per sample of all
        # ranks; analytic: configurations.cross_host_bytes_per_step.
        "cross_host_bytes_per_sample": None if cross_host is None else cross_host / all_samples,
        "expected_cross_host_bytes_per_sample": (None if expected_cross_host is None
                                                 else expected_cross_host / (batch * launch.size)),
        "final_test_accuracy": None,
    }


# --- throughput, custom loop ------------------------------------------------------------
def throughput(launch, args, model_name):
    import tensorflow as tf

    data = (hvd_easgd.data.synthetic((32, 32, 3), 10) if model_name == "resnet"
            else hvd_easgd.data.digits())
    steps = {"cnn": args.steps, "resnet": args.resnet_steps, "wide_mlp": args.wide_mlp_steps}[model_name]
    batch, k = args.batch, args.steps_per_call
    xs, ys = pre_sharded(data, batch, launch.rank, launch.size, steps)
    chunks = [(tf.constant(xs[i:i + k]), tf.constant(ys[i:i + k])) for i in range(0, steps, k)]
    configs = [configurations.Configuration(name, model_name, data.input_shape, data.num_classes, batch,
                                            launch.comm, lr=args.lr, plugins=args.plugin)
               for name in args.config_list]

    def timed(config, calls=chunks):
        launch.barrier()
        config.reset_account()
        start = time.perf_counter()
        for x, y in calls:
            loss = config.run(x, y)
        loss = float(loss.numpy())  # waits for the last step
        seconds, cross_host = launch.finish(time.perf_counter() - start)
        return len(calls) * k * batch * launch.size / seconds, dict(config.account(), cross_host_bytes=cross_host), loss

    launch.say(f"{model_name}: tracing and warming up {len(configs)} configurations")
    for config in configs:
        config.trace()
        timed(config, chunks[:2])  # discarded: first collectives, caches, allocator

    repeats = repeats_of(args, configs)

    def progress(r, results):
        launch.say(f"{model_name}: repeat {r + 1}/{repeats}: "
                   + ", ".join(f"{name}={runs[-1][0]:.0f}" for name, runs in results.items()))

    results = interleaved_repeats(configs, repeats, timed, progress)
    rows = []
    for config in configs:
        runs = results[config.name]  # (samples/s, account, last loss) per repeat
        traffic = dict(summed_traffic([account for _, account, _ in runs]),
                       steps=steps * repeats, samples=steps * repeats * batch)
        row = _row(launch, args, config.name, model_name, "custom", batch, steps, [sps for sps, _, _ in runs],
                   traffic, config.expected, order_record(configs, repeats), config.expected_cross_host)
        row["last_losses"] = [loss for _, _, loss in runs]  # a diverging configuration would show here
        rows.append(row)
    gradient_shapes = [list(v.shape) for v in configs[0].model.trainable_variables]
    return rows, gradient_shapes


# --- throughput, model.fit ----------------------------------------------------------------
def fit_throughput(launch, args):
    data = hvd_easgd.data.digits()
    batch, steps = args.batch, args.steps
    xs, ys = pre_sharded(data, batch, launch.rank, launch.size, steps)
    ds = fit_variants.dataset(xs, ys, batch)
    configs = [fit_variants.FitConfiguration(name, "cnn", data.input_shape, data.num_classes, batch, launch.comm,
                                             args.steps_per_call, lr=args.lr) for name in FIT]

    def timed(config):
        launch.barrier()
        seconds, timed_steps = config.fit_once(ds, steps)
        seconds = launch.slowest(seconds)
        return timed_steps * batch * launch.size / seconds, config.account(), timed_steps

    launch.say("model.fit: tracing and warming up")
    for config in configs:
        timed(config)  # traces
        timed(config)  # a second untimed fit: the first timed ones ran slow without it
    repeats = repeats_of(args, configs)
    results = interleaved_repeats(configs, repeats, timed)
    rows = []
    for config in configs:
        runs = results[config.name]  # (samples/s, account, timed steps) per repeat
        timed_steps = sum(n for _, _, n in runs)
        traffic = dict(summed_traffic([account for _, account, _ in runs]), steps=timed_steps,
                       samples=timed_steps * batch)
        row = _row(launch, args, config.name, "cnn", "fit", batch, steps, [sps for sps, _, _ in runs], traffic,
                   fit_variants.expected_traffic(config), order_record(configs, repeats))
        row["steps_per_execution"] = args.steps_per_call
        row["timed_steps_per_repeat"] = steps - args.steps_per_call
        rows.append(row)
    launch.say("model.fit: " + ", ".join(f"{name}={statistics.median(sps for sps, _, _ in runs):.0f}"
                                         for name, runs in results.items()))
    return rows


# --- time to accuracy ---------------------------------------------------------------------
# The workloads time to accuracy trains: a model and the data set it learns.
TTA_DATA = {"cnn": "digits", "student_mlp": "teacher"}


def train_py_strategy(name, plugins=()):
    """The strategy ``train.py`` builds from configuration ``name``'s flags (its row's ``train_py``)."""
    return cli.make_strategy(cli.parse_args(list(configurations.lookup(name, plugins).train_py)))


def scaled_learning_rate(base, size, name, plugins=()):
    """The learning rate ``train.py --lr BASE --scale-lr`` trains configuration ``name`` with:
    the rule of the strategy its train.py flags build (``lr_scale_factor``), or ``--lr``
    itself for a strategy --scale-lr refuses (DiLoCo)."""
    try:
        return base * train_py_strategy(name, plugins).lr_scale_factor(size)
    except NoScaleRule:
        return base


def no_comm_ceiling(launch, args, data, batch, steps=20):
    """Samples/s of one rank training alone (no_comm, ``steps`` steps after a traced warm-up call),
    the slowest rank's, and p times it: what p ranks would reach if communication were free."""
    import tensorflow as tf

    config = configurations.Configuration("no_comm", args.tta_model, data.input_shape, data.num_classes, batch,
                                          launch.comm, plugins=args.plugin)
    x = tf.constant(data.x_train[: steps * batch].reshape(steps, batch, *data.input_shape))
    y = tf.constant(data.y_train[: steps * batch].reshape(steps, batch))
    config.trace()
    config.run(x[:2], y[:2]).numpy()
    launch.barrier()
    start = time.perf_counter()
    config.run(x, y).numpy()
    per_rank = steps * batch / launch.slowest(time.perf_counter() - start)
    return {"samples_per_second_per_rank": per_rank, "samples_per_second": per_rank * launch.size, "steps": steps}


def time_to_accuracy(launch, args):
    """Trains each strategy ``--tta-epochs`` epochs per seed, epochs interleaved
    across strategies; wall time counts training only (the slowest rank's),
    not evaluation or tracing. Learning rates follow ``train.py --scale-lr``."""
    import tensorflow as tf

    data = hvd_easgd.data.load(TTA_DATA[args.tta_model])
    batch = args.tta_batch or args.batch
    n = len(data.y_train)
    per_epoch = steps_per_epoch(n, batch, launch.size)
    base_lr = args.tta_lr if args.tta_lr is not None else DEFAULT_LR
    names = args.tta_config_list
    lrs = {name: scaled_learning_rate(base_lr, launch.size, name, args.plugin) for name in names}
    results = {name: [] for name in names}
    for seed in range(args.tta_seeds):
        configs = [configurations.Configuration(name, args.tta_model, data.input_shape, data.num_classes,
                                                batch, launch.comm, lr=lrs[name], seed=seed, plugins=args.plugin)
                   for name in names]
        for config in configs:
            config.trace()
        points = {c.name: [] for c in configs}
        wall = {c.name: 0.0 for c in configs}
        for epoch in range(args.tta_epochs):
            index = epoch_indices(n, seed, epoch, launch.rank, launch.size, per_epoch, batch)
            for config in rotated(configs, epoch):
                if args.tta_cap and wall[config.name] >= args.tta_cap:
                    continue  # capped: its curve ends here (the rank-0 slowest wall, the same on every rank)
                # Accumulation windows never span an epoch (as hvd_easgd's trainer does).
                steps = per_epoch - per_epoch % config.window
                x = tf.constant(data.x_train[index[: steps * batch]].reshape(steps, batch, *data.input_shape))
                y = tf.constant(data.y_train[index[: steps * batch]].reshape(steps, batch))
                launch.barrier()
                start = time.perf_counter()
                config.run(x, y).numpy()
                wall[config.name] += launch.slowest(time.perf_counter() - start)
                accuracy = config.test_accuracy(data.x_test, data.y_test)
                points[config.name].append({"epoch": epoch + 1, "seconds": wall[config.name],
                                            "accuracy": accuracy})
        for name, curve in points.items():
            results[name].append(curves.summarise(seed, curve, args.tta_target))
        launch.say(f"time-to-accuracy seed {seed}: "
                   + ", ".join(f"{n}={c[-1]['accuracy']:.3f}" for n, c in points.items()))
    return {"target": args.tta_target, "epochs": args.tta_epochs, "seeds": args.tta_seeds, "np": launch.size,
            "controller": args.controller, "batch_per_rank": batch, "base_lr": base_lr,
            "model": args.tta_model, "data": TTA_DATA[args.tta_model], "cap_seconds": args.tta_cap or None,
            "steps_per_epoch": per_epoch, "ceiling": no_comm_ceiling(launch, args, data, batch),
            "per_config": {name: dict(curves.mean_over_seeds(runs), lr=lrs[name])
                           for name, runs in results.items()}}


# --- main ------------------------------------------------------------------------------------
def main(argv=None):
    args = parse_args(argv)
    load_before = os.getloadavg()
    grouped = configurations.needs_process_sets(args.config_list + (args.tta_config_list if args.tta_seeds else []),
                                                args.plugin)
    comm = hvd_easgd.init(threads_per_rank=1, process_sets="dynamic" if grouped else None,
                          collectives=args.collectives)
    import tensorflow as tf

    launch = Launch(comm, args.interface)
    affinity = comm.allgather_json(sorted(os.sched_getaffinity(0)))
    out = {
        "np": comm.size, "controller": args.controller, "binding": args.binding,
        "cpu_affinity_per_rank": affinity,
        "threads_per_rank": {"intra_op": tf.config.threading.get_intra_op_parallelism_threads(),
                             "inter_op": tf.config.threading.get_inter_op_parallelism_threads()},
        "versions": machine.versions(), "horovod_settings": runtime.horovod_settings(),
        "rows": [], "allreduce": None, "time_to_accuracy": None,
        "loadavg_before": load_before,
    }
    if args.link_probe_mb:
        hosts = len(set(comm.allgather_json(socket.gethostname())))
        out["link_probe"] = link_probe.measure(comm, args.link_probe_mb, hosts=hosts)
        launch.say(f"link probe: {out['link_probe']['bits_per_second'] / 1e6:,.0f} Mbit/s")
        if args.alpha_sweep:
            out["alpha_sweep"] = link_probe.alpha_sweep(comm, out["link_probe"]["bits_per_second"] / 8, hosts=hosts,
                                                      bucket=args.link_bucket)
            launch.say(f"alpha sweep: {out['alpha_sweep']['alpha'] * 1e6:,.1f} us a message")
        if grouped:  # the two-level configurations' own levels (their sub-communicators need process sets)
            out["link_levels"] = link_probe.levels(comm, args.link_probe_mb, sweep=args.alpha_sweep)
            if out["link_levels"]:
                launch.say("level probes: within a host {:,.0f} Mbit/s, across hosts {:,.0f} Mbit/s".format(
                    *(out["link_levels"][k]["bits_per_second"] / 1e6 for k in ("within_host", "across_hosts"))))
    started = time.perf_counter()
    gradient_shapes = None
    for model_name in args.models.split(","):
        rows, shapes = throughput(launch, args, model_name)
        out["rows"] += rows
        if model_name == "cnn":
            gradient_shapes = shapes
    if args.fit:
        out["rows"] += fit_throughput(launch, args)
    if args.tta_seeds:
        out["time_to_accuracy"] = time_to_accuracy(launch, args)
    if args.allreduce and comm.size > 1:
        if gradient_shapes is None:
            model = hvd_easgd.models.build("cnn", (8, 8, 1), 10)
            gradient_shapes = [list(v.shape) for v in model.trainable_variables]
        launch.say("allreduce microbenchmark")
        out["allreduce"] = allreduce.horovod(comm, args.controller, gradient_shapes, quick=args.quick)
    path = runtime.collectives_in_use()[0]
    for row in out["rows"]:
        row["collectives"] = path  # which path hvd_easgd's rows took (raw Horovod's is always Horovod)
    out["collectives"] = path
    out["loadavg_after"] = os.getloadavg()
    out["seconds"] = time.perf_counter() - started
    if comm.rank == 0:
        atomic.write_json(args.out, out, indent=1)
    launch.say(f"done in {out['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
