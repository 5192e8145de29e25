"""Shared test helpers: the venv's interpreter and bounded launchers (horovodrun,
mpirun), each with a timeout that turns a deadlock into a failure.

Tests import these from here, never from conftest.py (pytest's hook file)."""
import json
import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = sys.executable
HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
CONTROLLERS = ("gloo", "mpi")

# --- how long a deadlock may take to become a failure ----------------------------------
# Every timeout in the tests is set for the 2-core test machine on an ordinary day. A
# machine whose cores are shared (other jobs beside the suite: loads of 4-9 were seen
# here) runs everything slower. A CPU probe at the start of the session
# (tests/conftest.py) measures that, and every timeout is stretched by the factor. It
# never shrinks one, and it is capped, so a real deadlock still fails in bounded time.
# It does not see a cold disk cache or slow first-touch memory (this VM's host has been
# seen to cost TensorFlow 13 s per import that way); the launch-heavy tests' own bounds
# leave room for that.
SLOWDOWN_ENV = "HVD_EASGD_TEST_SLOWDOWN"  # set by conftest.py, inherited by xdist workers
PROBE_ITERATIONS = 2_000_000
PROBE_ORDINARY_SECONDS = 0.14  # the probe's time on an ordinary day (about 0.7 s per 10 M iterations)
MAX_SLOWDOWN = 4.0


def probe_slowdown():
    """This machine's slowness against an ordinary day: the best of three runs of a
    pure-Python loop, divided by ``PROBE_ORDINARY_SECONDS``, clamped to [1, MAX_SLOWDOWN]."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        total = 0
        for i in range(PROBE_ITERATIONS):
            total += i
        best = min(best, time.perf_counter() - start)
    return min(max(best / PROBE_ORDINARY_SECONDS, 1.0), MAX_SLOWDOWN)


def slowdown():
    return float(os.environ.get(SLOWDOWN_ENV) or 1.0)


def bounded(seconds):
    """``seconds``, a timeout set for an ordinary day, stretched by this session's slowdown."""
    return int(round(seconds * slowdown()))


def quiet_env(**extra):
    # Keep MPI's and Gloo's traffic on loopback: the tests run on one host.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT, PYTHONUNBUFFERED="1",
               OMPI_MCA_btl_tcp_if_include="lo", OMPI_MCA_oob_tcp_if_include="lo")
    env.update(extra)
    return env


# What horovodrun's Gloo summary reports for a rank it stopped after another exited: 143 if the
# SIGTERM ended it, 137 if it was still working (a rank in a collective, or whose preemption
# handler holds SIGTERM until the next agreement) when the launcher's 5-second grace ran out.
STOPPED_BY_LAUNCHER = {"137", "143"}


def horovodrun_command(args, np=2, controller="gloo"):
    """``horovodrun -np N --gloo|--mpi python ARGS`` on this host, over loopback."""
    return [HOROVODRUN, "-np", str(np), f"--{controller}", "--network-interface", "lo", PYTHON, *args]


def horovodrun(args, np=2, controller="gloo", timeout=240, cwd=None, env=None):
    """Runs ``horovodrun_command(args)``; the timeout turns a deadlock into a
    failure (and kills the whole process group)."""
    return run(horovodrun_command(args, np, controller), timeout=timeout, cwd=cwd, env=env)


def mpirun_command(args, np=2):
    """``mpirun -np N python ARGS`` on this host, over loopback: an MPI launch without horovodrun.
    ``--oversubscribe``: more ranks than cores (np=4 on the 2-core test machine), as horovodrun allows."""
    return ["mpirun", "-np", str(np), "--oversubscribe", "--mca", "btl_tcp_if_include", "lo", "--mca",
            "oob_tcp_if_include", "lo", PYTHON, *args]


def launch(args, launcher, np=2, timeout=240, cwd=None, env=None):
    """Runs ``args`` under ``launcher``: "gloo" or "mpi" (horovodrun --gloo|--mpi) or "mpirun"."""
    if launcher == "mpirun":
        # mpirun refuses root unless told twice (the test machines run as root).
        env = dict(env or quiet_env(), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        return run(mpirun_command(args, np), timeout=timeout, cwd=cwd, env=env)
    return horovodrun(args, np=np, controller=launcher, timeout=timeout, cwd=cwd, env=env)


def run(cmd, timeout=240, cwd=None, env=None):
    timeout = bounded(timeout)
    proc = subprocess.Popen(cmd, cwd=cwd or ROOT, env=env or quiet_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout}s (deadlock?): {' '.join(cmd)}\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def horovodrun_elastic_command(args, discovery_script, np=3, min_np=2, max_np=3):
    """``horovodrun --gloo`` in elastic mode (``--min-np``, ``--host-discovery-script``) on this host,
    over loopback. Horovod's elastic driver binds its servers to every address: only run it inside
    the tests' loopback-only network namespace (tools/loopback_network.py)."""
    return [HOROVODRUN, "--gloo", "-np", str(np), "--min-np", str(min_np), "--max-np", str(max_np),
            "--network-interface", "lo", "--host-discovery-script", discovery_script,
            "--start-timeout", str(bounded(60)), "--elastic-timeout", str(bounded(60)), PYTHON, *args]


def run_watching(cmd, log_path, watch, timeout=240, env=None):
    """Runs ``cmd`` with its output in ``log_path``, calling ``watch(text so far)`` about
    every half second while it runs (to act on what the job printed); the timeout
    turns a deadlock into a failure. Returns ``(returncode, text)``."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env or quiet_env(), stdout=log, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        timeout = bounded(timeout)
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError
                with open(log_path) as f:
                    watch(f.read())
                time.sleep(0.5)
        except BaseException as err:  # a timeout, a failed check in watch, Ctrl-C: never leave the job running
            os.killpg(proc.pid, 9)
            proc.wait()
            if isinstance(err, TimeoutError):
                with open(log_path) as f:
                    pytest.fail(f"timed out after {timeout}s (deadlock?): {' '.join(cmd)}\n{f.read()[-4000:]}")
            raise
    with open(log_path) as f:
        return proc.returncode, f.read()


def read_rank_results(directory, size):
    results = []
    for rank in range(size):
        with open(os.path.join(directory, f"rank{rank}.json")) as f:
            results.append(json.load(f))
    return results


def script(name):
    return os.path.join(ROOT, "tests", "multiproc", "scripts", name)


def mkdocs_build(config, site_dir):
    """``python -m mkdocs build --strict`` of ``config`` into ``site_dir`` (a few seconds: no launch)."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", config,
                           "--site-dir", str(site_dir)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
