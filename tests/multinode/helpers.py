"""The multinode tier's helpers: its cluster's shape, the launcher's environment, and bounded
launches from node1. The fixtures that build the virtual cluster live in tests/multinode/conftest.py.

Tests import these from here, never from a conftest.py.
"""
import os
import subprocess

from tests.helpers import HOROVODRUN, PYTHON, ROOT, run
from tools.vcluster import INTERFACE

TRAIN = os.path.join(ROOT, "train.py")
HOSTS = 2
RANKS_PER_HOST = 2
# The shared 2 hosts × 2 ranks launch (conftest.py's two_by_two_run): its bound, in seconds.
TWO_BY_TWO_TIMEOUT = 240


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
