"""Jobs across the hosts of the virtual cluster, launched from node1 as from a login node.

Every rank records its hostname and local/cross ranks in config.yaml; the
tests assert where the ranks really ran from there. The virtual hosts share
this machine's cores, hence --threads-per-rank 1.
"""
import json
import os
import shlex

import pytest
import yaml

from tests.helpers import PYTHON, ROOT
from tests.multinode.helpers import TRAIN, TWO_BY_TWO_TIMEOUT, horovodrun_on_hosts, launch, multinode_env
from tools.vcluster import INTERFACE

pytestmark = pytest.mark.multinode
LAUNCH_TIMEOUT = 150


def _ranks(run_dir):
    with open(os.path.join(run_dir, "config.yaml")) as f:
        return yaml.safe_load(f)["ranks"]


def _final_accuracy(run_dir):
    with open(os.path.join(run_dir, "metrics.json")) as f:
        return json.load(f)["final"]["test_accuracy"]


@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
@pytest.mark.parametrize("controller", ["mpi", "gloo"])
def test_one_rank_per_host_reaches_095(cluster, controller, tmp_path):
    run_dir = str(tmp_path / "run")
    args = ["--run-dir", run_dir, "--threads-per-rank", "1"]  # the default 10 epochs: about 5 s of training
    out = launch(cluster, horovodrun_on_hosts("node1:1,node2:1", controller, args, np=2), timeout=LAUNCH_TIMEOUT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ranks = _ranks(run_dir)
    assert [r["hostname"] for r in ranks] == ["node1", "node2"]
    assert [(r["cross_rank"], r["cross_size"], r["local_rank"], r["local_size"]) for r in ranks] == [
        (0, 2, 0, 1), (1, 2, 0, 1)]
    assert _final_accuracy(run_dir) >= 0.95


# The session's one 2 hosts × 2 ranks launch (conftest.py's two_by_two_run, a Gloo job of Hierarchical
# whose groups test_hierarchical.py asserts on): where the ranks run is the launcher's doing, whatever
# the strategy.
@pytest.mark.timeout(TWO_BY_TWO_TIMEOUT + 30)
def test_two_hosts_two_ranks_each(two_by_two_run):
    out, run_dir = two_by_two_run
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    placement = [(r["rank"], r["hostname"], r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"])
                 for r in _ranks(run_dir)]
    assert placement == [(0, "node1", 0, 2, 0, 2), (1, "node1", 1, 2, 0, 2),
                         (2, "node2", 0, 2, 1, 2), (3, "node2", 1, 2, 1, 2)]


# The docs' recipe, character for character (docs/virtual-cluster.md: "mpirun
# with a host file"). The test runs it in a directory holding the host file and
# a link to train.py, with the venv first on PATH, and adds only the run
# directory to train.py's options.
README_HOSTFILE = """\
node1 slots=1
node2 slots=1
"""
README_MPIRUN = """\
mpirun -np 2 --hostfile hostfile \\
    -bind-to none -map-by slot \\
    -mca pml ob1 -mca btl tcp,self \\
    -mca btl_tcp_if_include cluster0 -mca oob_tcp_if_include cluster0 \\
    -x PATH \\
    python train.py --threads-per-rank 1"""


def test_readme_recipe_matches_this_test():
    with open(os.path.join(ROOT, "docs", "virtual-cluster.md")) as f:
        page = f.read()
    if "mpirun -np 2 --hostfile hostfile" not in page:
        pytest.skip("the docs have no mpirun host-file recipe yet")
    assert README_MPIRUN in page and README_HOSTFILE in page


@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
def test_mpirun_with_a_host_file_as_the_readme_shows(cluster, tmp_path):
    assert INTERFACE in README_MPIRUN
    work = tmp_path / "project"
    work.mkdir()
    (work / "hostfile").write_text(README_HOSTFILE)
    (work / "train.py").symlink_to(TRAIN)  # python resolves the link: hvd_easgd is imported from ROOT
    run_dir = str(tmp_path / "run")
    cmd = shlex.split(README_MPIRUN.replace("\\\n", " ")) + ["--run-dir", run_dir]
    # Root only: mpirun refuses root unless told twice (CI runs the tier as root).
    env = multinode_env(PATH=f"{os.path.dirname(PYTHON)}:{os.environ['PATH']}",
                        OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = launch(cluster, cmd, timeout=LAUNCH_TIMEOUT, env=env, cwd=str(work))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert [r["hostname"] for r in _ranks(run_dir)] == ["node1", "node2"]
    assert _final_accuracy(run_dir) >= 0.95
