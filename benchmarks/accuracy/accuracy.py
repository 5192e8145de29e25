"""Accuracy and bytes of train.py variants over seeds: ``python -m benchmarks accuracy``.

    python -m benchmarks accuracy --out docs/results/compression-np2     # every variant, 3 seeds, np = 2
    python -m benchmarks accuracy --variants diloco,diloco_int8 --seeds 1 --out /tmp/acc

Each variant is a set of ``train.py`` flags and, for a compressed one, its
fp32 twin (the same flags without ``--compression``). Every (variant, seed)
is one ``horovodrun -np N python train.py --seed S ...`` at train.py's
defaults otherwise (default lr, epochs and collectives: what a user gets),
each launch bounded in time (``study``, the runner of every study). The
run's own ``config.yaml`` and ``metrics.json`` are kept in
``OUT/<variant>-seed<S>/`` and ``OUT/runs.json`` names every command, so the
docs page rendered from them (``python -m benchmarks defaults-report``:
``docs/compression-accuracy.md``) shows what train.py wrote, never numbers
copied by hand. Invoked again with the same ``--out``, it continues: the
runs already kept are not made again.

The targets it measures against: every compressed variant reaches
``--floor`` (0.95) and its mean over the seeds is within ``--within`` (1 pp)
of its twin's; DiLoCo int8's ``wire_bytes_per_step`` at most 0.30 of fp32
DiLoCo's and int4's at most 0.17; SyncAverage with PowerSGD rank 4 at most
0.25 of fp32 SyncAverage's after its warm-up. The run's mean of a per-epoch
figure weighs each epoch by its steps (equal here: every epoch has the same
number of steps).

This process never imports TensorFlow: it launches, waits and copies.
"""
import statistics
import sys

from .study import Variant, chosen, continue_runs, kept_runs, parsed, parser, run_or_render
from ..suite.runner import table


def _compressed(strategy, formats, extra=()):
    base = (Variant(strategy, ("--strategy", strategy)),)
    return base + tuple(Variant(f"{strategy}_{label}", ("--strategy", strategy, *flags), strategy)
                        for label, flags in formats) + extra


INT8_INT4 = (("int8", ("--compression", "int8")), ("int4", ("--compression", "int4")))
VARIANTS = (_compressed("diloco", INT8_INT4) + _compressed("periodic", INT8_INT4) + _compressed("easgd", INT8_INT4)
            + _compressed("sync", (("int8", ("--compression", "int8")),
                                   ("powersgd4", ("--compression", "powersgd", "--powersgd-rank", "4")))))
BY_NAME = {v.name: v for v in VARIANTS}
# Wire bytes per step at most this fraction of the twin's (mean over the run; PowerSGD's after its warm-up).
BYTES_GOALS = {"diloco_int8": 0.30, "diloco_int4": 0.17, "sync_powersgd4": 0.25}
FLOOR = 0.95
WITHIN_PP = 1.0


def parse_args(argv, prog):
    p = parser(prog, __doc__, None, timeout=300)
    p.add_argument("--variants", help=f"comma-separated, from {','.join(BY_NAME)} (default all; a compressed "
                                      "variant brings its twin)")
    args = parsed(p, argv)
    args.variant_list = chosen(p, args.variants, VARIANTS, option="--variants")
    return args


def main(argv=None, prog="python -m benchmarks accuracy"):
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    return run_or_render(args, render, lambda out: continue_runs(out, {"np": args.np}, args.variant_list, args.np,
                                                                 args.seeds, args.timeout, "accuracy"))


# --- the report (also rendered into the docs) ---------------------------------------------------------
def _run_mean(metrics, key, skip_epochs=0):
    epochs = metrics["epochs"][skip_epochs:] or metrics["epochs"]
    values = [e[key] for e in epochs if e.get(key) is not None]
    return statistics.fmean(values) if values else None


def summarise(directory):
    """Per variant: its runs' final accuracies, mean payload and wire bytes per step, and its twin."""
    index, runs = kept_runs(directory)
    found = {}
    for run, metrics in runs:
        # PowerSGD's bytes goal is after its warm-up: the first epoch holds the uncompressed steps.
        skip = 1 if "powersgd" in run["variant"] else 0
        entry = found.setdefault(run["variant"], {"twin": run["twin"], "accuracy": [], "wire": [], "payload": [],
                                                  "commands": [], "skip_epochs": skip})
        entry["accuracy"].append(metrics["final"]["test_accuracy"])
        entry["wire"].append(_run_mean(metrics, "wire_bytes_per_step", skip))
        entry["payload"].append(_run_mean(metrics, "bytes_sent_per_step", skip))
        entry["commands"].append(run["command"])
    return index, found


def _without_run_options(command):
    """A kept run's command as a user would type it: without its seed and run directory."""
    words = command.split()
    kept = [w for i, w in enumerate(words) if w not in ("--seed", "--run-dir")
            and (i == 0 or words[i - 1] not in ("--seed", "--run-dir"))]
    return " ".join(kept)


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def render(directory, title="Compressed payloads: accuracy and bytes at np = 2", provenance=None):
    """The Markdown page for the runs in ``directory``: its answer (from the same runs), an example command,
    ``provenance`` (a line) if given, then one row per variant with its targets checked."""
    index, found = summarise(directory)
    rows, compressed = [], []
    for name, e in found.items():
        acc = e["accuracy"]
        twin = found.get(e["twin"]) if e["twin"] else None
        delta = (f"{100 * (statistics.fmean(acc) - statistics.fmean(twin['accuracy'])):+.2f}" if twin else "—")
        wire = _mean(e["wire"])
        ratio = (f"{wire / _mean(twin['wire']):.3f}" if twin and wire is not None and _mean(twin["wire"]) else "—")
        goals = []
        if twin:
            goals.append("≥ 0.95 " + ("met" if min(acc) >= FLOOR else "**missed**"))
            goals.append(f"within {WITHIN_PP:g} pp " + ("met" if abs(statistics.fmean(acc) - statistics.fmean(
                twin["accuracy"])) * 100 <= WITHIN_PP else "**missed**"))
        if name in BYTES_GOALS and ratio != "—":
            goals.append(f"wire ≤ {BYTES_GOALS[name]:.2f} " + ("met" if float(ratio) <= BYTES_GOALS[name]
                                                              else "**missed**"))
        if twin and ratio != "—":
            compressed.append((name, statistics.fmean(acc) - statistics.fmean(twin["accuracy"]), float(ratio),
                               e["commands"][0]))
        rows.append([f"`{name}`", f"{statistics.fmean(acc):.4f}", f"{min(acc):.4f}–{max(acc):.4f}", delta,
                     "—" if _mean(e["payload"]) is None else f"{_mean(e['payload']):,.0f}",
                     "—" if wire is None else f"{wire:,.0f}", ratio, "; ".join(goals) or "—"])
    example = next(iter(found.values()))["commands"][0] if found else ""
    lines = [f"# {title}", ""]
    if compressed:
        # The answer first: each compressed variant's accuracy and bytes against its fp32 twin.
        worst = min(compressed, key=lambda c: c[1])
        smallest = min(compressed, key=lambda c: c[2])
        targets = [cell for row in rows for cell in row[-1].split("; ") if cell != "—"]
        missed = sum(cell.endswith("**missed**") for cell in targets)
        lines += [f"Over {len(compressed)} compressed variants, the mean test accuracy moves by "
                  f"{100 * min(c[1] for c in compressed):+.2f} to {100 * max(c[1] for c in compressed):+.2f} pp "
                  f"from the fp32 twin's (least: `{worst[0]}`), while each rank sends "
                  f"{min(c[2] for c in compressed):.3f}–{max(c[2] for c in compressed):.3f} of the twin's wire bytes; "
                  f"{len(targets) - missed} of {len(targets)} targets met. The fewest bytes against its twin, `{smallest[0]}`:", "",
                  "```bash", _without_run_options(smallest[3]), "```", ""]
    if provenance:
        lines += [provenance, ""]
    lines += [f"Digits, {index['np']} ranks, seeds 0–{index['seeds'] - 1}, train.py's defaults otherwise (lr, epochs, "
             f"collectives). Each row's runs are commands like `{example}`; their own config.yaml and metrics.json "
             "are the source. Bytes are per rank and optimizer step, the mean over the run's epochs "
             "(PowerSGD's from epoch 2, after its uncompressed warm-up): *payload* is what was handed to the "
             "collectives (`bytes_sent_per_step`), *wire* what each rank sent under the collective's algorithm "
             "(`wire_bytes_per_step`).", "",
             table(["variant", "accuracy, mean", "min–max", "Δ twin (pp)", "payload B/step", "wire B/step",
                    "wire ÷ twin", "targets"], rows, "lrrrrrrl")]
    if index.get("failures"):
        lines += ["", "Failed runs: " + ", ".join(index["failures"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
