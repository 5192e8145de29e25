"""`train.py --data images:DIR`: images of mixed sizes, one per micro-batch,
accumulated k at a time, under horovodrun -np 2.

The run is "images" of tests/multiproc/helpers.py's pair_launch(): one Gloo launch of 2 ranks shared with
other modules' runs (scripts/train_runs.py calls train.py's main() for each on every rank)."""
import json
import os

import pytest

from tests.multiproc.helpers import PAIR_LAUNCH_SECONDS, assert_run_ended_well, pair_argv, pair_launch

pytestmark = pytest.mark.multiproc


@pytest.mark.timeout(PAIR_LAUNCH_SECONDS + 60)  # may set up the shared launch: its bound, and a margin
def test_mixed_size_images_train_end_to_end(tmp_path_factory):
    out, launch = pair_launch(tmp_path_factory)
    folder, run_dir = os.path.join(out, "image-data"), os.path.join(out, "images", "run")
    argv = pair_argv(out, "images")
    assert argv == ["--data", f"images:{folder}", "--batch-size", "1", "--accumulate", "4", "--epochs", "6", "--lr",
                    "0.05", "--run-dir", run_dir]
    assert_run_ended_well(out, "images", argv, launch, 2)
    with open(os.path.join(run_dir, "metrics.json")) as f:
        metrics = json.load(f)
    # 38 training images → 19 per rank → 16 micro-batches (4 windows of k = 4) per epoch
    assert metrics["epochs"][0]["collective_calls_per_step"] == pytest.approx(1 / 4)
    assert metrics["final"]["test_accuracy"] >= 0.8
