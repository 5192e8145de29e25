"""Horovod's own settings against hvd_easgd's defaults, launch against launch.

``python -m benchmarks.studies.tuning_ab [--pairs 3] [--controllers mpi,gloo] [--models cnn]``

Horovod reads its tunables once, in ``hvd.init()``, so the two arms are two
kinds of launch (``horovodrun -np 2``):

* ``horovod``: Horovod 0.28.1's own values, set explicitly
  (``tuning.HOROVOD_OWN_DEFAULTS``), which ``hvd_easgd.init()`` leaves alone
  as it leaves any setting of the user's;
* ``hvd_easgd``: nothing set; ``hvd_easgd.init()`` chooses
  (``hvd_easgd.startup.tuning``).

``--horovod-arm-yields`` gives the ``horovod`` arm Open MPI's yielding too
(``OMPI_MCA_mpi_yield_when_idle=1``, as the suite's MPI launches have), so
that only Horovod's own tunables differ; without it that arm runs as plain
``horovodrun`` does, with Open MPI busy-polling (``=0``, its default when a
host's slots are not oversubscribed). ``--candidate NAME=VALUE`` gives the
``hvd_easgd`` arm a setting to try on top of hvd_easgd's defaults (how the
rejected ``HOROVOD_CYCLE_TIME=0.1`` was measured).
Launches of the two arms alternate, in pairs of a Williams design of two
(AB, BA, AB, ...), so slow drifts of the shared machine's load fall on
both. Each launch times the configurations (``--configs``, interleaved as
in the suite) and the latency of the CNN's gradients (153 KB, 8 tensors) in
one grouped allreduce inside a ``tf.function``, raw and through hvd_easgd's
communicator; every pair also runs the mpi4py reference of the same payload
(its own MPI launch, no Horovod). Reported: hvd_easgd ÷ horovod per pair,
median (min–max) over pairs, with the load average of each launch.
"""
import argparse
import datetime
import json
import os
import shlex
import sys
import time

from hvd_easgd.startup import tuning

from ..suite.compare import RESULTS_ROOT
from ..suite.machine import foreign_cpu_busy
from ..suite.order import balanced_order
from ..suite.runner import local_launch, log_tail, run_local, spread, summary, table

ARMS = ("horovod", "hvd_easgd")
YIELD = {"OMPI_MCA_mpi_yield_when_idle": "1"}  # the suite's MPI launches' (compare.mpi_polling_env)
CNN_GRADIENT_BYTES = 153_000  # replaced by the measured size in the reference launch


def arm_env(arm, horovod_arm_yields=False, candidate=()):
    """The environment a launch of ``arm`` adds to the suite's."""
    if arm == "horovod":
        own = {k: v for k, v in tuning.HOROVOD_OWN_DEFAULTS.items() if v is not None}
        return dict(own, OMPI_MCA_mpi_yield_when_idle="1" if horovod_arm_yields else "0")
    return dict(kv.split("=", 1) for kv in candidate)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.tuning_ab", description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3, help="launch pairs per controller (>= 3 for a min-max)")
    p.add_argument("--controllers", default="mpi,gloo")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--models", default="cnn", help="comma-separated, from cnn,resnet,wide_mlp")
    p.add_argument("--configs", default="no_comm,raw_horovod,sync",
                   help="custom-loop configurations (benchmarks.suite.names.CUSTOM_LOOP)")
    p.add_argument("--repeats", type=int, default=6, help="timed repeats per configuration in a launch")
    p.add_argument("--steps", type=int, default=200, help="digits-CNN steps per repeat")
    p.add_argument("--resnet-steps", type=int, default=20)
    p.add_argument("--wide-mlp-steps", type=int, default=20)
    p.add_argument("--no-latency", action="store_true", help="skip the allreduce latency rows")
    p.add_argument("--latency-iterations", type=int, default=200)
    p.add_argument("--launch-timeout", type=int, default=600)
    p.add_argument("--horovod-arm-yields", action="store_true",
                   help="the horovod arm also sets OMPI_MCA_mpi_yield_when_idle=1 (default: 0, Open MPI's own)")
    p.add_argument("--candidate", action="append", default=[], metavar="NAME=VALUE",
                   help="a setting the hvd_easgd arm tries on top of hvd_easgd's defaults (repeatable)")
    p.add_argument("--out", metavar="DIR")
    p.add_argument("--worker-out", help=argparse.SUPPRESS)  # internal: this process is one rank of a launch
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error(f"--pairs must be an integer >= 1. Received: --pairs={args.pairs}")
    args.controller_list = args.controllers.split(",")
    if set(args.controller_list) - set(tuning.CONTROLLERS):
        p.error(f"--controllers must be chosen from {','.join(tuning.CONTROLLERS)}. "
                f"Received: --controllers={args.controllers}")
    return args


# --- one launch (every rank runs this) -------------------------------------------------------
def worker_main(args):
    import hvd_easgd
    from hvd_easgd import atomic
    from hvd_easgd.startup import runtime

    from ..suite import allreduce, machine, worker

    load_before = os.getloadavg()
    comm = hvd_easgd.init(threads_per_rank=1)
    launch = worker.Launch(comm)
    wargs = worker.parse_args(["--out", args.worker_out, "--controller", runtime.horovod_settings()["controller"],
                               "--configs", args.configs, "--repeats", str(args.repeats),
                               "--steps", str(args.steps), "--resnet-steps", str(args.resnet_steps),
                               "--wide-mlp-steps", str(args.wide_mlp_steps)])
    out = {"np": comm.size, "horovod_settings": runtime.horovod_settings(), "versions": machine.versions(),
           "loadavg_before": load_before, "rows": [], "latency": None}
    for model_name in args.models.split(","):
        rows, shapes = worker.throughput(launch, wargs, model_name)
        out["rows"] += rows
        if model_name == "cnn" and not args.no_latency:
            launch.barrier()
            out["latency"] = allreduce.gradient_latency(comm, shapes, args.latency_iterations)
            launch.say("latency: " + ", ".join(f"{k}={v['median']:.0f}" for k, v in out["latency"].items()
                                               if k.endswith("_us")))
    out["loadavg_after"] = os.getloadavg()
    if comm.rank == 0:
        atomic.write_json(args.worker_out, out, indent=1)
    return 0


# --- the driver ---------------------------------------------------------------------------------
def launch_once(args, out_dir, controller, arm, pair):
    tag = f"{controller}-{arm}-pair{pair}"
    out_json = os.path.join(out_dir, f"{tag}.json")
    log_path = os.path.join(out_dir, "logs", f"{tag}.log")
    cmd = local_launch(args.np, controller) + [
        sys.executable, "-m", "benchmarks.studies.tuning_ab", "--worker-out", out_json, "--models", args.models,
        "--configs", args.configs, "--repeats", str(args.repeats), "--steps", str(args.steps),
        "--resnet-steps", str(args.resnet_steps), "--wide-mlp-steps", str(args.wide_mlp_steps),
        "--latency-iterations", str(args.latency_iterations)] + (["--no-latency"] if args.no_latency else [])
    env = arm_env(arm, args.horovod_arm_yields, args.candidate)
    busy = foreign_cpu_busy()
    print(f"[tuning_ab] {tag}: load {os.getloadavg()[0]:.1f}, other processes {busy:.0%} of the CPUs", flush=True)
    started = time.perf_counter()
    outcome = run_local(cmd, log_path, args.launch_timeout, env)
    if not outcome.ok or not os.path.exists(out_json):
        print(f"[tuning_ab] {tag} failed ({outcome.why}):\n{log_tail(log_path, 1500)}", flush=True)
        return None
    with open(out_json) as f:
        result = json.load(f)
    result.update(controller=controller, arm=arm, pair=pair, env=env, foreign_cpu_busy=busy,
                  seconds=time.perf_counter() - started,
                  command=" ".join([*(f"{k}={v}" for k, v in env.items()), shlex.join(cmd)]))
    return result


def mpi4py_reference(args, out_dir, pair, gradient_bytes):
    """mpi4py Allreduce of the same payload (its own MPI launch, no Horovod): µs per call."""
    out_json = os.path.join(out_dir, f"mpi4py-pair{pair}.json")
    cmd = local_launch(args.np, "mpi") + [sys.executable, "-m", "benchmarks.suite.allreduce", "--raw", "--quick",
                                          "--out", out_json, "--gradient-bytes", str(gradient_bytes)]
    outcome = run_local(cmd, os.path.join(out_dir, "logs", f"mpi4py-pair{pair}.log"), 180, YIELD)
    if not outcome.ok or not os.path.exists(out_json):
        return None
    with open(out_json) as f:
        return json.load(f)["gradients"]["mpi4py_allreduce_us"]["median"]


def summarise(launches, references):
    """Per (controller, model, config): hvd_easgd ÷ horovod samples/s per pair; latency likewise."""
    by = {(r["controller"], r["pair"], r["arm"]): r for r in launches}
    rows = []
    keys = sorted({(r["controller"], row["model"], row["config"]) for r in launches for row in r["rows"]})
    for controller, model, config in keys:
        ratios, loads, arms = [], [], {a: [] for a in ARMS}
        for (c, pair, arm), launch in by.items():
            if c != controller or arm != "hvd_easgd" or (c, pair, "horovod") not in by:
                continue
            pair_sps = {}
            for a in ARMS:
                other = by[(c, pair, a)]
                found = [row for row in other["rows"] if row["model"] == model and row["config"] == config]
                if found:
                    pair_sps[a] = found[0]["samples_per_sec"]["median"]
                    arms[a].append(pair_sps[a])
                    loads.append(other["loadavg_before"][0])
            if len(pair_sps) == 2:
                ratios.append(pair_sps["hvd_easgd"] / pair_sps["horovod"])
        rows.append({"controller": controller, "model": model, "config": config,
                     "tuned_over_default": summary(ratios), "per_pair": ratios,
                     "samples_per_sec": {a: summary(v) for a, v in arms.items()},
                     "loadavg_1min": summary(loads)})
    latency = []
    for controller in sorted({r["controller"] for r in launches}):
        per_arm = {a: [] for a in ARMS}
        ratios = []
        for pair in sorted({r["pair"] for r in launches}):
            got = {a: by.get((controller, pair, a)) for a in ARMS}
            if any(g is None or g.get("latency") is None for g in got.values()):
                continue
            us = {a: got[a]["latency"]["hvd_easgd_comm_allreduce_us"]["median"] for a in ARMS}
            for a in ARMS:
                per_arm[a].append(us[a])
            ratios.append(us["horovod"] / us["hvd_easgd"])
        raw = {a: summary([by[(controller, p, a)]["latency"]["hvd_grouped_allreduce_us"]["median"]
                                 for p in sorted({r["pair"] for r in launches})
                                 if by.get((controller, p, a)) and by[(controller, p, a)].get("latency")])
               for a in ARMS}
        latency.append({"controller": controller, "comm_allreduce_us": {a: summary(v) for a, v in per_arm.items()},
                        "hvd_grouped_allreduce_us": raw, "speedup_default_over_tuned": summary(ratios),
                        "mpi4py_allreduce_us": summary(list(references.values()))})
    return rows, latency


def markdown(rows, latency, launches):
    parts = [table(["controller", "model", "configuration", "Horovod's defaults, samples/s", "hvd_easgd's, samples/s",
                    "hvd_easgd ÷ Horovod's, median (min–max) of pairs", "load (1 min)"],
                   [[r["controller"], r["model"], r["config"], spread(r["samples_per_sec"]["horovod"], 0, "n/a"),
                     spread(r["samples_per_sec"]["hvd_easgd"], 0, "n/a"), spread(r["tuned_over_default"], 2, "n/a"),
                     spread(r["loadavg_1min"], 1, "n/a")] for r in rows],
                   "lllrrrr")]
    if latency:
        parts += ["", table(["controller", "comm.allreduce, Horovod's defaults (µs)",
                             "comm.allreduce, hvd_easgd's (µs)", "speed-up", "raw hvd.grouped_allreduce, Horovod's / hvd_easgd's (µs)",
                             "mpi4py Allreduce (µs)"],
                            [[r["controller"], spread(r["comm_allreduce_us"]["horovod"], 0, "n/a"),
                              spread(r["comm_allreduce_us"]["hvd_easgd"], 0, "n/a"),
                              spread(r["speedup_default_over_tuned"], 2, "n/a"),
                              f"{spread(r['hvd_grouped_allreduce_us']['horovod'], 0, 'n/a')} / "
                              f"{spread(r['hvd_grouped_allreduce_us']['hvd_easgd'], 0, 'n/a')}",
                              spread(r["mpi4py_allreduce_us"], 0, "n/a")] for r in latency],
                            "lrrrrr")]
    settings = {r["arm"]: r["horovod_settings"] for r in launches}
    parts += ["", "Settings in force per arm (from hvd_easgd.startup.runtime.horovod_settings(), recorded by each "
                  "launch):"]
    for arm, rec in sorted(settings.items()):
        parts.append(f"- {arm}: " + ", ".join(f"{k}={v['value']} ({v['set_by']})" for k, v in rec["settings"].items()))
    return "\n".join(parts) + "\n"


def main(argv=None):
    args = parse_args(argv)
    if args.worker_out:
        return worker_main(args)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = os.path.abspath(args.out or os.path.join(RESULTS_ROOT, f"tuning-ab-{stamp}"))
    os.makedirs(os.path.join(out_dir, "logs"), exist_ok=True)
    launches, references = [], {}
    for pair in range(args.pairs):
        for controller in args.controller_list:
            for arm in balanced_order(list(ARMS), pair):  # AB, BA, AB, ...
                result = launch_once(args, out_dir, controller, arm, pair)
                if result is not None:
                    launches.append(result)
        if not args.no_latency:
            with_latency = [r for r in launches if r.get("latency")]
            size = with_latency[0]["latency"]["bytes"] if with_latency else CNN_GRADIENT_BYTES
            references[pair] = mpi4py_reference(args, out_dir, pair, size)
        rows, latency = summarise(launches, references)
        text = markdown(rows, latency, launches)
        print(text, flush=True)
        with open(os.path.join(out_dir, "results.json"), "w") as f:
            json.dump({"command": "python -m benchmarks.studies.tuning_ab " + shlex.join(argv or sys.argv[1:]),
                       "timestamp": stamp,
                       "arms": {a: arm_env(a, args.horovod_arm_yields, args.candidate) for a in ARMS},
                       "launches": launches,
                       "mpi4py_reference_us": references, "rows": rows, "latency": latency}, f, indent=1)
        with open(os.path.join(out_dir, "results.md"), "w") as f:
            f.write(text)
    return 0 if launches else 1


if __name__ == "__main__":
    sys.exit(main())
