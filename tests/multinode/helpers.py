"""The multinode tier's helpers: its cluster's shape, the launcher's environment, and bounded
launches from node1. The fixtures that build the virtual cluster live in tests/multinode/conftest.py.

Tests import these from here, never from a conftest.py.
"""
import os
import subprocess
import time

from hvd_easgd import checkpoint
from tests.helpers import HOROVODRUN, PYTHON, ROOT, bounded, run
from tools.vcluster import INTERFACE
from tools.vcluster_public import listeners, public_address, reachable

TRAIN = os.path.join(ROOT, "train.py")
HOSTS = 2
RANKS_PER_HOST = 2
# The shared 2 hosts × 2 ranks launch (conftest.py's two_by_two_run): its bound, in seconds.
TWO_BY_TWO_TIMEOUT = 240
# The shared Gloo job that is measured, then loses node2 (conftest.py's gloo_job_exposed_then_node2_killed):
# seconds until its first complete checkpoint, and until it ends once node2 is gone.
FIRST_CHECKPOINT_TIMEOUT = 120
END_AFTER_KILL_TIMEOUT = 90


def multinode_env(**extra):
    """The launcher's environment: like the other tiers', minus their "MPI over lo only" settings.

    Those would keep Open MPI from ever reaching another host; the hosts have
    lo and cluster0 only, and Open MPI leaves lo out by itself.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_MCA_")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def launch(cluster, cmd, timeout, env=None, cwd=ROOT):
    """Runs ``cmd`` on the launcher (node1), in ``cwd``; bounded by ``timeout``."""
    return run(cluster.launcher_command(cmd, cwd=cwd), timeout=timeout, cwd=cwd,
               env=cluster.launcher_env(env or multinode_env()))


def popen(cluster, cmd, env=None):
    """Starts ``cmd`` on the launcher (node1) without waiting; the caller bounds and ends it."""
    return subprocess.Popen(cluster.launcher_command(cmd, cwd=ROOT), env=cluster.launcher_env(env or multinode_env()),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def horovodrun_on_hosts(hosts, controller, args, np):
    """``horovodrun -np N -H HOSTS --gloo|--mpi python train.py ARGS``; Gloo needs the interface's name."""
    nic = ["--network-interface", INTERFACE] if controller == "gloo" else []
    # --disable-cache: check ssh for real every time (and write nothing under ~/.horovod).
    return [HOROVODRUN, "--disable-cache", "-np", str(np), "-H", hosts, f"--{controller}", *nic,
            PYTHON, TRAIN, *args]


def public_exposure(cluster):
    """``{host: [(bound address, port, reachable from the public network)]}``: every listening TCP socket of
    each host (its /proc/net/tcp and tcp6), tried from the outsider at the host's public address.

    The public network is IPv4 only: an IPv6 listener ("::") is tried at the host's IPv4 public address,
    which it accepts too unless it is IPv6-only (Open MPI's, beside an IPv4 one on the same port, then
    answer as one)."""
    seen = {}
    for host in cluster.hosts:
        sockets = listeners(cluster, host)
        result = reachable(cluster, [(public_address(host), port) for _, port in sockets])
        seen[host] = [(address, port, result[f"{public_address(host)}:{port}"]) for address, port in sockets]
    return seen


def gloo_job_exposed_then_host_killed(cluster, run_dir, host="node2"):
    """One job, two tests' worth of observations (test_network_exposure.py's Gloo case, test_failures.py's
    dying host): ``train.py --epochs 400`` over Gloo on node1:1,node2:1 of ``cluster`` (which has the public
    network); once its first checkpoint is complete, the listeners the public network reaches
    (``public_exposure``), then every process of ``host`` killed, and the time the job takes to end.

    Asserts nothing: returns what was seen, each entry None where the job never got that far. Bounded:
    ``FIRST_CHECKPOINT_TIMEOUT``, the outsider's connects (``reachable``), ``END_AFTER_KILL_TIMEOUT``;
    a job still running after that is killed."""
    args = ["--run-dir", str(run_dir), "--epochs", "400", "--threads-per-rank", "1"]  # outlives the measurement
    record = {"run_dir": run_dir, "checkpointed": False, "seen": None, "alive_after_measurement": None,
              "killed": None, "elapsed": None, "returncode": None, "output": ""}
    proc = popen(cluster, horovodrun_on_hosts("node1:1,node2:1", "gloo", args, np=2))
    output = None
    try:
        # Wait for a *complete* checkpoint (its manifest written): the directory exists as soon as the
        # first shard is being written, and a kill then would leave nothing to resume from.
        deadline = time.monotonic() + bounded(FIRST_CHECKPOINT_TIMEOUT)
        while (not checkpoint.complete_checkpoints(str(run_dir)) and proc.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.5)
        record["checkpointed"] = bool(checkpoint.complete_checkpoints(str(run_dir)))
        if record["checkpointed"] and proc.poll() is None:
            record["seen"] = public_exposure(cluster)
            record["alive_after_measurement"] = proc.poll() is None
            if record["alive_after_measurement"]:
                record["killed"] = cluster.kill_host(host)  # every process of the host: its sshd, the session, the rank
                killed_at = time.monotonic()
                try:
                    output, _ = proc.communicate(timeout=bounded(END_AFTER_KILL_TIMEOUT))
                    record["elapsed"] = time.monotonic() - killed_at
                except subprocess.TimeoutExpired:
                    pass  # elapsed None: the job outlived its host by END_AFTER_KILL_TIMEOUT
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        if output is None:
            output, _ = proc.communicate()
    record["returncode"], record["output"] = proc.returncode, output
    return record
