"""A strategy from outside hvd_easgd, trained by train.py under horovodrun -np 2 --gloo:
``--plugin fast_periodic`` (tests/plugins, on PYTHONPATH) registers a PeriodicAverage
subclass; it takes ``--tau`` and the default ``--scale-lr auto`` applies its parent's
rule; ``--resume`` imports the plugin again from the saved config."""
import json
import os

import pytest
import yaml

from hvd_easgd import PeriodicAverage
from tests.helpers import ROOT, horovodrun, quiet_env

pytestmark = pytest.mark.multiproc
TRAIN = os.path.join(ROOT, "train.py")
# Measured here (seed 0, tau 5, the x2 rate): 0.864 after 2 epochs, 0.944 resumed to 3.
FLOOR_2_EPOCHS, FLOOR_3_EPOCHS = 0.8, 0.9


@pytest.mark.timeout(200)
def test_a_plugin_strategy_trains_and_resumes_from_its_saved_config(tmp_path):
    run_dir, imports = str(tmp_path / "run"), str(tmp_path / "imports.log")
    env = quiet_env(PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests", "plugins")]),
                    FAST_PERIODIC_IMPORT_LOG=imports)
    out = horovodrun([TRAIN, "--plugin", "fast_periodic", "--strategy", "fast_periodic", "--tau", "5",
                      "--epochs", "2", "--run-dir", run_dir], timeout=90, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert len(open(imports).read().split()) == 2  # imported on every rank
    run = yaml.safe_load(open(os.path.join(run_dir, "config.yaml")))
    assert (run["config"]["strategy"], run["config"]["plugin"], run["config"]["tau"]) == (
        "fast_periodic", ["fast_periodic"], 5)
    assert run["config"]["scale_lr"] is True  # --scale-lr auto: the parent's rule applies
    assert run["learning_rate"]["factor"] == PeriodicAverage.lr_scale_factor(2) == 2.0
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    print(f"after 2 epochs: {metrics['final']['test_accuracy']:.4f}")
    assert metrics["final"]["test_accuracy"] >= FLOOR_2_EPOCHS, metrics["final"]

    # No --plugin: the saved config names it, and it is imported before its strategy is checked.
    out = horovodrun([TRAIN, "--resume", run_dir, "--epochs", "3"], timeout=90, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert len(open(imports).read().split()) == 4  # both ranks of the resumed run imported it again
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert [row["epoch"] for row in metrics["epochs"]] == [1, 2, 3]
    print(f"resumed to 3 epochs: {metrics['final']['test_accuracy']:.4f}")
    assert metrics["final"]["test_accuracy"] >= FLOOR_3_EPOCHS, metrics["final"]
