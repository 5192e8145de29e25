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

The Gloo job is the session's shared one (conftest.py's ``gloo_job_exposed_then_node2_killed``):
measured here once its first checkpoint is complete, then node2 is killed under it, for
test_failures.py. The MPI job, the docs' mpirun recipe, is this test's own.
"""
import glob
import json
import os
import shlex
import time

import pytest

from tests.helpers import PYTHON
from tests.multinode.helpers import (END_AFTER_KILL_TIMEOUT, FIRST_CHECKPOINT_TIMEOUT, multinode_env, popen,
                                     public_exposure)
from tests.multinode.test_launch import README_MPIRUN
from tools.vcluster import SSH_PORT, VirtualCluster

pytestmark = pytest.mark.multinode
START_TIMEOUT = 120
WILDCARDS = ("0.0.0.0", "::")


def _mpi_job(cluster, run_dir):
    """docs/network-exposure.md's mpirun recipe, with the cluster's host file."""
    cmd = shlex.split(README_MPIRUN.replace("\\\n", " ").replace("--hostfile hostfile", f"--hostfile {cluster.hostfile}"))
    cmd = [PYTHON if word == "python" else word for word in cmd]
    env = multinode_env(PATH=f"{os.path.dirname(PYTHON)}:{os.environ['PATH']}",
                        OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return popen(cluster, cmd + ["--run-dir", run_dir, "--epochs", "400"], env=env)  # outlives the measurement


def _training(run_dir):
    """True once the ranks have met and trained an epoch (its checkpoint has been written)."""
    return bool(glob.glob(os.path.join(run_dir, "checkpoints", "epoch-*", "manifest.json")))


def _mpi_exposure(cluster, run_dir):
    job = _mpi_job(cluster, run_dir)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _training(run_dir):
            assert job.poll() is None, job.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the job did not start training in time"
            time.sleep(0.5)
        seen = public_exposure(cluster)
        assert job.poll() is None, "the job ended during the measurement"
    finally:
        cluster.stop_jobs()
        job.kill()
        job.wait(timeout=30)
    return seen


@pytest.mark.parametrize("controller", [
    # The shared job's bound: its first checkpoint, the measurement, and its end once node2 is killed.
    pytest.param("gloo", marks=pytest.mark.timeout(FIRST_CHECKPOINT_TIMEOUT + END_AFTER_KILL_TIMEOUT + 60)),
    pytest.param("mpi", marks=pytest.mark.timeout(START_TIMEOUT + 60))])
def test_which_listeners_the_public_network_reaches(controller, request, tmp_path):
    if controller == "gloo":
        job = request.getfixturevalue("gloo_job_exposed_then_node2_killed")
        assert job["checkpointed"], "the job did not start training in time\n" + job["output"][-3000:]
        assert job["seen"] is not None, "the job ended before the measurement\n" + job["output"][-3000:]
        assert job["alive_after_measurement"], "the job ended during the measurement"
        seen = job["seen"]
    else:
        seen = _mpi_exposure(request.getfixturevalue("public_cluster"), str(tmp_path / "run"))
    print(f"\n{controller}: (bound address, port, reachable from the public network) per host:\n"
          + json.dumps(seen, indent=1))
    for host, sockets in seen.items():
        assert (VirtualCluster.address(host), SSH_PORT, False) in sockets, (host, sockets)
        for address, port, is_reachable in sockets:
            # Reachable exactly when bound to every address: the interface settings do not change the bind.
            assert is_reachable == (address in WILDCARDS), (host, address, port, sockets)
    # The measured exposure: Gloo's rendezvous server on the launcher; under MPI, Open MPI's
    # out-of-band and TCP-transport listeners on every host.
    exposed = {host for host, sockets in seen.items() if any(r for _, _, r in sockets)}
    assert exposed == ({"node1"} if controller == "gloo" else {"node1", "node2"}), seen
