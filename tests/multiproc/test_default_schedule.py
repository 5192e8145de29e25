"""The mission's own command, `horovodrun -np N python train.py` with no option but the run
directory, at N = 8 (5 updates an epoch on digits) and N = 4: the defaults (--scale-lr auto, the
default --epochs) reach 0.95 there, and config.yaml records the rate and epochs they resolved to.

The run at 8 ranks is the "sync" run of tests/multiproc/helpers.py's mission_scale_launch(), one launch of 8 ranks
shared with test_every_strategy_at_np8.py's runs (scripts/train_runs.py calls train.py's main() for each on every
rank): a launch of 8 ranks on 2 cores spends 35-40 s importing TensorFlow. The run at 4 ranks has its own."""
import json
import os

import pytest
import yaml

from hvd_easgd.app.data import digits, steps_per_epoch
from hvd_easgd.app.lr_scaling import DEFAULT_LR, default_epochs
from hvd_easgd.strategies import SyncAverage
from tests.helpers import ROOT, horovodrun
from tests.multiproc.helpers import (MISSION_SCALE_LAUNCH_SECONDS, MISSION_SCALE_SIZE, assert_run_ended_well,
                                     mission_scale_launch)

pytestmark = pytest.mark.multiproc
TRAIN = os.path.join(ROOT, "train.py")


# np=8 may set up the shared launch (its bound, and a margin); np=4 is a launch of its own.
@pytest.mark.parametrize("np_, epochs", [
    pytest.param(8, 20, marks=pytest.mark.timeout(MISSION_SCALE_LAUNCH_SECONDS + 60)),
    pytest.param(4, 10, marks=pytest.mark.timeout(300))])
def test_the_mission_command_reaches_095_at_the_rate_and_length_it_records(np_, epochs, tmp_path, tmp_path_factory):
    if np_ == MISSION_SCALE_SIZE:
        out, proc = mission_scale_launch(tmp_path_factory)
        run_dir = os.path.join(out, "sync", "run")
        assert_run_ended_well(out, "sync", ["--run-dir", run_dir], proc, np_)  # no option but the run directory
    else:
        run_dir = str(tmp_path / "run")
        proc = horovodrun([TRAIN, "--run-dir", run_dir], np=np_, controller="mpi", timeout=280)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    print(f"np={np_}: final test accuracy {metrics['final']['test_accuracy']:.4f}")
    assert metrics["final"]["test_accuracy"] >= 0.95

    run = yaml.safe_load(open(os.path.join(run_dir, "config.yaml")))
    updates = steps_per_epoch(len(digits().y_train), 32, np_)
    assert default_epochs(updates) == epochs  # 5 updates an epoch at 8 ranks: 20 epochs make 100
    config = run["config"]
    assert (config["lr"], config["scale_lr"], config["epochs"]) == (DEFAULT_LR, True, epochs)
    assert run["learning_rate"] == {"rate": pytest.approx(DEFAULT_LR * SyncAverage.lr_scale_factor(np_), rel=1e-12),
                                    "factor": pytest.approx(SyncAverage.lr_scale_factor(np_), rel=1e-12),
                                    "warmup_updates": 0}
    assert [row["epoch"] for row in metrics["epochs"]] == list(range(1, epochs + 1))
    assert all(row["bytes_sent_per_step"] == 4 * 38282 for row in metrics["epochs"])  # still plain sync
