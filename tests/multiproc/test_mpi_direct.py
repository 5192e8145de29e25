"""train.py through the direct MPI communicator (--collectives mpi-direct), under
both MPI launch styles; and its refusal under a Gloo launch.

The strategy checks through it run in test_strategies.py (LAUNCHES).
"""
import json
import os
import re

import pytest
import yaml

from tests.helpers import ROOT, STOPPED_BY_LAUNCHER, launch, script

pytestmark = pytest.mark.multiproc
TRAIN = os.path.join(ROOT, "train.py")
FINAL = re.compile(r"final test accuracy: (\d\.\d{4})")
DIGITS_CNN_PARAMS = 38282


# Under horovodrun --mpi it is in the smoke subset: train.py on the direct path.
@pytest.mark.parametrize("launcher", [pytest.param("mpi", marks=pytest.mark.smoke), "mpirun"])
def test_train_py_over_mpi_direct_reaches_095_with_the_horovod_byte_account(launcher, tmp_path):
    run_dir = str(tmp_path / "run")
    proc = launch([TRAIN, "--collectives", "mpi-direct", "--run-dir", run_dir, "--no-tensorboard"], launcher,
                  timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    accuracy = float(FINAL.findall(proc.stdout)[-1])
    assert accuracy >= 0.95
    config = yaml.safe_load(open(os.path.join(run_dir, "config.yaml")))
    assert config["config"]["collectives"] == "mpi-direct" and config["num_ranks"] == 2
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    for row in metrics["epochs"]:
        # what the Horovod path sends (test_train.py): all gradients, one grouped call per step
        assert row["collective_calls_per_step"] == 1.0
        assert row["bytes_sent_per_step"] == 4 * DIGITS_CNN_PARAMS


def test_mpi_direct_under_gloo_is_refused_with_one_message_and_exit_2():
    out = launch([TRAIN, "--collectives", "mpi-direct"], "gloo", timeout=120)
    text = out.stdout + out.stderr
    messages = [line for line in text.splitlines() if "train.py: error" in line]
    assert len(messages) == 1 and "`collectives` must be \"auto\" or \"horovod\" under a Gloo launch" in messages[0], text[-3000:]
    # no rank printed a traceback (horovodrun's own summary may follow, unprefixed)
    assert not re.search(r"^\[\d+(,\d+)?\]<std(err|out)>:\s*Traceback", text, re.M), text[-3000:]
    exit_codes = dict(re.findall(r"Process (\d+) exit with status code (\d+)", text))  # horovodrun's summary
    assert exit_codes.get("0") == "2" and set(exit_codes.values()) <= {"2"} | STOPPED_BY_LAUNCHER, exit_codes


def test_a_late_rank_is_awaited_napping_and_one_that_never_arrives_aborts_the_job():
    # rank 1 first comes 1 s late, then sleeps past the 3 s stall limit that rank 0's allreduce waits
    out = launch([script("direct_stall.py"), "3"], "mpirun", timeout=120)
    text = out.stdout + out.stderr
    waited = re.search(r"rank 0 waited ([\d.]+) s using ([\d.]+) s of CPU", text)
    assert waited, text[-3000:]
    wall, cpu = map(float, waited.groups())
    # Napping measured 0.11 s of CPU over the 1 s wait; polling throughout (HVD_EASGD_MPI_DIRECT_WAIT=spin) 0.97 s.
    assert wall >= 0.9 and cpu < 0.35 * wall, (wall, cpu)
    assert out.returncode != 0
    assert "has waited 3 s for the other ranks" in text, text[-3000:]
    assert "rank 1 woke" not in text  # the job ended before the sleeper came back
