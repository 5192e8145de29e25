"""What the numbers were measured on: CPU, cores, memory, load and versions; and whether the machine is quiet.

The quiet-machine check is one measurement every benchmark takes before a launch:
``foreign_cpu_busy``, the share of the CPUs busy while none of our processes runs (other
people's work, which a benchmark cannot control but reports); ``wait_until_idle`` waits for it
to fall. ``ForeignLoad`` measures the same share during a launch on this host.

Nothing here imports mpi4py (that would initialise MPI in a Gloo launch) or
TensorFlow at module level.
"""
import importlib.metadata
import os
import platform
import shutil
import subprocess
import time


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def describe():
    """The machine, as results.json records it."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(), "cores_usable": usable,
            "memory_gib": memory_gib(), "platform": platform.platform(), "loadavg": os.getloadavg()}


def _dist_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions():
    """Versions of the Python stack (imports TensorFlow and Keras)."""
    from hvd_easgd import _compat

    found = dict(_compat.versions())
    for name in ("numpy", "mpi4py", "matplotlib", "tf_keras"):
        found[name] = _dist_version(name)
    return found


def mpi_library():
    """``mpirun --version``'s first line (the MPI Horovod and mpi4py use)."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        return None
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def _cpu_ticks():
    """Clock ticks all CPUs spent in each state since boot: the first line of /proc/stat (Linux only)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def _busy_cpu_seconds():
    """CPU-seconds all CPUs spent busy since boot."""
    ticks = _cpu_ticks()
    busy = sum(ticks[:3]) + sum(ticks[5:8])  # user nice system + irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def _total_and_idle_ticks():
    ticks = _cpu_ticks()
    return sum(ticks), ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait


def foreign_cpu_busy(seconds=1.0):
    """Share of all CPUs busy over ``seconds`` while none of our launches runs: other people's
    processes (None where unmeasurable)."""
    try:
        total0, idle0 = _total_and_idle_ticks()
        time.sleep(seconds)
        total1, idle1 = _total_and_idle_ticks()
    except OSError:
        return None
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def wait_until_idle(limit, threshold=0.2, tag="[compare]"):
    """Waits up to ``limit`` seconds for other processes to keep at most ``threshold`` of the CPUs busy;
    returns the last ``foreign_cpu_busy``."""
    busy = foreign_cpu_busy()
    deadline = time.monotonic() + limit
    while busy is not None and busy > threshold and time.monotonic() < deadline:
        print(f"{tag} other processes keep {busy:.0%} of the CPUs busy; waiting", flush=True)
        time.sleep(5)
        busy = foreign_cpu_busy()
    return busy


def _children_cpu_seconds():
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class ForeignLoad:
    """Context manager: the share of the machine's CPU time that processes
    other than ours used while the block ran (our launches are waited-for
    children, so their CPU time is known exactly). None where unmeasurable."""

    def __enter__(self):
        self.share = None
        try:
            self._start = (time.monotonic(), _busy_cpu_seconds(), _children_cpu_seconds())
        except (OSError, ValueError):
            self._start = None
        return self

    def __exit__(self, *exc):
        if self._start is not None:
            t0, busy0, ours0 = self._start
            wall = time.monotonic() - t0
            foreign = (_busy_cpu_seconds() - busy0) - (_children_cpu_seconds() - ours0)
            self.share = max(0.0, foreign) / max(1e-9, wall * (os.cpu_count() or 1))
        return False
