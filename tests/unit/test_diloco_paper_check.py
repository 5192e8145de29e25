"""The cost model against Streaming DiLoCo's simulated points: the committed points, a few by hand, and the
comparison table reproduced from them (no TensorFlow)."""
import json
import math
import subprocess
import sys

import pytest

from benchmarks.costmodel import diloco_paper_check as check
from benchmarks.costmodel import projection_report

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def result():
    return check.results()


def _point(result, model, method, target):
    return next(p for p in result["points"]
                if p["model"] == model and p["method"] == method and p["target"] == target)


def test_the_points_are_committed_with_their_source():
    data = check.load()
    assert data["source"]["url"] == "https://arxiv.org/abs/2501.18512" and "Table 4" in data["source"]["table"]
    assert data["source"]["read_from"].startswith("the table of the paper's arXiv HTML")
    assert data["targets"] == [0.5, 0.8, 0.9, 0.95, 0.99] and data["period"] == 100
    assert [(m["name"], m["layers"], m["step_seconds"]) for m in data["models"]] == [
        ("1B", 24, 0.1), ("10B", 48, 0.8), ("100B", 108, 4.9)]
    for model in data["models"]:
        assert list(model["gbit_per_second"]) == [m.name for m in check.METHODS]
        for values in model["gbit_per_second"].values():
            assert len(values) == 5 and values == sorted(values)  # a higher CU never needs less bandwidth


def test_the_bandwidths_sit_on_one_log_grid():
    # Consecutive distinct values differ by GRID_STEP^k, k >= 1, within their printed digit (±0.05).
    values = sorted({v for m in check.load()["models"] for vs in m["gbit_per_second"].values() for v in vs})
    for low, high in zip(values, values[1:]):
        smallest, largest = (high - 0.05) / (low + 0.05), (high + 0.05) / (low - 0.05)
        steps = [k for k in range(1, 6) if smallest <= check.GRID_STEP ** k <= largest]
        assert steps, (low, high)


def test_vanilla_diloco_1b_by_hand(result):
    # 1B, H = 100, bf16, M = 2: one ring allreduce of 2N bytes every 100 steps, 2(M−1)/M·2N/B = 2N/B, hidden
    # behind the backward pass (2/3 of c) of that step: per step comm = 2N/B/100, w = (2/3)/100.
    c, n, gbits = 0.1, 1e9, 6.2
    comm = 2 * n / (gbits * 1e9 / 8) / 100
    cu = c / (c + max(0.0, comm - (2 / 3) / 100 * c))
    point = _point(result, "1B", "Vanilla DiLoCo", 0.8)
    assert point["gbit_per_second"] == gbits and point["ours_at"] == pytest.approx(cu)
    # Just below 80 % here and above it a grid step lower? Neither: 0.1 pp under the target.
    assert point["difference"] == pytest.approx(cu - 0.8) and -0.002 < point["difference"] < 0


def test_data_parallel_10b_by_hand(result):
    # Every step, 2N bytes (N = 1e10) at 222.3 Gbit/s, hidden behind 2/3 of c = 0.8 s: CU = 0.8/(0.8 + T − 0.533).
    c, n, gbits = 0.8, 1e10, 222.3
    t = 2 * n / (gbits * 1e9 / 8)
    cu = c / (c + t - 2 / 3 * c)
    at_80, at_90 = _point(result, "10B", "Data-Parallel", 0.8), _point(result, "10B", "Data-Parallel", 0.9)
    assert at_80["ours_at"] == pytest.approx(cu) == at_90["ours_at"]
    below = c / (c + 2 * n / (gbits / check.GRID_STEP * 1e9 / 8) - 2 / 3 * c)
    assert below < 0.8 <= cu < 0.9  # the 80 % point reproduced, the 90 % one missed
    assert at_80["difference"] == 0.0 and at_90["difference"] == pytest.approx(cu - 0.9)
    # The hidden share that would put CU at 90 % there: T/c − (1/0.9 − 1), more than the model's 2/3.
    assert at_90["implied_hidden"] == pytest.approx(t / c - (1 / 0.9 - 1)) and at_90["implied_hidden"] > 2 / 3
    assert "at least 79%" in check.reading(at_90) and "the model 67%" in check.reading(at_90)


def test_streaming_overlapped_fp4_100b_by_hand(result):
    # 108 layers / 3 = 36 fragments, each 0.5·N/36 bytes every 100/36 steps, hidden behind one step plus the
    # backward pass: w = 36/100 · (1 + 2/3) = 0.6; per step comm = 0.5·N/B/100 (ring factor 1).
    c, n, gbits = 4.9, 1e11, 1.1
    comm = 0.5 * n / (gbits * 1e9 / 8) / 100
    w = 36 / 100 * (1 + 2 / 3)
    point = _point(result, "100B", "Streaming DiLoCo w/ overlapped FP4 com.", 0.95)
    assert point["hidden"] == pytest.approx(w)
    assert point["ours_at"] == pytest.approx(c / (c + max(0.0, comm - w * c)))


def test_the_comparison_is_reproduced_from_the_committed_points(result):
    # The committed JSON and both pages' tables are what the points give; the summary counts are theirs.
    committed = json.loads((projection_report.OUT / "streaming_diloco_paper.json").read_text())
    assert committed == json.loads(json.dumps(result))
    page = projection_report.PAGE.read_text()
    assert check.render_summary_table(result) in page
    assert check.render_points(result) in projection_report.TABLES_PAGE.read_text()
    within = sum(abs(p["difference"]) <= check.TOLERANCE + 1e-12 for p in result["points"])
    assert result["within"] == within and result["total"] == 75
    assert f"**{within} of its 75 points within" in page
    # Every point outside the tolerance has its line, and names the assumption that differs.
    missed = [p for p in result["points"] if abs(p["difference"]) > check.TOLERANCE + 1e-12]
    lines = check.outliers(result).splitlines()
    assert len(lines) == len(missed) and all("overlap:" in line for line in lines)


def test_the_difference_is_the_distance_from_the_papers_bracket():
    assert check.difference(0.83, 0.79, 0.8) == 0.0
    assert check.difference(0.76, 0.70, 0.8) == pytest.approx(-0.04)
    assert check.difference(0.99, 0.93, 0.9) == pytest.approx(0.03)


def test_needed_is_where_the_model_reaches_the_target(result):
    data = check.load()
    model, method = data["models"][0], check.METHODS[0]
    gbits = check.needed(model, method, 0.9, data)
    assert check.utilisation(model, method, gbits, data) >= 0.9 > check.utilisation(model, method, gbits * 0.999,
                                                                                      data)
    assert math.isclose(_point(result, "1B", "Data-Parallel", 0.9)["ours_needed_gbit_per_second"], gbits)


def test_cli_paper_table():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "project", "--paper", "streaming-diloco"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()[2:]
    assert len(rows) == 15 and rows[0].startswith("| 1B | Data-Parallel | SyncAverage | 86.8: ")
