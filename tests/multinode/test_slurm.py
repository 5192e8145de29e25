"""SLURM on two nodes of the virtual cluster: one slurmd per host, jobs submitted from node1."""
import re
from pathlib import Path

import pytest
import yaml

from tests.helpers import PYTHON, ROOT
from tests.multinode import slurm_on_cluster
from tests.multinode.helpers import HOSTS, RANKS_PER_HOST

pytestmark = [pytest.mark.multinode, pytest.mark.timeout(300)]
JOB_TIMEOUT = 200


@pytest.fixture(scope="module")
def slurm(virtual_cluster, tmp_path_factory):
    if not virtual_cluster.healthy():  # an earlier test killed a host
        virtual_cluster.up(HOSTS, RANKS_PER_HOST)
    started = slurm_on_cluster.start(virtual_cluster, tmp_path_factory.mktemp("slurm-on-cluster"))
    try:
        yield started
    finally:
        started.stop()


def _output(info):
    path = Path(info["StdOut"])
    return path.read_text(errors="replace") if path.is_file() else f"(no output file {path})"


def test_every_daemon_listens_on_its_host_address_only(slurm):
    cluster = slurm.cluster
    for host in cluster.hosts:
        addresses = {address for address, _ in cluster.listening_sockets(host)}
        assert addresses == {cluster.address(host)}, (host, cluster.listening_sockets(host))
    ports = {port for _, port in cluster.listening_sockets("node1")}
    assert {6817, 6818} <= ports  # slurmctld and node1's slurmd are among them


def test_the_slurm_helper_expands_the_two_node_nodelist(slurm, tmp_path):
    done = slurm.run(["sbatch", "--parsable", "-N", "2", "--ntasks-per-node=2", "--cpus-per-task=1",
                      f"--output={tmp_path}/slurm-%j.out", "--wrap", f"{PYTHON} -m hvd_easgd.startup.slurm hosts"])
    job = done.stdout.strip().split(";")[0]
    info = slurm.wait(job, timeout=60)
    assert info["JobState"] == "COMPLETED" and info["NodeList"] == "node[1-2]", _output(info)
    assert _output(info).split() == ["node1:2,node2:2"]


LAUNCHES = ("srun", "horovodrun")


@pytest.fixture(scope="module")
def train_jobs(slurm, tmp_path_factory):
    """slurm/train.sbatch on two nodes, one job per launch mode, submitted together: each job takes
    one CPU of each node's two, so they run side by side. Launch mode -> (job id, run directory)."""
    jobs = {}
    for launch in LAUNCHES:
        tmp = tmp_path_factory.mktemp(f"train-sbatch-{launch}")
        run_dir = tmp / "run"
        jobs[launch] = (slurm.submit(Path(ROOT) / "slurm" / "train.sbatch",
                                     ["-N", "2", "--ntasks-per-node=1", "--cpus-per-task=1",
                                      f"--output={tmp}/slurm-%j.out"],
                                     ["--run-dir", str(run_dir), "--epochs", "1"], env={"HVD_EASGD_LAUNCH": launch}),
                        run_dir)
    return jobs


@pytest.mark.parametrize("launch", LAUNCHES)
def test_train_sbatch_on_two_nodes_completes_with_a_rank_on_each(slurm, train_jobs, launch):
    job, run_dir = train_jobs[launch]
    info = slurm.wait(job, timeout=JOB_TIMEOUT)
    output = _output(info)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", output[-4000:]
    assert info["NodeList"] == "node[1-2]" and f"launch={launch}" in output
    with open(run_dir / "config.yaml") as f:
        ranks = yaml.safe_load(f)["ranks"]
    assert [(r["hostname"], r["cross_rank"], r["cross_size"]) for r in ranks] == [("node1", 0, 2), ("node2", 1, 2)]
    assert re.search(r"final test accuracy: \d", output), output[-2000:]
