"""The virtual cluster is what it claims to be, read from the namespaces' own tables.

No traffic is sent: addresses, routes and listening sockets are read with
`ip -n` and `ss` inside each namespace, and the machine's root namespace is
only looked at (through pid 1's /proc/1/net tables).
"""
import ipaddress
import json
import subprocess

import pytest

from tools import loopback_network
from tools.vcluster import BENCHMARK_RANGE, INTERFACE, SSH_PORT

pytestmark = pytest.mark.multinode


def _ip_json(*args, netns=None):
    prefix = ["ip", "-n", netns] if netns else ["ip"]
    return json.loads(subprocess.run([*prefix, "-j", *args], capture_output=True, text=True, check=True,
                                     timeout=30).stdout or "[]")


def _hex_ipv4(little_endian_hex):
    return str(ipaddress.ip_address(bytes.fromhex(little_endian_hex)[::-1]))


def _root_namespace_tables():
    """(interfaces, local IPv4 addresses, IPv4 routes) of the machine's root network namespace.

    Read from pid 1's /proc/1/net tables: entering that namespace may be
    forbidden (it is here), and reading needs no traffic and no entering.
    """
    with open("/proc/1/net/dev") as f:
        interfaces = {line.split(":")[0].strip() for line in f.readlines()[2:]}
    with open("/proc/1/net/fib_trie") as f:
        lines = f.read().splitlines()
    addresses = {lines[i - 1].split()[-1] for i, line in enumerate(lines) if line.strip() == "/32 host LOCAL"}
    routes = []
    with open("/proc/1/net/route") as f:
        for line in f.readlines()[1:]:
            iface, dst, _gateway, _flags, _ref, _use, _metric, mask = line.split()[:8]
            routes.append((iface, ipaddress.ip_network(f"{_hex_ipv4(dst)}/{_hex_ipv4(mask)}")))
    return interfaces, addresses, routes


def _addresses(links):
    return [(link["ifname"], info["local"]) for link in links for info in link.get("addr_info", [])]


def test_hosts_reach_each_other_and_nothing_else(cluster):
    for host in cluster.hosts:
        netns = cluster.netns(host)
        routes = _ip_json("route", "show", "table", "all", netns=netns)
        assert not [r for r in routes if r["dst"] == "default"], f"{host} has a default route: {routes}"
        for route in _ip_json("route", "show", netns=netns):  # the main table: where packets may go
            assert ipaddress.ip_network(route["dst"]).subnet_of(BENCHMARK_RANGE), (host, route)
        links = _ip_json("addr", "show", netns=netns)
        assert sorted(link["ifname"] for link in links) == sorted(["lo", INTERFACE])
        assert [a for ifname, a in _addresses(links) if ifname == INTERFACE] == [cluster.address(host)]
    switch_links = _ip_json("addr", "show", netns=cluster.switch_netns)
    assert [a for ifname, a in _addresses(switch_links) if ifname != "lo"] == [], "the switch has an address"
    assert _ip_json("route", "show", netns=cluster.switch_netns) == []


def test_the_pytest_and_root_namespaces_hold_nothing_of_the_cluster(cluster):
    assert loopback_network.is_loopback_only(), loopback_network.interfaces()
    interfaces, addresses, routes = _root_namespace_tables()
    assert "lo" in interfaces, f"could not read the root namespace's interfaces: {interfaces}"
    assert INTERFACE not in interfaces and not any(name.startswith("port") for name in interfaces), interfaces
    in_range = sorted(a for a in addresses if ipaddress.ip_address(a) in BENCHMARK_RANGE)
    assert in_range == [], f"the root namespace holds cluster addresses: {in_range}"
    assert [r for r in routes if r[1].prefixlen and r[1].overlaps(BENCHMARK_RANGE)] == [], routes


def test_each_sshd_listens_only_on_its_host_address(cluster):
    for host in cluster.hosts:
        sshd = cluster.sshd_pid(host)
        assert cluster.host_pids(host) == [sshd], "the idle host runs something besides its sshd"
        assert cluster.listening_sockets(host) == [(cluster.address(host), SSH_PORT)]


def test_hosts_resolve_each_other_and_log_in_with_the_cluster_key(cluster):
    from tests.multinode.helpers import launch

    out = launch(cluster, ["sh", "-c", 'hostname; getent hosts node2; ssh node2 hostname'], timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["node1", cluster.address("node2"), "node2", "node2"]
    # The host keys are trusted through the cluster's own files: no ~/.ssh gets involved.
    refused = launch(cluster, ["/usr/bin/ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                               "-o", "UserKnownHostsFile=/dev/null", "node2", "true"], timeout=30)
    assert refused.returncode == 255, "plain ssh, without the cluster's configuration, got in"
