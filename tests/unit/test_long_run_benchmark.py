"""benchmarks.accuracy.long_run: its table of memory per epoch and the growth and slope it leads with,
rendered from a results folder (metrics.json and command.txt) written here by hand."""
import json

import pytest

from benchmarks.accuracy import long_run

pytestmark = pytest.mark.unit


def test_the_page_leads_with_each_ranks_growth_after_its_first_epoch_and_its_slope(tmp_path):
    rss = [[800, 900], [810, 950], [820, 900], [830, 905]]  # rank 0 grows 10 MB an epoch; rank 1 settles
    epochs = [{"epoch": i + 1, "seconds": 300.0, "test_loss": 2.0 - 0.1 * i, "rss_mb": m} for i, m in enumerate(rss)]
    (tmp_path / "metrics.json").write_text(json.dumps({"epochs": epochs}))
    (tmp_path / "command.txt").write_text("horovodrun -np 2 python train.py --data python_docs --epochs 4\n")
    text = long_run.render(str(tmp_path))
    assert text.startswith("Resident memory after the first epoch, over 4 epochs (20 minutes of training): "
                           "rank 0 800 → 830 MB (+3.8 %, +10.0 MB an epoch from the second epoch on); "
                           "rank 1 900 → 905 MB (+0.6 %, -22.5 MB an epoch from the second epoch on).")
    assert "| 2 | 300 | 1.9000 | 810 | 950 |" in text
    assert long_run._slope([5.0]) == 0.0
