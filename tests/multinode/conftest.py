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

import pytest

from tests.multinode.helpers import HOSTS, RANKS_PER_HOST
from tools.vcluster import ClusterError, VirtualCluster, check_privileges


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
