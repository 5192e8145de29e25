"""Compressed payloads across real ranks (issue 24, section B): the quantised allreduce (bf16, int8, int4,
sign) and DiLoCo int8 under horovodrun --gloo and horovodrun --mpi at np = 3 (Horovod's alltoall +
allgather form, under both of its controllers) and on the direct MPI path under mpirun at np = 3 (MpiDirectAlltoall), one launch each;
in the same launches the sparse allreduce and DiLoCo with topk (issue 62: one allgather, every rank the
reference's bits); and train.py on digits with --strategy diloco --compression int8 through Horovod under
horovodrun --mpi (the allgather form at np = 2).
"""
import json
import os
import re

import numpy as np
import pytest

from tests import reference as ref
from tests.helpers import ROOT, launch, read_rank_results, script

pytestmark = pytest.mark.multiproc
LAUNCHES = [("gloo", "horovod", 3), ("mpi", "horovod", 3), ("mpirun", "mpi-direct", 3)]


@pytest.mark.parametrize("launcher, collectives, size", LAUNCHES, ids=[f"{l}-{c}-np{n}" for l, c, n in LAUNCHES])
def test_quantised_collectives_match_the_reference_on_every_rank(launcher, collectives, size, tmp_path):
    proc = launch([script("compression_checks.py"), str(tmp_path), collectives], launcher, np=size, timeout=200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    ranks = read_rank_results(tmp_path, size)
    alltoall = ranks[0]["has_alltoall"] and size > 2
    for r in ranks:
        for name in ("bf16", "int8", "int4", "sign"):
            got = r[name]
            assert got["equals_reference"] and got["identical_maxdiff"] == 0.0
            assert got["traced_relative_error"] <= 1e-6
            assert got["exact_value"] == [size * (size + 1) / 2]
            message = ref.quantised_message_bytes(900, 1, name, size if alltoall else 2)
            assert got["account"] == ({"bytes": (size + 1) * message, "calls": 2,
                                       "wire_bytes": 2 * (size - 1) * message} if alltoall else
                                      {"bytes": message, "calls": 1, "wire_bytes": (size - 1) * message})
        if r["has_alltoall"]:  # rank j receives part j of every rank's bytes, in rank order
            assert r["alltoall"] == [10 * src + r["rank"] for src in range(size) for _ in range(3)]
        diloco = r["diloco"]
        assert diloco["identical_maxdiff"] == 0.0 and diloco["residual_norm"] > 0.0
        message = ref.quantised_message_bytes(ref.DIM, 1, "int8", size if alltoall else 2)
        assert diloco["account"] == ({"bytes": 3 * (size + 1) * message, "calls": 6,
                                      "wire_bytes": 3 * 2 * (size - 1) * message} if alltoall else
                                     {"bytes": 3 * message, "calls": 3, "wire_bytes": 3 * (size - 1) * message})
    assert len({tuple(r["diloco"]["weights"]) for r in ranks}) == 1
    # topk: one allgather of each rank's message, whatever the transport (sparse_allreduce.py)
    message = ref.topk_message_bytes(9000, 1, 0.01, 2)
    small = ref.topk_message_bytes(ref.DIM, 1, 2 / 4095, 2)
    for r in ranks:
        got = r["topk"]
        assert got["equals_reference"] and got["conserved"] and got["identical_maxdiff"] == 0.0
        assert got["traced_relative_error"] <= 1e-6 and got["exact_value"] == [size * (size + 1) / 2]
        assert got["account"] == {"bytes": message, "calls": 1, "wire_bytes": (size - 1) * message}
        diloco = r["diloco_topk"]
        assert diloco["identical_maxdiff"] == 0.0 and diloco["residual_norm"] > 0.0
        assert diloco["account"] == {"bytes": 3 * small, "calls": 3, "wire_bytes": 3 * (size - 1) * small}
    assert len({tuple(r["diloco_topk"]["weights"]) for r in ranks}) == 1


def test_train_py_diloco_int8_on_digits_reaches_095_with_its_wire_formula(tmp_path):
    run_dir = str(tmp_path / "run")
    proc = launch([os.path.join(ROOT, "train.py"), "--strategy", "diloco", "--compression", "int8", "--run-dir",
                   run_dir, "--no-tensorboard", "--collectives", "horovod"], "mpi", timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    accuracy = float(re.findall(r"final test accuracy: (\d\.\d{4})", proc.stdout)[-1])
    assert accuracy >= 0.95
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    # every tau = 10 steps one allgather of the 38282 digits CNN parameters in int8 blocks and the exact flag
    # (a 1-element tensor would travel exact too: the CNN has none)
    message = -(-38282 // 256) * 260 + 4
    steps = 22  # per epoch at np=2: 220 steps, 22 synchronisations
    for key in ("bytes_sent_per_step", "wire_bytes_per_step"):  # equal at p = 2: (p-1) * S for an allgather
        assert sum(row[key] * steps for row in metrics["epochs"]) == pytest.approx(22 * message, rel=1e-12)
    assert round(message / (4 * (38282 + 1)), 4) == 0.2547  # of fp32 DiLoCo's wire bytes (goal: <= 0.30)
