"""Launched process groups: ending them, and reading what they left in their logs.

Every launch (horovodrun, mpirun, an MWMS worker) runs in its own session, so
ending its process group ends the launcher and every rank it started, and
nothing else.
"""
import os
import signal
import time


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
            time.sleep(0.2)


def log_tail(path, chars=3000):
    """The last ``chars`` characters of a log ('' if it cannot be read)."""
    try:
        with open(path) as f:
            return f.read()[-chars:]
    except OSError:
        return ""


def report_failed_launch(failures, label, code, log_path):
    """A launch that timed out (``code`` None) or exited non-zero: one line in
    ``failures``, and its log's tail printed for whoever is watching."""
    why = "timed out" if code is None else f"exit status {code}"
    failures.append(f"{label}: {why} (log: logs/{os.path.basename(log_path)})")
    print(f"[compare] {label} {why}; log tail:\n{log_tail(log_path, 2500)}", flush=True)
