"""Accuracy and bytes of train.py variants over seeds: ``python -m benchmarks accuracy``.

    python -m benchmarks accuracy --out docs/results/compression-np2     # every variant, 3 seeds, np = 2
    python -m benchmarks accuracy --variants diloco,diloco_int8 --seeds 1 --out /tmp/acc

Each variant is a set of ``train.py`` flags and, for a compressed one, its
fp32 twin (the same flags without ``--compression``). Every (variant, seed)
is one ``horovodrun -np N python train.py --seed S ...`` at train.py's
defaults otherwise (default lr, epochs and collectives: what a user gets),
each launch bounded in time. The run's own ``config.yaml`` and
``metrics.json`` are copied to ``OUT/<variant>-seed<S>/`` and ``OUT/runs.json``
names every command, so the docs page rendered from them
(``python -m benchmarks defaults-report``: ``docs/compression-accuracy.md``)
shows what train.py wrote, never numbers copied by hand.

The targets it measures against: every compressed variant reaches
``--floor`` (0.95) and its mean over the seeds is within ``--within`` (1 pp)
of its twin's; DiLoCo int8's ``wire_bytes_per_step`` at most 0.30 of fp32
DiLoCo's and int4's at most 0.17; SyncAverage with PowerSGD rank 4 at most
0.25 of fp32 SyncAverage's after its warm-up. The run's mean of a per-epoch
figure weighs each epoch by its steps (equal here: every epoch has the same
number of steps).

This process never imports TensorFlow: it launches, waits and copies.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import sys
from typing import NamedTuple

from ..suite.runner import REPO_ROOT, local_launch, log_tail, run_local, table


class Variant(NamedTuple):
    name: str
    flags: tuple
    twin: str = None  # the fp32 variant it is compared with; None for an fp32 one


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


class LocalLaunch(NamedTuple):
    """How a run of ``np`` ranks starts on this host: ``horovodrun`` over loopback (the default of
    ``run_over_seeds``; ``time_to_target.ClusterLaunch`` starts one across the virtual cluster's hosts)."""
    np: int
    controller: str = "mpi"

    def command(self, variant, seed, run_dir):
        """The launch of one run (with ``run_dir`` where train.py writes)."""
        return (local_launch(self.np, self.controller)
                + [sys.executable, os.path.join(REPO_ROOT, "train.py"), "--run-dir", run_dir, "--seed", str(seed),
                   *variant.flags])

    def shown(self, variant, seed):
        """The command as the docs show it: what a user types."""
        return shown_command(f"horovodrun -np {self.np}", variant, seed)

    def run(self, cmd, log, timeout):
        return run_local(cmd, log, timeout)


def shown_command(launcher, variant, seed):
    """``launcher python train.py FLAGS --seed S --run-dir DIR``, as a user types it."""
    return " ".join([f"{launcher} python train.py", *variant.flags, "--seed", str(seed), "--run-dir DIR"])


def parse_args(argv, prog):
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, metavar="DIR", help="where each run's config.yaml and metrics.json go")
    p.add_argument("--np", type=int, default=2, help="ranks per run (default 2)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per variant (default 3)")
    p.add_argument("--variants", help=f"comma-separated, from {','.join(BY_NAME)} (default all; a compressed "
                                      "variant brings its twin)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per launch (default 300)")
    args = p.parse_args(argv)
    if args.np < 1 or args.seeds < 1:
        p.error(f"--np and --seeds must be integers >= 1. Received: --np={args.np} --seeds={args.seeds}")
    names = args.variants.split(",") if args.variants else list(BY_NAME)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error(f"--variants must be chosen from {','.join(BY_NAME)}. Received: --variants={args.variants}")
    with_twins = []
    for name in names:
        for n in (BY_NAME[name].twin, name):
            if n and n not in with_twins:
                with_twins.append(n)
    args.variant_list = [BY_NAME[n] for n in with_twins]
    return args


def main(argv=None, prog="python -m benchmarks accuracy"):
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    out = os.path.abspath(args.out)
    runs, failures = run_over_seeds(args.variant_list, args.np, args.seeds, out, args.timeout, "accuracy")
    with open(os.path.join(out, "runs.json"), "w") as f:
        json.dump({"np": args.np, "seeds": args.seeds, "runs": runs, "failures": failures}, f, indent=1)
    print(render(out), flush=True)
    return 1 if failures else 0


def run_over_seeds(variants, np_, seeds, out, timeout, tag, shown=None, done=(), launch=None, on_run=None):
    """Launches every (variant, seed) once, seeds 0..``seeds``-1, one after the other, each bounded by
    ``timeout`` seconds, and keeps each run's config.yaml and metrics.json in ``out/<variant>-seed<S>/``
    (its log in ``out/logs/``).

    Args:
      variants: the ``Variant`` s.
      np_, seeds, out, timeout: ranks per run, seeds per variant, the output folder, seconds per launch.
      tag: the prefix of the progress lines (``[tag]``).
      shown: ``metrics.json -> str``, what a progress line says of a finished run (default: its final
        test accuracy).
      done: labels (``<variant>-seed<S>``) already kept in ``out`` by an earlier invocation: not run again.
      launch: how a run starts (``command``, ``shown``, ``run``); default ``LocalLaunch(np_)``.
      on_run: called with ``(runs, failures)`` so far after every launch, kept or failed.

    Returns:
      ``(runs, failures)``: one entry per kept run (``run``, ``variant``, ``twin``, ``seed``, ``command``),
      and one line per failed launch.
    """
    shown = shown or (lambda metrics: f"final test accuracy {metrics['final']['test_accuracy']:.4f}")
    launch = launch or LocalLaunch(np_)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    runs, failures = [], []
    for variant in variants:
        for seed in range(seeds):
            label = f"{variant.name}-seed{seed}"
            if label in done:
                continue
            scratch = os.path.join(out, "logs", label)
            shutil.rmtree(scratch, ignore_errors=True)
            log = os.path.join(out, "logs", f"{label}.log")
            outcome = launch.run(launch.command(variant, seed, scratch), log, timeout)
            if not outcome.ok:
                failures.append(f"{label}: {outcome.why}")
                print(f"[{tag}] {label}: {outcome.why}; log tail:\n{log_tail(log, 1500)}", flush=True)
                if on_run:
                    on_run(runs, failures)
                continue
            kept = os.path.join(out, label)
            os.makedirs(kept, exist_ok=True)
            for name in ("config.yaml", "metrics.json"):
                shutil.copy(os.path.join(scratch, name), os.path.join(kept, name))
            shutil.rmtree(scratch)
            with open(os.path.join(kept, "metrics.json")) as f:
                metrics = json.load(f)
            runs.append({"run": label, "variant": variant.name, "twin": variant.twin, "seed": seed,
                         "command": launch.shown(variant, seed)})
            print(f"[{tag}] {label}: {shown(metrics)} ({outcome.seconds:.0f} s)", flush=True)
            if on_run:
                on_run(runs, failures)
    return runs, failures


def continue_runs(out, index, variants, np_, seeds, timeout, tag, shown=None, launch=None):
    """``run_over_seeds`` into ``out``, continuing the runs an earlier invocation kept there (its
    runs.json, made with the same ``index``: a long benchmark can be run in parts), then ``out/runs.json``:
    ``index``, the seeds, every kept run and the failures. Returns the failures."""
    earlier = earlier_runs(out, index)

    def write_index(runs, failures):
        # After every launch, not only at the end: a benchmark of hours that is stopped keeps the
        # index of the runs it made, and the next invocation continues from them.
        kept = earlier + runs
        with open(os.path.join(out, "runs.json"), "w") as f:
            json.dump({**index, "seeds": max(run["seed"] for run in kept) + 1 if kept else 0, "runs": kept,
                       "failures": failures}, f, indent=1)

    runs, failures = run_over_seeds(variants, np_, seeds, out, timeout, tag, shown=shown,
                                    done={run["run"] for run in earlier}, launch=launch, on_run=write_index)
    write_index(runs, failures)
    return failures


def earlier_runs(out, index):
    """The runs an earlier invocation kept in ``out`` (its runs.json), which this one continues.
    Refused, in one line, if they were made otherwise (another ``index``)."""
    path = os.path.join(out, "runs.json")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        earlier = json.load(f)
    differs = [key for key in index if earlier.get(key) != index[key]]
    if differs:
        raise SystemExit(f"{out} holds runs made with other {', '.join(differs)} "
                         f"({', '.join(f'{k}={earlier.get(k)!r}' for k in differs)}); choose another --out")
    return earlier["runs"]


def write_rendered(directory, name, render):
    """``render(directory)``, a results folder's page, written to ``directory``/``name``; returns the text."""
    text = render(directory)
    with open(os.path.join(directory, name), "w") as f:
        f.write(text)
    return text


def data_under_out(command):
    """``command`` with a data path under a results folder's ``data/`` (written there by the benchmark, wherever
    the folder was when the runs were made) shown as ``OUT/data/``."""
    return re.sub(r"(text|fashion_mnist):\S*/data/", r"\1:OUT/data/", command)


def docs_link(directory, name):
    """How a report in ``directory`` links its file ``name``: from docs/ when ``directory`` is under it (the
    report is included into a page there, and links resolve from the page), else beside the report."""
    docs = os.path.join(REPO_ROOT, "docs")
    path = os.path.abspath(os.path.join(directory, name))
    return os.path.relpath(path, docs) if path.startswith(docs + os.sep) else name


def kept_runs(directory):
    """``(runs.json, [(its run entry, that run's metrics.json)])`` of a results folder, in run order."""
    path = os.path.join(directory, "runs.json")
    if not os.path.isfile(path):
        raise SystemExit(f"{directory} holds no runs.json: not a results folder of this benchmark (or no run "
                         "of it has finished yet)")
    with open(path) as f:
        index = json.load(f)
    found = []
    for run in index["runs"]:
        with open(os.path.join(directory, run["run"], "metrics.json")) as f:
            found.append((run, json.load(f)))
    return index, found


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
