"""The one way a study launches train.py: its configurations over seeds, one bounded launch a run.

A study asks what a strategy does to train.py's own runs and answers in a page rendered from them:
``parity``, ``time-to-target``, ``slow-rank``, ``long-run`` and ``accuracy`` are studies. What they
share is here, so that each keeps only what differs: its configurations, its launch and its page.

Every run gets the same from ``continue_runs``:

* **Seeds.** Each configuration (a ``Variant``: its name, train.py's flags, the twin it is read
  against) runs for seeds 0..N-1, one launch at a time, each bounded by ``--timeout`` seconds.
* **Run dirs.** train.py writes into ``OUT/logs/<configuration>-seed<S>/``; its config.yaml and
  metrics.json are kept in ``OUT/<configuration>-seed<S>/``, its log in ``OUT/logs/``.
* **Resume.** ``OUT/runs.json`` is written after every launch: the study's *index* (the settings its
  runs are made with: workload, ranks, flags...), the seeds, every kept run and the failures. Invoked
  again with the same ``--out``, a study continues: at the same index it makes only the runs not kept
  yet (a study of hours can be run in parts); at another it is refused in one line.
* **The quiet machine.** Before each launch, the share of the CPUs other processes keep busy (the
  suite's check, ``suite.machine.foreign_cpu_busy``) is kept with the run, and said when it is more
  than ``QUIET``.
* **The command.** runs.json names each run's command as a user types it
  (``horovodrun -np 2 python train.py FLAGS --seed S --run-dir DIR``); the pages quote it.

A *launch* is how a run starts: ``command(variant, seed, run_dir)`` (the command line),
``shown(variant, seed)`` (as a user types it) and ``run(cmd, log, timeout)`` (an ``Outcome``).
``LocalLaunch`` is horovodrun on this host over loopback; ``time_to_target.ClusterLaunch`` starts one
across the virtual cluster's hosts, and ``slow_hook.SlowRankLaunch`` makes one rank of either slow.

How a study is written (``parity.py`` is the model): a module of ``benchmarks/accuracy/`` with
``main(argv, prog)``, named by one line of ``SUBCOMMANDS`` in ``benchmarks/__main__.py``.

1. Its configurations: ``configurations(("sync", "--strategy sync", None), ...)``.
2. Its arguments: ``parser(prog, __doc__, PAGE, timeout)`` gives ``--out``, ``--np``, ``--seeds``,
   ``--timeout`` and ``--render DIR``; it adds its own, and ``parsed(p, argv)`` checks the shared ones.
   ``chosen`` takes the configurations a ``--configurations`` names, each with its twin.
3. Its page: ``render(directory)``, Markdown from ``kept_runs(directory)`` (runs.json and each run's
   metrics.json), never typed; ``write_rendered`` writes it into the results folder as ``PAGE``.
4. Its ``main``: ``run_or_render(args, write, lambda out: continue_runs(out, index, variants, ...))``:
   ``--render DIR`` rewrites DIR's page from its runs; otherwise the runs are made (or continued) and
   the page follows. ``index`` holds the settings a folder's runs must share; ``continue_runs`` starts
   each run with ``LocalLaunch`` unless the study passes its own ``launch``.

This process never imports TensorFlow: it launches, waits and copies.
"""
import argparse
import json
import os
import re
import shutil
import sys
from typing import NamedTuple

from ..suite.machine import foreign_cpu_busy
from ..suite.runner import REPO_ROOT, local_launch, log_tail, run_local

RUNS = "runs.json"  # the results folder's index of its runs
# A launch is made on a quiet machine if other processes keep at most QUIET of the CPUs busy, sampled over
# QUIET_SECONDS before it (two CPUs tick 50 times in a quarter second: enough to tell quiet from busy).
QUIET, QUIET_SECONDS = 0.2, 0.25


class Variant(NamedTuple):
    """A configuration: its name, train.py's flags, and the one it is read against (None if none)."""
    name: str
    flags: tuple
    twin: str = None


def configurations(*entries):
    """``Variant`` s from ``(name, "train.py flags", twin)`` entries."""
    return tuple(Variant(name, tuple(flags.split()), twin) for name, flags, twin in entries)


# --- launches -----------------------------------------------------------------------------------
class LocalLaunch(NamedTuple):
    """How a run of ``np`` ranks starts on this host: ``horovodrun`` over loopback."""
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


# --- the arguments --------------------------------------------------------------------------------
def parser(prog, doc, page, timeout, np_=2, seeds=3):
    """A study's argument parser with the options every study shares.

    Args:
      prog, doc: the program's name and its module docstring (whose first line describes it).
      page: the page ``--render DIR`` rewrites in DIR; None: no ``--render`` (``--out`` is then required).
      timeout: the default seconds per launch.
      np_, seeds: the defaults of ``--np`` (ranks per run) and ``--seeds``; None leaves the option out.
    """
    p = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    p.add_argument("--out", metavar="DIR", required=page is None,
                   help="the results folder: each run's config.yaml and metrics.json, and runs.json")
    if np_ is not None:
        p.add_argument("--np", type=int, default=np_, help=f"ranks per run (default {np_})")
    if seeds is not None:
        p.add_argument("--seeds", type=int, default=seeds, help=f"seeds 0..N-1 per configuration (default {seeds})")
    p.add_argument("--timeout", type=float, default=timeout, help=f"seconds per launch (default {timeout:g})")
    if page is not None:
        p.add_argument("--render", metavar="DIR",
                       help=f"rewrite DIR/{page} (and its plot, if it has one) from DIR's runs, print it and exit")
    return p


def parsed(p, argv, required=("out",), min_np=1):
    """``p``'s arguments, the shared ones checked (each refusal one line, exit status 2): ``required``
    options unless ``--render``, ``--np`` at least ``min_np`` and ``--seeds`` at least 1."""
    args = p.parse_args(argv)
    if getattr(args, "render", None):
        return args
    if not all(getattr(args, name) for name in required):
        names = " and ".join(f"--{name}" for name in required)
        p.error(f"{names} {'is' if len(required) == 1 else 'are'} required (or --render DIR)")
    np_, seeds = getattr(args, "np", min_np), getattr(args, "seeds", 1)
    if np_ < min_np or seeds < 1:
        p.error(f"--np must be an integer >= {min_np} and --seeds >= 1. Received: --np={np_} --seeds={seeds}")
    return args


def chosen(p, given, known, option="--configurations", first=()):
    """The configurations of ``known`` that ``given`` names (comma-separated; None: all), each after its twin,
    after those named ``first``; a name not known is refused in one line."""
    by_name = {c.name: c for c in known}
    names = given.split(",") if given else list(by_name)
    if any(n not in by_name for n in names):
        p.error(f"{option} must be chosen from {','.join(by_name)}. Received: {option}={given}")
    picked = list(first)
    for name in names:
        for n in (by_name[name].twin, name):
            if n and n not in picked:
                picked.append(n)
    return [by_name[n] for n in picked]


# --- the runs -----------------------------------------------------------------------------------
def run_or_render(args, write, run):
    """A study's command. With ``--render DIR``: ``write(DIR)``, DIR's page rewritten from its runs, printed.
    Otherwise ``run(out)`` makes the runs into ``--out`` and returns the failures; ``write(out)`` follows.
    Returns the exit status: 1 if a run failed, else 0."""
    if getattr(args, "render", None):
        print(write(args.render), end="")
        return 0
    failures = run(os.path.abspath(args.out))
    print(write(os.path.abspath(args.out)), end="", flush=True)
    return 1 if failures else 0


def continue_runs(out, index, variants, np_, seeds, timeout, tag, shown=None, launch=None):
    """Launches every (variant, seed) that ``out`` does not hold yet, seeds 0..``seeds``-1, one after the other,
    and keeps each run in ``out/<variant>-seed<S>/``; ``out/runs.json`` follows every launch.

    Args:
      out: the results folder; the runs an earlier invocation kept there (its runs.json, made at the same
        ``index``) are not made again.
      index: the settings the runs are made with, kept in runs.json; another invocation continues them only
        at the same settings.
      variants: the ``Variant`` s.
      np_, seeds, timeout: ranks per run, seeds per variant, seconds per launch.
      tag: the prefix of the progress lines (``[tag]``).
      shown: ``metrics.json -> str``, what a progress line says of a finished run (default: its final
        test accuracy).
      launch: how a run starts (``command``, ``shown``, ``run``); default ``LocalLaunch(np_)``.

    Returns:
      The failures of this invocation, one line each.
    """
    shown = shown or (lambda metrics: f"final test accuracy {metrics['final']['test_accuracy']:.4f}")
    launch = launch or LocalLaunch(np_)
    runs = earlier_runs(out, index)
    failures = []
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    done = {run["run"] for run in runs}
    for variant in variants:
        for seed in range(seeds):
            label = f"{variant.name}-seed{seed}"
            if label in done:
                continue
            outcome, run = _launch(out, label, variant, seed, timeout, tag, shown, launch)
            if run is None:
                failures.append(f"{label}: {outcome.why}")
            else:
                runs.append(run)
            # After every launch, not only at the end: a study of hours that is stopped keeps the index
            # of the runs it made, and the next invocation continues from them.
            _write_index(out, index, runs, failures)
    _write_index(out, index, runs, failures)
    return failures


def _launch(out, label, variant, seed, timeout, tag, shown, launch):
    """One run, bounded, after the quiet-machine check; its config.yaml and metrics.json kept in ``out/label``.
    Returns ``(its Outcome, its runs.json entry)``, the entry None if it failed (its log's tail printed)."""
    busy = foreign_cpu_busy(QUIET_SECONDS)
    if busy is not None and busy > QUIET:
        print(f"[{tag}] {label}: other processes keep {busy:.0%} of the CPUs busy (a quiet machine: at most "
              f"{QUIET:.0%})", flush=True)
    scratch = os.path.join(out, "logs", label)
    shutil.rmtree(scratch, ignore_errors=True)
    log = os.path.join(out, "logs", f"{label}.log")
    outcome = launch.run(launch.command(variant, seed, scratch), log, timeout)
    if not outcome.ok:
        print(f"[{tag}] {label}: {outcome.why}; log tail:\n{log_tail(log, 1500)}", flush=True)
        return outcome, None
    kept = os.path.join(out, label)
    os.makedirs(kept, exist_ok=True)
    for name in ("config.yaml", "metrics.json"):
        shutil.copy(os.path.join(scratch, name), os.path.join(kept, name))
    shutil.rmtree(scratch)
    with open(os.path.join(kept, "metrics.json")) as f:
        metrics = json.load(f)
    print(f"[{tag}] {label}: {shown(metrics)} ({outcome.seconds:.0f} s)", flush=True)
    return outcome, {"run": label, "variant": variant.name, "twin": variant.twin, "seed": seed,
                     "command": launch.shown(variant, seed), "foreign_cpu_busy": busy}


def _write_index(out, index, runs, failures):
    with open(os.path.join(out, RUNS), "w") as f:
        json.dump({**index, "seeds": max(run["seed"] for run in runs) + 1 if runs else 0, "runs": runs,
                   "failures": failures}, f, indent=1)


def earlier_runs(out, index):
    """The runs an earlier invocation kept in ``out`` (its runs.json), which this one continues.
    Refused, in one line, if they were made otherwise (another ``index``)."""
    path = os.path.join(out, RUNS)
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        earlier = json.load(f)
    differs = [key for key in index if earlier.get(key) != index[key]]
    if differs:
        raise SystemExit(f"{out} holds runs made with other {', '.join(differs)} "
                         f"({', '.join(f'{k}={earlier.get(k)!r}' for k in differs)}); choose another --out")
    return earlier["runs"]


# --- the results folder -----------------------------------------------------------------------------
def kept_runs(directory):
    """``(runs.json, [(its run entry, that run's metrics.json)])`` of a results folder, in run order."""
    path = os.path.join(directory, RUNS)
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


def write_rendered(directory, name, render):
    """``render(directory)``, a results folder's page, written to ``directory``/``name``; returns the text."""
    text = render(directory)
    with open(os.path.join(directory, name), "w") as f:
        f.write(text)
    return text


def data_under_out(command):
    """``command`` with a data path under a results folder's ``data/`` (written there by the study, wherever
    the folder was when the runs were made) shown as ``OUT/data/``."""
    return re.sub(r"(text|fashion_mnist):\S*/data/", r"\1:OUT/data/", command)


def docs_link(directory, name):
    """How a page in ``directory`` links its file ``name``: from docs/ when ``directory`` is under it (the
    page is included into one there, and links resolve from that page), else beside the page."""
    docs = os.path.join(REPO_ROOT, "docs")
    path = os.path.abspath(os.path.join(directory, name))
    return os.path.relpath(path, docs) if path.startswith(docs + os.sep) else name
