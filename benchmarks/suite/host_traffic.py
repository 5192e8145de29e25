"""The bytes a host puts on its network interface, from the kernel's own counters.

A rank reads ``/proc/self/net/dev``, which shows the interfaces of its own
network namespace: on a virtual-cluster host (tools/vcluster.py), the
host's link to the others. Summed over one rank per host, the growth of the
transmit counters over a timed run is what crossed between hosts during it,
whatever the allreduce algorithm: payload, MPI's and TCP's headers, and
Horovod's negotiation.
"""

PROC_NET_DEV = "/proc/self/net/dev"


class InterfaceMissing(RuntimeError):
    pass


def transmitted_bytes(interface, path=PROC_NET_DEV):
    """The transmit byte counter of ``interface`` in this process's network namespace."""
    with open(path) as f:
        text = f.read()
    for line in text.splitlines()[2:]:  # two header lines
        name, _, fields = line.partition(":")
        if name.strip() == interface:
            # receive: bytes packets errs drop fifo frame compressed multicast; transmit: bytes ...
            return int(fields.split()[8])
    names = [line.partition(":")[0].strip() for line in text.splitlines()[2:]]
    raise InterfaceMissing(f"--interface {interface}: no such interface in this host's network namespace "
                           f"(it has {', '.join(names)})")
