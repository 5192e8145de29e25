"""hvd_easgd/choosing/cost_model.py (the formulas) and benchmarks/costmodel/calibration.py (the table, the links): each formula against hand-derived values, the CLI, and no TensorFlow."""
import math
import subprocess
import sys
import time

import pytest

from benchmarks.costmodel import calibration
from hvd_easgd.choosing import cost_model

pytestmark = pytest.mark.unit

A, B, S = 1e-5, 1e9, 4e6  # α 10 µs, B 1 GB/s, S 4 MB


def test_ring_allreduce_at_8_ranks():
    # 2·7·1e-5 + 2·7/8·4e6/1e9 = 1.4e-4 + 7e-3
    assert cost_model.ring_allreduce(8, S, A, B) == pytest.approx(1.4e-4 + 7e-3)


def test_halving_doubling_pays_log2_latencies():
    # 2·3·1e-5 + 7e-3
    assert cost_model.halving_doubling(8, S, A, B) == pytest.approx(6e-5 + 7e-3)


def test_reduce_scatter_and_allgather_are_half_an_allreduce_of_bandwidth():
    # 3·1e-5 + 3/4·4e6/1e9; the allgather takes a rank's part, S/4: 3·1e-5 + 3·1e6/1e9
    assert cost_model.reduce_scatter(4, S, A, B) == pytest.approx(3e-5 + 3e-3)
    assert cost_model.allgather(4, S / 4, A, B) == pytest.approx(3e-5 + 3e-3)


def test_alltoall_and_broadcast():
    # alltoall of S (all 8 chunks): 7·1e-5 + 7/8·4e6/1e9; broadcast: ⌈log2 8⌉·1e-5 + the same bandwidth term
    assert cost_model.alltoall(8, S, A, B) == pytest.approx(7e-5 + 3.5e-3)
    assert cost_model.broadcast(8, S, A, B) == pytest.approx(3e-5 + 3.5e-3)
    assert cost_model.broadcast(5, S, A, B) == pytest.approx(3e-5 + 0.8 * 4e-3)


def test_quantised_allreduce_is_charged_as_alltoall_plus_allgather():
    # sync_int8 at 8 hosts × 8 ranks (p = 64), N = 1e6: the table (at 4 × 2, q_ref = 8) holds per step one
    # alltoall of 32 + 1.015625·N bytes (int8 + an fp32 scale per 256-block, all 8 chunks, flag included)
    # and one allgather of a rank's part, 4 + 0.126953125·N = 126,957 B at q_ref = 8, so 126,957·8/64 at 64.
    table = calibration.load_table()
    entry = table["configurations"]["sync_int8"]
    assert entry["across_groups"]["collectives"] == {
        "alltoall": {"bytes_a": 32.0, "bytes_b": 1.015625, "calls": 1.0},
        "allgather": {"bytes_a": 4.0, "bytes_b": 0.126953125, "calls": 1.0}}
    alltoall = 63 * A + 63 / 64 * 1_015_657 / B
    allgather = 63 * A + 63 * (126_957 * 8 / 64) / B
    got = cost_model.comm_time(entry, table["reference"], 1_000_000, 8, 8, (A, B))
    assert got == pytest.approx(alltoall + allgather)
    assert got == pytest.approx(1.26e-3 + 9.997874e-4 + 9.997864e-4, rel=1e-6)
    # not an allreduce's 2(p−1) latencies per call: 2 calls × 63 α, not 2 × 126 α
    assert got < 2 * cost_model.ring_allreduce(64, 1_015_657, A, B)


def test_hierarchical_levels_from_the_table():
    # sync_two_level at 4 hosts × 4 ranks, N = 1e6. Table (n_ref = 2): within, a reduce-scatter of
    # 8 + 4N B and an allgather of the 2N B shard (a rank's part at 2 ranks: N/4·4 B = N B at 4 ranks);
    # across, an allreduce of the shard, 2N B at n_ref = 2, so N B at n = 4, each of 4 sets at B/4.
    table = calibration.load_table()
    entry = table["configurations"]["sync_two_level"]
    intra = (1e-6, 1e10)
    n_mb = 1_000_000
    within = (3 * 1e-6 + 3 / 4 * (8 + 4 * n_mb) / 1e10) + (3 * 1e-6 + 3 * (2 * n_mb * 2 / 4) / 1e10)
    across = 2 * 2 * A + 2 * 3 / 4 * (4 * n_mb / 4) / (B / 4)  # halving/doubling over 4 hosts: 2·log2 4 α
    got = cost_model.comm_time(entry, table["reference"], n_mb, 4, 4, (A, B), intra)
    assert got == pytest.approx(within + across)


def test_one_rank_costs_nothing():
    assert cost_model.ring_allreduce(1, S, A, B) == 0.0


def test_hierarchical_composite():
    # 4 hosts × 2 ranks: 2·RS(2) intra + ring(4) on S/2 inter
    intra, inter = (1e-6, 1e10), (A, B)
    rs = 1e-6 + 0.5 * S / 1e10
    ring = 2 * 3 * A + 1.5 * (S / 2) / B
    assert cost_model.hierarchical_allreduce(4, 2, S, intra, inter) == pytest.approx(2 * rs + ring)


def test_overlap_hides_communication_up_to_compute():
    assert cost_model.step_time(0.010, 0.004) == pytest.approx(0.014)
    assert cost_model.step_time(0.010, 0.004, overlapped=1.0) == pytest.approx(0.010)
    assert cost_model.step_time(0.010, 0.030, overlapped=1.0) == pytest.approx(0.030)
    # communication during half of each step's compute: c + max(0, comm − 0.5·c)
    assert cost_model.step_time(0.010, 0.030, overlapped=0.5) == pytest.approx(0.010 + 0.025)
    assert cost_model.step_time(0.010, 0.004, overlapped=0.5) == pytest.approx(0.010)


def test_flat_sync_is_the_faster_of_nearest_first_halving_doubling_and_the_ring():
    # 8 hosts × 8 ranks, N = 1e6, S = 4N: within the host a reduce-scatter and an allgather (intra), then
    # the 8 ranks of a host each allreduce their S/8 shard over the 8 hosts at B/8, by halving/doubling.
    table = calibration.load_table()
    entry = table["configurations"]["sync"]
    params, hosts, n = 1_000_000, 8, 8
    size = 4 * params
    assert entry["across_groups"]["bytes_b"] == 4.0 and entry["across_groups"]["bytes_a"] == 0.0
    intra = (cost_model.INTRA_ALPHA, cost_model.INTRA_BANDWIDTH)
    within = 2 * (7 * intra[0] + 7 / 8 * size / intra[1])  # reduce-scatter of S + allgather of S/8 parts
    across = 2 * 3 * A + 2 * 7 / 8 * (size / 8) / (B / 8)
    got = cost_model.comm_time(entry, table["reference"], params, hosts, n, (A, B))
    assert got == pytest.approx(within + across)
    assert got < cost_model.ring_allreduce(64, size, A, B)  # 2·63 α and the same link bytes
    # 400 MB over a 100 GB/s link: the within-host steps at 10 GB/s cost more than the ring's latencies.
    fast = (A, 1e11)
    ring = cost_model.ring_allreduce(64, 4e8, *fast)
    assert cost_model.comm_time(entry, table["reference"], 100_000_000, hosts, n, fast) == pytest.approx(ring)
    # One rank a host: halving/doubling over the 8, at the host's whole link.
    assert cost_model.comm_time(entry, table["reference"], params, hosts, 1, (A, B)) == pytest.approx(
        2 * 3 * A + 2 * 7 / 8 * size / B)
    # The paper check's ring: 2(p − 1) latencies over all 64 ranks at the host's link.
    assert cost_model.comm_time(entry, table["reference"], params, hosts, n, (A, B),
                                allreduce=cost_model.ring_allreduce) == pytest.approx(
        cost_model.ring_allreduce(64, size, A, B))


def test_an_allreduce_on_the_links_is_two_hosts_shares_and_log2_latencies():
    assert [cost_model.allreduce_latencies(h) for h in (1, 2, 4, 5, 8)] == [0, 2, 4, 6, 6]
    assert cost_model.allreduce_link_share(2) == 1.0 and cost_model.allreduce_link_share(4) == 1.5


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "benchmarks", "project", *args], capture_output=True, text=True,
                          timeout=30)


def test_cli_one_row_per_host_count_and_fast():
    start = time.perf_counter()
    result = _cli("--hosts", "8,64,512,1024", "--link", "100gbit", "--model", "resnet50", "--configuration", "sync")
    assert time.perf_counter() - start < 1.0
    assert result.returncode == 0, result.stderr
    rows = result.stdout.splitlines()[1:]
    assert [r.split()[2] for r in rows] == ["8", "64", "512", "1024"]
    last = rows[-1].split()
    assert last[3] == "8192"
    from benchmarks.costmodel import workloads
    resnet50 = workloads.models()["resnet50"]
    params, compute = resnet50.params, resnet50.compute
    table = calibration.load_table()
    comm = cost_model.comm_time(table["configurations"]["sync"], table["reference"], params, 1024, 8,
                                (cost_model.INTER_ALPHA, 100e9 / 8))
    assert float(last[5]) == pytest.approx(compute / (compute + comm), abs=1e-3)


@pytest.mark.parametrize("args", [("--hosts", "0"), ("--link", "fast"), ("--model", "nope"), ("--params", "x"),
                                  ("--params", "100",), ("--paper", "nope"), ("--check",)])
def test_cli_bad_input_is_one_line_and_exit_2(args):
    result = _cli(*args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "Received:" in result.stderr


def test_imports_no_tensorflow():
    code = ("import sys, hvd_easgd.choosing.cost_model, benchmarks.costmodel.projection; "
            "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules and 'matplotlib' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    assert math.isfinite(calibration.LINKS["100gbit"])


def test_overlapped_configuration_hides_its_communication_behind_compute():
    # The table's hooks answer for the default transports, which reduce started allreduces in the background:
    # easgd_tau10_overlap (δ = 1, τ = 10) runs its sync behind δ/τ = 0.1 of the steps' compute. Per τ steps
    # τ·c + max(0, T − δ·c), i.e. per step c + max(0, comm − 0.1·c) with comm = T/τ.
    import copy
    table = calibration.load_table()
    assert table["configurations"]["easgd_tau10_overlap"]["overlapped"] == pytest.approx(0.1)
    assert table["configurations"]["easgd_tau10"]["overlapped"] == 0.0
    assert table["configurations"]["diloco_tau10_int8"]["overlapped"] == 0.0
    assert cost_model.step_time(0.010, 0.0005, 0.1) == pytest.approx(0.010)   # 0.5 ms < 1 ms window: hidden
    assert cost_model.step_time(0.010, 0.0030, 0.1) == pytest.approx(0.012)   # 3 ms − 1 ms shows
    assert cost_model.step_time(0.010, 0.0030, 0.0) == pytest.approx(0.013)
    assert cost_model.step_time(0.010, 0.0300, 1.0) == pytest.approx(0.030)   # w = 1: max(c, comm)
    table = copy.deepcopy(table)
    table["configurations"]["hidden"] = dict(table["configurations"]["easgd_tau10"], overlapped=1.0)
    rows = {r[0]: r for r in cost_model.project(table, 1_000_000, 0.05, [8], 8, (A, B),
                                                configurations=["easgd_tau10", "easgd_tau10_overlap", "hidden"])}
    comm = cost_model.comm_time(table["configurations"]["easgd_tau10"], table["reference"], 1_000_000, 8, 8, (A, B))
    assert rows["hidden"][3] == pytest.approx(0.05 / max(0.05, comm))
    assert rows["easgd_tau10"][3] == pytest.approx(0.05 / (0.05 + comm))
    assert rows["easgd_tau10_overlap"][3] == pytest.approx(0.05 / (0.05 + max(0.0, comm - 0.005)))
    assert rows["easgd_tau10"][3] < rows["easgd_tau10_overlap"][3] <= rows["hidden"][3]


def test_alpha_fit_recovers_alpha_and_bandwidth():
    from hvd_easgd.choosing import link_probe  # imports no TF until a sweep runs
    hosts, alpha, bandwidth = 4, 2e-5, 5e8
    times = [2 * 2 * alpha + 2 * 3 / 4 * s / bandwidth for s in link_probe.SWEEP_BYTES]  # halving/doubling
    fit = link_probe.fit_alpha(link_probe.SWEEP_BYTES, times, hosts)
    assert fit["alpha"] == pytest.approx(alpha, rel=1e-6)
    assert fit["bandwidth"] == pytest.approx(bandwidth, rel=1e-6)


def test_alpha_is_fitted_from_the_sizes_whose_chain_fits_the_bucket():
    from hvd_easgd.choosing import link_probe

    # 2 hosts at 10 Mbit/s, a 64 KiB bucket: a chain of 8 × S fits while S ≤ 8 KiB. Above, the chain waits on
    # the tbf's rate (1.25e6 B/s), and a line through every size tips the intercept below zero (α = 0).
    alpha, line, rate, bucket = 50e-6, 1.25e8, 1.25e6, 65_536
    sizes = link_probe.SWEEP_BYTES
    times = [2 * alpha + s / line if 8 * s <= bucket else 2 * alpha + s / rate - bucket / 8 / rate for s in sizes]
    kept, kept_times = link_probe.within_bucket(sizes, times, 8, 2, bucket)
    assert kept == [8, 32, 128, 512, 2048, 8192] and kept_times == times[:len(kept)]
    assert link_probe.fit_alpha(sizes, times, 2)["alpha"] == 0.0  # the worker's fit before the bucket was known
    fit = link_probe.fit_alpha(kept, kept_times, 2)
    assert fit["alpha"] == pytest.approx(alpha, rel=1e-6) and fit["bandwidth"] == pytest.approx(line, rel=1e-6)
    assert link_probe.within_bucket(sizes, times, 8, 4, bucket)[0] == [8, 32, 128, 512, 2048]  # 1.5 S at 4 hosts
    assert link_probe.within_bucket(sizes, times, 8, 2, None) == (list(sizes), times)
    assert link_probe.tbf_of("tbf rate 10000000 burst 65536 latency 50ms") == (1.25e6, 65_536)


def test_the_sweep_runs_one_trace_a_size_without_tensorflows_retracing_warning(caplog):
    from hvd_easgd.choosing import link_probe
    from hvd_easgd.comm.local_comm import LocalCommunicator

    # One rank: its allreduces return their inputs, so this times the calls alone; 8 sizes, 8 traces.
    sweep = link_probe.alpha_sweep(LocalCommunicator(), 1e6, sizes=(8, 32, 128, 512, 2048, 8192), timed=1, hosts=2,
                                   bucket=8 * 512)
    assert sweep["fitted_bytes"] == [8, 32, 128, 512] and sweep["bucket"] == 4096
    assert len(sweep["seconds"]) == 6 and all(t > 0 for t in sweep["seconds"]) and sweep["bandwidth"] == 1e6
    assert sweep["alpha"] >= 0 and not [r for r in caplog.records if "retracing" in r.getMessage()]


def test_calibration_file_sets_alpha_and_bandwidth(tmp_path):
    path = tmp_path / "calibration.json"
    path.write_text('{"alpha": 0.001, "bandwidth": 1.25e8}')
    args = ("--model", "resnet50", "--configuration", "sync", "--hosts", "8")
    calibrated = _cli(*args, "--calibration", str(path))
    explicit = _cli(*args, "--alpha", "0.001", "--bandwidth", "1.25e8")
    assert calibrated.returncode == 0 and calibrated.stdout == explicit.stdout
    assert _cli(*args, "--calibration", str(tmp_path / "missing.json")).returncode == 2


def test_project_charges_an_encoding_share_on_the_compute_only():
    # One configuration of one allreduce of 4N bytes a step at 2 hosts × 1 rank, α 0, B = 1e6 B/s, c = 0.1 s:
    # comm = 2·(1/2)·4000/1e6 = 4 ms; with a share of 0.5, the step is 0.15 + 0.004 and efficiency c / step.
    table = {"reference": {"hosts": 2, "ranks_per_host": 1},
             "configurations": {"x": {"ranks_per_group": 1, "overlapped": 0.0, "across_groups": {"collectives": {
                 "allreduce": {"bytes_a": 0, "bytes_b": 4, "calls": 1}}}}}}
    (_, _, rate, eff), = cost_model.project(table, 1000, 0.1, [2], 1, (0.0, 1e6), batch=10, encoding={"x": 0.5})
    assert eff == pytest.approx(0.1 / 0.154) and rate == pytest.approx(2 * 10 / 0.154)
    (_, _, _, plain), = cost_model.project(table, 1000, 0.1, [2], 1, (0.0, 1e6), batch=10)
    assert plain == pytest.approx(0.1 / 0.104)
