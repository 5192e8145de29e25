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

A second cluster, with a public network as well (tools/vcluster_public.py),
serves the tests of what that network reaches, and is removed at the end of
the session too.

Two launches are shared, each run once, for whichever of its tests comes first;
neither asserts itself, each test asserts on what it returned:

- ``two_by_two_run``: the 2 hosts × 2 ranks Hierarchical job, whose config.yaml
  both test_hierarchical.py (its groups) and test_launch.py (where the 4 ranks
  ran) assert on;
- ``gloo_job_exposed_then_node2_killed``: the long Gloo job on the public
  cluster that test_network_exposure.py measures the listeners of and that
  test_failures.py then kills node2 under.
"""
import os

import pytest

from tests.multinode.helpers import (HOSTS, RANKS_PER_HOST, TWO_BY_TWO_TIMEOUT, gloo_job_exposed_then_host_killed,
                                     horovodrun_on_hosts, launch)
from tools.vcluster import ClusterError, VirtualCluster, check_privileges
from tools.vcluster_public import add_public_network


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


def _healthy(virtual_cluster):
    if not virtual_cluster.healthy():  # an earlier test killed a host
        virtual_cluster.up(HOSTS, RANKS_PER_HOST)
    return virtual_cluster


@pytest.fixture
def cluster(virtual_cluster):
    yield _healthy(virtual_cluster)
    virtual_cluster.stop_jobs()


@pytest.fixture(scope="session")
def two_by_two_run(virtual_cluster, tmp_path_factory):
    """``(completed process, run directory)`` of one Gloo launch on node1:2,node2:2 of
    ``train.py --strategy hierarchical --inter easgd --tau 10 --epochs 1`` (bounded by
    TWO_BY_TWO_TIMEOUT; the tests that read it allow for it in their own timeouts)."""
    cluster = _healthy(virtual_cluster)
    run_dir = str(tmp_path_factory.mktemp("two-by-two") / "run")
    args = ["--strategy", "hierarchical", "--inter", "easgd", "--tau", "10", "--run-dir", run_dir,
            "--epochs", "1", "--threads-per-rank", "1"]
    try:
        out = launch(cluster, horovodrun_on_hosts("node1:2,node2:2", "gloo", args, np=4), timeout=TWO_BY_TWO_TIMEOUT)
    finally:
        cluster.stop_jobs()
    return out, run_dir


def _healthy_public(cluster):
    """``cluster``, rebuilt with its public network if a host died (2 hosts × 1 rank: its host file's slots)."""
    if not cluster.healthy():
        cluster.up(HOSTS, 1)
        add_public_network(cluster)
    return cluster


@pytest.fixture(scope="session")
def public_network_cluster():
    try:
        check_privileges()
    except ClusterError as err:
        pytest.fail(f"the multinode tier cannot build its virtual cluster: {err}")
    cluster = VirtualCluster(f"hvdp{os.getpid()}"[:12])
    try:
        yield _healthy_public(cluster)
    finally:
        cluster.down()


@pytest.fixture
def public_cluster(public_network_cluster):
    yield _healthy_public(public_network_cluster)
    public_network_cluster.stop_jobs()


@pytest.fixture(scope="session")
def gloo_job_exposed_then_node2_killed(public_network_cluster, tmp_path_factory):
    """``helpers.gloo_job_exposed_then_host_killed`` on the public cluster, once; leaves node2 dead (the next
    ``public_cluster`` rebuilds it)."""
    cluster = _healthy_public(public_network_cluster)
    try:
        return gloo_job_exposed_then_host_killed(cluster, tmp_path_factory.mktemp("gloo-job") / "run")
    finally:
        cluster.stop_jobs()
