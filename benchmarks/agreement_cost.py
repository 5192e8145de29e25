"""What the stop-request agreement costs: train.py's throughput with it on, divided by without.

``--checkpoint-on-signal TERM`` makes the ranks sum their signal notes in one allreduce of two
float32 every ``--agree-every N`` micro-batches (hvd_easgd.callbacks.checkpointing). This runs
``horovodrun -np 2 train.py`` on digits three ways, N = 10 (the default), N = 1, and the agreement
off, under MPI and Gloo, repeats interleaved (every repeat runs each configuration once, in a
rotated order), and reports per configuration the ratio of its samples/s to the run without the
agreement of the same repeat and controller: median (min-max) over the repeats. Samples/s is
``metrics.json``'s ``final.samples_per_sec`` (the epochs' own time: start-up and evaluation are
left out). No checkpoint is written in any run (``--checkpoint-every 0``), so only the agreement
differs. The machine's load (``/proc/loadavg``) is recorded around every run: the figures are only
as good as the machine was quiet.

Usage (root: it enters a loopback-only network namespace, as the tests do)::

    python benchmarks/agreement_cost.py --repeats 3 --epochs 10
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = {
    "off": [],
    "agree every 10": ["--checkpoint-on-signal", "TERM", "--agree-every", "10"],
    "agree every 1": ["--checkpoint-on-signal", "TERM", "--agree-every", "1"],
}


def load():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def one_run(controller, options, epochs, timeout):
    """samples/s of one ``horovodrun -np 2`` train.py run."""
    python = sys.executable
    horovodrun = os.path.join(os.path.dirname(python), "horovodrun")
    run_dir = os.path.join(tempfile.mkdtemp(prefix="agreement-cost-"), "run")
    cmd = [horovodrun, "-np", "2", f"--{controller}", "--network-interface", "lo", python,
           os.path.join(ROOT, "train.py"), "--run-dir", run_dir, "--epochs", str(epochs), "--eval-every", "1000",
           "--checkpoint-every", "0", "--no-tensorboard", "--threads-per-rank", "1", "--seed", "1", *options]
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", OMPI_MCA_btl_tcp_if_include="lo",
               OMPI_MCA_oob_tcp_if_include="lo")
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    with open(os.path.join(run_dir, "metrics.json")) as f:
        return json.load(f)["final"]["samples_per_sec"]


def summary(values):
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--controllers", default="mpi,gloo")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    parser.add_argument("--out", default=None, help="also write the raw figures as JSON here")
    args = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    from tests import loopback_network

    print(f"network: {loopback_network.enter()}; load before: {load()}", flush=True)
    names = list(VARIANTS)
    rows = []
    for repeat in range(args.repeats):
        for controller in args.controllers.split(","):
            order = names[repeat % len(names):] + names[:repeat % len(names)]  # rotated: no fixed position
            for name in order:
                before = load()
                started = time.time()
                rate = one_run(controller, VARIANTS[name], args.epochs, args.timeout)
                rows.append({"repeat": repeat, "controller": controller, "variant": name, "samples_per_sec": rate,
                             "load_before": before, "load_after": load(), "seconds": time.time() - started})
                print(f"repeat {repeat + 1} {controller:4s} {name:15s} {rate:9.0f} samples/s "
                      f"(load {before} -> {rows[-1]['load_after']})", flush=True)
    print(f"\nthroughput with the agreement / without, np=2, {args.epochs} epochs of digits, "
          f"median (min-max) of {args.repeats} paired repeats:")
    for controller in args.controllers.split(","):
        base = {r["repeat"]: r["samples_per_sec"] for r in rows
                if r["controller"] == controller and r["variant"] == "off"}
        print(f"  {controller}: off {statistics.median(base.values()):.0f} samples/s (median)")
        for name in names[1:]:
            ratios = [r["samples_per_sec"] / base[r["repeat"]] for r in rows
                      if r["controller"] == controller and r["variant"] == name]
            print(f"  {controller}: {name}: {summary(ratios)}")
    print(f"load after: {load()}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
