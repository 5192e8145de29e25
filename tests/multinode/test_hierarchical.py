"""Hierarchical across the virtual cluster's hosts: by default a group is a host.

Its launch (2 hosts × 2 ranks, Gloo) is the session's shared ``two_by_two_run`` (conftest.py):
test_launch.py asserts on the same run where each rank ran."""
import os

import pytest
import yaml

from tests.multinode.helpers import TWO_BY_TWO_TIMEOUT

pytestmark = pytest.mark.multinode


@pytest.mark.timeout(TWO_BY_TWO_TIMEOUT + 30)
def test_two_hosts_of_two_ranks_are_two_groups(two_by_two_run):
    out, run_dir = two_by_two_run
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    with open(os.path.join(run_dir, "config.yaml")) as f:
        run = yaml.safe_load(f)
    hosts = {}
    for rank in run["ranks"]:
        hosts.setdefault(rank["hostname"], []).append(rank["rank"])
    assert sorted(hosts) == ["node1", "node2"]
    assert run["groups"] == [hosts["node1"], hosts["node2"]] == [[0, 1], [2, 3]]
    assert run["config"]["tau"] == 10 and run["config"]["inter"] == "easgd"
