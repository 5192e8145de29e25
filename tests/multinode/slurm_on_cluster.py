"""SLURM on the virtual cluster: slurmctld and munged on node1, one slurmd per host, each its own node.

It is the slurm tier's one-node ``SlurmCluster`` (tests/slurm/conftest.py) with
the daemons started inside the hosts' namespaces, every client command run on
node1, and a configuration that names every host with its cluster address.
"""
import os
import subprocess
import sys

from tests.conftest import ROOT
from tests.multinode.conftest import multinode_env
from tests.slurm.conftest import COMMAND_TIMEOUT, START_TIMEOUT, SlurmCluster, _node_hardware


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
        hardware, self.cpus = _node_hardware()
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

    def _spawn(self, name, cmd, host="node1"):
        log = open(self.root / "log" / f"{name}.console", "w")
        self.daemons[name] = subprocess.Popen(self.cluster.host_command(host, cmd, cwd="/"), stdout=log,
                                              stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        log.close()

    def start(self):
        m = self.root / "munge"
        self._spawn("munged", ["munged", "-F", "--force", f"--socket={m}/munge.socket",
                               f"--key-file={m}/munge.key", f"--log-file={m}/munged.log",
                               f"--pid-file={m}/munged.pid", f"--seed-file={m}/munged.seed"])
        self._wait_for(lambda: (m / "munge.socket").exists(), "munged's socket", timeout=15)
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        for host in self.cluster.hosts:
            self._spawn(f"slurmd-{host}", ["slurmd", "-D", "-f", str(self.conf), "-N", host], host=host)
        self._wait_for(self._nodes_idle, "every node idle in sinfo", timeout=START_TIMEOUT)

    def _nodes_idle(self):
        out = self.run(["sinfo", "-h", "-N", "-o", "%T"], check=False).stdout.split()
        return len(out) == len(self.cluster.hosts) and set(out) == {"idle"}

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

