"""SLURM on the virtual cluster: slurmctld and munged on node1, one slurmd per host, each its own node.

It is the slurm tier's one-node ``SlurmCluster`` (tests/slurm/helpers.py) with
the daemons started inside the hosts' namespaces, every client command run on
node1, and a configuration that names every host with its cluster address.
"""
import os
import sys

from tests.helpers import ROOT
from tests.multinode.helpers import multinode_env
from tests.slurm.helpers import COMMAND_TIMEOUT, SlurmCluster, node_hardware


class VirtualClusterSlurm(SlurmCluster):
    def __init__(self, root, cluster):
        super().__init__(root)
        self.cluster = cluster
        self.host = "node1"  # slurmctld's host, and where clients run
        # Ours, minus any SLURM job we might be running inside (its SLURM_* would steer sbatch/srun).
        env = {k: v for k, v in multinode_env().items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
        self.env = dict(env, SLURM_CONF=str(self.conf), HVD_EASGD_VENV=sys.prefix)

    def write_config(self):
        hosts = self.cluster.hosts
        hardware, self.cpus = node_hardware()
        first, last = self.cluster.address(hosts[0]), self.cluster.address(hosts[-1]).rsplit(".", 1)[1]
        prefix, first_octet = first.rsplit(".", 1)
        # srun --mpi=pmix keeps per-step files under a directory named by job and step, which
        # must be node-local: on one file system two nodes' slurmstepds would collide.
        for host in hosts:
            os.makedirs(os.path.join(self.cluster.host_scratch(host), "pmix"), exist_ok=True)
        self._write_config(
            about=f"{len(hosts)} nodes of the virtual cluster {self.cluster.name} "
                  "(tests/multinode/slurm_on_cluster.py).",
            site=f"""ClusterName=hvdeasgdvc
SlurmctldHost=node1({first})
SlurmctldPort=6817
SlurmdPort=6818
# Every daemon binds its node's cluster address, never every address.""",
            nodes=f"""NodeName=node[1-{len(hosts)}] NodeAddr={prefix}.[{first_octet}-{last}] {hardware} State=UNKNOWN
PartitionName=debug Nodes=node[1-{len(hosts)}] Default=YES MaxTime=INFINITE State=UP""",
            node_names=hosts)
        (self.root / "mpi.conf").write_text(f"PMIxCliTmpDirBase={self.cluster.scratch}/pmix\n")

    def node_hosts(self):
        return self.cluster.hosts

    def _on_host(self, host, cmd):
        # munged and slurmctld on node1; each slurmd on its own host.
        return self.cluster.host_command(host or "node1", cmd, cwd="/")

    def _check_listeners(self):
        return None  # tests/multinode/test_topology.py checks every daemon's listeners on every host

    def run(self, cmd, check=True, timeout=COMMAND_TIMEOUT, env=None, cwd=ROOT):
        """A SLURM client command on node1, as a user on the login node types it."""
        return super().run(self.cluster.launcher_command([str(c) for c in cmd], cwd=str(cwd)), check=check,
                           timeout=timeout, env=self.cluster.launcher_env(env or self.env), cwd=cwd)


def start(cluster, root):
    slurm = VirtualClusterSlurm(root, cluster)
    try:
        slurm.write_config()
        slurm.start()
    except BaseException:
        slurm.stop()
        raise
    return slurm

