"""Hierarchical across the virtual cluster's hosts: by default a group is a host."""
import os

import pytest
import yaml

from tests.multinode.helpers import horovodrun_on_hosts, launch

pytestmark = pytest.mark.multinode
LAUNCH_TIMEOUT = 240


@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
def test_two_hosts_of_two_ranks_are_two_groups(cluster, tmp_path):
    run_dir = str(tmp_path / "run")
    args = ["--strategy", "hierarchical", "--inter", "easgd", "--tau", "10", "--run-dir", run_dir,
            "--epochs", "1", "--threads-per-rank", "1"]
    out = launch(cluster, horovodrun_on_hosts("node1:2,node2:2", "gloo", args, np=4), timeout=LAUNCH_TIMEOUT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with open(os.path.join(run_dir, "config.yaml")) as f:
        run = yaml.safe_load(f)
    hosts = {}
    for rank in run["ranks"]:
        hosts.setdefault(rank["hostname"], []).append(rank["rank"])
    assert sorted(hosts) == ["node1", "node2"]
    assert run["groups"] == [hosts["node1"], hosts["node2"]] == [[0, 1], [2, 3]]
    assert run["config"]["tau"] == 10 and run["config"]["inter"] == "easgd"
