"""benchmarks/costmodel/cluster_check.py and the token-bucket link of calibration.py: hand-derived rows, the committed page."""
import subprocess
import sys

import pytest

from benchmarks.costmodel import calibration, cluster_check
from hvd_easgd.choosing import cost_model, link_probe

pytestmark = pytest.mark.unit


def test_token_bucket_link_by_hand():
    # tbf at 1e7 B/s with a 125 KB bucket; the probe measured 8e6 B/s; the line runs at 1e9 B/s.
    link = calibration.TokenBucketLink(1e7, 125_000, 8e6, 1e9)
    assert link.bandwidth(1e6) == 1e7 and link.bandwidth(1e6 + 1) == 8e6  # a long burst: the probe's rate
    # A burst of 1e5 B after 2 ms idle finds 2e4 B of tokens, which leave at 1e9 B/s instead of 1e7.
    assert link.credit(1e5, 1, 0.002) == pytest.approx(2e4 * (1e-7 - 1e-9))
    # A long idle fills the bucket past the burst: the whole burst goes at the line's rate.
    assert 1e5 / 1e7 - link.credit(1e5, 1, 1.0) == pytest.approx(1e5 / 1e9)
    # A burst of 2e6 B every 10 steps: the bucket's 125 KB, spread over 10 steps, instead of the probe's rate.
    assert link.credit(2e6, 10, 1.0) == pytest.approx(125_000 * (1 / 8e6 - 1e-9) / 10)
    assert calibration.TokenBucketLink(1e7, 0, 8e6).credit(1e5, 1, 1.0) == 0  # no bucket, no credit


def test_burst_period_of_each_kind_of_configuration():
    table = calibration.load_table()["configurations"]
    periods = {name: cost_model.burst_period(table[name]) for name in
               ("sync", "sync_powersgd4", "accum4_sync", "easgd_tau10", "diloco_tau10_int8", "no_comm")}
    assert periods == pytest.approx({"sync": 1, "sync_powersgd4": 1, "accum4_sync": 4, "easgd_tau10": 10,
                                     "diloco_tau10_int8": 10, "no_comm": 1})


def _result():
    """One launch at 2 hosts × 1 rank: the sweep's line is t(S) = 2·50 µs + S/1e9 (p = 2), the probe 80 Mbit/s.
    The 64 KB point's chain (8 × 64 KB) overflows the 125 KB bucket: it is left out of the fit."""
    sizes = [8, 8_192, 65_536]
    row = {"model": "cnn", "batch_per_rank": 32, "np": 2, "link": {"nominal": "100mbit"}}
    return {"topology": {"hosts": 2, "ranks_per_host": 1},
            "links": [{"nominal": "100mbit", "qdisc": "tbf rate 100000000 burst 125000 latency 50ms",
                       "measured_bits_per_second": 8e7, "measured_mbit": 80.0,
                       "probe": {"bytes": 32_000_000, "seconds": [3.0, 3.2, 3.4]},
                       "alpha_sweep": {"bytes": sizes, "seconds": [1e-4 + s / 1e9 for s in sizes[:2]] + [5e-3],
                                       "ranks": 2, "chain": 8}}],
            "rows": [dict(row, config="no_comm", samples_per_sec={"median": 32_000, "min": 31_000, "max": 33_000}),
                     dict(row, config="sync", samples_per_sec={"median": 8_000, "min": 7_000, "max": 9_000})]}


def test_a_sync_row_by_hand():
    (row,) = cluster_check.rows_of(_result())
    # c = 32·2/32,000 = 2 ms. The digits CNN's gradients are 4·38,282 = 153,128 B; at p = 2 a host sends all of
    # it per step, a short burst (TokenBucketLink.SHORT_BURST), so at the tbf's 1.25e7 B/s. Idle
    # before the burst: c + 2α = 2.1 ms, so the bucket holds 1.25e7·0.0021 = 26,250 B, sent at 1e9 B/s.
    comm = 1e-4 + 153_128 / 1.25e7 - 26_250 * (1 / 1.25e7 - 1e-9)
    assert row["alpha_us"] == pytest.approx(50) and row["swept_sizes"] == 2 and row["line_mbit"] == pytest.approx(8e3)
    assert row["comm_ms_predicted"] == pytest.approx(comm * 1e3)
    assert row["predicted_ms"] == pytest.approx((0.002 + comm) * 1e3)
    # the probe's B alone: 32 MB in a median 3.2 s is 1e7 B/s on the link
    assert row["plain_predicted_ms"] == pytest.approx((0.002 + 1e-4 + 153_128 / 1e7) * 1e3)
    assert row["measured_ms"] == pytest.approx(8.0) and row["measured_ms_range"] == pytest.approx([64 / 9, 64 / 7])
    assert row["comm_share"] == pytest.approx(0.75) and row["band"] == cluster_check.TIGHT
    assert row["error"] == pytest.approx((0.002 + comm) / 0.008 - 1) and row["within"] is False


def test_a_formats_encoding_is_charged_as_a_share_of_c():
    (plain,) = cluster_check.rows_of(_result(), formats={})
    (row,) = cluster_check.rows_of(_result(), formats={("cnn", "sync"): 0.5, ("wide_mlp", "sync"): 9.0})
    # c = 2 ms, and the encoding half of it: 3 ms of compute. The bucket refills for 1 ms longer (c + 2α =
    # 3.1 ms): 12,500 B more of the burst leave at the line's 1e9 B/s instead of the tbf's 1.25e7.
    assert row["encoding_ms"] == pytest.approx(1.0) and row["compute_ms"] == pytest.approx(3.0)
    credit = 0.001 * 1.25e7 * (1 / 1.25e7 - 1e-9)
    assert row["comm_ms_predicted"] == pytest.approx(plain["comm_ms_predicted"] - credit * 1e3)
    assert row["predicted_ms"] == pytest.approx(3.0 + row["comm_ms_predicted"])
    assert row["comm_share"] == pytest.approx(1 - 3 / 8)  # the encoding is compute, not communication


def test_a_quantising_formats_share_is_the_one_at_the_rows_p():
    (plain,) = cluster_check.rows_of(_result(), formats={("cnn", "sync"): 0.5})
    (at_p,) = cluster_check.rows_of(_result(), formats={("cnn", "sync", 2): 0.5, ("cnn", "sync", 4): 9.0,
                                                        ("cnn", "sync"): 3.0})
    assert at_p == plain and at_p["encoding_ms"] == pytest.approx(1.0)  # p = 2: its own share, not p = 4's
    (none,) = cluster_check.rows_of(_result(), formats={("cnn", "sync", 4): 9.0})
    assert none["encoding_ms"] == 0.0


def test_the_quantised_configurations_and_their_recorded_shares(tmp_path):
    import json

    from benchmarks.costmodel import format_compute

    assert format_compute.quantised_configurations() == {"diloco_tau10_int8": ("int8", 10),
                                                         "diloco_tau10_int4": ("int4", 10)}
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"models": {"wide_mlp": {"step_seconds": 0.08, "configurations": {
        "sync_powersgd4": {"seconds": 0.04, "share": 0.5, "rank": 4},
        "diloco_tau10_int8": {"format": "int8", "period": 10, "by_ranks": {
            "2": {"seconds": 0.048, "share": 0.06}, "4": {"seconds": 0.056, "share": 0.07}}}}}}}))
    loaded = format_compute.load(path)
    assert loaded == {("wide_mlp", "sync_powersgd4"): 0.5, ("wide_mlp", "diloco_tau10_int8", 2): 0.06,
                      ("wide_mlp", "diloco_tau10_int8", 4): 0.07}
    assert format_compute.share_of(loaded, "wide_mlp", "diloco_tau10_int8", 4) == 0.07
    assert format_compute.share_of(loaded, "wide_mlp", "sync_powersgd4", 4) == 0.5
    assert format_compute.share_of(loaded, "wide_mlp", "diloco_tau10_int8", 8) == 0.0  # not measured at 8
    # The projection's: the largest p measured (the alltoall form); a model nothing measured, 0.
    from benchmarks.costmodel import workloads

    models = workloads.models()
    projected = format_compute.shares(("wide_mlp", models["wide_mlp"]), loaded)
    assert projected["diloco_tau10_int8"] == (0.07, "measured at p = 4")
    assert projected["diloco_tau10_int4"] == (0.0, "unknown") and projected["sync_powersgd4"] == (0.5, "measured")
    assert format_compute.shares(("resnet50", models["resnet50"]), loaded)["diloco_tau10_int8"] == (0.0, "unknown")


def test_the_quantising_formats_are_the_formats_that_are_not_summable():
    # format_compute spells the list out (asking the formats imports TensorFlow); it must be theirs.
    from benchmarks.costmodel import format_compute
    from hvd_easgd.comm.compression import COMPRESSIONS, Compression

    assert set(format_compute.QUANTISED) == {n for n in COMPRESSIONS if not Compression.by_name(n).summable
                                             and not Compression.by_name(n).sparse}  # topk: the sparse allreduce


def test_the_echo_communicator_runs_one_ranks_quantised_work_at_p():
    """Through EchoCommunicator the allgather form (p = 2) averages 2 copies of this rank's payload: the
    decoded payload, which with the error kept is exactly the input. The alltoall form (p = 4) decodes and
    sums 4 chunks (this rank's own, not rank j's: the values are not a sum's, the work is), and the error
    it keeps is its own payload's, the same as at p = 2."""
    import numpy as np
    import tensorflow as tf

    from benchmarks.costmodel.format_compute import EchoCommunicator
    from hvd_easgd.comm.compression import Compression
    from hvd_easgd.comm.quantised_allreduce import quantised_allreduce

    x = tf.random.stateless_normal([1000], seed=[1, 2])
    out = {p: quantised_allreduce(EchoCommunicator(p), [x], "average", Compression.by_name("int8"), record=False,
                                  with_errors=True) for p in (2, 4)}
    (reduced,), (error,) = out[2]
    assert float(tf.reduce_max(tf.abs(error))) > 0  # int8 loses something
    np.testing.assert_allclose(reduced + error, x, atol=1e-6)
    (reduced4,), (error4,) = out[4]
    assert reduced4.shape == x.shape
    np.testing.assert_allclose(error4, error, atol=1e-7)


def test_the_powersgd_configurations_are_found_with_their_rank():
    from benchmarks.costmodel import format_compute

    assert format_compute.powersgd_configurations() == {"sync_powersgd4": 4}


def test_tbf_description_is_read():
    assert link_probe.tbf_of("tbf rate 100000000 burst 125000 latency 50ms") == (1.25e7, 125_000)


def test_a_sweep_that_found_the_bucket_empty_leaves_the_line_unmeasured():
    # 8 × 8 KB fit a 125 KB bucket; the slope says 1.5e7 B/s, not above 2 × the tbf's 1.25e7: no line measured.
    sweep = {"bytes": [8, 8_192], "seconds": [1e-4, 1e-4 + 8_184 / 1.5e7], "ranks": 2, "chain": 8}
    alpha, line, kept = cluster_check.sweep_fit(sweep, 125_000, 1.25e7, 2)
    assert line == float("inf") and kept == 2 and alpha == pytest.approx(5e-5 - 8 / 1.5e7 / 2)
    assert cluster_check.sweep_fit(dict(sweep, bytes=[8, 65_536]), 125_000, 1.25e7, 2) is None  # one size fits


def test_the_probe_rate_is_a_hosts_link():
    # 2 hosts × 2 ranks: an allreduce of 32 MB puts 2(H−1)/H·32 MB = 32 MB on each host's link, whatever the
    # ranks a host (halving/doubling, nearest ranks first); at 4 hosts 1.5 × 32 MB.
    probe = {"bytes": 32_000_000, "seconds": [4.0, 3.2, 3.0]}
    assert cluster_check.probe_bandwidth(probe, 2) == pytest.approx(1e7)
    assert cluster_check.probe_bandwidth(probe, 4) == pytest.approx(1.5e7)


def _two_level_result():
    """_result's link at 2 hosts × 2 ranks, with the level probes of ``link_probe.levels``: within a host
    32 MB in a median 20 ms (2(n−1)/n = 1: 1.6e9 B/s) and a sweep on the line t(S) = 2·20 µs + S/1e9; across
    hosts 2 sets of 16 MB at once in 2 s (2 × 16 MB on a host's link: 1.6e7 B/s)."""
    result = _result()
    result["topology"] = {"hosts": 2, "ranks_per_host": 2}
    sizes = [8, 8_192]
    result["links"][0]["levels"] = {
        "ranks_per_host": 2,
        "within_host": {"bytes": 32_000_000, "seconds": [0.02, 0.03, 0.01], "hosts": 2, "streams": 1,
                        "alpha_sweep": {"bytes": sizes, "seconds": [4e-5 + s / 1e9 for s in sizes]}},
        "across_hosts": {"bytes": 16_000_000, "seconds": [2.0, 2.5, 1.5], "hosts": 2, "streams": 2}}
    row = {"model": "cnn", "batch_per_rank": 32, "np": 4, "link": {"nominal": "100mbit"}}
    result["rows"] = [dict(row, config=config, samples_per_sec={"median": s, "min": s, "max": s})
                      for config, s in (("no_comm", 32_000), ("sync", 12_800), ("sync_two_level", 12_800))]
    return result


def test_a_two_level_row_is_charged_its_levels_own_probes():
    (flat, two_level) = cluster_check.rows_of(_two_level_result())
    assert (flat["config"], two_level["config"]) == ("sync", "sync_two_level")
    assert two_level["levels_probed"] and not flat["levels_probed"]
    assert two_level["levels"] == flat["levels"] == pytest.approx(
        {"within_mbit": 1.6e9 * 8 / 1e6, "within_alpha_us": 20, "across_mbit": 128})
    # The B each was charged: the across-hosts probe's 1.6e7 B/s, the flat probe's 1e7; both record the flat one.
    assert two_level["measured_mbit"] == pytest.approx(128) and flat["measured_mbit"] == pytest.approx(80)
    assert two_level["probe_mbit"] == flat["probe_mbit"] == pytest.approx(80)
    # c = 32·4/32,000 = 4 ms. Within a host (n = 2) at α 20 µs, B 1.6e9: the reduce-scatter of the CNN's
    # gradients and a count (4·38,282 + 8 B: half of it sent) and the allgather of a half (2·38,282 B).
    n_params = 38_282
    within = 2 * 20e-6 + (4 * n_params + 8) / 2 / 1.6e9 + 2 * n_params / 1.6e9
    # Across: the 2 sets of rank j each allreduce the half (2·38,282 B) at 2 hosts, sharing the link (B/2):
    # halving/doubling's 2α (α 50 µs, the launch's sweep) and the half each way at 1.6e7/2.
    across_plain = 2 * 50e-6 + 2 * n_params / (1.6e7 / 2)
    assert two_level["plain_predicted_ms"] == pytest.approx((0.004 + within + across_plain) * 1e3)
    # The burst (153,128 B on a host's link) is short: the tbf's 1.25e7 B/s, less the bucket's credit for
    # what it holds after c + the latency-and-within-host time.
    idle = 0.004 + within + 2 * 50e-6
    credit = min(125_000, 1.25e7 * idle, 4 * n_params) * (1 / 1.25e7 - 1 / 1e9)
    comm = within + 2 * 50e-6 + 4 * n_params / 1.25e7 - credit
    assert two_level["comm_ms_predicted"] == pytest.approx(comm * 1e3)
    # The flat SyncAverage keeps the flat probe's 1e7 B/s and the within-host steps all but free.
    assert flat["plain_predicted_ms"] == pytest.approx(
        (0.004 + cost_model.comm_time(calibration.load_table()["configurations"]["sync"],
                                      calibration.load_table()["reference"], n_params, 2, 2, (50e-6, 1e7))) * 1e3)


def test_the_level_calibration_by_hand():
    levels = _two_level_result()["links"][0]["levels"]
    (alpha, intra), across = cluster_check.level_calibration(levels)
    assert alpha == pytest.approx(20e-6) and intra == pytest.approx(1.6e9) and across == pytest.approx(1.6e7)
    assert cluster_check.level_calibration(None) is None


def test_a_probe_of_several_streams_counts_each_streams_bytes():
    probe = {"bytes": 16_000_000, "seconds": [2.0], "streams": 2}
    assert cluster_check.probe_bandwidth(probe, 2) == pytest.approx(1.6e7)
    assert cluster_check.probe_bandwidth(probe, 4) == pytest.approx(2.4e7)  # 2 × 1.5 × 16 MB at 4 hosts


def test_levels_are_not_probed_with_one_rank_a_host():
    from hvd_easgd.comm.local_comm import LocalCommunicator

    assert link_probe.levels(LocalCommunicator(), 1) is None


def test_rows_without_a_sweep_or_a_no_comm_twin_are_not_predicted():
    result = _result()
    assert cluster_check.rows_of(dict(result, rows=result["rows"][1:])) == []
    result["links"][0]["alpha_sweep"] = None
    assert cluster_check.rows_of(result) == []


def test_the_set_runs_every_strategy_and_the_two_formats_at_the_default_collectives():
    table = calibration.load_table()["configurations"]
    for run in cluster_check.RUNS:
        assert "no_comm" in run.configs and set(run.configs) <= set(table)
        argv = run.argv("out")
        assert argv[argv.index("--collectives") + 1] == "auto"
    layouts = {(r.hosts, r.ranks_per_host) for r in cluster_check.RUNS}
    assert layouts == {(2, 1), (4, 1), (2, 2)}
    assert {"diloco_tau10_int8", "sync_powersgd4", "hier_easgd_tau10", "sync_two_level"} <= {
        c for r in cluster_check.RUNS for c in r.configs}


def test_oversubscribed_rows_that_are_mostly_compute_are_not_judged():
    (row,) = cluster_check.rows_of(_result(), cores=2)
    assert not row["oversubscribed"] and row["judged"]  # 2 ranks on 2 cores
    (row,) = cluster_check.rows_of(_result(), cores=1)
    assert row["oversubscribed"] and row["judged"]  # communication-bound (share 0.75): judged all the same
    result = _result()
    result["rows"][1]["samples_per_sec"] = {"median": 25_600, "min": 25_000, "max": 26_000}  # 2.5 ms: share 0.2
    (row,) = cluster_check.rows_of(result, cores=1)
    assert row["oversubscribed"] and not row["judged"]


def _row(config, rate, measured, predicted, **more):
    row = {"layout": "2x2", "rate": rate, "model": "wide_mlp", "config": config, "compute_ms": 150.0,
           "encoding_ms": 20.0,
           "measured_ms": measured, "predicted_ms": predicted, "judged": True, "band": cluster_check.LOOSE,
           "burst_bytes": 2e5, "burst_mbit": 100.0, "comm_ms_predicted": 5.0, "error": predicted / measured - 1}
    row.update(more)
    return dict(row, within=abs(row["error"]) <= row["band"])


def test_each_miss_is_explained_from_the_rows():
    long_burst = dict(band=cluster_check.TIGHT, burst_bytes=21.7e6, burst_mbit=48.0, comm_ms_predicted=3600.0)
    rows = [_row("sync_two_level", "100mbit", 2700.0, 3750.0, **long_burst),
            _row("sync", "100mbit", 3350.0, 3750.0, **long_burst),  # within ±15 %: a peer, not a miss
            _row("sync_powersgd4", "1gbit", 123.0, 79.0), _row("sync_powersgd4", "100mbit", 120.0, 80.0),
            _row("diloco_tau10", "100mbit", 100.0, 300.0, judged=False)]  # not judged: never listed
    two_level, sgd_1g, sgd_100m = cluster_check.misses(rows)
    # 3,600 ms predicted at 48 Mbit/s, 2,550 measured (2,700 − c): 48·3600/2550 = 67.8 Mbit/s; the peer's
    # 48·3600/3200 = 54.
    assert "sync_two_level (wide_mlp) at 2x2, 100mbit" in two_level and "took 2,550 ms" in two_level
    assert "about 68 Mbit/s" in two_level and "the launch's probe" in two_level and "at 54–54 Mbit/s" in two_level
    # The residual measured − predicted at each rate of the layout: 44 ms and 40 ms.
    assert sgd_1g == sgd_100m.replace("100mbit, -33.3 %", "1gbit, -35.8 %")
    assert "44 ms at 1gbit, 40 ms at 100mbit over the prediction" in sgd_1g
    assert "the no_comm run's c, 130.0 ms, plus 20.0 ms of the format's measured encoding" in sgd_1g


def test_each_launch_has_its_calibration_row():
    # The digits CNN's 2x2 run and the wide MLP's are two launches at the same layout and rate.
    rows = [dict(_row("sync", "100mbit", 1.0, 1.0), run=run) for run in ("2x2", "2x2", "2x2-wide-mlp")]
    assert [r["run"] for r in cluster_check._links(rows)] == ["2x2", "2x2-wide-mlp"]
    assert {r["run"] for r in cluster_check.compute()["rows"]} == {r.name for r in cluster_check.RUNS}


def test_committed_files_equal_their_render():
    assert cluster_check.write(check=True) == []
    summary = cluster_check.compute()["summary"]
    assert summary["missing_runs"] == [] and summary["rows"] > 0


@pytest.mark.parametrize("argv", [["--only", "2x1"], ["--run", "--only", "9x9"], ["--run", "--check"]])
def test_cli_refuses_contradictions_in_one_line(argv):
    code = f"import sys; from benchmarks.costmodel import cluster_check; sys.exit(cluster_check.main({argv!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "tensorflow" not in done.stderr
