"""The one runner every benchmark program uses: launch, bounded run, summary, Markdown.

* **Launch.** ``local_launch`` (``horovodrun`` on this host, over loopback) and
  ``mpirun_launch`` (``mpirun`` without Horovod's launcher) build command lines;
  ``launch_env`` the environment every launch starts from. A launch elsewhere
  (the virtual cluster's launcher host) goes through the same ``run_bounded``,
  with a ``through`` callable the caller passes that rewrites the command and
  its environment (``VirtualCluster.launcher_command``/``launcher_env``).
* **Bounded run.** ``run_bounded`` starts each command in a session of its own,
  output to one log, and waits at most ``timeout`` seconds; on a timeout, a
  failure of any one process, or an interruption, it ends every process group
  it started (the launcher and every rank the launcher started, and nothing
  else) and says so in the ``Outcome`` it returns.
* **Summary.** ``summary`` is the one median/min/max of a set of measurements,
  with the measurements themselves under ``repeats``: a row's
  ``samples_per_sec`` and every other figure measured more than once.
* **Markdown.** ``table`` writes one GitHub Markdown table; ``spread`` the
  "median (min–max)" cell every table shows a summary in.

This module never imports TensorFlow: the drivers that use it only launch,
wait and report.
"""
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Every rank of a local launch runs on this host, so ranks talk over loopback,
# whatever other interfaces the machine has (and in a namespace with lo alone,
# where Open MPI would otherwise find no network for its out-of-band channel).
LOOPBACK_ENV = {"OMPI_MCA_oob_tcp_if_include": "lo", "OMPI_MCA_btl_tcp_if_include": "lo"}
# How often a bounded run looks at its processes (and calls ``while_running``).
POLL_SECONDS = 0.2


# --- launch ---------------------------------------------------------------------------------------
def horovodrun():
    """The ``horovodrun`` beside this interpreter (the venv's), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return beside if os.path.exists(beside) else "horovodrun"


def local_launch(np_, controller):
    """``horovodrun`` for ``np_`` ranks on this host, over loopback.

    Args:
      np_: the number of ranks.
      controller: ``"gloo"`` or ``"mpi"``.

    Returns:
      The command line's start; the program and its arguments follow.
    """
    return [horovodrun(), "-np", str(np_), "-H", f"localhost:{np_}", "--network-interface", "lo", f"--{controller}"]


def mpirun_launch(np_):
    """``mpirun`` for ``np_`` ranks on this host over loopback, without Horovod's launcher."""
    return ["mpirun", "-np", str(np_), "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]


def launch_env(extra=None, base=None, drop=()):
    """The environment a launch starts from.

    Args:
      extra: variables set on top (they win over everything else).
      base: the environment to start from (default: this process's).
      drop: names removed from ``base`` first (settings a launch must not inherit).

    Returns:
      A new dict: ``base`` without ``drop``, TensorFlow's C++ log quiet unless
      set, Python unbuffered (logs show progress as it happens), this
      repository first on ``PYTHONPATH``, then ``extra``.
    """
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in drop}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


# --- bounded run ------------------------------------------------------------------------------------
class Outcome(NamedTuple):
    """How a bounded run ended.

    ``status``: the exit status (the first non-zero one of several processes),
    or None when it timed out; ``seconds``: its wall time; ``log_path``: its log.
    """

    status: object
    seconds: float
    log_path: str

    @property
    def ok(self):
        return self.status == 0

    @property
    def why(self):
        """'timed out' or 'exit status N' (for a run that is not ``ok``)."""
        return "timed out" if self.status is None else f"exit status {self.status}"


def stop_process_groups(procs, grace_seconds=10):
    """SIGTERM the groups of ``procs`` still running; SIGKILL what outlives the grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_seconds
        while any(p.poll() is None for p in alive) and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)


def run_bounded(cmd, log_path, timeout, env=None, *, through=None, cleanup=None, while_running=None,
                cwd=REPO_ROOT, grace_seconds=10):
    """Runs one command or several together, bounded in time, output to one log.

    Args:
      cmd: a command line (a list of str), or a list of ``(command line,
        environment)`` pairs started together (the MWMS workers).
      log_path: the log every process writes to; it starts with the commands.
      timeout: seconds after which every process group still running is ended.
      env: the environment of a single command (default ``launch_env()``).
      through: ``through(cmd, env) -> (cmd, env)``: how the command reaches the
        host it runs on (e.g. the virtual cluster's launcher); the log shows
        the command as given.
      cleanup: called once after the processes ended, however they ended (e.g.
        the virtual cluster ending ranks that ssh left on other hosts).
      while_running: called about every ``POLL_SECONDS`` while processes run;
        what an investigation does mid-run (e.g. kill one worker).
      cwd: the working directory (default: the repository).
      grace_seconds: between SIGTERM and SIGKILL when a run is ended.

    Returns:
      An ``Outcome``. A process that exits non-zero ends the others at once.
    """
    jobs = cmd if cmd and isinstance(cmd[0], tuple) else [(cmd, env)]
    jobs = [(c, launch_env() if e is None else e) for c, e in jobs]
    started = time.perf_counter()
    procs = []
    status = None
    with open(log_path, "w") as log:
        for c, e in jobs:
            # What the launch sets beyond this process's environment, then the command.
            added = " ".join(f"{k}={v}" for k, v in sorted(e.items()) if os.environ.get(k) != v)
            log.write("$ " + (added + " " if added else "") + shlex.join(c) + "\n")
        log.flush()
        try:
            for c, e in jobs:
                if through is not None:
                    c, e = through(c, e)
                procs.append(subprocess.Popen(c, cwd=cwd, env=e, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                codes = [p.poll() for p in procs]
                failed = [c for c in codes if c not in (None, 0)]
                if failed or all(c == 0 for c in codes):
                    status = failed[0] if failed else 0
                    break
                if while_running is not None:
                    while_running()
                time.sleep(POLL_SECONDS)
        finally:
            # Timed out, failed, interrupted or done: leave nothing behind.
            stop_process_groups(procs, grace_seconds)
            if cleanup is not None:
                cleanup()
    return Outcome(status, time.perf_counter() - started, log_path)


def run_local(cmd, log_path, timeout, extra_env=None, **options):
    """``run_bounded`` of a launch whose ranks all run on this host: over loopback, plus ``extra_env``."""
    return run_bounded(cmd, log_path, timeout, launch_env(dict(LOOPBACK_ENV, **(extra_env or {}))), **options)


def log_tail(path, chars=3000):
    """The last ``chars`` characters of a log ('' if it cannot be read)."""
    try:
        with open(path) as f:
            return f.read()[-chars:]
    except OSError:
        return ""


def report_failed_launch(failures, label, outcome, prefix="[compare]", chars=2500):
    """A launch that timed out or exited non-zero: one line in ``failures``,
    and its log's tail printed for whoever is watching."""
    failures.append(f"{label}: {outcome.why} (log: logs/{os.path.basename(outcome.log_path)})")
    print(f"{prefix} {label} {outcome.why}; log tail:\n{log_tail(outcome.log_path, chars)}", flush=True)


# --- summary ------------------------------------------------------------------------------------------
def summary(values):
    """The median, min and max of measurements, and the measurements.

    Args:
      values: the figures measured, one per repeat (a timed run, a call, a
        launch or a pair of launches); None entries (a launch that gave no
        figure) are left out.

    Returns:
      ``{"median", "min", "max", "repeats"}`` (``repeats``: the values, in
      their order), or None when no value is left.
    """
    kept = [v for v in values if v is not None]
    if not kept:
        return None
    return {"median": statistics.median(kept), "min": min(kept), "max": max(kept), "repeats": kept}


def scaled(result, factor):
    """A ``summary`` in other units (every figure times ``factor``), e.g. seconds to µs."""
    return None if result is None else summary([v * factor for v in result["repeats"]])


# --- Markdown ---------------------------------------------------------------------------------------
def spread(result, digits=2, missing="—"):
    """A summary's "median (min–max)" cell, each with ``digits`` decimals and thousands separators."""
    if result is None:
        return missing
    f = f"{{:,.{digits}f}}".format
    return f"{f(result['median'])} ({f(result['min'])}–{f(result['max'])})"


def table(header, rows, align=None):
    """One GitHub Markdown table.

    Args:
      header: the column titles.
      rows: the rows, each a sequence of cells (``str()`` is applied).
      align: one letter per column, ``l`` (left) or ``r`` (right, for numbers);
        default: every column left.

    Returns:
      The table's lines joined by newlines, without a trailing one.
    """
    align = align or "l" * len(header)
    if len(align) != len(header) or set(align) - {"l", "r"}:
        raise ValueError(f"`align` must be one of 'l' or 'r' per column ({len(header)}). Received: align={align!r}")
    for row in rows:
        if len(row) != len(header):
            raise ValueError(f"every row must have {len(header)} cells. Received: row={list(row)!r}")
    rule = "|" + "".join("---:|" if a == "r" else "---|" for a in align)
    return "\n".join(["| " + " | ".join(header) + " |", rule]
                     + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])
