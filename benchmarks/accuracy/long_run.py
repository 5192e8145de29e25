"""Does a long language-model run hold its memory? ``python -m benchmarks long-run``.

    python -m benchmarks long-run --out docs/results/long-run-language-model-np2     # 6 epochs, about 35 min
    python -m benchmarks long-run --render DIR       # rewrite DIR/memory.md from DIR's run (no launch)

One ``horovodrun -np N python train.py --data python_docs --epochs E`` at train.py's defaults otherwise: the
language model for half an hour or more, launched by the study runner (``study``: the run kept in
``OUT/long-run-seed0/`` and named in ``OUT/runs.json``; invoked again, a finished run is not made again).
train.py samples every rank's resident memory at each epoch's end (``rss_mb`` in metrics.json); the table,
``OUT/memory.md``, shows it per epoch with the epoch's seconds and validation loss, and leads with each
rank's growth after its first epoch and its slope per epoch (the real-workloads issue asks for memory flat
after the first epoch). Rendered from the run's own metrics.json, never typed. This process never imports
TensorFlow.
"""
import json
import os
import sys

from .study import RUNS, Variant, continue_runs, kept_runs, parsed, parser, run_or_render, write_rendered
from ..suite.runner import table

TABLE = "memory.md"


def parse_args(argv, prog):
    p = parser(prog, __doc__, TABLE, timeout=5400, seeds=None)
    p.add_argument("--epochs", type=int, default=6, help="epochs of the Python docs (default 6)")
    return parsed(p, argv)


def main(argv=None, prog="python -m benchmarks long-run"):
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    variant = Variant("long-run", ("--data", "python_docs", "--epochs", str(args.epochs)))
    return run_or_render(args, write_table, lambda out: continue_runs(
        out, {"np": args.np, "epochs": args.epochs}, [variant], args.np, 1, args.timeout, "long-run", shown=memory))


def memory(metrics):
    """What the progress line says of the run: each rank's resident memory after the last epoch."""
    ranks = metrics["epochs"][-1]["rss_mb"]
    return "resident memory after the last epoch " + ", ".join(f"{mb:.0f}" for mb in ranks) + " MB"


def write_table(directory):
    """Renders ``directory``'s table into its memory.md; returns the table."""
    return write_rendered(directory, TABLE, render)


def the_run(directory):
    """``(command, the epochs of its metrics.json)`` of a results folder's one run: runs.json's, or in a folder
    made before the study runner, metrics.json and command.txt beside the page."""
    if os.path.isfile(os.path.join(directory, RUNS)):
        _, ((run, metrics),) = kept_runs(directory)
        return run["command"], metrics["epochs"]
    with open(os.path.join(directory, "metrics.json")) as f:
        epochs = json.load(f)["epochs"]
    with open(os.path.join(directory, "command.txt")) as f:
        return f.read().strip(), epochs


def render(directory):
    """Per epoch: seconds, validation loss and every rank's resident memory; first, each rank's growth from
    its first epoch's end to the last, and its slope (least squares, MB an epoch) from the second epoch on:
    a leak grows with every epoch, an allocator settling does not."""
    command, epochs = the_run(directory)
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
