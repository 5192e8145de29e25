"""The benchmark's strategies for several hosts: their analytic bytes (per rank, and
across hosts under rings in rank order), and the host counter the measured figure
comes from."""
import types

import numpy as np
import pytest

from benchmarks.suite import configurations, host_traffic, names
from hvd_easgd.app import models
from hvd_easgd.comm import Compression, quantised_allreduce

pytestmark = pytest.mark.unit

# The digits CNN: conv 3·3·1·16+16, conv 3·3·16·32+32, dense 512·64+64, dense 64·10+10.
P = (9 * 16 + 16) + (9 * 16 * 32 + 32) + (4 * 4 * 32 * 64 + 64) + (64 * 10 + 10)
M = 4 * P


@pytest.fixture(scope="module")
def cnn():
    model = models.build("cnn", (8, 8, 1), 10)
    assert configurations.trainable_count(model) == P
    return model


@pytest.mark.parametrize("hosts, per_host, expected", [
    # (sync_two_level, hier_easgd_tau10) bytes per step and rank at n = 2, G = 2 (shards of M/2): within,
    # the reduce-scatter of 2 rows of M/2 + 4 (the non-finite flag) and the update's allgather of M/2
    # (EASGD: and every 10th step the weights' allgather of M/2); across, the shard (EASGD: and its flag,
    # every 10th step).
    (2, 2, ((2 * (M / 2 + 4) + M / 2 + M / 2, 3.0), (2 * (M / 2 + 4) + M / 2 + M / 20 + (M / 2 + 4) / 10, 2.2))),
    (1, 2, ((M, 1.0), (M, 1.0))),                        # one group: the intra level alone
    (2, 1, ((M, 1.0), ((M + 4) / 10, 0.1))),             # one rank per group: the inter level alone
])
def test_hierarchical_bytes_per_level_follow_the_layout(cnn, hosts, per_host, expected):
    for name, (bytes_, calls) in zip(("sync_two_level", "hier_easgd_tau10"), expected):
        got = configurations.expected_traffic(name, cnn, hosts, per_host)
        assert got == {"bytes_per_step": pytest.approx(bytes_), "calls_per_step": pytest.approx(calls)}, name


def test_the_local_update_strategies_send_once_per_period(cnn):
    # two ranks on one host: the strategies' hooks answer for the size asked (nothing at one rank)
    assert configurations.expected_traffic("periodic_tau10", cnn, 1, 2)["bytes_per_step"] == pytest.approx(
        (M + 4) / 10)
    assert configurations.expected_traffic("diloco_tau10", cnn, 1, 2)["bytes_per_step"] == pytest.approx(
        (M + 4) / 10)
    with_bn = models.build("resnet", (32, 32, 3), 10)  # PeriodicAverage also averages BatchNorm's statistics
    statistics = sum(int(np.prod(v.shape)) for v in with_bn.non_trainable_variables)
    assert statistics > 0
    weights = 4 * configurations.trainable_count(with_bn)
    assert configurations.expected_traffic("periodic_tau10", with_bn, 1, 2)["bytes_per_step"] == pytest.approx(
        (weights + 4 * statistics + 4) / 10)
    assert configurations.expected_traffic("diloco_tau10", with_bn, 1, 2)["bytes_per_step"] == pytest.approx(
        (weights + 4) / 10)


@pytest.mark.parametrize("hosts, per_host, crossings", [(2, 1, 2.0), (2, 2, 2.0), (4, 1, 6.0), (4, 2, 6.0)])
def test_a_flat_allreduce_crosses_hosts_as_halving_doubling_does(cnn, hosts, per_host, crossings):
    # 2(H-1)·B whatever the ranks per host: their steps within a host never cross.
    assert configurations.cross_host_bytes_per_step("sync", cnn, hosts, per_host) == pytest.approx(crossings * M)
    assert configurations.cross_host_bytes_per_step("easgd_tau10", cnn, hosts, per_host) == pytest.approx(
        crossings * (M + 4) / 10)


@pytest.mark.parametrize("hosts, per_host", [(2, 1), (2, 2), (4, 2)])
def test_an_allgather_or_alltoall_crosses_hosts_part_by_part(cnn, hosts, per_host):
    # Each rank's part reaches every rank on another host: p·(p − r) parts in all, not an allreduce's
    # 2(H − 1)·B (the hosts' counters at 4 × 2: docs/results/wire/4x2-topk).
    p, flag = hosts * per_host, 1
    sparse = Compression.topk.message_bytes(P, flag)  # one rank's top-k message: the allgather's part
    assert configurations.cross_host_bytes_per_step("diloco_tau10_topk", cnn, hosts, per_host) == pytest.approx(
        p * (p - per_host) * sparse / 10)
    # int4: at p = 2 one allgather of the whole message; from p = 3 an alltoall of p parts of S/p, then an
    # allgather of one part (the encoded sum of its range).
    part = quantised_allreduce.message_bytes(P, flag, Compression.int4, p, True)
    crossing = p * (p - per_host) * part * (1 if p == 2 else 2)
    assert configurations.cross_host_bytes_per_step("diloco_tau10_int4", cnn, hosts, per_host) == pytest.approx(
        crossing / 10)


def test_hierarchical_carries_each_shard_once_per_rank_index(cnn):
    # 2 hosts × 2: two cross-group sets {0,2} and {1,3}, each carrying its half of the payload (the
    # shard); a 2-rank ring sends it once each way: 2M in all, the flat allreduce's figure.
    assert configurations.cross_host_bytes_per_step("sync_two_level", cnn, 2, 2) == pytest.approx(2 * M)
    assert configurations.cross_host_bytes_per_step("hier_easgd_tau10", cnn, 2, 2) == pytest.approx(
        4 * (M / 2 + 4) / 10)
    # Its intra level never leaves a host, and one host sends nothing across.
    assert configurations.cross_host_bytes_per_step("sync_two_level", cnn, 1, 4) == 0.0
    assert configurations.cross_host_bytes_per_step("sync", cnn, 1, 4) == 0.0


def test_every_topology_configuration_builds_its_strategy():
    made = {name: type(configurations.make_strategy(name)).__name__ for name in names.TOPOLOGY}
    assert made == {"sync_two_level": "Hierarchical", "hier_easgd_tau10": "Hierarchical",
                    "periodic_tau10": "PeriodicAverage", "diloco_tau10": "DiLoCo"}
    assert configurations.needs_process_sets(["sync", "hier_easgd_tau10"])
    assert not configurations.needs_process_sets(["sync", "periodic_tau10", "diloco_tau10"])


PROC_NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0
cluster0: 5555555   4000    0    0    0     0          0         0 123456789   7000    0    0    0     0       0          0
"""


def test_the_host_counter_reads_the_interfaces_transmitted_bytes(tmp_path):
    path = tmp_path / "dev"
    path.write_text(PROC_NET_DEV)
    assert host_traffic.transmitted_bytes("cluster0", str(path)) == 123456789
    assert host_traffic.transmitted_bytes("lo", str(path)) == 1000
    with pytest.raises(host_traffic.InterfaceMissing, match=r"--interface eth9: .*it has lo, cluster0"):
        host_traffic.transmitted_bytes("eth9", str(path))
    assert host_traffic.transmitted_bytes("lo") >= 0  # this process's own namespace


class _Ranks:
    def __init__(self, size):
        self.size = size


@pytest.mark.parametrize("name", ["sync", "easgd_tau10", "accum4_sync", "periodic_tau10", "diloco_tau10",
                                  "sync_two_level", "hier_easgd_tau10", "no_comm"])
def test_one_rank_expects_nothing_sent_but_raw_horovod_still_calls(cnn, name):
    # hvd_easgd's communicators return a one-rank collective's inputs without a call (0 bytes, 0 calls),
    # so the analytic column at np = 1 is zero; at two ranks on one host it is the per-rank formula.
    assert configurations.expected_for_launch(name, cnn, _Ranks(1), 1, 1) == {"bytes_per_step": 0.0,
                                                                              "calls_per_step": 0.0}
    assert configurations.expected_for_launch(name, cnn, _Ranks(2), 1, 2) == configurations.expected_traffic(
        name, cnn, 1, 2)
    assert configurations.expected_for_launch("raw_horovod", cnn, _Ranks(1), 1, 1) == {
        "bytes_per_step": float(M), "calls_per_step": 1.0}
    if name == "sync":
        assert configurations.expected_traffic(name, cnn, 1, 2) == {"bytes_per_step": float(M),
                                                                    "calls_per_step": 1.0}


def test_model_fit_rows_expect_what_their_custom_loop_twins_send(cnn):
    from benchmarks.suite import fit_variants

    def fit(name, size):
        return types.SimpleNamespace(name=name, model=cnn, comm=_Ranks(size))

    every_step = {"bytes_per_step": float(M), "calls_per_step": 1.0}
    assert fit_variants.expected_traffic(fit("sync_fit", 2)) == every_step
    assert fit_variants.expected_traffic(fit("raw_horovod_fit", 2)) == every_step
    assert fit_variants.expected_traffic(fit("sync_fit", 1)) == {"bytes_per_step": 0.0, "calls_per_step": 0.0}
    assert fit_variants.expected_traffic(fit("raw_horovod_fit", 1)) == every_step
