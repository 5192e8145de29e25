"""train.py with --overlap 1 on both collective paths: Horovod's (horovodrun --gloo) and the direct
one (--collectives mpi-direct under horovodrun --mpi). The arithmetic is checked in tests/unit/test_overlap.py
and tests/unit/test_diloco_overlap.py; DiLoCo's also across real ranks here, exact against NumPy."""
import os
import re

import numpy as np
import pytest

from tests import reference as ref
from tests.helpers import ROOT, launch, read_rank_results, script

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


@pytest.mark.timeout(200)
def test_diloco_overlap_across_real_ranks_matches_the_numpy_reference(tmp_path):
    proc = launch([script("diloco_overlap_checks.py"), str(tmp_path)], "gloo", np=2, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = read_rank_results(tmp_path, 2)
    shards, w0 = ref.least_squares_shards(2)
    bounds = np.cumsum([0, 2, 2, 2])
    for name, (tau, fragments, delta, compression, steps, merge) in {
            "tau10_f3_delta2": (10, 3, 2, "none", 17, "progress"),  # the default merge
            "tau4_f2_delta1_int8_mix": (4, 2, 1, "int8", 11, "mix")}.items():
        layout = ranks[0][name]["fragment_indices"]
        masks = [np.isin(np.arange(bounds[-1]), np.concatenate([np.arange(bounds[i], bounds[i + 1]) for i in ix]))
                 for ix in layout]
        reference = ref.DiLoCoOverlapReference(shards, w0, masks, tau, delta, name=compression, merge=merge)
        xs, theta = reference.run(steps, drain_after=steps)
        assert ranks[0][name]["in_flight_at_end"] == (name == "tau10_f3_delta2")  # 16 started, drained
        for r, result in enumerate(ranks):
            assert result[name]["pending_after_drain"] == 0
            np.testing.assert_allclose(result[name]["weights"], xs[r], rtol=1e-5, atol=1e-6, err_msg=name)
            np.testing.assert_allclose(result[name]["theta"], theta, rtol=1e-5, atol=1e-6, err_msg=name)
