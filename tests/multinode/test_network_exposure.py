"""Which of a live job's listeners someone on a host's *public* network can reach.

The cluster of this test gets a second network (tools/vcluster_public.py):
every host has public0 on 198.19.0.0/24, and an outsider namespace sits on that
network alone. A job runs across node1 and node2 with the settings docs/network-exposure.md
documents for keeping traffic on the cluster network (Gloo:
``--network-interface cluster0``; Open MPI: ``btl_tcp_if_include`` and
``oob_tcp_if_include cluster0``). While it trains, every listening socket in the
hosts' /proc/net/tcp and tcp6 is tried from the outsider, at the host's public
address. Those settings choose the interface the traffic takes, not what is
bound: every listener bound to a wildcard address is reachable from the public
network, the rest (sshd, bound to the cluster address) are not.
"""
import glob
import json
import os
import shlex
import time

import pytest

from tests.helpers import PYTHON
from tests.multinode.helpers import horovodrun_on_hosts, multinode_env, popen
from tests.multinode.test_launch import README_MPIRUN
from tools.vcluster import SSH_PORT, VirtualCluster, check_privileges
from tools.vcluster_public import add_public_network, listeners, public_address, reachable

pytestmark = pytest.mark.multinode
START_TIMEOUT = 120
WILDCARDS = ("0.0.0.0", "::")


@pytest.fixture(scope="module")
def public_cluster():
    check_privileges()
    cluster = VirtualCluster(f"hvdp{os.getpid()}"[:12])
    try:
        cluster.up(2, 1)
        add_public_network(cluster)
        yield cluster
    finally:
        cluster.down()


def _job(cluster, controller, run_dir):
    args = ["--run-dir", run_dir, "--threads-per-rank", "1", "--epochs", "400"]  # outlives the measurement
    if controller == "gloo":
        return popen(cluster, horovodrun_on_hosts("node1:1,node2:1", "gloo", args, np=2))
    # docs/network-exposure.md's mpirun recipe, with the cluster's host file.
    cmd = shlex.split(README_MPIRUN.replace("\\\n", " ").replace("--hostfile hostfile", f"--hostfile {cluster.hostfile}"))
    cmd = [PYTHON if word == "python" else word for word in cmd]
    env = multinode_env(PATH=f"{os.path.dirname(PYTHON)}:{os.environ['PATH']}",
                        OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return popen(cluster, cmd + ["--run-dir", run_dir, "--epochs", "400"], env=env)


def _training(run_dir):
    """True once the ranks have met and trained an epoch (its checkpoint has been written)."""
    return bool(glob.glob(os.path.join(run_dir, "checkpoints", "epoch-*", "manifest.json")))


@pytest.mark.timeout(START_TIMEOUT + 60)
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_which_listeners_the_public_network_reaches(public_cluster, controller, tmp_path):
    cluster = public_cluster
    run_dir = str(tmp_path / "run")
    job = _job(cluster, controller, run_dir)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _training(run_dir):
            assert job.poll() is None, job.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the job did not start training in time"
            time.sleep(0.5)
        seen = {}
        for host in cluster.hosts:
            sockets = listeners(cluster, host)
            # The public network is IPv4 only: an IPv6 listener ("::") is tried at the host's IPv4
            # public address, which it accepts too unless it is IPv6-only (Open MPI's, beside an
            # IPv4 one on the same port, then answer as one).
            result = reachable(cluster, [(public_address(host), port) for _, port in sockets])
            seen[host] = [(address, port, result[f"{public_address(host)}:{port}"]) for address, port in sockets]
        assert job.poll() is None, "the job ended during the measurement"
    finally:
        cluster.stop_jobs()
        job.kill()
        job.wait(timeout=30)
    print(f"\n{controller}: (bound address, port, reachable from the public network) per host:\n"
          + json.dumps(seen, indent=1))
    for host, sockets in seen.items():
        assert (cluster.address(host), SSH_PORT, False) in sockets, (host, sockets)
        for address, port, is_reachable in sockets:
            # Reachable exactly when bound to every address: the interface settings do not change the bind.
            assert is_reachable == (address in WILDCARDS), (host, address, port, sockets)
    # The measured exposure: Gloo's rendezvous server on the launcher; under MPI, Open MPI's
    # out-of-band and TCP-transport listeners on every host.
    exposed = {host for host, sockets in seen.items() if any(r for _, _, r in sockets)}
    assert exposed == ({"node1"} if controller == "gloo" else {"node1", "node2"}), seen
