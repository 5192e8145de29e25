"""A second, "public" network for a virtual cluster (tools/vcluster.py): where a job's exposure is measured.

Real cluster nodes often have two networks: the cluster's own, and a public
one (the campus or the internet side). This module gives every host of a
running cluster a second interface, ``public0``, with the address
198.19.0.I/24, on a bridge in a switch namespace of its own (``NAME-pubsw``),
and adds one more namespace, ``NAME-outside``: an outsider at 198.19.0.254
that is on the public network only. No namespace gets a default route, and
198.19.0.0/24 lies inside 198.18.0.0/15 (reserved for network benchmarking),
so nothing leaves the namespaces created here.

From the outsider, ``reachable`` tries a TCP connect to each listener a host
has (its /proc/net/tcp and tcp6 tables): which of a live job's listeners could
someone on the public network reach? The namespaces are recorded in the
cluster's state before they are created, so ``VirtualCluster.down`` removes
them with the rest, by name.
"""
import ipaddress
import json
import subprocess
import sys

from tools.vcluster import BENCHMARK_RANGE, ClusterError, _run

PUBLIC_SUBNET = ipaddress.ip_network("198.19.0.0/24")
PUBLIC_INTERFACE = "public0"
PUBLIC_BRIDGE = "br0"
OUTSIDER_HOST_NUMBER = 254
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's state column
assert PUBLIC_SUBNET.subnet_of(BENCHMARK_RANGE)


def public_switch_netns(cluster):
    return f"{cluster.name}-pubsw"


def outsider_netns(cluster):
    return f"{cluster.name}-outside"


def public_address(host):
    """``node3`` -> 198.19.0.3; the outsider is 198.19.0.254."""
    number = OUTSIDER_HOST_NUMBER if host == "outside" else int(host[len("node"):])
    return str(PUBLIC_SUBNET.network_address + number)


def add_public_network(cluster):
    """Gives every host of the (running) ``cluster`` a public0 interface, and adds the outsider."""
    state = cluster.state()
    if not state or state.get("status") != "up":
        raise ClusterError(f"cluster {cluster.name} is not up; HINT: build it with VirtualCluster.up first")
    switch, outsider = public_switch_netns(cluster), outsider_netns(cluster)
    if state.get("public"):
        return state["public"]
    # Recorded first, so that `down` removes them even if what follows fails half-way.
    state["extra_netns"] = sorted(set(state.get("extra_netns", [])) | {switch, outsider})
    state["public"] = {"subnet": str(PUBLIC_SUBNET), "interface": PUBLIC_INTERFACE, "switch_netns": switch,
                       "outsider_netns": outsider, "outsider_address": public_address("outside"),
                       "hosts": {h: public_address(h) for h in cluster.hosts}}
    cluster._save(state)
    for netns in (switch, outsider):
        _run(["ip", "netns", "add", netns])
        _run(["ip", "netns", "exec", netns, "sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1"])
        _run(["ip", "-n", netns, "link", "set", "lo", "up"])
    _run(["ip", "-n", switch, "link", "add", PUBLIC_BRIDGE, "type", "bridge"])
    _run(["ip", "-n", switch, "link", "set", PUBLIC_BRIDGE, "up"])
    ends = [(cluster.netns(h), public_address(h)) for h in cluster.hosts] + [(outsider, public_address("outside"))]
    for i, (netns, address) in enumerate(ends, start=1):
        port = f"pub{i}"
        _run(["ip", "-n", switch, "link", "add", port, "type", "veth", "peer", "name", PUBLIC_INTERFACE,
              "netns", netns])
        _run(["ip", "-n", switch, "link", "set", port, "master", PUBLIC_BRIDGE, "up"])
        _run(["ip", "-n", netns, "addr", "add", f"{address}/{PUBLIC_SUBNET.prefixlen}", "dev", PUBLIC_INTERFACE])
        _run(["ip", "-n", netns, "link", "set", PUBLIC_INTERFACE, "up"])
    return state["public"]


def _address(hex_address):
    """/proc/net/tcp's little-endian hex address (IPv4 or IPv6) as text."""
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return str(ipaddress.ip_address(raw[::-1]))
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.ip_address(words))


def listeners(cluster, host):
    """Sorted ``(address, port)`` of every listening TCP socket of ``host``, from its /proc/net/tcp and tcp6."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        text = _run(["ip", "netns", "exec", cluster.netns(host), "cat", table], check=False).stdout
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == LISTEN:
                address, port = fields[1].split(":")
                found.add((_address(address), int(port, 16)))
    return sorted(found)


_CONNECT = """
import json, socket, sys
result = {}
for address, port in json.loads(sys.argv[1]):
    try:
        socket.create_connection((address, port), timeout=float(sys.argv[2])).close()
        result[f"{address}:{port}"] = True
    except OSError:
        result[f"{address}:{port}"] = False
print(json.dumps(result))
"""


def reachable(cluster, targets, timeout=1.0):
    """``{"addr:port": bool}``: whether a TCP connect from the outsider to each ``(address, port)`` succeeds.

    The outsider only connects and closes: it sends no byte."""
    cmd = ["ip", "netns", "exec", outsider_netns(cluster), sys.executable, "-c", _CONNECT,
           json.dumps([list(t) for t in targets]), str(timeout)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30 + timeout * len(targets))
    if done.returncode != 0:
        raise ClusterError(f"the outsider's connects failed: {done.stderr.strip()}")
    return json.loads(done.stdout)
