"""The rated-link benchmark end to end, at its smallest: ``python -m benchmarks.suite.compare
--quick --link-rates 100mbit`` builds its own two-host cluster, measures the link,
times the six configurations on the digits CNN across it, and removes the cluster;
with ``--topology``, the strategies for several hosts on 2 hosts × 2 ranks.

The schema is checked, the measured rate against the tc rate, the bytes each
configuration moved against their formula (in the account, and on the hosts'
interfaces), and c and T against the rows they come from.

Both runs pass ``--no-alpha-sweep``: the small-message sweep for α (link_probe.alpha_sweep, a
trace and three chains of allreduces for each of 8 sizes, across hosts and again within each host
in the level probes) is a third of a 2 × 2 launch's time, and nothing here reads it. Its code runs
across hosts in test_auto.py (``--strategy auto`` measures α), and on one host in the unit tier."""
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, bounded, run

pytestmark = pytest.mark.multinode

CONFIGS = {"no_comm", "raw_horovod", "sync", "easgd_tau4", "easgd_tau10", "accum4_sync"}
BATCH = 32
# The digits CNN (8×8×1, 10 classes): conv 3·3·1·16+16, conv 3·3·16·32+32, dense 512·64+64, dense 64·10+10.
GRADIENT_BYTES = 4 * ((9 * 16 + 16) + (9 * 16 * 32 + 32) + (4 * 4 * 32 * 64 + 64) + (64 * 10 + 10))
BYTES_PER_STEP = {"no_comm": 0, "raw_horovod": GRADIENT_BYTES, "sync": GRADIENT_BYTES,
                  "easgd_tau4": (GRADIENT_BYTES + 4) / 4, "easgd_tau10": (GRADIENT_BYTES + 4) / 10,
                  "accum4_sync": (GRADIENT_BYTES + 4) / 4}
NOMINAL = 100e6


# Besides the payload, each step puts a fixed number of small packets on the wire (TCP ACKs, MPI's
# headers): CI measured about 2.4 KB per rank and step on the slow day that τ=10's small payloads
# showed (the hierarchical EASGD's (M/2 + 4)/10 crossed at 1.32× its formula). Allowed: 4 KB, and 6 %
# on top of the payload for the ACKs of large messages. A group that leaked across hosts would add its
# intra level, 3·M/2 per rank and step (≥ 230 KB here), far outside this.
FIXED_BYTES_PER_RANK_STEP = 4096


def cross_host_ratios(rows):
    """Bytes the hosts' interfaces sent ÷ the analytic bytes that cross between hosts, per configuration."""
    return {c: r["cross_host_bytes_per_sample"] / r["expected_cross_host_bytes_per_sample"]
            for c, r in rows.items() if r["expected_cross_host_bytes_per_sample"]}


def assert_crossed_as_the_formula_says(rows):
    """Every configuration with cross-host traffic sent at least its formula's bytes (3 % short for the
    counters' sampling) and at most that, 6 %, and the fixed per-step packets more. Per sample of all
    ranks, a rank's step is BATCH samples."""
    ratios = cross_host_ratios(rows)
    assert all(ratio > 0.97 for ratio in ratios.values()), ratios
    excess = {c: (r["cross_host_bytes_per_sample"] - 1.06 * r["expected_cross_host_bytes_per_sample"]) * BATCH
              for c, r in rows.items() if c in ratios}
    assert all(e < FIXED_BYTES_PER_RANK_STEP for e in excess.values()), (ratios, excess)
    return ratios


@pytest.mark.timeout(300)
def test_quick_rated_link_run(tmp_path):
    name = f"hvdq{os.getpid()}"[:12]
    cmd = [sys.executable, "-m", "benchmarks.suite.compare", "--quick", "--link-rates", "100mbit", "--cluster-name", name,
           "--repeats", "1", "--no-alpha-sweep", "--out", str(tmp_path), "--launch-timeout", str(bounded(240))]
    out = run(cmd, timeout=280, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert name not in netns  # the benchmark's cluster is gone
    with open(tmp_path / "results.json") as f:
        results = json.load(f)
    assert results["topology"]["hosts"] == 2 and results["topology"]["np"] == 2
    assert results["horovod_settings"]["environment"]["OMPI_MCA_btl_tcp_if_include"] == "cluster0"
    [link] = results["links"]
    assert link["nominal_bits_per_second"] == NOMINAL
    # tbf lets through no more than its rate (plus one bucket); TCP and framing cost some of it.
    assert 0.5 * NOMINAL < link["measured_bits_per_second"] < 1.1 * NOMINAL, link
    assert link["levels"] is None  # one rank a host: one level, nothing more to probe
    assert link["alpha_sweep"] is None  # --no-alpha-sweep
    rows = {r["config"]: r for r in results["rows"]}
    assert set(rows) == CONFIGS
    for config, row in rows.items():
        assert row["link"] == {"nominal": "100mbit", "measured_mbit": link["measured_mbit"]}
        assert row["bytes_per_sample"] == pytest.approx(BYTES_PER_STEP[config] / BATCH), config
    # On the wire: the payload (2 hosts: once each way) plus TCP/IP and MPI headers, ACKs and Horovod's
    # negotiation, a few per cent; without a collective, next to nothing crosses.
    ratios = assert_crossed_as_the_formula_says(rows)
    assert set(ratios) == CONFIGS - {"no_comm"}
    assert rows["no_comm"]["cross_host_bytes_per_sample"] < 0.01 * rows["sync"]["cross_host_bytes_per_sample"]
    [analysis] = results["analysis"]
    step = {c: BATCH * 2 / rows[c]["samples_per_sec"]["median"] for c in ("no_comm", "sync")}
    assert analysis["compute_seconds_per_step"] == pytest.approx(step["no_comm"])
    assert analysis["sync_comm_seconds_per_step"] == pytest.approx(max(step["sync"] - step["no_comm"], 0))
    c, t = step["no_comm"], analysis["sync_comm_seconds_per_step"]
    assert analysis["easgd"]["10"]["analytic"] == pytest.approx((c + t) / (c + t / 10))
    # Across 100 Mbit/s the CNN's 153 KB per SyncAverage step cost more than its compute (measured ~3×).
    assert rows["easgd_tau10"]["samples_per_sec"]["median"] > rows["sync"]["samples_per_sec"]["median"]
    assert (tmp_path / "throughput_vs_link_rate.png").stat().st_size > 0
    assert "| sync |" in (tmp_path / "results.md").read_text()


TOPOLOGY = {"no_comm", "sync", "easgd_tau10", "sync_two_level", "hier_easgd_tau10", "periodic_tau10", "diloco_tau10"}


@pytest.mark.timeout(360)
def test_quick_topology_run_keeps_each_group_inside_its_host(tmp_path):
    """2 hosts × 2 ranks: Hierarchical's groups are the hosts, so its intra level never crosses and its
    inter level crosses as the formula says (one allreduce of a shard per index within the host); the flat
    strategies cross as Open MPI's halving-doubling allreduce does, 2(H-1) times their payload."""
    name = f"hvdo{os.getpid()}"[:12]
    cmd = [sys.executable, "-m", "benchmarks.suite.compare", "--quick", "--topology", "--link-rates", "100mbit",
           "--cluster-name", name, "--repeats", "1", "--no-alpha-sweep", "--out", str(tmp_path),
           "--launch-timeout", str(bounded(300))]
    out = run(cmd, timeout=340, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert name not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    with open(tmp_path / "results.json") as f:
        results = json.load(f)
    assert results["topology"]["np"] == 4 and results["topology"]["ranks_per_host"] == 2
    rows = {r["config"]: r for r in results["rows"]}
    assert set(rows) == TOPOLOGY
    # The two-level configurations' own levels were probed (link_probe.levels): across hosts, the 2 sets of
    # rank j crossed at about the tc rate, 2 streams sharing each link; within a host nothing crosses it.
    levels = results["links"][0]["levels"]
    assert levels["ranks_per_host"] == 2 and levels["across_hosts"]["streams"] == 2, levels
    assert 0.5 * NOMINAL < levels["across_hosts"]["bits_per_second"] < 1.1 * NOMINAL, levels
    assert levels["within_host"]["bits_per_second"] > 2 * NOMINAL and levels["within_host"]["hosts"] == 2, levels
    assert results["links"][0]["alpha_sweep"] is None and levels["within_host"]["alpha_sweep"] is None  # --no-alpha-sweep
    # The account, per rank, on shards of M/2 (2 ranks per group): within its host the reduce-scatter of 2
    # rows of M/2 + 4 (the non-finite flag) and the update's allgather of M/2, and, for EASGD τ=10, the
    # weights' allgather of M/2 every 10th step; across, the shard (EASGD: with its flag, every 10th step).
    shard = GRADIENT_BYTES / 2
    per_rank = {"sync_two_level": 2 * (shard + 4) + shard + shard,
                "hier_easgd_tau10": 2 * (shard + 4) + shard + shard / 10 + (shard + 4) / 10,
                "periodic_tau10": (GRADIENT_BYTES + 4) / 10, "diloco_tau10": (GRADIENT_BYTES + 4) / 10}
    for config, bytes_per_step in per_rank.items():
        assert rows[config]["bytes_per_sample"] == pytest.approx(bytes_per_step / BATCH), config
    ratios = assert_crossed_as_the_formula_says(rows)
    assert set(ratios) == TOPOLOGY - {"no_comm"}
    # Per sample of all 4 ranks: the two-level allreduce carries each half of the gradients across in its
    # own index set, once each way: what the flat one carries.
    assert rows["sync_two_level"]["expected_cross_host_bytes_per_sample"] == pytest.approx(
        rows["sync"]["expected_cross_host_bytes_per_sample"])
