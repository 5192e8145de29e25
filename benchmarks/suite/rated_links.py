"""The strategies across a link with a rate, on the virtual cluster (tools/vcluster.py).

    python -m benchmarks.suite.compare --hosts 2 --ranks-per-host 1 --link-rates 1gbit,100mbit
    python -m benchmarks.suite.compare --topology --hosts 2 --ranks-per-host 2 --link-rates 1gbit,100mbit

For each nominal rate the suite builds a cluster of ``--hosts`` hosts whose
links are shaped to that rate (tc tbf on every host's egress), and launches one
``horovodrun --mpi`` from node1 with the ranks spread over the hosts. That
launch first measures the link with a large allreduce and its latency with
small ones (``link_probe``: B and α, the cost model's calibration), then
times every configuration on the digits CNN and on the wide MLP (5.4 M
parameters, 21.7 MB of gradients) exactly as the single-host suite does
(``benchmarks.suite.worker``). The launch at the slowest rate also measures the
time to ``--target`` test accuracy on digits. The cluster is removed at the end, also on failure.

With ``--topology`` it compares the strategies made for several hosts
instead (``names.TOPOLOGY_SUITE``: flat SyncAverage and EASGD τ=10, the
two-level allreduce, Hierarchical(SyncAverage, EASGD τ=10), PeriodicAverage
and DiLoCo τ=10, no communication), and times them to accuracy at every rate,
not only the slowest.

Every launch counts the bytes that cross between hosts: each host's transmit
counter on its cluster interface (``--interface``), read around every timed
run, against ``configurations.cross_host_bytes_per_step``.

Against each rate it sets the analytic speed-up of EASGD over SyncAverage,
(c + T) / (c + T/τ): c is the compute time of a step (from ``no_comm``), T the
communication time of a SyncAverage step (its step time minus c).
"""
import json
import os
import shlex
import sys
import time

from tools.vcluster import INTERFACE, ClusterError, VirtualCluster, check_privileges, parse_rate

from hvd_easgd.choosing import link_probe

from . import curves, plots, report, runner
from .names import BASELINES, TOPOLOGY_SUITE
from .runner import REPO_ROOT, report_failed_launch, spread, table

CONFIGS = ("no_comm", "raw_horovod", "sync", "easgd_tau4", "easgd_tau10", "accum4_sync")
MODELS = ("cnn", "wide_mlp")
LINK_PROBE_MB = 32
# The settings every rated-link launch runs with; recorded in results.json.
# Open MPI keeps its traffic on the cluster interface and yields when idle
# (the ranks share two cores with Horovod's background threads).
MPI_ENV = {"OMPI_MCA_btl_tcp_if_include": INTERFACE, "OMPI_MCA_oob_tcp_if_include": INTERFACE,
           "OMPI_MCA_mpi_yield_when_idle": "1"}


def hosts_argument(hosts, ranks_per_host):
    return ",".join(f"{h}:{ranks_per_host}" for h in VirtualCluster.host_names(hosts))


def slowest_rate(rates):
    return min(rates, key=parse_rate)


def configs_of(args):
    if getattr(args, "configs", None):
        return tuple(args.configs.split(","))
    return TOPOLOGY_SUITE if args.topology else CONFIGS


def tta_configs_of(args):
    """The strategies timed to accuracy: every configuration but the baselines."""
    return [c for c in configs_of(args) if c not in BASELINES]


def worker_command(args, out_json, tta=False, qdisc=None):
    """The horovodrun command of one launch; ``qdisc``, the links' tc tbf, gives the α sweep its bucket."""
    np_ = args.hosts * args.ranks_per_host
    cmd = [runner.horovodrun(), "--disable-cache", "-np", str(np_),
           "-H", hosts_argument(args.hosts, args.ranks_per_host), "--mpi", sys.executable, "-m", "benchmarks.suite.worker", "--out", out_json, "--controller", "mpi",
           "--models", ",".join(args.rated_models), "--configs", ",".join(configs_of(args)),
           "--steps", str(args.steps), "--wide-mlp-steps", str(args.wide_mlp_steps),
           "--steps-per-call", str(args.steps_per_call), "--link-probe-mb", str(args.link_probe_mb),
           "--interface", INTERFACE, "--collectives", getattr(args, "collectives", "horovod")]
    if not getattr(args, "no_alpha_sweep", False):
        cmd.append("--alpha-sweep")
    if qdisc:
        cmd += ["--link-bucket", repr(link_probe.tbf_of(qdisc)[1])]
    if args.repeats is not None:
        cmd += ["--repeats", str(args.repeats)]
    if tta:
        cmd += ["--tta-seeds", str(args.seeds), "--tta-epochs", str(args.epochs), "--tta-target", str(args.target),
                "--tta-configs", ",".join(tta_configs_of(args)), "--tta-model", getattr(args, "tta_model", "cnn"),
                "--tta-cap", repr(getattr(args, "tta_cap", 0.0))]
        for flag in ("tta_batch", "tta_lr"):
            if getattr(args, flag, None) is not None:
                cmd += ["--" + flag.replace("_", "-"), repr(getattr(args, flag))]
    return cmd


def runs_tta_at(args, rate):
    """Time to accuracy runs at the slowest rate, or at every rate with --topology (one panel each)."""
    return args.run_tta and (args.topology or rate == slowest_rate(args.link_rate_list))


def launch_env(tcp_links=None):
    """The launcher's environment: ours without any loopback-only Open MPI setting, plus MPI_ENV.

    ``tcp_links``: Open MPI's TCP connections per pair of ranks (``btl_tcp_links``; None: its own, 1). With
    one, a pair's exchange through a tbf link ran at 48-66 Mbit/s of 100 where plain TCP, one socket or two,
    ran at 94, and with two at 89-96 (``benchmarks/studies/link_transport.py``)."""
    extra = dict(MPI_ENV, **({"OMPI_MCA_btl_tcp_links": str(tcp_links)} if tcp_links else {}))
    return runner.launch_env(extra, base={k: v for k, v in os.environ.items() if not k.startswith("OMPI_MCA_")})


def horovod_settings(env):
    """What decides how Horovod moves the bytes, as the launch had it."""
    return {"controller": "mpi (horovodrun --mpi)",
            "environment": {k: v for k, v in sorted(env.items()) if k.startswith(("HOROVOD_", "OMPI_MCA_"))},
            "note": "HOROVOD_* variables not listed take Horovod 0.28.1's defaults"}


def run_on_cluster(cluster, cmd, log_path, timeout, env=None):
    """``runner.run_bounded`` of ``cmd`` on node1 (the launcher), in ``env`` (default ``launch_env()``); the
    ranks it starts on the other hosts, should ssh have left any behind, are ended with it."""
    return runner.run_bounded(cmd, log_path, timeout, cluster.launcher_env(env or launch_env()),
                              through=lambda c, e: (cluster.launcher_command(c, cwd=REPO_ROOT), e),
                              cleanup=cluster.stop_jobs)


# --- the model of a step ----------------------------------------------------------------------------
def step_seconds(row):
    """Seconds per training step of one rank, from the row's median samples/s."""
    return row["batch_per_rank"] * row["np"] / row["samples_per_sec"]["median"]


def analysis(rows):
    """Per (model, rate): c, T, and EASGD ÷ SyncAverage measured against (c + T) / (c + T/τ)."""
    found = []
    keys = sorted({(r["model"], r["link"]["nominal"]) for r in rows}, key=lambda k: (k[0], -parse_rate(k[1])))
    for model, rate in keys:
        by = {r["config"]: r for r in rows if r["model"] == model and r["link"]["nominal"] == rate}
        if "no_comm" not in by or "sync" not in by:
            continue
        c, sync = step_seconds(by["no_comm"]), step_seconds(by["sync"])
        t = max(sync - c, 0.0)
        entry = {"model": model, "link_rate": rate, "measured_mbit": by["sync"]["link"]["measured_mbit"],
                 "compute_seconds_per_step": c, "sync_comm_seconds_per_step": t, "easgd": {}}
        for tau in (4, 10):
            row = by.get(f"easgd_tau{tau}")
            if row is None:
                continue
            measured = row["samples_per_sec"]["median"] / by["sync"]["samples_per_sec"]["median"]
            predicted = (c + t) / (c + t / tau)
            entry["easgd"][tau] = {"measured": measured, "analytic": predicted,
                                   "relative_error": measured / predicted - 1}
        found.append(entry)
    return found


# --- report -------------------------------------------------------------------------------------------
def throughput_pass(results, model):
    """What a throughput row of ``model`` timed: its pass's steps, repeats and batch, and, when the run also
    timed accuracy on another model, that these rows are not of that workload."""
    steps = results["settings"]["wide_mlp_steps" if model == "wide_mlp" else "steps"]
    batches = sorted({r["batch_per_rank"] for r in results["rows"] if r["model"] == model})
    repeats = results["settings"]["repeats"]
    text = (f"the throughput pass (`--models {model}`: {steps} steps per repeat, {repeats} "
            f"repeat{'s' if repeats != 1 else ''}, per-rank batch {', '.join(map(str, batches))})")
    trained = {tta.get("model", "cnn") for tta in results["time_to_accuracy_by_rate"]}
    if trained - {model}:
        text += f", not the time-to-accuracy workload ({', '.join(sorted(trained))})"
    return text


def _find(rows, model, config, rate):
    return next((r for r in rows if r["model"] == model and r["config"] == config
                 and r["link"]["nominal"] == rate), None)


def _per_rate(results, model, cell):
    """A table of ``cell(row, rate)`` per configuration (rows) and link rate (columns)."""
    rates = [link["nominal"] for link in results["links"]]
    return table(["configuration", *rates],
                 [[config, *(cell(_find(results["rows"], model, config, rate), rate) for rate in rates)]
                  for config in results["configs"]],
                 "l" + "r" * len(rates))


def _answer(results):
    """The report's first lines: per model and rate, the configuration with the most samples/s (the
    no-communication baseline aside) and how it compares with flat SyncAverage, from the same rows."""
    parts = []
    for model in results["models"]:
        for link in results["links"]:
            rate = link["nominal"]
            rows = [r for r in results["rows"] if r["model"] == model and r["link"]["nominal"] == rate
                    and r["config"] != "no_comm" and r.get("samples_per_sec")]
            if not rows:
                continue
            best = max(rows, key=lambda r: r["samples_per_sec"]["median"])
            sync = _find(results["rows"], model, "sync", rate)
            versus = (f", {best['samples_per_sec']['median'] / sync['samples_per_sec']['median']:.2f}× SyncAverage"
                      if sync and sync.get("samples_per_sec") and best is not sync else "")
            parts.append(f"{curves.throughput_model_name(model)} at {rate}: `{best['config']}`{versus}")
    if not parts:
        return "No configuration ran to a throughput; the failures are listed below."
    return "The most samples/s, per model and rate: " + "; ".join(parts) + "."


def markdown(results):
    topology = results["topology"]
    lines = [f"# Strategies across a rated link ({results['timestamp']})", "",
             _answer(results), "",
             "```bash", results["command"], "```", "",
             f"Topology: {topology['hosts']} hosts × {topology['ranks_per_host']} rank(s), "
             f"virtual cluster `{topology['cluster']}`, tc tbf on every host's egress.", "",
             table(["nominal rate", "measured (allreduce bus bandwidth)"],
                   [[link["nominal"], f"{link['measured_mbit']:,.0f} Mbit/s"] for link in results["links"]], "lr")]
    for model in results["models"]:
        def throughput(row, rate, model=model):
            if not row:
                return "–"
            sync = _find(results["rows"], model, "sync", rate)
            ratio = f", {row['samples_per_sec']['median'] / sync['samples_per_sec']['median']:.2f}×" if sync else ""
            return spread(row["samples_per_sec"], 0) + ratio

        def crossed(row, rate):
            measured = row and row.get("cross_host_bytes_per_sample")
            return ("–" if measured is None else
                    f"{measured:,.0f} / {row['expected_cross_host_bytes_per_sample']:,.0f}")

        name = f"**{curves.throughput_model_name(model)}**, {throughput_pass(results, model)}"
        lines += ["", f"{name}: samples/s, median (min–max) of the repeats, and ÷ flat SyncAverage:", "",
                  _per_rate(results, model, throughput),
                  "", f"{name}: bytes per sample that crossed between hosts, measured (every host's "
                  "transmit counter) / analytic (configurations.cross_host_bytes_per_step):", "",
                  _per_rate(results, model, crossed)]
    if results["analysis"]:
        # τ keys are ints as compare computes them and strings once results.json is read back: one form.
        analysis = [dict(a, easgd={int(tau): v for tau, v in a["easgd"].items()}) for a in results["analysis"]]
        lines += ["", "c: compute time per step (no_comm); T: communication time per SyncAverage step "
                  "(its step time − c). EASGD ÷ SyncAverage, measured against (c + T)/(c + T/τ):", "",
                  table(["model", "rate", "c (ms)", "T (ms)", "τ=4 measured / analytic", "τ=10 measured / analytic"],
                        [[a["model"], a["link_rate"], f"{1e3 * a['compute_seconds_per_step']:.1f}",
                          f"{1e3 * a['sync_comm_seconds_per_step']:.1f}",
                          *(f"{a['easgd'][tau]['measured']:.2f} / {a['easgd'][tau]['analytic']:.2f} "
                            f"({a['easgd'][tau]['relative_error']:+.0%})" if tau in a["easgd"] else "–"
                            for tau in (4, 10))] for a in analysis],
                        "llrrrr")]
    else:
        lines += ["", "c and T (EASGD ÷ SyncAverage against (c + T)/(c + T/τ)): not computed, the run has no "
                  "no_comm and SyncAverage rows of one model at one rate."]
    for tta in results["time_to_accuracy_by_rate"]:
        lines += ["", f"Time to accuracy across the {tta['link']['nominal']} link "
                  f"({tta['link']['measured_mbit']:,.0f} Mbit/s measured).", "", report.tta_table(tta)]
    if results["failures"]:
        lines += ["", "Failures:"] + [f"- {f}" for f in results["failures"]]
    lines += ["", f"Total wall time: {results['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


# --- main ---------------------------------------------------------------------------------------------
def main(args, out_dir, command, stamp):
    check_privileges()
    for rate in args.link_rate_list:
        parse_rate(rate)  # every rate is valid before the first cluster is built
    cluster = VirtualCluster(args.cluster_name)
    env = launch_env(getattr(args, "mpi_tcp_links", None))
    results = {"timestamp": stamp, "command": command,
               "topology": {"cluster": args.cluster_name, "hosts": args.hosts, "ranks_per_host": args.ranks_per_host,
                            "np": args.hosts * args.ranks_per_host, "interface": INTERFACE,
                            "launcher": "node1", "shaping": "tc tbf on the egress of every host's " + INTERFACE},
               "horovod_settings": horovod_settings(env), "models": list(args.rated_models),
               "configs": list(configs_of(args)), "collectives": getattr(args, "collectives", "horovod"),
               "settings": {"steps": args.steps, "wide_mlp_steps": args.wide_mlp_steps,
                            "steps_per_call": args.steps_per_call, "repeats": args.repeats,
                            "link_probe_mb": args.link_probe_mb},
               "links": [], "launches": [], "rows": [], "time_to_accuracy": None, "time_to_accuracy_by_rate": [],
               "failures": []}
    started = time.perf_counter()
    try:
        for rate in args.link_rate_list:
            state = cluster.up(args.hosts, args.ranks_per_host, rate)
            out_json = os.path.join(out_dir, f"launch-{rate}.json")
            log_path = os.path.join(out_dir, "logs", f"hvd-{rate}.log")
            tta = runs_tta_at(args, rate)
            cmd = worker_command(args, out_json, tta, state["link"]["qdisc"])
            print(f"[compare] {rate}: horovodrun across {args.hosts} hosts" + (" + time-to-accuracy" if tta else ""),
                  flush=True)
            t0 = time.perf_counter()
            outcome = run_on_cluster(cluster, cmd, log_path, args.launch_timeout, env)
            if not outcome.ok or not os.path.exists(out_json):
                report_failed_launch(results["failures"], rate, outcome)
                continue
            with open(out_json) as f:
                launch = json.load(f)
            probe = launch["link_probe"]
            link = {"nominal": rate, "nominal_bits_per_second": parse_rate(rate),
                    "qdisc": state["link"]["qdisc"], "measured_bits_per_second": probe["bits_per_second"],
                    "measured_mbit": probe["bits_per_second"] / 1e6, "probe": probe,
                    "alpha_sweep": launch.get("alpha_sweep"), "levels": launch.get("link_levels")}
            results["links"].append(link)
            results["launches"].append({"link_rate": rate, "command": shlex.join(cmd),
                                        "seconds": time.perf_counter() - t0, "versions": launch["versions"]})
            if launch.get("time_to_accuracy"):
                results["time_to_accuracy_by_rate"].append(dict(launch["time_to_accuracy"], link=link))
                if rate == slowest_rate(args.link_rate_list):
                    results["time_to_accuracy"] = results["time_to_accuracy_by_rate"][-1]
            for row in launch["rows"]:
                row["link"] = {"nominal": rate, "measured_mbit": link["measured_mbit"]}
                results["rows"].append(row)
            print(f"[compare] {rate}: measured {link['measured_mbit']:,.0f} Mbit/s; "
                  + ", ".join(f"{r['model']}/{r['config']}={r['samples_per_sec']['median']:,.0f}"
                              for r in launch["rows"]), flush=True)
    except ClusterError as err:
        results["failures"].append(f"virtual cluster: {err}")
    finally:
        cluster.down()
    results["analysis"] = analysis(results["rows"])
    results["seconds"] = time.perf_counter() - started
    results["plots"] = (plots.throughput_vs_link_rate(results, out_dir)
                        + plots.time_to_accuracy_by_rate(results["time_to_accuracy_by_rate"], out_dir))
    text = markdown(results)
    report.write(out_dir, results, text)
    return 0 if results["rows"] and not results["failures"] else 1
