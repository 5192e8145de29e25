#!/usr/bin/env python3
"""A virtual cluster on this one machine: H hosts in network namespaces, real ssh between them.

    python tools/vcluster.py up --hosts 2 --ranks-per-host 1 [--link-rate 100mbit]
    python tools/vcluster.py run -- horovodrun -np 2 -H node1:1,node2:1 \\
        --gloo --network-interface cluster0 python train.py --threads-per-rank 1
    python tools/vcluster.py down

What it builds (``NAME`` is ``--name``, default ``hvdvc``):

- Host ``nodeI`` is the network namespace ``NAME-nodeI`` plus, for the
  processes started in it, a UTS namespace whose hostname is ``nodeI`` and a
  private mount namespace where the cluster's hosts file is bind-mounted over
  /etc/hosts. Its only interface besides lo is ``cluster0``, with the address
  198.18.0.I/24 (198.18.0.0/15 is reserved for network benchmarking, RFC 2544).
- The other end of every host's veth is plugged into a bridge in the namespace
  ``NAME-switch``. Nothing of the cluster lives in the namespace that creates it:
  both ends of each veth are created directly inside the cluster's namespaces.
- There is no default route: a host reaches the other hosts and nothing else.
- Each host runs one sshd, bound to its own cluster address, that lets root in
  with the cluster's own key pair and with nothing else. The sshd is also the
  host's anchor: the UTS and mount namespaces are its own, and everything
  started through ssh inherits them.
- The launcher is node1, as on a login node that is also a compute node:
  ``run`` enters node1's namespaces and puts ``STATE/bin`` first on PATH, where
  an ``ssh`` wrapper adds ``-F STATE/ssh_config`` (the cluster's key, host keys
  pre-trusted, batch mode). horovodrun and mpirun then reach the hosts exactly
  as they reach real nodes. The launcher must be a cluster host rather than a
  bare namespace because Horovod's Gloo driver looks the --network-interface
  name up on the launcher too (``network.get_driver_ip``): the address of that
  interface *on the launcher* is the rendezvous address every rank dials.
- Every host sees its own directory at STATE/scratch: node-local scratch, like
  /tmp on real nodes. Every other path is this machine's file system, shared
  by all hosts as NFS would be.
- ``--link-rate`` shapes the egress of every host's cluster0 with a tbf qdisc
  (this kernel has no netem); the rate and the qdisc are recorded in the state.

Everything is named after ``NAME`` and recorded in STATE/state.json *before*
it is created, so ``down`` removes exactly that, by name (namespaces) or by pid
(the processes inside them), even after a half-finished ``up``. Both commands
are idempotent. Root is needed (network namespaces, veths, sshd).
"""
import argparse
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

STATE_ROOT = "/run/hvd_easgd-vcluster"
DEFAULT_NAME = "hvdvc"
SUBNET = ipaddress.ip_network("198.18.0.0/24")  # inside 198.18.0.0/15, reserved for benchmarking
BENCHMARK_RANGE = ipaddress.ip_network("198.18.0.0/15")
INTERFACE = "cluster0"
BRIDGE = "br0"
SSH_PORT = 22
SSHD = "/usr/sbin/sshd"
SSH = "/usr/bin/ssh"
PRIVSEP_DIR = "/run/sshd"
PRIVSEP_MARKER = ".created-run-sshd"
LAUNCHER = "node1"
COMMAND_TIMEOUT = 30
START_TIMEOUT = 20
STOP_TIMEOUT = 10
_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,11}$")
_RATE_PATTERN = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_REQUIRED_TOOLS = {"ip": "iproute2", "tc": "iproute2", "ss": "iproute2", "nsenter": "util-linux",
                   "unshare": "util-linux", "ssh-keygen": "openssh-client", SSH: "openssh-client",
                   SSHD: "openssh-server"}


class ClusterError(RuntimeError):
    """The virtual cluster cannot be built, used or removed; the message says why."""


# --- small helpers ------------------------------------------------------------------------

def _run(cmd, check=True, timeout=COMMAND_TIMEOUT, **kwargs):
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{' '.join(cmd)}` took over {timeout}s") from None
    if check and done.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


def parse_rate(rate):
    """'100mbit' -> 100_000_000 (bits per second), in tc's own units."""
    match = _RATE_PATTERN.match(rate or "")
    if not match or float(match.group(1)) <= 0:
        raise ValueError("`link_rate` must be a positive rate in tc's units (bit, kbit, mbit, gbit), "
                         f"e.g. 100mbit. Received: link_rate={rate!r}")
    return int(float(match.group(1)) * _RATE_UNITS[match.group(2)])


def tbf_arguments(bits_per_second):
    """The tbf qdisc for one link: its bucket holds 10 ms of traffic, and at
    least 64 KiB, so that one GSO packet of the veth always fits."""
    burst = max(64 * 1024, bits_per_second // 8 // 100)
    return ["tbf", "rate", str(bits_per_second), "burst", str(burst), "latency", "50ms"]


def _alive(pid):
    """True unless ``pid`` is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _netns_path(netns):
    return f"/run/netns/{netns}"


def _same_netns(pid, netns):
    """True when process ``pid`` lives in the named namespace ``netns`` (guards against pid reuse)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(_netns_path(netns)).st_ino
    except OSError:
        return False


def check_privileges():
    """Raises ClusterError, saying what is missing, unless this process can build a cluster."""
    if os.geteuid() != 0:
        raise ClusterError("the virtual cluster needs root: it creates network namespaces and veths and "
                           f"starts sshd. Received: euid={os.geteuid()}; HINT: run it with sudo (CI runs as root)")
    missing = sorted({package for tool, package in _REQUIRED_TOOLS.items() if shutil.which(tool) is None})
    if missing:
        raise ClusterError(f"the virtual cluster needs {', '.join(missing)}; HINT: `make setup` installs them "
                           "(openssh-server without starting the machine's own sshd)")
    probe = _run(["unshare", "--net", "--uts", "--mount", "true"], check=False)
    if probe.returncode != 0:
        raise ClusterError("cannot create network, UTS and mount namespaces here "
                           f"({probe.stderr.strip()}); HINT: the virtual cluster needs CAP_SYS_ADMIN and "
                           "CAP_NET_ADMIN (a privileged container, or the host)")


# --- the cluster -------------------------------------------------------------------------

class VirtualCluster:
    """One named virtual cluster; its state lives in ``STATE_ROOT/NAME``."""

    def __init__(self, name=DEFAULT_NAME, state_root=STATE_ROOT):
        if not _NAME_PATTERN.match(name):
            raise ValueError("`name` must be a lower-case letter then up to 11 letters or digits. "
                             f"Received: name={name!r}")
        self.name = name
        self.dir = os.path.join(state_root, name)
        self.state_file = os.path.join(self.dir, "state.json")
        self._daemons = {}  # host -> Popen, for the sshds this process started (to reap them)

    # --- names and paths ------------------------------------------------------------
    @property
    def switch_netns(self):
        return f"{self.name}-switch"

    def netns(self, host):
        return f"{self.name}-{host}"

    @staticmethod
    def host_names(count):
        return [f"node{i}" for i in range(1, count + 1)]

    @staticmethod
    def address(host):
        return str(SUBNET.network_address + int(host[len("node"):]))

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    @property
    def ssh_config(self):
        return self.path("ssh_config")

    @property
    def bin_dir(self):
        return self.path("bin")

    @property
    def scratch(self):
        """A path that is a different, node-local directory on every host (none outside the hosts)."""
        return self.path("scratch")

    def host_scratch(self, host):
        """Where ``host``'s scratch lives on the machine (to look at it from outside the cluster)."""
        return self.path(host, "scratch")

    @property
    def hostfile(self):
        """The mpirun host file: one line ``nodeI slots=R`` per host."""
        return self.path("hostfile")

    # --- state ------------------------------------------------------------------------
    def state(self):
        """The recorded state, or None when no cluster of this name exists."""
        try:
            with open(self.state_file) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def _save(self, state):
        tmp = self.state_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f, indent=2, sort_keys=True)
        os.replace(tmp, self.state_file)

    @property
    def hosts(self):
        state = self.state()
        return [h["name"] for h in state["hosts"]] if state else []

    def sshd_pid(self, host):
        state = self.state() or {"hosts": []}
        for h in state["hosts"]:
            if h["name"] == host:
                return h.get("sshd_pid")
        raise ClusterError(f"no host {host!r} in cluster {self.name}")

    # --- up -------------------------------------------------------------------------------
    def up(self, hosts, ranks_per_host=1, link_rate=None):
        """Builds the cluster (or leaves an identical healthy one as it is); returns the state."""
        if not isinstance(hosts, int) or not 1 <= hosts <= 200:
            raise ValueError(f"`hosts` must be an integer from 1 to 200. Received: hosts={hosts!r}")
        if not isinstance(ranks_per_host, int) or ranks_per_host < 1:
            raise ValueError(f"`ranks_per_host` must be an integer >= 1. Received: ranks_per_host={ranks_per_host!r}")
        rate = parse_rate(link_rate) if link_rate is not None else None
        check_privileges()
        wanted = {"hosts": hosts, "ranks_per_host": ranks_per_host, "link_rate": link_rate}
        current = self.state()
        if current is not None:
            if current.get("status") == "up" and {k: current.get(k) for k in wanted} == wanted and self.healthy():
                return current
            self.down()
        names = self.host_names(hosts)
        os.makedirs(self.dir, mode=0o700)
        state = {
            **wanted, "name": self.name, "status": "starting", "interface": INTERFACE, "launcher": LAUNCHER,
            "subnet": str(SUBNET), "switch_netns": self.switch_netns, "ssh_config": self.ssh_config,
            "hostfile": self.hostfile, "bin": self.bin_dir,
            "hosts": [{"name": h, "netns": self.netns(h), "address": self.address(h), "sshd_pid": None}
                      for h in names],
        }
        if rate is not None:
            state["link"] = {"nominal": link_rate, "bits_per_second": rate,
                             "qdisc": " ".join(tbf_arguments(rate)),
                             "where": f"egress of every host's {INTERFACE}"}
        self._save(state)  # before anything exists: `down` then knows every name
        try:
            self._write_files(names, ranks_per_host)
            self._build_network(names, rate)
            for entry in state["hosts"]:
                entry["sshd_pid"] = self._start_sshd(entry["name"])
                self._save(state)
            for host in names:
                self._wait_listening(host)
            self._check_ssh(names)
        except BaseException:
            self.down()
            raise
        state["status"] = "up"
        self._save(state)
        return state

    def _write_files(self, names, ranks_per_host):
        os.makedirs(self.bin_dir)
        os.makedirs(self.scratch)
        comment = f"hvd_easgd-vcluster-{self.name}"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", self.path("id_ed25519")])
        known = []
        for host in names:
            os.makedirs(self.path(host), mode=0o700)
            key = self.path(host, "ssh_host_ed25519_key")
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{host}.{comment}", "-f", key])
            with open(key + ".pub") as f:
                key_type, key_text = f.read().split()[:2]
            known.append(f"{host},{self.address(host)} {key_type} {key_text}\n")
            self._write(self.path(host, "sshd_config"), self._sshd_config(host))
        self._write(self.path("known_hosts"), "".join(known))
        with open(self.path("id_ed25519.pub")) as f:
            # The key only works from inside the cluster's subnet.
            self._write(self.path("authorized_keys"), f'from="{SUBNET}" {f.read()}', mode=0o600)
        self._write(self.path("hosts"), "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                    + "".join(f"{self.address(h)}\t{h}\n" for h in names), mode=0o644)
        self._write(self.hostfile, "".join(f"{h} slots={ranks_per_host}\n" for h in names), mode=0o644)
        self._write(self.ssh_config, self._client_config(names))
        self._write(os.path.join(self.bin_dir, "ssh"),
                    f'#!/bin/sh\n# The cluster\'s ssh: its key, its known hosts, never a prompt.\n'
                    f'exec {SSH} -F {self.ssh_config} "$@"\n', mode=0o755)
        # sshd wants its privilege-separation directory; the package's service (never started here)
        # would create it. A marker says this tool made it, so that the last `down` removes it.
        if not os.path.isdir(PRIVSEP_DIR):
            os.makedirs(PRIVSEP_DIR, mode=0o755)
            open(os.path.join(os.path.dirname(self.dir), PRIVSEP_MARKER), "w").close()

    @staticmethod
    def _write(path, text, mode=0o600):
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w") as f:
            f.write(text)

    def _sshd_config(self, host):
        return f"""\
# sshd of virtual host {host} (cluster {self.name}); written by tools/vcluster.py.
ListenAddress {self.address(host)}:{SSH_PORT}
HostKey {self.path(host, 'ssh_host_ed25519_key')}
PidFile {self.path(host, 'sshd.pid')}
AuthorizedKeysFile {self.path('authorized_keys')}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
UsePAM no
AllowUsers root
PermitUserEnvironment no
AllowTcpForwarding no
AllowAgentForwarding no
X11Forwarding no
PrintMotd no
PrintLastLog no
MaxStartups 64
MaxSessions 64
"""

    def _client_config(self, names):
        addresses = [self.address(h) for h in names]
        return f"""\
# ssh client configuration of cluster {self.name}; written by tools/vcluster.py.
Host {' '.join(names + addresses)}
    User root
    Port {SSH_PORT}
    IdentityFile {self.path('id_ed25519')}
    IdentitiesOnly yes
    UserKnownHostsFile {self.path('known_hosts')}
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    UpdateHostKeys no
    BatchMode yes
    PasswordAuthentication no
    ConnectTimeout 10
    ServerAliveInterval 5
    ServerAliveCountMax 3
    LogLevel ERROR
"""

    def _build_network(self, names, rate):
        sw = self.switch_netns
        for netns in [sw] + [self.netns(h) for h in names]:
            _run(["ip", "netns", "add", netns])
            # No IPv6 link-local addresses on the new interfaces: the cluster's only addresses are its own.
            _run(["ip", "netns", "exec", netns, "sysctl", "-q", "-w", "net.ipv6.conf.default.disable_ipv6=1"])
            _run(["ip", "-n", netns, "link", "set", "lo", "up"])
        _run(["ip", "-n", sw, "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", BRIDGE, "up"])
        for i, host in enumerate(names, start=1):
            netns, port = self.netns(host), f"port{i}"
            # Both ends are born inside the cluster's namespaces, never in ours.
            _run(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", INTERFACE, "netns", netns])
            _run(["ip", "-n", sw, "link", "set", port, "master", BRIDGE, "up"])
            _run(["ip", "-n", netns, "addr", "add", f"{self.address(host)}/{SUBNET.prefixlen}", "dev", INTERFACE])
            _run(["ip", "-n", netns, "link", "set", INTERFACE, "up"])
            if rate is not None:
                _run(["ip", "netns", "exec", netns, "tc", "qdisc", "replace", "dev", INTERFACE, "root",
                      *tbf_arguments(rate)])

    def _start_sshd(self, host):
        log = open(self.path(host, "sshd.log"), "w")
        # Like `ip netns exec`, the host gets a sysfs of its own network namespace (its /sys/class/net);
        # unlike it, the host keeps the machine's cgroup mounts under /sys/fs/cgroup, which slurmd needs.
        # nsenter and unshare exec (no fork), so the pid is sshd's own.
        # Each host also sees its own directory at self.scratch: node-local scratch, as /tmp is on
        # real nodes (everything else, /tmp included, is the machine's file system, shared like NFS).
        keep = self.path(host, "cgroup")
        os.makedirs(keep)
        os.makedirs(self.path(host, "scratch"))
        script = ('hostname "$1" && mount --bind "$2" /etc/hosts && mount --bind "$3" "$4"'
                  ' && mount --rbind /sys/fs/cgroup "$5" && mount -t sysfs sysfs /sys'
                  ' && mount --rbind "$5" /sys/fs/cgroup && umount -l "$5"'
                  ' && exec "$6" -D -e -f "$7"')
        cmd = ["nsenter", f"--net={_netns_path(self.netns(host))}", "unshare", "--uts", "--mount",
               "--propagation", "private", "--", "sh", "-c", script, "sh", host, self.path("hosts"),
               self.path(host, "scratch"), self.scratch, keep, SSHD, self.path(host, "sshd_config")]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        log.close()
        self._daemons[host] = proc
        return proc.pid

    def listening_sockets(self, host):
        """(address, port) of every listening TCP socket in ``host``'s namespace, from its own table."""
        out = _run(["ip", "netns", "exec", self.netns(host), "ss", "-H", "-l", "-t", "-n"]).stdout
        found = []
        for line in out.splitlines():
            local = line.split()[3]
            address, port = local.rsplit(":", 1)
            found.append((address.strip("[]"), int(port)))
        return found

    def _wait_listening(self, host):
        pid, want = self.sshd_pid(host), (self.address(host), SSH_PORT)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if not _alive(pid):
                raise ClusterError(f"sshd of {host} exited:\n{self.sshd_log(host)}")
            if want in self.listening_sockets(host):
                return
            time.sleep(0.1)
        raise ClusterError(f"sshd of {host} is not listening on {want[0]}:{want[1]} after {START_TIMEOUT}s:\n"
                           + self.sshd_log(host))

    def sshd_log(self, host):
        try:
            with open(self.path(host, "sshd.log")) as f:
                return f.read()[-3000:]
        except FileNotFoundError:
            return "(no log)"

    def _check_ssh(self, names):
        """Every host answers the launcher's ssh with its own hostname, without a prompt."""
        for host in names:
            done = _run(self.launcher_command(["ssh", host, "hostname"]), check=False, env=self.launcher_env())
            if done.returncode != 0 or done.stdout.strip() != host:
                raise ClusterError(f"`ssh {host} hostname` from {LAUNCHER} gave {done.returncode} "
                                   f"{done.stdout.strip()!r}: {done.stderr.strip()}\n{self.sshd_log(host)}")

    def healthy(self):
        state = self.state()
        if not state or state.get("status") != "up":
            return False
        return all(os.path.exists(_netns_path(h["netns"])) and _alive(h["sshd_pid"])
                   and _same_netns(h["sshd_pid"], h["netns"]) for h in state["hosts"])

    # --- using it ------------------------------------------------------------------------
    def host_command(self, host, cmd, cwd=None):
        """``cmd`` as a process of ``host``: its network, hostname and /etc/hosts (entered through its sshd)."""
        pid = self.sshd_pid(host)
        if not (pid and _alive(pid) and _same_netns(pid, self.netns(host))):
            raise ClusterError(f"host {host} of cluster {self.name} is down (its sshd is gone)")
        return ["nsenter", f"--target={pid}", "--net", "--uts", "--mount", f"--wd={cwd or os.getcwd()}", "--", *cmd]

    def launcher_command(self, cmd, cwd=None):
        """``cmd`` on the launcher (node1), as a user on a login node would type it."""
        return self.host_command(LAUNCHER, cmd, cwd)

    def launcher_env(self, env=None):
        """``env`` (default: ours) with the cluster's ssh wrapper first on PATH."""
        env = dict(os.environ if env is None else env)
        env["PATH"] = f"{self.bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"
        return env

    def host_pids(self, host):
        """Every process in ``host``'s network namespace, by ``ip netns pids``."""
        netns = self.netns(host) if host != "switch" else self.switch_netns
        if not os.path.exists(_netns_path(netns)):
            return []
        out = _run(["ip", "netns", "pids", netns], check=False).stdout
        return [int(p) for p in out.split() if _alive(int(p))]

    def kill_host(self, host, sig=signal.SIGKILL):
        """Sends ``sig`` to every process of ``host`` (a host that dies); returns their pids."""
        pids = self.host_pids(host)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def stop_jobs(self):
        """Ends every process in the cluster except the sshds: what a test leaves behind."""
        keep = {h["sshd_pid"] for h in (self.state() or {"hosts": []})["hosts"]}
        pids = [p for host in self.hosts for p in self.host_pids(host) if p not in keep]
        self._stop(pids)
        return pids

    # --- down -----------------------------------------------------------------------------
    def down(self):
        """Removes everything of this cluster, by pid and by name; returns what it removed."""
        state = self.state()
        removed = []
        if state is not None:
            # extra_netns: namespaces added to a running cluster (tools/vcluster_public.py).
            netnss = [h["netns"] for h in state["hosts"]] + [state["switch_netns"]] + state.get("extra_netns", [])
            pids = [h["sshd_pid"] for h in state["hosts"] if h.get("sshd_pid")]
            for netns in netnss:
                if os.path.exists(_netns_path(netns)):
                    pids += [int(p) for p in _run(["ip", "netns", "pids", netns], check=False).stdout.split()]
            self._stop(sorted(set(p for p in pids if _alive(p))))
            for netns in netnss:
                if os.path.exists(_netns_path(netns)):
                    _run(["ip", "netns", "delete", netns])
                    removed.append(netns)
        for proc in self._daemons.values():  # reap the sshds we started
            try:
                proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass
        self._daemons.clear()
        if os.path.isdir(self.dir):
            shutil.rmtree(self.dir)
            removed.append(self.dir)
        removed += self._remove_shared_leftovers()
        return removed

    def _remove_shared_leftovers(self):
        """The state root and /run/sshd (if this tool made it), once no cluster is left."""
        root = os.path.dirname(self.dir)
        if not os.path.isdir(root) or [n for n in os.listdir(root) if n != PRIVSEP_MARKER]:
            return []
        removed = []
        if os.path.exists(os.path.join(root, PRIVSEP_MARKER)):
            try:
                os.rmdir(PRIVSEP_DIR)  # only if empty
                removed.append(PRIVSEP_DIR)
            except OSError:
                pass
            os.remove(os.path.join(root, PRIVSEP_MARKER))
        os.rmdir(root)
        return removed + [root]

    def _stop(self, pids):
        """SIGTERM, then SIGKILL what is still alive after STOP_TIMEOUT seconds."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            for proc in self._daemons.values():
                proc.poll()  # reap, so that a dead sshd is not a zombie counted as alive
            deadline = time.monotonic() + STOP_TIMEOUT
            while any(_alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.1)
                for proc in self._daemons.values():
                    proc.poll()
            pids = [p for p in pids if _alive(p)]
            if not pids:
                return
        raise ClusterError(f"processes {pids} of cluster {self.name} survived SIGKILL")


# --- command line ----------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(prog="tools/vcluster.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default=DEFAULT_NAME, help=f"cluster name (default {DEFAULT_NAME})")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build the cluster (idempotent)")
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--ranks-per-host", type=int, default=1, help="slots per host in the mpirun host file")
    up.add_argument("--link-rate", default=None, help="e.g. 100mbit: tbf on every host's link")
    sub.add_parser("down", help="remove the cluster and every process in it (idempotent)")
    sub.add_parser("status", help="print the recorded state")
    run = sub.add_parser("run", help="run a command on the launcher (node1); default: a shell")
    run.add_argument("--host", default=LAUNCHER)
    run.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        cluster = VirtualCluster(args.name)
        if args.command == "up":
            state = cluster.up(args.hosts, args.ranks_per_host, args.link_rate)
            hosts = ", ".join(f"{h['name']}={h['address']}" for h in state["hosts"])
            print(f"cluster {cluster.name} up: {hosts}; launcher {LAUNCHER}; "
                  f"run commands there with: python tools/vcluster.py --name {cluster.name} run -- CMD")
        elif args.command == "down":
            removed = cluster.down()
            print(f"cluster {cluster.name} down: "
                  + (f"removed {', '.join(removed)}" if removed else "nothing to remove"))
        elif args.command == "status":
            state = cluster.state()
            print(json.dumps(dict(state, healthy=cluster.healthy()), indent=2) if state
                  else f"no cluster {cluster.name}")
        else:
            if cluster.state() is None:
                raise ClusterError(f"no cluster {cluster.name}; HINT: python tools/vcluster.py up first")
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            command = cluster.host_command(args.host, cmd or ["bash", "-i"])
            return subprocess.call(command, env=cluster.launcher_env())
    except (ClusterError, ValueError) as err:
        print(f"vcluster: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
