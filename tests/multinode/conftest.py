"""The multinode tier: a virtual cluster of two hosts (tools/vcluster.py) for the whole session.

The pytest session itself runs in a loopback-only network namespace
(tools/loopback_network.py). The cluster's namespaces are *named* ones
(``ip netns add``, held in /run/netns): they do not nest in the namespace of
the process that creates them, so building them from here leaves the pytest
namespace with lo alone, and the machine's root namespace untouched. Jobs are
launched from node1, entered with nsenter, as a user would from a login node.

The cluster is removed at the end of the session even when tests fail; after
each test, whatever the test left running on the hosts is stopped. A test
that kills a host leaves the cluster unhealthy, and the next test rebuilds it.
"""
import os
import subprocess

import pytest

from tests.helpers import PYTHON, ROOT, run
from tools.vcluster import INTERFACE, ClusterError, VirtualCluster, check_privileges

TRAIN = os.path.join(ROOT, "train.py")
HOROVODRUN = os.path.join(os.path.dirname(PYTHON), "horovodrun")
HOSTS = 2
RANKS_PER_HOST = 2


def multinode_env(**extra):
    """The launcher's environment: like the other tiers', minus their "MPI over lo only" settings.

    Those would keep Open MPI from ever reaching another host; the hosts have
    lo and cluster0 only, and Open MPI leaves lo out by itself.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_MCA_")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT, PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def virtual_cluster():
    try:
        check_privileges()
    except ClusterError as err:
        pytest.fail(f"the multinode tier cannot build its virtual cluster: {err}")
    cluster = VirtualCluster(f"hvdt{os.getpid()}"[:12])
    try:
        cluster.up(HOSTS, RANKS_PER_HOST)
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def cluster(virtual_cluster):
    if not virtual_cluster.healthy():  # an earlier test killed a host
        virtual_cluster.up(HOSTS, RANKS_PER_HOST)
    yield virtual_cluster
    virtual_cluster.stop_jobs()


def launch(cluster, cmd, timeout, env=None, cwd=ROOT):
    """Runs ``cmd`` on the launcher (node1), in ``cwd``; bounded by ``timeout``."""
    return run(cluster.launcher_command(cmd, cwd=cwd), timeout=timeout, cwd=cwd,
               env=cluster.launcher_env(env or multinode_env()))


def popen(cluster, cmd, env=None):
    return subprocess.Popen(cluster.launcher_command(cmd, cwd=ROOT), env=cluster.launcher_env(env or multinode_env()),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def horovodrun_on_hosts(hosts, controller, args, np):
    """``horovodrun -np N -H HOSTS --gloo|--mpi python train.py ARGS``; Gloo needs the interface's name."""
    nic = ["--network-interface", INTERFACE] if controller == "gloo" else []
    # --disable-cache: check ssh for real every time (and write nothing under ~/.horovod).
    return [HOROVODRUN, "--disable-cache", "-np", str(np), "-H", hosts, f"--{controller}", *nic,
            PYTHON, TRAIN, *args]
