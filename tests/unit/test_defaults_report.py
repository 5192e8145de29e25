"""docs/default-collectives.md is what benchmarks.accuracy.defaults_report renders from the committed results."""
import pytest

from benchmarks.accuracy import defaults_report

pytestmark = pytest.mark.unit


def test_the_committed_page_equals_its_render_from_the_committed_results():
    with open(defaults_report.PAGE) as f:
        assert f.read() == defaults_report.render()


def test_the_page_carries_the_default_paths_goal_rows():
    text = defaults_report.render()
    assert "| SyncAverage ÷ no communication | 2 | mpi-direct |" in text
    assert "| SyncAverage ÷ no communication | 1 | mpi-direct |" in text


def test_the_committed_training_page_equals_its_render_from_the_runs_files():
    with open(defaults_report.TRAINING_PAGE) as f:
        assert f.read() == defaults_report.render_training()


def test_every_default_run_on_the_training_page_reached_095():
    rows = [line for line in defaults_report.render_training().splitlines() if line.startswith("| `")]
    assert len(rows) == 14
    defaults = [r for r in rows if "--no-scale-lr" not in r]
    assert all(float(r.rsplit("|", 2)[1]) >= 0.95 for r in defaults), defaults
