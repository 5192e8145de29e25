"""train.py with --overlap 1 on both collective paths: Horovod's (horovodrun --gloo) and the direct
one (--collectives mpi-direct under horovodrun --mpi). The arithmetic is checked in tests/unit/test_overlap.py."""
import os
import re

import pytest

from tests.helpers import ROOT, launch

pytestmark = pytest.mark.multiproc
TRAIN = os.path.join(ROOT, "train.py")
FINAL = re.compile(r"final test accuracy: (\d\.\d{4})")


@pytest.mark.parametrize("strategy, launcher, collectives", [("easgd", "gloo", "horovod"),
                                                             ("periodic", "mpi", "mpi-direct")])
def test_train_py_with_overlap_one_trains_and_checkpoints(strategy, launcher, collectives, tmp_path):
    run_dir = str(tmp_path / "run")
    proc = launch([TRAIN, "--strategy", strategy, "--tau", "4", "--overlap", "1", "--epochs", "4",
                   "--collectives", collectives, "--run-dir", run_dir, "--no-tensorboard"], launcher, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert float(FINAL.findall(proc.stdout)[-1]) >= 0.9
    assert any(name.startswith("epoch") for name in os.listdir(os.path.join(run_dir, "checkpoints")))
