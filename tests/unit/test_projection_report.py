"""docs/projection.md, docs/projection-tables.md and docs/results/projection/ are what the cost model computes
from the committed inputs, and a few of their numbers by hand (no TensorFlow)."""
import json
import subprocess
import sys

import pytest

from benchmarks.costmodel import paper_check, projection_report, workloads

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def data():
    return projection_report.compute()


def test_committed_files_equal_their_render(data):
    texts = projection_report.files()
    for path, text in texts.items():
        assert path.read_text() == text, f"{path} is stale: run `{projection_report.COMMAND}`"
    assert json.loads(texts[projection_report.OUT / "projection.json"]) == json.loads(json.dumps(data))
    for model in data["projection"]:  # the plots are drawn by the same command (not compared byte for byte)
        assert (projection_report.FIGURES / f"projection_{model}.png").stat().st_size > 10_000
    assert (projection_report.FIGURES / "projection_h200.png").stat().st_size > 10_000


def test_every_strategy_model_link_and_host_count_is_projected(data):
    assert data["hosts"] == [8, 64, 512, 1024] and data["ranks_per_host"] == 8
    assert set(data["projection"]) == {"digits_cnn", "wide_mlp", "overlap_mlp", "resnet50", "resnet50_h200", "1b"}
    links = [x["name"] for x in data["links"]]
    assert len(links) == 9 and "100mbit α 100 ms" in links and "400gbit α 5 µs" in links
    for per_link in data["projection"].values():
        for per in per_link.values():
            assert set(per) == set(data["configurations"]) and "no_comm" not in per
            assert all(len(v["efficiency"]) == 4 for v in per.values())


def test_resnet50_sync_at_8_hosts_by_hand(data):
    # S = 4·25,583,592 B; p = 64; α 5 µs, B = 100e9/8: the ring, 2·63·5e-6 + 2·63/64·S/B, is faster here than
    # halving/doubling nearest ranks first, whose within-host steps move 2·7/8·S at 10 GB/s; c = 64/219 s.
    size = 4 * 25_583_592
    comm = 2 * 63 * 5e-6 + 2 * 63 / 64 * size / 12.5e9
    nearest_first = 2 * (7e-6 + 7 / 8 * size / 1e10) + 2 * 3 * 5e-6 + 2 * 7 / 8 * (size / 8) / (12.5e9 / 8)
    assert comm < nearest_first
    compute = 64 / 219
    row = data["projection"]["resnet50"]["100gbit α 5 µs"]["sync"]
    assert row["efficiency"][0] == pytest.approx(compute / (compute + comm), rel=1e-5)
    assert row["samples_per_second"][0] == pytest.approx(64 * 64 / (compute + comm), rel=1e-5)


def test_teacher_workload_periodic_across_sites_by_hand(data):
    # periodic_tau10 sends 4 + 4N bytes in one allreduce every 10 steps; at 1,024 hosts × 8 ranks over 1 Gbit/s
    # and 10 ms, halving/doubling nearest ranks first: within the host (1 µs, 10 GB/s), then 2·log2(1024)
    # latencies and the S/8 shards at B/8 across; a ring's 2·8191·0.01 s a call would be 160 s.
    # c from the committed ceiling (256 samples).
    tta = json.loads(projection_report.TTA.read_text())["time_to_accuracy"]
    compute = 256 / tta["ceiling"]["samples_per_second_per_rank"]
    size = 4 + 4 * 1_093_642
    within = 2 * (7e-6 + 7 / 8 * size / 1e10)
    across = 2 * 10 * 0.01 + 2 * 1023 / 1024 * (size / 8) / (1.25e8 / 8)
    comm = 0.1 * (within + across)
    row = data["projection"]["overlap_mlp"]["1gbit α 10 ms"]["periodic_tau10"]
    assert row["efficiency"][-1] == pytest.approx(compute / (compute + comm), rel=1e-5)


def test_step_ratios_come_from_the_time_to_accuracy_run(data):
    per = json.loads(projection_report.TTA.read_text())["time_to_accuracy"]["per_config"]
    assert data["step_ratios"]["sync"] == 1.0
    assert data["step_ratios"]["easgd_tau10"] == pytest.approx(
        per["easgd_tau10"]["epochs_to_target"] / per["sync"]["epochs_to_target"], rel=1e-5)
    # the reading divides samples/s by the ratio: at 400 Gbit/s on the 1 B model, sync against periodic
    winner, gain = projection_report.best(data, "1b", "400gbit α 5 µs", -1)
    per_link = data["projection"]["1b"]["400gbit α 5 µs"]
    expected = max(per_link[c]["samples_per_second"][-1] / r for c, r in data["step_ratios"].items())
    assert gain == pytest.approx(expected / per_link["sync"]["samples_per_second"][-1])
    assert winner.split(" = ")[0] in data["step_ratios"]


def test_horovod_paper_inception_v3_by_hand():
    # 23,817,352 fp32 parameters, 512 ranks (128 × 4), α 10 µs, 25 Gbit/s: 2·511·1e-5 + 2·511/512·S/3.125e9;
    # c = 64/142 s. Efficiency c/(c + comm); reported 90%.
    size = 4 * 23_817_352
    comm = 2 * 511 * 1e-5 + 2 * 511 / 512 * size / 3.125e9
    compute = 64 / 142
    row = next(r for r in paper_check.results()["rows"] if r["model"] == "Inception V3")
    assert row["comm_seconds"] == pytest.approx(comm)
    assert row["predicted"] == pytest.approx(compute / (compute + comm))
    assert row["predicted_all_hidden"] == 1.0  # comm < c
    assert row["reported"] == 0.90
    # the hidden share o solving c/(c + (1−o)·comm) = 0.9
    assert compute / (compute + (1 - row["hidden_share_implied"]) * comm) == pytest.approx(0.90)
    low, high = row["predicted_range"]
    assert low < row["predicted"] < high


def test_every_paper_input_has_a_source_or_a_range():
    result = paper_check.results()
    assert all(url.startswith("https://") for url in result["sources"].values())
    for r in result["rows"]:
        assert r["images_source"] and r["images_range"][0] <= r["images_per_second"] <= r["images_range"][1]
    assert all(lo <= central <= hi for central, lo, hi in result["assumptions"].values())


def test_workloads_read_their_measurements():
    models = workloads.models()
    assert {m: w.basis for m, w in models.items()} == {
        "digits_cnn": "measured", "wide_mlp": "measured", "overlap_mlp": "measured", "resnet50": "cited",
        "resnet50_h200": "measured elsewhere", "1b": "measured elsewhere"}
    tta = json.loads(projection_report.TTA.read_text())["time_to_accuracy"]
    assert models["overlap_mlp"].compute == 256 / tta["ceiling"]["samples_per_second_per_rank"]


def test_the_h200_file_holds_the_figures_it_is_cited_for():
    # The committed copy, against the figures its README and the projection quote (ms, rounded as quoted).
    h = workloads.h200()
    r, lm, q = h["resnet50"], h["lm_1b"], h["quantise_block256"]
    assert [round(r[k]["median_ms"], 1) for k in ("b64_fp32", "b64_bf16", "b256_fp32", "b256_bf16")] == [
        27.7, 22.6, 82.2, 55.3]
    assert round(lm["median_ms"]) == 244 and round(lm["params"] / 1e9, 2) == 1.07
    assert lm["tokens_per_step"] == 8 * 2048
    assert round(r["powersgd_r4_encode"]["median_ms"], 1) == 7.5
    assert round(lm["powersgd_r4_encode"]["median_ms"], 1) == 17.6
    assert round(q["int8"]["median_ms"], 1) == 19.4 and q["elements"] == 2 ** 30
    assert round(min(h["h2d"].values())) == 55 and round(h["ceilings"]["d2d_copy_GBps_rw"] / 1e3, 1) == 4.2


def test_the_h200_workloads_and_their_formats_by_hand():
    # c is the measured median; a format's share is what its pass takes there over c: PowerSGD's encode each
    # step, a quantised allreduce 2 quantise + dequantise passes over N a period (format_compute.QUANTISE_PASSES),
    # the 1.07 B-element pass scaled to N.
    from benchmarks.costmodel import format_compute

    h = workloads.h200()
    models = workloads.models()
    resnet, lm = models["resnet50_h200"], models["1b"]
    assert resnet.compute == h["resnet50"]["b64_bf16"]["median_ms"] / 1e3 and resnet.batch == 64
    assert resnet.params == h["resnet50"]["params"]
    assert lm.compute == h["lm_1b"]["median_ms"] / 1e3 and lm.batch == 8 and lm.params == h["lm_1b"]["params"]
    assert lm.flops_per_sample == pytest.approx(h["lm_1b"]["model_TFLOPs_per_step"] * 1e12 / 8)
    per_element = h["quantise_block256"]["int8"]["median_ms"] / 1e3 / 2 ** 30
    shares = format_compute.shares(("1b", lm), measured={})
    assert shares["sync_powersgd4"] == (pytest.approx(h["lm_1b"]["powersgd_r4_encode"]["median_ms"] / 1e3 / lm.compute),
                                        "measured elsewhere")
    assert shares["diloco_tau10_int8"][0] == pytest.approx(2 * per_element * lm.params / 10 / lm.compute)
    assert shares["sync_int8"][0] == pytest.approx(2 * per_element * lm.params / lm.compute)
    assert format_compute.shares(("resnet50_h200", resnet), measured={})["sync_powersgd4"][0] == pytest.approx(
        h["resnet50"]["powersgd_r4_encode"]["median_ms"] / h["resnet50"]["b64_bf16"]["median_ms"])
    # Charged in the projection: c·(1 + s) + comm, efficiency against c.
    row = projection_report.compute()["projection"]["1b"]["100gbit α 5 µs"]["sync_int8"]
    from benchmarks.costmodel import calibration
    from hvd_easgd.choosing import cost_model
    table = calibration.load_table()
    comm = cost_model.comm_time(table["configurations"]["sync_int8"], table["reference"], lm.params, 8, 8,
                                (5e-6, 12.5e9))
    assert row["efficiency"][0] == pytest.approx(lm.compute / (lm.compute * (1 + shares["sync_int8"][0]) + comm),
                                                 rel=1e-5)


def test_the_h200_sweep_by_hand(data):
    # SyncAverage, the 1 B model at 1,024 hosts × 1 rank, 100 Gbit/s, α 5 µs: one halving/doubling allreduce of
    # 4N bytes, 2·10 latencies + 2·1023/1024·4N/B; nothing hidden.
    h = data["h200"]
    lm = workloads.models()["1b"]
    comm = 2 * 10 * 5e-6 + 2 * 1023 / 1024 * 4 * lm.params / (100e9 / 8)
    at = h["gbit_per_second"].index(100)
    assert h["utilisation"]["1b"]["1024"]["sync"][at] == pytest.approx(lm.compute / (lm.compute + comm), rel=1e-5)
    # The summary's rate: where the utilisation reaches the target (bisection), so just below it does not.
    need = h["needs_gbit_per_second"]["1b"]["sync"]
    bytes_per_second = lambda gbits: gbits * 1e9 / 8  # noqa: E731
    for gbits, reaches in ((need * 1.001, True), (need * 0.999, False)):
        comm = 2 * 10 * 5e-6 + 2 * 1023 / 1024 * 4 * lm.params / bytes_per_second(gbits)
        assert (lm.compute / (lm.compute + comm) >= h["target"]) is reaches
    # A format whose own share caps the utilisation below the target never reaches it.
    powersgd = data["encoding"]["resnet50_h200"]["sync_powersgd4"]["share"]
    assert 1 / (1 + powersgd) < h["target"] and h["needs_gbit_per_second"]["resnet50_h200"]["sync_powersgd4"] is None


def test_the_page_leads_with_its_answer_in_five_lines_and_one_plot(data):
    page = projection_report.PAGE.read_text()
    assert len(page.encode()) <= 25 * 1024
    lines = page.splitlines()
    plots = [i for i, line in enumerate(lines) if line.startswith("![")]
    assert len(plots) == 1 and "projection_h200.png" in lines[plots[0]]
    head = [line for line in lines[1:plots[0]] if line.strip()]
    assert len(head) <= 5
    # The sentence is the results': SyncAverage's rate for the 1 B model, and the paper check's count.
    from benchmarks.costmodel import diloco_paper_check

    text = " ".join(head)
    assert f"{data['h200']['needs_gbit_per_second']['1b']['sync']:,.0f}" in text
    check = diloco_paper_check.results()
    assert f"{check['within']} of Streaming DiLoCo's {check['total']}" in text


def test_cli_paper_table():
    result = subprocess.run([sys.executable, "-m", "benchmarks", "project", "--paper", "horovod"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert [line.split("|")[1].strip() for line in result.stdout.splitlines()[2:]] == [
        "Inception V3", "ResNet-101", "VGG-16"]


def test_powersgd_computes_c_times_one_plus_its_encoding_share_by_hand(data):
    # wide_mlp: the committed measurement's share s (format_compute.json) at 100 Gbit/s and 8 hosts:
    # c·(1 + s) + comm, efficiency against the plain c. resnet50: no measurement, so the FLOPs estimate,
    # 6·r·N / (b·f) = 6·4·25,583,592 / (64 · 3·2·3.8e9).
    from benchmarks.costmodel import calibration, format_compute
    from hvd_easgd.choosing import cost_model

    measured = format_compute.load()
    s = measured[("wide_mlp", "sync_powersgd4")]
    w = workloads.models()["wide_mlp"]
    entry = calibration.load_table()
    comm = cost_model.comm_time(entry["configurations"]["sync_powersgd4"], entry["reference"], w.params, 8, 8,
                                (5e-6, 12.5e9))
    row = data["projection"]["wide_mlp"]["100gbit α 5 µs"]["sync_powersgd4"]
    assert row["efficiency"][0] == pytest.approx(w.compute / (w.compute * (1 + s) + comm), rel=1e-5)
    assert data["encoding"]["wide_mlp"]["sync_powersgd4"] == {"share": pytest.approx(s, rel=1e-5),
                                                             "basis": "measured", "estimate": 0.125}
    resnet = data["encoding"]["resnet50"]["sync_powersgd4"]
    assert resnet["basis"] == "FLOPs estimate"
    assert resnet["share"] == pytest.approx(6 * 4 * 25_583_592 / (64 * 6 * 3.8e9), rel=1e-5)
    # A dense model's estimate is r/b; a model whose FLOPs are unknown and that nothing measured is charged 0.
    assert format_compute.flop_share(4, 32, 1000, 6 * 1000) == 4 / 32
    unknown = workloads.Workload(1000, 32, 0.1, "given", "test")
    assert format_compute.shares(("custom", unknown), measured={})["sync_powersgd4"] == (0.0, "unknown")
    # Nothing else is charged an encoding but the quantising formats, at their share measured at p = 4.
    assert set(data["encoding"]["wide_mlp"]) == {"sync_powersgd4", "diloco_tau10_int8", "diloco_tau10_int4"}
    int8 = measured[("wide_mlp", "diloco_tau10_int8", 4)]
    assert data["encoding"]["wide_mlp"]["diloco_tau10_int8"] == {"share": pytest.approx(int8, rel=1e-5),
                                                                "basis": "measured at p = 4", "estimate": None}
    comm8 = cost_model.comm_time(entry["configurations"]["diloco_tau10_int8"], entry["reference"], w.params, 8, 8,
                                 (5e-6, 12.5e9))
    row8 = data["projection"]["wide_mlp"]["100gbit α 5 µs"]["diloco_tau10_int8"]
    assert row8["efficiency"][0] == pytest.approx(w.compute / (w.compute * (1 + int8) + comm8), rel=1e-5)
