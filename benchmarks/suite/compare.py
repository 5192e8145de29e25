"""The benchmark suite: ``python -m benchmarks compare [--quick] [--out DIR]``
(``python -m benchmarks.suite.compare`` is the same program).

Runs one horovodrun launch per (np, controller), each running every
configuration interleaved (``benchmarks.suite.worker``), then the MWMS baseline
(``benchmarks.suite.mwms``), and writes ``results.json``, ``results.md`` (also
printed) and PNG plots to ``benchmarks/results/<timestamp>/`` or ``--out``.

``--quick``: np=2, one controller, 3 repeats, digits CNN only, no MWMS, no
ResNet, no time-to-accuracy (about two minutes on two cores).

``--link-rates 1gbit,100mbit [--hosts 2 --ranks-per-host 1]``: the strategies
across hosts of a virtual cluster whose links have each rate
(``benchmarks.suite.rated_links``; needs root).

This process never imports TensorFlow: it launches, waits (every launch
with a timeout, after which its whole process group is ended) and reports.
"""
import argparse
import datetime
import json
import os
import re
import shlex
import statistics
import sys
import time

from tools.vcluster import parse_rate

from . import machine, mwms, plots, rated_links, report, runner
from .curves import mean_over_seeds, summarise
from .machine import foreign_cpu_busy, wait_until_idle
from .names import BASELINES, BY_NAME, CUSTOM_LOOP, FIT, TOPOLOGY_SUITE
from .order import MIN_REPEATS, default_repeats, design_length, is_whole_design
from .runner import REPO_ROOT, local_launch, report_failed_launch, run_local

RESULTS_ROOT = os.path.join(REPO_ROOT, "benchmarks", "results")
CONTROLLERS = ("gloo", "mpi")
RATED_REPEATS = 3
PROG = "python -m benchmarks.suite.compare"


def default_np_list():
    """1 and 2, and powers of two up to the usable cores beyond that."""
    cores = machine.describe()["cores_usable"] or 1
    found, n = [1, 2], 4
    while n <= cores:
        found.append(n)
        n *= 2
    return found


def parse_args(argv=None, prog=PROG):
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="np=2, one controller, 3 repeats, digits CNN only; no MWMS, ResNet or time-to-accuracy")
    p.add_argument("--out", metavar="DIR", help="output directory (default benchmarks/results/<timestamp>)")
    p.add_argument("--np", help="comma-separated rank counts (default 1,2[,4,...] up to the cores; quick: 2)")
    p.add_argument("--controllers", help="comma-separated, from gloo,mpi (default both; quick: mpi)")
    p.add_argument("--mpi-binding", choices=("none", "core"), default="none",
                   help="MPI process binding: none (horovodrun's default) or one core per rank")
    p.add_argument("--mpi-busy-poll", action="store_true",
                   help="let Open MPI busy-poll (OMPI_MCA_mpi_yield_when_idle=0; by default MPI launches yield, =1)")
    p.add_argument("--mpi-tcp-links", type=int, default=None, metavar="N",
                   help="rated links: Open MPI's TCP connections per pair of ranks (OMPI_MCA_btl_tcp_links; "
                        "default Open MPI's own, 1)")
    p.add_argument("--repeats", type=int,
                   help="timed repeats per configuration (default: the fewest whole Williams designs giving at "
                        f"least {MIN_REPEATS}: {default_repeats(len(CUSTOM_LOOP))} for the {len(CUSTOM_LOOP)} "
                        f"custom-loop configurations, {default_repeats(len(FIT))} for the {len(FIT)} model.fit ones "
                        "and MWMS; quick: 3)")
    p.add_argument("--plugin", metavar="MODULE", action="append", default=[],
                   help="import MODULE in every worker first (as train.py --plugin does): the strategies it "
                        "registers run as configurations of their own, beside the built-in ones")
    p.add_argument("--steps", type=int, default=200, help="digits-CNN steps per timed repeat")
    p.add_argument("--resnet-steps", type=int, default=20, help="ResNet steps per timed repeat")
    p.add_argument("--steps-per-call", type=int, default=20,
                   help="steps per tf.function call and model.fit steps_per_execution (a multiple of 20)")
    p.add_argument("--epochs", type=int, default=20, help="time-to-accuracy epochs")
    p.add_argument("--seeds", type=int, default=3, help="time-to-accuracy seeds")
    p.add_argument("--target", type=float, default=0.95, help="time-to-accuracy target test accuracy")
    p.add_argument("--tta-model", choices=("cnn", "student_mlp"), default="cnn",
                   help="the time-to-accuracy workload: cnn (digits) or student_mlp (--data teacher, where "
                        "communication dominates; docs/benchmarks.md)")
    p.add_argument("--tta-batch", type=int, help="time-to-accuracy per-rank batch (default 32)")
    p.add_argument("--tta-lr", type=float, help="time-to-accuracy base learning rate (default: train.py's --lr)")
    p.add_argument("--tta-cap", type=float, default=0.0,
                   help="training seconds per configuration and seed; a run that hits it stops and, short of "
                        "--target, counts as not reached (0: no cap)")
    p.add_argument("--no-fit", action="store_true", help="skip the model.fit comparison")
    p.add_argument("--no-allreduce", action="store_true", help="skip the allreduce microbenchmark")
    p.add_argument("--no-mwms", action="store_true", help="skip the MultiWorkerMirroredStrategy baseline")
    p.add_argument("--no-resnet", action="store_true", help="skip the synthetic-image ResNet")
    p.add_argument("--no-tta", action="store_true", help="skip time-to-accuracy")
    p.add_argument("--launch-timeout", type=int, help="seconds per launch (default 170 quick, 600 full)")
    rated = p.add_argument_group("across a rated link (on the virtual cluster, tools/vcluster.py; needs root)",
                                 "the options after --link-rates set that run, and need it")
    rated.add_argument("--link-rates", metavar="RATES",
                       help=f"comma-separated tc rates, e.g. 1gbit,100mbit: run {', '.join(rated_links.CONFIGS)} "
                            "across hosts whose links have each rate")
    rated.add_argument("--hosts", type=int, default=2, help="virtual hosts")
    rated.add_argument("--ranks-per-host", type=int, help="ranks per virtual host (default 1, with --topology 2)")
    rated.add_argument("--topology", action="store_true",
                       help=f"compare the strategies for several hosts ({', '.join(TOPOLOGY_SUITE)}), time to "
                            "accuracy at every rate")
    rated.add_argument("--cluster-name", default="hvdbench", help="the virtual cluster's name; the tests use hvdt<pid>")
    rated.add_argument("--wide-mlp-steps", type=int, default=20,
                       help="wide-MLP (5.4 M parameters) steps per timed repeat")
    rated.add_argument("--link-probe-mb", type=float, default=32, help="MB of the allreduce that measures each link")
    rated.add_argument("--no-alpha-sweep", action="store_true",
                       help="skip the small-message sweep for the latency alpha (across hosts, and within a host in "
                            "the level probes); results.json then has no alpha to calibrate the cost model with "
                            "(python -m benchmarks validate, project --calibration)")
    rated.add_argument("--configs", metavar="NAMES",
                       help="comma-separated configurations to run instead of the suite's (benchmarks/suite/names.py), "
                            "e.g. no_comm,sync,diloco_tau10,diloco_tau10_int8")
    rated.add_argument("--models", metavar="NAMES", dest="rated_models_given",
                       help=f"comma-separated, from {','.join(rated_links.MODELS)} (default all; quick: cnn)")
    rated.add_argument("--collectives", choices=("horovod", "auto"), default="horovod",
                       help="hvd_easgd's collectives in the launches (auto: what a job gets by default, the direct "
                            "MPI path; horovod: Horovod's, which raw Horovod's rows need)")
    p.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                   help="before each launch, wait up to this long for other processes to leave the CPUs idle")
    args = p.parse_args(argv)
    quick = args.quick
    args.np_list = [int(n) for n in args.np.split(",")] if args.np else ([2] if quick else default_np_list())
    args.controller_list = (args.controllers.split(",") if args.controllers
                            else (["mpi"] if quick else list(CONTROLLERS)))
    if set(args.controller_list) - set(CONTROLLERS):
        p.error(f"--controllers must be chosen from {CONTROLLERS}")
    if args.mpi_tcp_links is not None and (args.mpi_tcp_links < 1 or not args.link_rates):
        p.error("--mpi-tcp-links must be an integer >= 1, with --link-rates. "
                f"Received: --mpi-tcp-links={args.mpi_tcp_links}, --link-rates={args.link_rates}")
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be an integer >= 1. Received: --repeats={args.repeats}")
    args.repeats = args.repeats or (3 if quick else None)  # None: each group's own default
    args.models = ["cnn"] if (quick or args.no_resnet) else ["cnn", "resnet"]
    args.run_mwms = not (quick or args.no_mwms)
    args.run_tta = not (quick or args.no_tta) and args.seeds > 0
    args.launch_timeout = args.launch_timeout or (170 if quick else (2400 if args.topology else 1200) if args.link_rates
                                                 else 600)
    args.link_rate_list = args.link_rates.split(",") if args.link_rates else []
    if args.link_rates is None and (args.configs or args.rated_models_given or args.collectives != "horovod"
                                    or args.no_alpha_sweep):
        p.error("--configs, --models, --collectives and --no-alpha-sweep choose what runs across a rated link: "
                "give --link-rates too")
    if args.topology and args.link_rates is None:
        p.error("--topology compares strategies across hosts: give it --link-rates (e.g. 1gbit,100mbit)")
    if args.ranks_per_host is None:
        args.ranks_per_host = 2 if args.topology else 1
    if args.link_rates is not None:
        if args.hosts < 2 or args.ranks_per_host < 1:
            p.error("--hosts must be an integer >= 2 and --ranks-per-host >= 1 with --link-rates. "
                    f"Received: --hosts={args.hosts} --ranks-per-host={args.ranks_per_host}")
        for rate in args.link_rate_list:
            try:
                parse_rate(rate)
            except ValueError as err:
                p.error(str(err))
        args.rated_models = (args.rated_models_given.split(",") if args.rated_models_given else ["cnn"] if quick else ["cnn", "wide_mlp"])
        if set(args.rated_models) - set(rated_links.MODELS):
            p.error(f"--models must be chosen from {','.join(rated_links.MODELS)}. Received: --models={args.rated_models_given}")
        if args.configs is not None:
            unknown = set(args.configs.split(",")) - set(BY_NAME)
            if unknown:
                p.error(f"--configs must be chosen from {','.join(BY_NAME)}. Received: --configs={args.configs}")
            if args.collectives != "horovod" and set(args.configs.split(",")) & set(BASELINES) - {"no_comm"}:
                p.error("--collectives auto cannot run raw Horovod's configurations (they call Horovod, which the "
                        f"direct path does not start). Received: --configs={args.configs}")
        # At 100 Mbit/s one SyncAverage step of the wide MLP takes ~2.3 s: 3 repeats of 20 steps (not a
        # whole Williams design of 6) keep the run of both rates under about 15 minutes.
        args.repeats = args.repeats or RATED_REPEATS
        if quick:
            args.steps, args.wide_mlp_steps, args.link_probe_mb = 2 * args.steps_per_call, args.steps_per_call, 4
    return args


# --- launching ------------------------------------------------------------------------------------
def mpi_polling_env(args):
    """How MPI ranks wait, for every MPI launch of the suite.

    Horovod's background thread enters MPI every cycle; Open MPI busy-polls
    there unless told to yield, taking CPU from the compute thread whenever
    ranks (plus that thread) outnumber the cores. hvd_easgd.init() makes ranks
    yield unless the variable is set, so busy-polling must be asked for
    explicitly (0); the mpi4py reference launch does not call init() and gets
    the same value from here.
    """
    return {"OMPI_MCA_mpi_yield_when_idle": "0" if args.mpi_busy_poll else "1"}


def worker_command(args, np_, controller, out_json, tta):
    """The horovodrun command line, the binding it gives, and extra environment."""
    cmd = local_launch(np_, controller)
    binding, env = "none", {}
    if controller == "mpi" and args.mpi_binding == "core":
        cmd.append("--binding-args=--bind-to core --map-by core")
        binding = "core"
    if controller == "mpi":
        env = mpi_polling_env(args)
    cmd += [sys.executable, "-m", "benchmarks.suite.worker", "--out", out_json, "--controller", controller,
            "--binding", binding, "--models", ",".join(args.models),
            "--steps", str(args.steps), "--resnet-steps", str(args.resnet_steps),
            "--steps-per-call", str(args.steps_per_call)]
    if args.repeats is not None:
        cmd += ["--repeats", str(args.repeats)]
    for module in args.plugin:
        cmd += ["--plugin", module]
    if not args.no_fit:
        cmd.append("--fit")
    if not args.no_allreduce:
        cmd.append("--allreduce")
    if args.quick:
        cmd.append("--quick")
    if tta:
        cmd += ["--tta-seeds", str(args.seeds), "--tta-epochs", str(args.epochs), "--tta-target", str(args.target)]
        cmd += tta_workload_flags(args)
    return cmd, binding, env


_RANK_TAG = re.compile(r"\[\d+(,\d+)?\]<std(out|err)>:")


def _progress(log_path):
    """The worker's own progress lines from a launch log, launcher tags removed."""
    try:
        with open(log_path) as f:
            return [_RANK_TAG.sub("", line).strip() for line in f if "[worker" in line]
    except OSError:
        return []


# --- raw MPI and memcpy references for the allreduce microbenchmark --------------------------------
def run_raw_references(args, out_dir, results):
    """One small MPI launch per rank count (mpi4py + numpy only), merged
    into every controller's Horovod figures at that rank count."""
    from . import allreduce  # numpy only at import

    for n in sorted({r["n"] for r in results["allreduce"]}):
        same_n = [r for r in results["allreduce"] if r["n"] == n]
        out_json = os.path.join(out_dir, f"raw-mpi-np{n}.json")
        log_path = os.path.join(out_dir, "logs", f"raw-mpi-np{n}.log")
        cmd = local_launch(n, "mpi")
        if args.mpi_binding == "core":
            cmd.append("--binding-args=--bind-to core --map-by core")
        cmd += [sys.executable, "-m", "benchmarks.suite.allreduce", "--raw", "--out", out_json,
                "--gradient-bytes", str(same_n[0]["gradients"]["bytes"])] + (["--quick"] if args.quick else [])
        env = mpi_polling_env(args)
        print(f"[compare] raw MPI (mpi4py) and memcpy references, np={n}", flush=True)
        outcome = run_local(cmd, log_path, min(args.launch_timeout, 180), env)
        raw = None
        if outcome.ok and os.path.exists(out_json):
            with open(out_json) as f:
                raw = json.load(f)
        else:
            results["failures"].append(f"raw MPI references np={n}: {outcome.why} "
                                       f"(log: logs/{os.path.basename(log_path)})")
        results["allreduce"] = [allreduce.combine(r, raw) if r["n"] == n else r for r in results["allreduce"]]


# --- MWMS ------------------------------------------------------------------------------------------
def run_mwms(args, out_dir, results):
    reason = mwms.ensure_tf_keras()
    if reason:
        results["failures"].append(f"MWMS baseline skipped: {reason}")
        return
    horovod_tta = results["time_to_accuracy"]
    if args.run_tta and horovod_tta is None:
        results["failures"].append("MWMS time to accuracy skipped: it takes SyncAverage's learning rate "
                                   "from the Horovod time-to-accuracy launch, which gave none")
    for np_ in args.np_list:
        tta = args.run_tta and horovod_tta is not None and np_ == horovod_tta["np"]
        # MWMS is timed like the model.fit rows, so it gets their number of repeats.
        worker_args = ["--repeats", str(args.repeats or default_repeats(len(FIT))), "--steps", str(args.steps),
                       "--steps-per-call", str(args.steps_per_call)]
        if tta:
            # Synchronous gradient averaging, like SyncAverage: the same learning rate.
            worker_args += ["--tta-seeds", str(args.seeds), "--tta-epochs", str(args.epochs),
                            "--tta-lr", repr(horovod_tta["per_config"]["sync"]["lr"])]
        busy = wait_until_idle(args.wait_idle) if args.wait_idle else foreign_cpu_busy()
        print(f"[compare] MWMS np={np_} (tf_keras, RING, TF_CONFIG on 127.0.0.1)", flush=True)
        started = time.perf_counter()
        try:
            with machine.ForeignLoad() as foreign:
                workers = mwms.launch(np_, os.path.join(out_dir, "mwms", f"np{np_}"),
                                      os.path.join(out_dir, "logs", f"mwms-np{np_}.log"), args.launch_timeout,
                                      worker_args)
        except RuntimeError as err:
            results["failures"].append(f"MWMS np={np_}: {str(err).splitlines()[0]}")
            print(f"[compare] MWMS np={np_} failed: {err}", flush=True)
            continue
        merged = mwms.merge(workers)
        results["launches"].append({"np": np_, "controller": "grpc-ring", "binding": "none", "kind": "mwms",
                                    "foreign_cpu_busy": busy, "foreign_cpu_share_during": foreign.share,
                                    "seconds": time.perf_counter() - started})
        results["versions"].setdefault("tf_keras", merged["versions"].get("tf_keras"))
        sps = merged["samples_per_sec"]
        results["rows"].append({
            "config": "mwms_fit", "model": "cnn", "loop": "fit", "np": np_, "controller": "grpc-ring",
            "binding": "none", "batch_per_rank": merged["batch_per_rank"],
            "steps_per_repeat": merged["steps_per_repeat"],
            "steps_per_call": merged["steps_per_execution"], "steps_per_execution": merged["steps_per_execution"],
            "timed_steps_per_repeat": merged["timed_steps_per_repeat"],
            "samples_per_sec": runner.summary(sps),
            "bytes_per_sample": None, "calls_per_step": None,
            "expected_bytes_per_sample": 4 * merged["trainable_params"] / merged["batch_per_rank"],
            "expected_calls_per_step": 1.0,
            "account_source": "not measured (TensorFlow collectives keep no account)",
            "final_test_accuracy": None,
        })
        if merged["time_to_accuracy"]:
            runs = [summarise(r["seed"], r["curve"], args.target) for r in merged["time_to_accuracy"]]
            results.setdefault("_mwms_tta", dict(mean_over_seeds(runs), lr=merged["tta_lr"]))
        print(f"[compare] MWMS np={np_}: {statistics.median(sps):,.0f} samples/s", flush=True)


def tta_workload_flags(args):
    """The worker flags that choose the time-to-accuracy workload and bound its runs."""
    flags = ["--tta-model", args.tta_model, "--tta-cap", repr(args.tta_cap)]
    if args.tta_batch is not None:
        flags += ["--tta-batch", str(args.tta_batch)]
    if args.tta_lr is not None:
        flags += ["--tta-lr", repr(args.tta_lr)]
    return flags


def tta_np(args):
    return 2 if 2 in args.np_list else max(args.np_list)


# --- main ---------------------------------------------------------------------------------------------
def order_note(args):
    """How many repeats each group ran, and whether they make whole Williams designs."""
    groups = [("Custom loop", len(CUSTOM_LOOP))] + ([] if args.no_fit else [("model.fit", len(FIT))])
    parts = []
    for label, n in groups:
        repeats = args.repeats or default_repeats(n)
        designs = (f"{repeats // design_length(n)} whole design(s) of {design_length(n)} rounds"
                   if is_whole_design(n, repeats) else
                   f"not a whole design of {design_length(n)} rounds, so only partly balanced")
        parts.append(f"{label}: {n} configurations, median of {repeats} repeats ({designs})")
    return "; ".join(parts)


def method_notes(args, tta=None):
    notes = [
        f"Throughput: samples/s = steps × per-rank batch (32) × np ÷ the slowest rank's time for {args.steps} "
        f"steps (ResNet: {args.resnet_steps}) after one discarded warm-up run (trace, first collectives), "
        f"with min–max over the repeats. {order_note(args)}. Within a launch the configurations run "
        "round-robin, each round a row of a Williams design: over one design (n rounds for an even number n "
        "of configurations, 2n for odd n) each configuration runs in each position, and directly after each "
        "other configuration within a round, equally often (once for even n, twice for odd n), and none runs "
        "twice in a row across rounds (n ≥ 3), so noise and after-effects hit them alike.",
        f"Custom loop: one tf.function takes {args.steps_per_call} steps in a tf.range loop over pre-sharded "
        "tensors, collectives inside; the same for every configuration. model.fit rows use steps_per_execution="
        f"{args.steps_per_call} and are timed from the end of the first execution.",
        "One TF intra-op and one inter-op thread per rank (hvd_easgd.init(threads_per_rank=1)); same model, seed, "
        "SGD(lr=0.05, momentum=0.9) and per-rank batch for every throughput configuration; data sharded as "
        "hvd_easgd.data does.",
        "Bytes/sample: payload bytes a rank hands to collectives per sample it trains on: for hvd_easgd from "
        "comm.account(); for raw_horovod and no_comm counted inside the graph at horovod.tensorflow's "
        "collective functions (calls, and the bytes of the tensors actually passed). Analytic value, from the "
        "model's parameter count, in brackets.",
        "Scaling efficiency: samples/s at np=n ÷ (n × samples/s at np=1), same configuration and controller.",
        "Ratios come only from figures measured in this invocation; 'per repeat' ranges pair the interleaved "
        "repeats of the same launch.",
        "Other processes: the share of the machine's CPU time used by processes other than the suite's, "
        "sampled for 1 s before each launch and measured over each launch (all CPUs' busy time from /proc/stat "
        "minus our launches' own CPU time), is listed per launch above; the suite cannot stop them.",
    ]
    if tta:
        notes.append(f"Time to accuracy: each configuration trains at the learning rate train.py --lr "
                     f"{tta['base_lr']} --scale-lr uses for it, {tta['base_lr']} × "
                     "the strategy's lr_scale_factor(np, accumulation k), the method train.py asks, so "
                     "accumulation is scaled by train.py's rule"
                     + ("; MWMS at SyncAverage's" if "mwms_fit" in tta["per_config"] else "")
                     + ". Each row's learning rate is in the table.")
    if args.run_mwms:
        notes.append("MWMS: tf.distribute.MultiWorkerMirroredStrategy with RING collectives in "
                     f"{mwms.TF_KERAS.replace('==', ' ')} (Keras 3 model.fit fails under MWMS), workers started with TF_CONFIG on 127.0.0.1, the same "
                     "CNN layer for layer, shards, batch and SGD; its "
                     f"{args.repeats or default_repeats(len(FIT))} repeats (as many as the model.fit rows') are "
                     "consecutive within its own launch.")
    if "mpi" in args.controller_list:
        notes.append(f"MPI launches: horovodrun --mpi, binding {args.mpi_binding} "
                     "(none = horovodrun's '-bind-to none -map-by slot'), "
                     + ("Open MPI busy-polling (--mpi-busy-poll: OMPI_MCA_mpi_yield_when_idle=0)" if args.mpi_busy_poll else
                        "OMPI_MCA_mpi_yield_when_idle=1 (Horovod's background thread waits in MPI every cycle; "
                        "busy-polling there takes CPU from the ranks' compute threads on a machine with no spare core)")
                     + "; mpi4py uses the same Open MPI.")
    return notes


def main(argv=None, prog=PROG):
    """Runs the suite; ``prog`` is how it was invoked (recorded as the command)."""
    args = parse_args(argv, prog)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = os.path.abspath(args.out or os.path.join(RESULTS_ROOT, stamp))
    os.makedirs(os.path.join(out_dir, "logs"), exist_ok=True)
    command = f"{prog} " + shlex.join(argv if argv is not None else sys.argv[1:])
    results = {"timestamp": stamp, "command": command.strip(), "quick": args.quick, "machine": machine.describe(),
               "versions": {}, "settings": {k: v for k, v in vars(args).items() if not k.startswith("_")},
               "launches": [], "rows": [], "allreduce": [], "time_to_accuracy": None, "failures": []}
    if args.link_rate_list:
        return rated_links.main(args, out_dir, command.strip(), stamp)
    results["versions"]["mpi_library"] = machine.mpi_library()
    started = time.perf_counter()
    tta_pending = args.run_tta
    for np_ in args.np_list:
        for controller in args.controller_list:
            tta = tta_pending and np_ == tta_np(args)
            tta_pending = tta_pending and not tta
            _launch(args, results, out_dir, np_, controller, "", tta,
                    lambda out_json: worker_command(args, np_, controller, out_json, tta))
            if controller == "mpi":
                # What a job gets by default: hvd_easgd's configurations on the collectives that
                # `auto` picks under an MPI launch (the direct path where its ops are built). In its
                # own launch: raw Horovod's rows need Horovod, which the direct path does not start.
                _launch(args, results, out_dir, np_, controller, "-default", False,
                        lambda out_json: default_path_command(args, np_, out_json))
    if results["allreduce"]:
        run_raw_references(args, out_dir, results)
    if args.run_mwms:
        run_mwms(args, out_dir, results)
    finish(results, args, out_dir, started)
    return 0 if results["rows"] else 1


def default_path_command(args, np_, out_json):
    """The worker on the default collectives (``auto``): hvd_easgd's configurations and
    the no-communication ceiling only, no model.fit, microbenchmark or time to accuracy."""
    cmd, binding, env = worker_command(argparse.Namespace(**dict(vars(args), no_fit=True, no_allreduce=True)),
                                       np_, "mpi", out_json, tta=False)
    hvd_easgd_configs = [c for c in CUSTOM_LOOP if c != "raw_horovod"]
    return cmd + ["--collectives", "auto", "--configs", ",".join(hvd_easgd_configs)], binding, env


def _launch(args, results, out_dir, np_, controller, suffix, tta, command):
    """One bounded worker launch; its rows, versions and launch record go into ``results``.
    ``command(out_json)`` gives ``(cmd, binding, extra_env)``, as ``worker_command`` does."""
    out_json = os.path.join(out_dir, f"launch-np{np_}-{controller}{suffix}.json")
    log_path = os.path.join(out_dir, "logs", f"hvd-np{np_}-{controller}{suffix}.log")
    cmd, binding, extra_env = command(out_json)
    busy = wait_until_idle(args.wait_idle) if args.wait_idle else foreign_cpu_busy()
    print(f"[compare] horovodrun np={np_} --{controller} (binding {binding})"
          + (" + time-to-accuracy" if tta else "") + (", default collectives" if suffix else ""), flush=True)
    t0 = time.perf_counter()
    with machine.ForeignLoad() as foreign:
        outcome = run_local(cmd, log_path, args.launch_timeout, extra_env)
    for line in _progress(log_path):
        print("   ", line, flush=True)
    if not outcome.ok or not os.path.exists(out_json):
        report_failed_launch(results["failures"], f"np={np_} {controller}{suffix}", outcome)
        return
    with open(out_json) as f:
        launch = json.load(f)
    results["launches"].append({"np": np_, "controller": controller, "binding": binding, "kind": "horovodrun",
                                "collectives": launch.get("collectives"),
                                "command": " ".join([*(f"{k}={v}" for k, v in extra_env.items()),
                                                     shlex.join(cmd)]),
                                "env": extra_env, "foreign_cpu_busy": busy,
                                "foreign_cpu_share_during": foreign.share,
                                "cpu_affinity_per_rank": launch["cpu_affinity_per_rank"],
                                "threads_per_rank": launch["threads_per_rank"],
                                "horovod_settings": launch.get("horovod_settings"),
                                "loadavg_before": launch["loadavg_before"],
                                "loadavg_after": launch["loadavg_after"],
                                "seconds": time.perf_counter() - t0})
    for key, value in launch["versions"].items():
        results["versions"].setdefault(key, value)
    results["rows"] += launch["rows"]
    if launch.get("allreduce"):
        results["allreduce"].append(launch["allreduce"])
    if launch.get("time_to_accuracy"):
        results["time_to_accuracy"] = launch["time_to_accuracy"]


def finish(results, args, out_dir, started):
    rows = results["rows"]
    report.add_scaling_efficiency(rows)
    tta = results["time_to_accuracy"]
    mwms_tta = results.pop("_mwms_tta", None)
    if tta and mwms_tta:
        tta["per_config"]["mwms_fit"] = mwms_tta
    if tta:
        for name, res in tta["per_config"].items():
            row = report.find(rows, config=name, model="cnn", np=tta["np"],
                              controller="grpc-ring" if name == "mwms_fit" else tta["controller"])
            if row is not None:
                row["final_test_accuracy"] = res["final_accuracy"]
                row["time_to_accuracy"] = {k: res[k] for k in ("epochs_to_target", "seconds_to_target",
                                                               "seeds_reaching_target", "train_seconds")}
    results["headlines"] = report.headline_ratios(rows, results["allreduce"])
    results["method"] = method_notes(args, tta)
    results["seconds"] = time.perf_counter() - started
    results["plots"] = plots.write_all(results, out_dir)
    text = report.markdown(results) + f"\nTotal wall time of the suite: {results['seconds']:.0f} s.\n"
    report.write(out_dir, results, text)


if __name__ == "__main__":
    sys.exit(main())
