"""What sets a long transfer's rate across the virtual cluster's tbf links: TCP, or Open MPI's use of it.

``python -m benchmarks.studies.link_transport [--rate 100mbit] [--rounds 3] [--megabytes 32]``

The rated-link launches' link probe (one 32 MB allreduce, ``hvd_easgd/choosing/link_probe.py``)
measured 48 to 94 Mbit/s through a 100 Mbit/s tbf from launch to launch, and
the cost model takes each launch's probe as the rate of its long transfers
(``calibration.TokenBucketLink``). This asks where the shortfall comes from,
on 2 hosts × 1 rank, both hosts sending at once as an allreduce's do:

* ``tcp_two_sockets``: plain TCP, one connection each way (Python sockets,
  a server in each host's namespace on its cluster address);
* ``tcp_one_socket``: plain TCP, one connection carrying both ways, as
  Open MPI's TCP transport carries a pair of ranks by default;
* ``mpi_sendrecv`` and ``mpi_allreduce``: mpi4py's ``Sendrecv`` (each rank
  sends S and receives S) and ``Allreduce`` (2(H−1)/H·S a host's link) of S,
  with Open MPI's ``btl_tcp_links`` at 1 (its default) and 2 (two connections
  a pair of ranks).

Then on 2 hosts × 2 ranks, the two patterns SyncAverage's flat allreduce and
its two-level one (``sync_two_level``) put on the link, each S on a host's
link, with ``btl_tcp_links`` at 1 and 2:

* ``mpi_flat4``: one allreduce over the 4 ranks (Open MPI's
  halving/doubling: two pairs of ranks cross, S/2 each);
* ``mpi_leaders``: one allreduce over one rank a host (one pair crosses).

Each arm reports the bytes one way over the seconds, in Mbit/s, and the
packets the hosts' tbf dropped while it ran (``tc -s qdisc``). Arms are
rotated round by round. Output: ``--out`` (default
``docs/results/link-transport/``), ``results.json`` and ``results.md``.
Needs root (the virtual cluster); its servers listen only on the cluster's
own addresses inside its namespaces.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
import time

from tools.vcluster import INTERFACE, VirtualCluster, check_privileges

from ..suite import runner
from ..suite.rated_links import MPI_ENV, run_on_cluster
from ..suite.runner import REPO_ROOT, table

PORT = 5301
# Per layout (hosts, ranks a host), its arms.
LAYOUTS = {(2, 1): ("tcp_two_sockets", "tcp_one_socket", "mpi_sendrecv_links1", "mpi_sendrecv_links2",
                    "mpi_allreduce_links1", "mpi_allreduce_links2"),
           (2, 2): ("mpi_flat4_links1", "mpi_flat4_links2", "mpi_leaders_links1", "mpi_leaders_links2")}
OUT = os.path.join(REPO_ROOT, "docs", "results", "link-transport")

# One host's side of the plain-TCP arms: a server on its own address, a client to the peer's, both at once;
# prints the seconds its client took to send S and its server to receive S.
TCP_SIDE = textwrap.dedent("""
    import socket, sys, threading, time
    me, peer, port, size, one = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
    chunk = b"x" * (1 << 20)
    def send(c):
        left = size
        while left > 0:
            left -= c.send(chunk[:min(left, len(chunk))])
    def receive(c, done):
        got = 0
        while got < size:
            n = len(c.recv(1 << 20))
            if not n:
                break
            got += n
        done.append(time.perf_counter())
    server = socket.create_server((me, port))
    time.sleep(1.0)  # the peer's server is up
    start = time.perf_counter()
    if one:  # one connection both ways: the lower address dials, each side sends and receives on it
        if me < peer:
            c = socket.create_connection((peer, port))
        else:
            c, _ = server.accept()
        done = []
        r = threading.Thread(target=receive, args=(c, done)); r.start(); send(c); r.join()
    else:
        out = socket.create_connection((peer, port)); inc, _ = server.accept()
        done = []
        r = threading.Thread(target=receive, args=(inc, done)); r.start(); send(out); out.shutdown(socket.SHUT_WR)
        r.join()
    print(done[0] - start)
""")

# The MPI arms: S bytes of float32, one warm-up call, then the timed ones; rank 0 prints each call's seconds.
MPI_SIDE = textwrap.dedent("""
    import sys, time
    import numpy as np
    from mpi4py import MPI
    comm, kind, size, calls = MPI.COMM_WORLD, sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    a = np.ones(size // 4, np.float32); b = np.empty_like(a)
    per_host = comm.size // 2  # ranks are placed host by host
    peer = (comm.rank + per_host) % comm.size  # the same index on the other host
    leaders = comm.Split(0 if comm.rank % per_host == 0 else MPI.UNDEFINED, comm.rank)
    for i in range(calls + 1):
        comm.Barrier(); t = time.perf_counter()
        if kind == "sendrecv":
            comm.Sendrecv(a, dest=peer, recvbuf=b, source=peer)
        elif kind == "leaders":
            if leaders != MPI.COMM_NULL:
                leaders.Allreduce(a, b)
        else:  # allreduce, flat4: every rank
            comm.Allreduce(a, b)
        t = time.perf_counter() - t
        if i and comm.rank == 0:
            print(t, flush=True)
""")


def dropped(cluster):
    """Packets the tbf of each host's cluster link has dropped so far, summed."""
    total = 0
    for host in cluster.hosts:
        out = subprocess.run(["ip", "netns", "exec", cluster.netns(host), "tc", "-s", "qdisc", "show", "dev",
                              INTERFACE], capture_output=True, text=True, timeout=30, check=True).stdout
        total += sum(int(n) for n in re.findall(r"dropped (\d+)", out))
    return total


def tcp_arm(cluster, size, one_socket, log_dir, timeout):
    """Seconds of the slower host's transfer of ``size`` bytes, both hosts sending at once."""
    hosts = cluster.hosts
    addresses = [cluster.address(h) for h in hosts]
    jobs = []
    for i, host in enumerate(hosts):
        cmd = [sys.executable, "-c", TCP_SIDE, addresses[i], addresses[1 - i], str(PORT), str(size),
               "1" if one_socket else "0"]
        jobs.append((cluster.host_command(host, cmd, cwd=REPO_ROOT), dict(os.environ)))
    log = os.path.join(log_dir, f"tcp-{'one' if one_socket else 'two'}-{time.time_ns()}.log")
    outcome = runner.run_bounded(jobs, log, timeout)
    if not outcome.ok:
        raise RuntimeError(f"the TCP arm failed; its log: {log}")
    seconds = [float(line) for line in open(log) if re.fullmatch(r"[0-9.e-]+\n?", line)]
    return max(seconds)


def mpi_arm(cluster, kind, links, size, calls, log_dir, timeout, ranks_per_host):
    """Each timed call's seconds on rank 0."""
    hosts = cluster.hosts
    cmd = ["mpirun", "--allow-run-as-root", "-np", str(len(hosts) * ranks_per_host),
           "-H", ",".join(f"{h}:{ranks_per_host}" for h in hosts),
           "--mca", "btl_tcp_links", str(links), sys.executable, "-c", MPI_SIDE, kind, str(size), str(calls)]
    log = os.path.join(log_dir, f"mpi-{kind}-{links}-{time.time_ns()}.log")
    outcome = run_on_cluster(cluster, cmd, log, timeout)
    if not outcome.ok:
        raise RuntimeError(f"the MPI arm failed; its log: {log}")
    return [float(line) for line in open(log) if re.fullmatch(r"[0-9.e-]+\n?", line)]


def run_arm(cluster, arm, args, log_dir, ranks_per_host):
    """(Mbit/s one way per timed transfer, packets dropped). Every arm puts S on each host's link one way:
    a transfer, a Sendrecv, or an allreduce across 2 hosts (2(H−1)/H·S), flat or among the leaders."""
    before = dropped(cluster)
    if arm.startswith("tcp"):
        seconds = [tcp_arm(cluster, args.bytes, arm == "tcp_one_socket", log_dir, args.timeout)
                   for _ in range(args.calls)]
    else:
        kind, links = arm.split("_")[1], int(arm[-1])  # mpi_<kind>_links<n>
        seconds = mpi_arm(cluster, kind, links, args.bytes, args.calls, log_dir, args.timeout, ranks_per_host)
    return [8 * args.bytes / s / 1e6 for s in seconds], dropped(cluster) - before


def markdown(results):
    rows, extremes = [], []
    for layout in results["layouts"]:
        medians = {}
        for arm in layout["arms"]:
            rates = [r for rnd in layout["rounds"] for r in rnd[arm]["mbit"]]
            drops = [rnd[arm]["dropped"] for rnd in layout["rounds"]]
            medians[arm] = statistics.median(rates)
            rows.append([layout["name"], f"`{arm}`",
                         f"{statistics.median(rates):.1f} ({min(rates):.1f}–{max(rates):.1f})", str(len(rates)),
                         str(sum(drops))])
        fastest, slowest = max(medians, key=medians.get), min(medians, key=medians.get)
        extremes.append(f"{layout['name']}, `{fastest}` {medians[fastest]:.1f} Mbit/s and `{slowest}` "
                        f"{medians[slowest]:.1f}")
    return "\n".join([
        f"# Link transport at {results['rate']} ({results['qdisc']})", "",
        # The answer first, from the same transfers as the table.
        "The fastest and the slowest way across the link, median of each: " + "; ".join(extremes) + ".", "",
        "```bash", results["command"], "```", "",
        f"Both hosts sending {results['bytes'] / 1e6:g} MB at once; Mbit/s one way on a host's link, median "
        "(min–max) over every timed transfer of every round; packets the hosts' tbf dropped during the arm, over "
        f"all rounds. Load average before: {_load(results['load_before'])}, after: {_load(results['load_after'])}.",
        "", table(["layout", "arm", "Mbit/s", "transfers", "tbf drops"], rows, "llrrr"), ""])


def _load(averages):
    return " ".join(f"{x:.2f}" for x in averages)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.link_transport", description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=2, help="timed transfers an arm and round")
    p.add_argument("--megabytes", type=float, default=32.0)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a launch may take")
    p.add_argument("--cluster-name", default="hvdlink")
    p.add_argument("--out", default=OUT)
    args = p.parse_args(argv)
    if args.rounds < 1 or args.calls < 1 or args.megabytes <= 0:
        p.error(f"--rounds and --calls must be at least 1 and --megabytes positive. Received: --rounds {args.rounds} "
                f"--calls {args.calls} --megabytes {args.megabytes}")
    args.bytes = int(args.megabytes * 1e6) // 4 * 4
    check_privileges()
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    cluster = VirtualCluster(args.cluster_name)
    results = {"timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "command": "python -m benchmarks.studies.link_transport " + " ".join(argv or sys.argv[1:]),
               "rate": args.rate, "bytes": args.bytes, "mpi_env": dict(MPI_ENV), "layouts": [],
               "load_before": os.getloadavg()}
    try:
        for (hosts, ranks_per_host), arms in LAYOUTS.items():
            cluster.down()  # a layout is its own cluster (the hostfile's slots)
            state = cluster.up(hosts, ranks_per_host, args.rate)
            results["qdisc"] = state["link"]["qdisc"]
            layout = {"name": f"{hosts}x{ranks_per_host}", "arms": list(arms), "rounds": []}
            results["layouts"].append(layout)
            for r in range(args.rounds):
                order = arms[r % len(arms):] + arms[:r % len(arms)]
                found = {}
                for arm in order:
                    mbit, drops = run_arm(cluster, arm, args, os.path.join(args.out, "logs"), ranks_per_host)
                    found[arm] = {"mbit": mbit, "dropped": drops}
                    print(f"[link_transport] {layout['name']} round {r + 1} {arm}: "
                          + ", ".join(f"{x:.1f}" for x in mbit) + f" Mbit/s, {drops} dropped", flush=True)
                layout["rounds"].append(found)
    finally:
        cluster.down()
    results["load_after"] = os.getloadavg()
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    text = markdown(results)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
