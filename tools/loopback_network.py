"""Runs the test session in a private network namespace that has only loopback.

Why: several servers the tests start cannot be told to bind to loopback.
Open MPI 4.1's mpirun binds its out-of-band listener to INADDR_ANY in code
(no MCA parameter changes that), its TCP BTL listens on every address, and
horovodrun's Gloo rendezvous server binds to ''. In a namespace whose only
interface is ``lo``, "every address" *is* loopback, so nothing a test starts
(MPI, Gloo, the SLURM daemons, srun) can be reached from outside the machine.

The namespace is entered once, in the pytest process, before any test runs;
every process a test starts inherits it. It needs CAP_SYS_ADMIN (root, as CI
runs). ``HVD_EASGD_TEST_NETWORK=host`` opts out; the tier that checks the
listeners then fails, saying why.
"""
import ctypes
import os
import socket
import subprocess

CLONE_NEWNET = 0x40000000
OPT_OUT = "HVD_EASGD_TEST_NETWORK"

# glibc's getaddrinfo(AI_ADDRCONFIG) answers nothing for IPv4 when the only
# IPv4 address is 127.0.0.1 (it does not count that one), and slurmctld then
# cannot even resolve "127.0.0.1". A second loopback address on lo fixes that
# without adding any interface.
SECOND_LOOPBACK_ADDRESS = "127.0.0.2/8"


def interfaces():
    return sorted(name for _, name in socket.if_nameindex())


def is_loopback_only():
    """True when this process's network namespace has no interface but lo."""
    return interfaces() == ["lo"]


def enter():
    """Moves this process into a new loopback-only network namespace.

    Returns a one-line description of the network the tests run in.
    """
    if os.environ.get(OPT_OUT) == "host":
        return f"host network ({OPT_OUT}=host): servers may listen on every interface"
    if is_loopback_only():
        return "loopback only (already in a loopback-only namespace)"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        reason = os.strerror(ctypes.get_errno())
        return (f"host network: could not create a network namespace ({reason}); "
                "HINT: run the tests as root (CI does)")
    for cmd in (["ip", "link", "set", "lo", "up"],
                ["ip", "addr", "add", SECOND_LOOPBACK_ADDRESS, "dev", "lo"]):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed in the test network namespace: {done.stderr.strip()} "
                               "(HINT: `make setup` installs iproute2)")
    return "loopback only (private network namespace with lo alone)"


# --- what is listening --------------------------------------------------------------
_TCP_LISTEN = "0A"


def _decode(hex_address, family):
    ip_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(ip_hex)
    if family == socket.AF_INET:
        packed = raw[::-1]  # /proc/net/tcp holds the address as a little-endian u32
    else:
        packed = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(family, packed), int(port_hex, 16)


def listening_tcp_sockets():
    """(address, port) of every listening TCP socket in this network namespace."""
    found = []
    for path, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        if not os.path.exists(path):
            continue
        with open(path) as table:
            next(table)
            for line in table:
                fields = line.split()
                if fields[3] == _TCP_LISTEN:
                    found.append(_decode(fields[1], family))
    return found


def reachable_from_outside(address):
    """Whether a socket bound to ``address`` can be reached from another machine."""
    if address.startswith("127.") or address in ("::1", "::ffff:127.0.0.1"):
        return False
    # A wildcard (0.0.0.0, ::) or any other address is reachable unless lo is all there is.
    return not is_loopback_only()
