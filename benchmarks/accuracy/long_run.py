"""Does a long language-model run hold its memory? ``python -m benchmarks long-run``.

    python -m benchmarks long-run --out docs/results/long-run-language-model-np2     # 6 epochs, about 35 min
    python -m benchmarks long-run --render DIR       # rewrite DIR/memory.md from DIR's run (no launch)

One ``horovodrun -np N python train.py --data python_docs --epochs E`` at train.py's defaults otherwise:
the language model for half an hour or more. train.py samples every rank's resident memory at each
epoch's end (``rss_mb`` in metrics.json); the table, ``OUT/memory.md``, shows it per epoch with the
epoch's seconds and validation loss, and leads with each rank's growth after its first epoch and its
slope per epoch (the real-workloads issue asks for memory flat after the first epoch). Rendered from the run's own
metrics.json and config.yaml (kept in OUT), never typed. This process never imports TensorFlow.
"""
import argparse
import json
import os
import shutil
import sys

from .accuracy import LocalLaunch, Variant, write_rendered
from ..suite.runner import log_tail, table

TABLE = "memory.md"


def parse_args(argv, prog):
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--out", metavar="DIR", help="where the run's config.yaml and metrics.json go")
    p.add_argument("--np", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--epochs", type=int, default=6, help="epochs of the Python docs (default 6)")
    p.add_argument("--timeout", type=float, default=5400, help="seconds for the launch (default 5400)")
    p.add_argument("--render", metavar="DIR", help="rewrite DIR/memory.md from DIR's run, print it and exit")
    args = p.parse_args(argv)
    if not args.render and not args.out:
        p.error("--out is required (or --render DIR)")
    return args


def main(argv=None, prog="python -m benchmarks long-run"):
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    if args.render:
        print(write_rendered(args.render, TABLE, render), end="")
        return 0
    out = os.path.abspath(args.out)
    scratch, log = os.path.join(out, "run"), os.path.join(out, "run.log")
    os.makedirs(out, exist_ok=True)
    variant = Variant("long-run", ("--data", "python_docs", "--epochs", str(args.epochs)))
    launch = LocalLaunch(args.np)
    outcome = launch.run(launch.command(variant, 0, scratch), log, args.timeout)
    if not outcome.ok:
        print(f"[long-run] {outcome.why}; log tail:\n{log_tail(log, 1500)}", flush=True)
        return 1
    for name in ("config.yaml", "metrics.json"):
        shutil.copy(os.path.join(scratch, name), os.path.join(out, name))
    shutil.rmtree(scratch)
    with open(os.path.join(out, "command.txt"), "w") as f:
        f.write(launch.shown(variant, 0) + "\n")
    print(write_rendered(out, TABLE, render), end="", flush=True)
    return 0


def render(directory):
    """Per epoch: seconds, validation loss and every rank's resident memory; first, each rank's growth from
    its first epoch's end to the last, and its slope (least squares, MB an epoch) from the second epoch on:
    a leak grows with every epoch, an allocator settling does not."""
    with open(os.path.join(directory, "metrics.json")) as f:
        epochs = json.load(f)["epochs"]
    with open(os.path.join(directory, "command.txt")) as f:
        command = f.read().strip()
    ranks = len(epochs[0]["rss_mb"])
    minutes = sum(e["seconds"] for e in epochs) / 60
    parts = []
    for r in range(ranks):
        first, last = epochs[0]["rss_mb"][r], epochs[-1]["rss_mb"][r]
        parts.append(f"rank {r} {first:.0f} → {last:.0f} MB ({100 * (last - first) / first:+.1f} %, "
                     f"{_slope([e['rss_mb'][r] for e in epochs[1:]]):+.1f} MB an epoch from the second epoch on)")
    lead = (f"Resident memory after the first epoch, over {len(epochs)} epochs ({minutes:.0f} minutes of "
            f"training): " + "; ".join(parts) + ".")
    rows = [[e["epoch"], f"{e['seconds']:.0f}", f"{e['test_loss']:.4f}", *(f"{m:.0f}" for m in e["rss_mb"])]
            for e in epochs]
    header = ["epoch", "seconds", "validation loss (nats/token)", *(f"rank {r} RSS (MB)" for r in range(ranks))]
    return "\n".join([lead, "", f"`{command}`, train.py's defaults otherwise.", "",
                      table(header, rows, "r" * len(header))]) + "\n"


def _slope(values):
    """Least-squares change per step of ``values`` (0 for fewer than two)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    return sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values)) / sum((x - mean_x) ** 2 for x in range(n))


if __name__ == "__main__":
    sys.exit(main())
