"""The benchmark suite end to end: ``python -m benchmarks.suite.compare --quick``
on a tiny configuration (40 steps per repeat), then results.json against
its schema: every row measured, bytes and calls equal to their formula
(from a parameter count worked out by hand here), every headline ratio
recomputed from its rows, and the report and plots written."""
import json
import os
import statistics
import subprocess
import sys

import pytest

from tests.helpers import bounded

pytestmark = pytest.mark.multiproc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CUSTOM_LOOP = {"no_comm", "raw_horovod", "sync", "easgd_tau4", "easgd_tau10", "easgd_tau10_overlap", "accum4_sync"}
FIT = {"raw_horovod_fit", "sync_fit"}
MEASURED = ("config", "np", "controller", "samples_per_sec", "bytes_per_sample", "calls_per_step",
            "expected_bytes_per_sample", "expected_calls_per_step")
BATCH = 32
# The digits CNN (hvd_easgd.models.cnn at 8×8×1, 10 classes), layer by layer:
# conv 3·3·1·16+16, conv 3·3·16·32+32, dense (4·4·32)·64+64, dense 64·10+10.
PARAMETERS = (9 * 16 + 16) + (9 * 16 * 32 + 32) + (4 * 4 * 32 * 64 + 64) + (64 * 10 + 10)
GRADIENT_BYTES = 4 * PARAMETERS  # float32
# Per rank and step: (payload bytes, collective calls). EASGD sends the elastic
# differences and a 4-byte non-finite flag every τ steps (the CNN has no
# non-trainable state); accumulation sends the sums and a 4-byte count every k.
TRAFFIC_PER_STEP = {
    "no_comm": (0, 0), "raw_horovod": (GRADIENT_BYTES, 1), "sync": (GRADIENT_BYTES, 1),
    "easgd_tau4": ((GRADIENT_BYTES + 4) / 4, 1 / 4), "easgd_tau10": ((GRADIENT_BYTES + 4) / 10, 1 / 10),
    "easgd_tau10_overlap": ((GRADIENT_BYTES + 4) / 10, 1 / 10), "accum4_sync": ((GRADIENT_BYTES + 4) / 4, 1 / 4),
    "raw_horovod_fit": (GRADIENT_BYTES, 1), "sync_fit": (GRADIENT_BYTES, 1),
}
# Far above what 2 CPU ranks can train the digits CNN at (the full run measured
# at most ~60k); a timer that stopped before the last step finished would
# show millions.
MAX_SAMPLES_PER_SEC = 500_000


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    cmd = [sys.executable, "-m", "benchmarks.suite.compare", "--quick", "--steps", "40", "--out", str(out),
           "--launch-timeout", str(bounded(120))]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=bounded(280))
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    with open(out / "results.json") as f:
        return out, json.load(f), proc.stdout


@pytest.mark.timeout(300)
def test_quick_results_follow_the_schema(quick):
    out, results, _ = quick
    assert not results["failures"], results["failures"]
    assert results["machine"]["cpu_model"] and results["machine"]["cores"] >= 1
    for package in ("tensorflow", "keras", "horovod", "hvd_easgd"):
        assert results["versions"][package], package
    rows = results["rows"]
    assert {r["config"] for r in rows} == CUSTOM_LOOP | FIT
    for row in rows:
        for key in MEASURED:
            assert row[key] is not None, (row["config"], key)
        assert "final_test_accuracy" in row  # None: the quick run measures no accuracy
        assert row["np"] == 2 and row["controller"] in ("gloo", "mpi")
        group = CUSTOM_LOOP if row["loop"] == "custom" else FIT
        if row["collectives"] == "mpi-direct":  # the default-path launch: hvd_easgd's configurations alone
            group = CUSTOM_LOOP - {"raw_horovod"}
        # --quick's 3 repeats: a smoke test, less than one Williams design (2n rounds for odd n, n for even)
        assert row["order"] == {"group_size": len(group),
                                "design_rounds": 2 * len(group) if len(group) % 2 else len(group),
                                "repeats": 3, "whole_designs": False}
        sps = row["samples_per_sec"]
        assert len(sps["repeats"]) == 3
        assert (sps["median"], sps["min"], sps["max"]) == (
            statistics.median(sps["repeats"]), min(sps["repeats"]), max(sps["repeats"]))
        assert max(sps["repeats"]) < MAX_SAMPLES_PER_SEC, row["config"]


@pytest.mark.timeout(300)
def test_quick_bytes_and_calls_match_the_analytic_expectation(quick):
    _, results, _ = quick
    for row in results["rows"]:
        step_bytes, calls = TRAFFIC_PER_STEP[row["config"]]
        # Measured: comm.account() for hvd_easgd, a count at Horovod's collectives for the baselines.
        assert row["bytes_per_sample"] == pytest.approx(step_bytes / BATCH), row["config"]
        assert row["calls_per_step"] == pytest.approx(calls), row["config"]
        # The suite's own analytic column, from the model's variables, agrees with the hand count.
        assert row["expected_bytes_per_sample"] == pytest.approx(step_bytes / BATCH), row["config"]
        assert row["expected_calls_per_step"] == pytest.approx(calls), row["config"]
    sources = {r["config"]: r["account_source"] for r in results["rows"] if r["collectives"] == "horovod"}
    for baseline in ("no_comm", "raw_horovod", "raw_horovod_fit"):
        assert sources[baseline] == "counted at horovod.tensorflow's collectives", baseline


@pytest.mark.timeout(300)
def test_quick_writes_report_ratios_and_plots(quick):
    out, results, stdout = quick
    labels = {h["label"] for h in results["headlines"]}
    assert "SyncAverage ÷ raw Horovod (custom loop)" in labels
    assert "EASGD τ=10 ÷ SyncAverage" in labels
    rows = {(r["config"], r["loop"], r["collectives"]): r for r in results["rows"] if r["model"] == "cnn"}
    # Horovod's path and the default one (mpi-direct) are both measured under MPI
    assert {path for _, _, path in rows} == {"horovod", "mpi-direct"}
    assert "SyncAverage ÷ no communication [mpi-direct]" in labels
    throughput_headlines = [h for h in results["headlines"] if "numerator" in h]
    # every ratio of report.HEADLINES at np=2 on Horovod's path (7), and the 5 without raw Horovod on the default
    assert len(throughput_headlines) == 7 + 5
    for h in throughput_headlines:
        loop = "fit" if h["numerator"].endswith("_fit") else "custom"
        a = rows[(h["numerator"], loop, h["collectives"])]["samples_per_sec"]
        b = rows[(h["denominator"], loop, h["collectives"])]["samples_per_sec"]
        assert h["value"] == pytest.approx(a["median"] / b["median"]), h["label"]
        paired = [x / y for x, y in zip(a["repeats"], b["repeats"])]
        assert (h["paired_min"], h["paired_max"]) == pytest.approx((min(paired), max(paired))), h["label"]
        goal = {"SyncAverage ÷ no communication": 0.75, "EASGD τ=10 ÷ SyncAverage": None,
                "EASGD τ=10 ÷ no communication": 0.85}.get(h["label"].replace(" [mpi-direct]", ""), h["goal"])  # the MPI goals of issue 14
        assert h["goal"] == goal, h["label"]
        assert h["met"] == (None if goal is None else h["value"] >= goal), h["label"]
    for result in results["allreduce"]:
        assert result["gradients"]["bytes"] == GRADIENT_BYTES  # the latency payload: one model's gradients
        for size in result["sizes"]:  # busbw fractions, from the figures beside them
            if "mpi4py" in size:
                assert size["hvd_fraction_of_mpi4py"] == pytest.approx(
                    size["hvd"]["busbw_gbs"] / size["mpi4py"]["busbw_gbs"])
    text = (out / "results.md").read_text()
    assert "## Headline ratios" in text and "| sync |" in text
    assert "## Headline ratios" in stdout  # the table is printed too
    for png in ("throughput_cnn.png", "bytes_per_sample.png"):
        assert (out / png).stat().st_size > 1000
