"""The benchmark suite end to end: ``python -m benchmarks.compare --quick``
on a tiny configuration (40 steps per repeat), then results.json against
its schema: every row measured, bytes and calls equal to the analytic
expectation, and the report and plots written."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.multiproc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CUSTOM_LOOP = {"no_comm", "raw_horovod", "sync", "easgd_tau4", "easgd_tau10", "easgd_tau10_overlap", "accum4_sync"}
FIT = {"raw_horovod_fit", "sync_fit"}
MEASURED = ("config", "np", "controller", "samples_per_sec", "bytes_per_sample", "calls_per_step",
            "expected_bytes_per_sample", "expected_calls_per_step")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    cmd = [sys.executable, "-m", "benchmarks.compare", "--quick", "--steps", "40", "--out", str(out),
           "--launch-timeout", "120"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    with open(out / "results.json") as f:
        return out, json.load(f), proc.stdout


@pytest.mark.timeout(170)
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
        sps = row["samples_per_sec"]
        assert len(sps["repeats"]) == 3
        assert 0 < sps["min"] <= sps["median"] <= sps["max"]


@pytest.mark.timeout(170)
def test_quick_bytes_and_calls_match_the_analytic_expectation(quick):
    _, results, _ = quick
    for row in results["rows"]:
        assert row["bytes_per_sample"] == pytest.approx(row["expected_bytes_per_sample"]), row["config"]
        assert row["calls_per_step"] == pytest.approx(row["expected_calls_per_step"]), row["config"]
    sync = next(r for r in results["rows"] if r["config"] == "sync")
    easgd = next(r for r in results["rows"] if r["config"] == "easgd_tau10")
    assert sync["calls_per_step"] == 1.0 and easgd["calls_per_step"] == pytest.approx(0.1)


@pytest.mark.timeout(170)
def test_quick_writes_report_ratios_and_plots(quick):
    out, results, stdout = quick
    labels = {h["label"] for h in results["headlines"]}
    assert "SyncAverage ÷ raw Horovod (custom loop)" in labels
    assert "EASGD τ=10 ÷ SyncAverage" in labels
    for h in results["headlines"]:
        assert h["value"] > 0
    text = (out / "results.md").read_text()
    assert "## Headline ratios" in text and "| sync |" in text
    assert "## Headline ratios" in stdout  # the table is printed too
    for png in ("throughput_cnn.png", "bytes_per_sample.png"):
        assert (out / png).stat().st_size > 1000
