"""The α–β cost model of a training step at scale (``python -m benchmarks project``: projection.py).

Imports no TensorFlow: what each configuration sends comes from the committed
table ``docs/results/traffic/traffic.json`` (written from the strategies' own
``expected_traffic`` hooks by ``python -m benchmarks traffic``), split by the
collective that carries it.

Per step and rank, at H hosts × n ranks (p = H·n), a collective over q ranks
with per-message latency α and bandwidth B costs, S being what one rank hands
to it (the byte account's payload: ``comm/communicator.py``):

* allreduce (ring)          2(q−1)·α + 2(q−1)/q · S/B
* allreduce (halving/doubling, what Open MPI chose here)  2·log2(q)·α + 2(q−1)/q · S/B
* reduce-scatter            (q−1)·α + (q−1)/q · S/B      (S: the whole input)
* alltoall                  (q−1)·α + (q−1)/q · S/B      (S: all q chunks)
* allgather                 (q−1)·α + (q−1) · S/B        (S: a rank's part)
* broadcast                 ⌈log2 q⌉·α + (q−1)/q · S/B   (scatter, then pipelined)
* hierarchical composite    intra reduce-scatter + inter allreduce on the S/n shard + intra allgather

and step time is c + comm, or max(c, comm) where the strategy overlaps.
A flat collective over hosts numbered host by host crosses each host's link
once per ring edge, so it runs at the across-hosts α and B. An allgather's
part is a share of a whole that does not grow with q (a shard of the model,
a chunk of the quantised payload), so from the table's q_ref to q it scales
by q_ref/q; every other kind's S stays what the table says.
"""
import json
import math
import pathlib

TABLE_PATH = pathlib.Path(__file__).resolve().parents[1] / "docs" / "results" / "traffic" / "traffic.json"
LINKS = {"100mbit": 100e6 / 8, "1gbit": 1e9 / 8, "10gbit": 10e9 / 8, "25gbit": 25e9 / 8, "100gbit": 100e9 / 8,
         "400gbit": 400e9 / 8}
# Within a host: shared memory (an assumption: ~10 GB/s, 1 µs a message).
INTRA_BANDWIDTH, INTRA_ALPHA = 10e9, 1e-6
INTER_ALPHA = 10e-6


def ring_allreduce(q, size, alpha, bandwidth):
    return 0.0 if q <= 1 else 2 * (q - 1) * alpha + 2 * (q - 1) / q * size / bandwidth


def halving_doubling(q, size, alpha, bandwidth):
    return 0.0 if q <= 1 else 2 * math.log2(q) * alpha + 2 * (q - 1) / q * size / bandwidth


def reduce_scatter(q, size, alpha, bandwidth):
    """``size``: the whole input; each rank keeps 1/q of the sum."""
    return 0.0 if q <= 1 else (q - 1) * alpha + (q - 1) / q * size / bandwidth


def alltoall(q, size, alpha, bandwidth):
    """``size``: all q chunks a rank hands over; it keeps one and sends q−1."""
    return 0.0 if q <= 1 else (q - 1) * alpha + (q - 1) / q * size / bandwidth


def allgather(q, part, alpha, bandwidth):
    """``part``: one rank's part; each rank sends it to the q−1 others (receives as much)."""
    return 0.0 if q <= 1 else (q - 1) * alpha + (q - 1) * part / bandwidth


def broadcast(q, size, alpha, bandwidth):
    """A scatter then a pipelined gather of ``size`` from one root: what the account's (q−1)/q assumes."""
    return 0.0 if q <= 1 else math.ceil(math.log2(q)) * alpha + (q - 1) / q * size / bandwidth


COLLECTIVES = {"allreduce": ring_allreduce, "reducescatter": reduce_scatter, "alltoall": alltoall,
               "allgather": allgather, "broadcast": broadcast}


def hierarchical_allreduce(hosts, ranks_per_host, size, intra, inter, inter_algorithm=ring_allreduce):
    """intra reduce-scatter, inter allreduce of the 1/n shard, intra allgather; ``intra``/``inter`` = (α, B)."""
    return (reduce_scatter(ranks_per_host, size, *intra) + allgather(ranks_per_host, size / ranks_per_host, *intra)
            + inter_algorithm(hosts, size / ranks_per_host, *inter))


def step_time(compute, comm, overlapped=0.0):
    """c + max(0, comm − w·c): communication runs during the share ``w`` of each step's compute
    (``ExpectedTraffic.overlapped``, F·δ/τ for a δ-step overlap); w = 1 gives max(c, comm)."""
    return compute + max(0.0, comm - overlapped * compute)


def load_table(path=TABLE_PATH):
    return json.loads(pathlib.Path(path).read_text())


def level_time(level, params, q, q_ref, link, shard=1.0):
    """Seconds per step of one level of a table entry at q ranks over ``link`` = (α, B).

    Each collective kind of the level (``collectives``: payload ``a + b·N``
    and calls per step at the table's q_ref ranks) is charged by its own
    formula (``COLLECTIVES``) on its per-call payload; ``shard`` scales the
    ``b·N`` part (Hierarchical's across level sends a 1/n shard), and an
    allgather's part scales by q_ref/q (module docstring).
    """
    total = 0.0
    for kind, entry in sorted(level.get("collectives", {}).items()):
        calls = entry["calls"]
        if not calls:
            continue
        size = (entry["bytes_a"] + entry["bytes_b"] * params * shard) / calls
        if kind == "allgather":
            size *= q_ref / q
        total += calls * COLLECTIVES[kind](q, size, *link)
    return total


def comm_time(entry, reference, params, hosts, ranks_per_host, inter, intra=(INTRA_ALPHA, INTRA_BANDWIDTH)):
    """Seconds per step one configuration communicates (table ``entry``) at ``hosts`` × ``ranks_per_host``."""
    alpha, bandwidth = inter
    n_ref, hosts_ref = reference["ranks_per_host"], reference["hosts"]
    if entry["ranks_per_group"] > 1:  # groups are hosts: within at intra, across on the 1/n shard
        t_in = level_time(entry["within_group"], params, ranks_per_host, n_ref, intra)
        # n such sets (one per index within the host) share a host's link: B/n each.
        t_out = level_time(entry["across_groups"], params, hosts, hosts_ref, (alpha, bandwidth / ranks_per_host),
                           shard=n_ref / ranks_per_host)
        return t_in + t_out
    p = hosts * ranks_per_host
    link = intra if hosts <= 1 else inter
    return level_time(entry["across_groups"], params, p, hosts_ref * n_ref, link)


def project(table, params, compute, hosts_list, ranks_per_host, inter, batch=64, configurations=None):
    """Rows: (configuration, hosts, samples/s over the cluster, scaling efficiency vs no communication)."""
    rows = []
    for name, entry in table["configurations"].items():
        if configurations and name not in configurations:
            continue
        for hosts in hosts_list:
            comm = comm_time(entry, table["reference"], params, hosts, ranks_per_host, inter)
            t = step_time(compute, comm, entry.get("overlapped", 0.0))
            p = hosts * ranks_per_host
            rows.append((name, hosts, p * batch / t, compute / t))
    return rows
