"""train.py --strategy auto under horovodrun on one host: the job measures itself, rank 0 prints the one
line, every rank trains the choice, config.yaml keeps it, and a resume builds the same strategy without
measuring again. On one host there is no link to pay for, so the choice is SyncAverage at full precision."""
import os

import pytest
import yaml

from tests.helpers import ROOT, launch

pytestmark = pytest.mark.multiproc
TRAIN = os.path.join(ROOT, "train.py")


def _config(run_dir):
    with open(os.path.join(run_dir, "config.yaml")) as f:
        return yaml.safe_load(f)


@pytest.mark.timeout(200)
def test_auto_on_one_host_chooses_sync_and_a_resume_keeps_the_choice(tmp_path):
    run_dir = str(tmp_path / "run")
    out = launch([TRAIN, "--strategy", "auto", "--epochs", "1", "--run-dir", run_dir, "--threads-per-rank", "1"],
                 "gloo", np=2, timeout=150)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    config = _config(run_dir)
    choice = config["config"]["auto_choice"]
    assert choice["candidate"] == {"strategy": "sync", "compression": "none", "period": 1, "hierarchical": False}
    # within a host only shared memory to pay for: sync's predicted utilisation is all but 1
    assert choice["hosts"] == 1 and choice["ranks_per_host"] == 2 and choice["utilisation"] > 0.9
    assert choice["compute"] > 0 and not any("hierarchical" in p["candidate"] for p in choice["predictions"])
    lines = [line for line in out.stdout.splitlines() if "auto: " in line]
    assert len(lines) == 1 and lines[0].endswith(choice["reason"]), out.stdout[-2000:]  # rank 0 alone
    assert choice["measure_seconds"] < 30

    out = launch([TRAIN, "--resume", run_dir, "--epochs", "2", "--threads-per-rank", "1"], "gloo", np=2, timeout=150)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "auto: " not in out.stdout  # nothing measured again: the saved choice
    resumed = _config(run_dir)
    assert resumed["config"]["auto_choice"] == choice
