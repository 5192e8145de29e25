"""The α–β cost model of a training step: what a step costs at H hosts × n ranks over a link (α, B).

Standard library only, no TensorFlow, so that a job can price its own candidates at start-up and the
benchmarks can project to thousands of hosts (``python -m benchmarks project``) from the same formulas.
What a configuration sends is a traffic entry: its bytes as ``a + b·N`` and its calls per step for each
collective kind, per level (the strategies' ``expected_traffic`` hooks; the committed table
``docs/results/traffic/traffic.json`` holds one per benchmark configuration, ``benchmarks/costmodel/calibration.py``).

Per step and rank, at H hosts × n ranks (p = H·n), a collective over q ranks
with per-message latency α and bandwidth B costs, S being what one rank hands
to it (the byte account's payload: ``comm/communicator.py``):

* allreduce (ring)          2(q−1)·α + 2(q−1)/q · S/B
* allreduce (halving/doubling: reduce-scatter by recursive halving, allgather by recursive doubling,
  what Open MPI chose here)  2·⌈log2 q⌉·α + 2(q−1)/q · S/B
* reduce-scatter            (q−1)·α + (q−1)/q · S/B      (S: the whole input)
* alltoall                  (q−1)·α + (q−1)/q · S/B      (S: all q chunks)
* allgather                 (q−1)·α + (q−1) · S/B        (S: a rank's part)
* sparse_allgather          the allgather's formula       (S: a rank's whole sparse message)
* broadcast                 ⌈log2 q⌉·α + (q−1)/q · S/B   (scatter, then pipelined)
* hierarchical composite    intra reduce-scatter + inter allreduce on the S/n shard + intra allgather

and step time is c + comm, or max(c, comm) where the strategy overlaps.

An allreduce is charged as the faster of two algorithms, as a tuned MPI
picks one by size and rank count: a ring over all the ranks in rank order,
and halving/doubling, which pairs the nearest ranks first (the virtual
cluster's host counters show Open MPI choosing it at 4 ranks for 153 KB and
21.7 MB alike; ``python -m benchmarks validate`` rests on it). With several
ranks a host, halving/doubling is on the wire the hierarchical composite:
its within-host steps first, then the n ranks of a host each exchange their
1/n shard across hosts, sharing the host's link (B/n each). It pays
2·⌈log2 p⌉ latencies where the ring pays 2(p−1) (16 s a call at 8,192 ranks
and 1 ms), but its within-host steps do not overlap the link, so for large
payloads over fast links the ring can be faster. Every other flat collective
over hosts numbered host by host runs at the across-hosts α and B; the ring
alone is the Horovod paper's check (``paper_check.py``: NCCL's ring, as the
paper ran). An allgather's
part is a share of a whole that does not grow with q (a shard of the model,
a chunk of the quantised payload), so from the table's q_ref to q it scales
by q_ref/q; every other kind's S stays what the table says, the sparse
allgather's too (``comm/sparse_allreduce.py``: each rank's part is its
whole top-k message, whatever q).
"""
import math

# Within a host: shared memory (an assumption: ~10 GB/s, 1 µs a message).
INTRA_BANDWIDTH, INTRA_ALPHA = 10e9, 1e-6
INTER_ALPHA = 10e-6


def ring_allreduce(q, size, alpha, bandwidth):
    return 0.0 if q <= 1 else 2 * (q - 1) * alpha + 2 * (q - 1) / q * size / bandwidth


def halving_doubling(q, size, alpha, bandwidth):
    return 0.0 if q <= 1 else 2 * math.ceil(math.log2(q)) * alpha + 2 * (q - 1) / q * size / bandwidth


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


COLLECTIVES = {"allreduce": halving_doubling, "reducescatter": reduce_scatter, "alltoall": alltoall,
               "allgather": allgather, "broadcast": broadcast,
               "sparse_allgather": allgather}  # its part stays S at every q (module docstring)


def allreduce_latencies(hosts):
    """α's count in one small allreduce across ``hosts`` hosts, halving/doubling's (its within-host steps
    cost the intra α): what the α sweep divides its intercept by."""
    return 2 * math.ceil(math.log2(hosts)) if hosts > 1 else 0


def allreduce_link_share(hosts):
    """Bytes an allreduce of S puts on each host's link, over S: 2(H−1)/H, whatever the ranks a host."""
    return 2 * (hosts - 1) / hosts


def hierarchical_allreduce(hosts, ranks_per_host, size, intra, inter, inter_algorithm=ring_allreduce):
    """intra reduce-scatter, inter allreduce of the 1/n shard, intra allgather; ``intra``/``inter`` = (α, B)."""
    return (reduce_scatter(ranks_per_host, size, *intra) + allgather(ranks_per_host, size / ranks_per_host, *intra)
            + inter_algorithm(hosts, size / ranks_per_host, *inter))


def step_time(compute, comm, overlapped=0.0):
    """c + max(0, comm − w·c): communication runs during the share ``w`` of each step's compute
    (``ExpectedTraffic.overlapped``, F·δ/τ for a δ-step overlap); w = 1 gives max(c, comm)."""
    return compute + max(0.0, comm - overlapped * compute)


def burst_period(entry):
    """Steps between a configuration's bursts on the link across hosts: 1 / the calls per step of its
    most frequent collective kind there, and at least 1 (a SyncAverage step is one burst, PowerSGD's two
    calls of a step one burst, DiLoCo int8's alltoall and allgather every τ steps one burst)."""
    calls = [c["calls"] for c in entry["across_groups"].get("collectives", {}).values() if c["calls"]]
    return 1.0 / min(1.0, max(calls)) if calls else 1.0


def level_time(level, params, q, q_ref, link, shard=1.0, formulas=None):
    """Seconds per step of one level of a table entry at q ranks over ``link`` = (α, B).

    Each collective kind of the level (``collectives``: payload ``a + b·N``
    and calls per step at the table's q_ref ranks) is charged by its own
    formula (``formulas``, default ``COLLECTIVES``) on its per-call payload; ``shard`` scales the
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
        total += calls * (formulas or COLLECTIVES)[kind](q, size, *link)
    return total


def flat_allreduce(hosts, ranks_per_host, size, intra, inter):
    """One flat allreduce of ``size`` over hosts × ranks: the faster of the ring over all ranks (at the
    across-hosts link: each host's link carries one ring edge) and halving/doubling nearest ranks first
    (the hierarchical composite with the n shards sharing the link). Module docstring."""
    alpha, bandwidth = inter
    if hosts <= 1:
        return halving_doubling(ranks_per_host, size, *intra)
    if ranks_per_host == 1:
        return halving_doubling(hosts, size, alpha, bandwidth)  # never slower than the ring
    ring = ring_allreduce(hosts * ranks_per_host, size, alpha, bandwidth)
    nearest_first = hierarchical_allreduce(hosts, ranks_per_host, size, intra, (alpha, bandwidth / ranks_per_host),
                                           inter_algorithm=halving_doubling)
    return min(ring, nearest_first)


def comm_time(entry, reference, params, hosts, ranks_per_host, inter, intra=(INTRA_ALPHA, INTRA_BANDWIDTH),
              allreduce=None):
    """Seconds per step one configuration communicates (table ``entry``) at ``hosts`` × ``ranks_per_host``.

    ``allreduce``: None for the faster algorithm of each call (``flat_allreduce``), or ``ring_allreduce`` for
    a ring over all the ranks in rank order, as NCCL ran in the Horovod paper."""
    alpha, bandwidth = inter
    n_ref, hosts_ref = reference["ranks_per_host"], reference["hosts"]
    formulas = dict(COLLECTIVES, allreduce=allreduce or halving_doubling)
    if entry["ranks_per_group"] > 1:  # groups are hosts: within at intra, across on the 1/n shard
        t_in = level_time(entry["within_group"], params, ranks_per_host, n_ref, intra)
        # n such sets (one per index within the host) share a host's link: B/n each.
        t_out = level_time(entry["across_groups"], params, hosts, hosts_ref, (alpha, bandwidth / ranks_per_host),
                           shard=n_ref / ranks_per_host, formulas=formulas)
        return t_in + t_out
    p = hosts * ranks_per_host
    if allreduce is None:
        formulas["allreduce"] = lambda q, size, a, b: flat_allreduce(hosts, ranks_per_host, size, intra, (a, b))
    link = intra if hosts <= 1 else inter
    return level_time(entry["across_groups"], params, p, hosts_ref * n_ref, link, formulas=formulas)


def project(table, params, compute, hosts_list, ranks_per_host, inter, batch=64, configurations=None,
            encoding=None):
    """Rows: (configuration, hosts, samples/s over the cluster, scaling efficiency vs no communication).

    ``encoding``: {configuration: share of c} a format's own work adds to every step (PowerSGD's products:
    ``format_compute.shares``); such a configuration computes c·(1 + share), and its efficiency is still
    against the plain c."""
    rows = []
    for name, entry in table["configurations"].items():
        if configurations and name not in configurations:
            continue
        worked = compute * (1 + (encoding or {}).get(name, 0.0))
        for hosts in hosts_list:
            comm = comm_time(entry, table["reference"], params, hosts, ranks_per_host, inter)
            t = step_time(worked, comm, entry.get("overlapped", 0.0))
            p = hosts * ranks_per_host
            rows.append((name, hosts, p * batch / t, compute / t))
    return rows
