"""train.py --elastic under horovodrun's elastic mode (Gloo, 3 ranks, --min-np 2): a rank
killed with SIGKILL mid-epoch, the survivors continuing at 2, a replacement growing the job
back to 3, and the weights after a failure equal to a checkpoint resize at the same step.

Two "hosts" are this machine under two names (``localhost`` and ``127.0.0.1``): Horovod's
elastic driver blacklists the *host* of a failed worker, so the victim is alone on its
name. The failure falls at a fixed micro-batch through the test-only hook of
hvd_easgd/checkpoint/elastic.py (``HVD_EASGD_TEST_DIE_AT_STEP``). The elastic driver's servers bind
to every address: these tests need the session's loopback-only network namespace
(tests/conftest.py) and are skipped outside it.
"""
import os
import re
import shutil

import numpy as np
import pytest

from hvd_easgd import checkpoint
from hvd_easgd.checkpoint import elastic
from tests.helpers import ROOT, horovodrun, horovodrun_elastic_command, quiet_env, run_watching
from tools import loopback_network

LOOPBACK_ONLY = "Horovod's elastic driver binds to every address: these tests run in a loopback-only namespace only"
pytestmark = [pytest.mark.multiproc, pytest.mark.skipif(not loopback_network.is_loopback_only(), reason=LOOPBACK_ONLY)]
TRAIN = os.path.join(ROOT, "train.py")
FINAL = re.compile(r"final test accuracy: (\d\.\d{4})")
KILLED_AT = re.compile(r"killing this rank at micro-batch (\d+) \(unix time ([\d.]+)\)")
CONTINUED = re.compile(r"elastic: continuing at (\d) ranks from the commit at epoch (\d+), micro-batch (\d+) "
                       r"\(state mapped from (\d) ranks.*unix time ([\d.]+)\)")
VICTIM_HOST = "127.0.0.1"
NEW_HOST = "127.0.0.2"  # the namespace's second loopback address: a replacement under a new host name
STEPS_AT_3 = 14  # micro-batches per epoch of digits' 1437 training samples at 3 ranks x 32
COMMON = ["--threads-per-rank", "1", "--seed", "0", "--no-tensorboard", "--checkpoint-every", "1",
          "--keep-checkpoints", "10"]
RECOVERY_SECONDS = 30


def discovery(tmp_path, hosts):
    """A discovery script that prints the lines of ``tmp_path/hosts`` (the test rewrites them)."""
    (tmp_path / "hosts").write_text("\n".join(hosts) + "\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {tmp_path / 'hosts'}\n")
    script.chmod(0o755)
    return str(script)


def elastic_run(tmp_path, run_dir, epochs, die_at, watch=lambda text: None, timeout=170, extra=(), hooks=None):
    env = quiet_env(**{elastic.TEST_DIE_AT_STEP: str(die_at), elastic.TEST_DIE_ON_HOST: VICTIM_HOST, **(hooks or {})})
    cmd = horovodrun_elastic_command([TRAIN, "--elastic", "--epochs", str(epochs), "--run-dir", run_dir, *COMMON,
                                      *extra], discovery(tmp_path, ["localhost:2", f"{VICTIM_HOST}:1"]))
    return run_watching(cmd, str(tmp_path / "log"), watch, timeout=timeout, env=env)


def final_state(run_dir, epoch, rank=0):
    with np.load(os.path.join(checkpoint.checkpoint_dir(run_dir, epoch), f"rank-{rank:05d}.npz")) as shard:
        return {key: shard[key] for key in shard.files}


def test_a_rank_killed_mid_epoch_the_survivors_finish_at_2_as_a_checkpoint_resize_would(tmp_path):
    epochs = 5
    run_dir = str(tmp_path / "elastic")
    # Killed after the first micro-batch of epoch 2: the last commit is epoch 1's end.
    status, text = elastic_run(tmp_path, run_dir, epochs, die_at=STEPS_AT_3 + 1)
    assert status == 0, text[-4000:]
    killed = KILLED_AT.search(text)
    continued = CONTINUED.findall(text)
    assert killed and int(killed.group(1)) == STEPS_AT_3 + 1, text[-4000:]
    assert [c[:4] for c in continued] == [("2", "1", "0", "2")], text[-4000:]  # at 2, from epoch 1's commit
    recovery = float(continued[0][4]) - float(killed.group(2))
    assert 0 < recovery <= RECOVERY_SECONDS, f"recovered {recovery:.1f}s after the kill"
    accuracy = float(FINAL.findall(text)[-1])
    assert accuracy >= 0.95
    assert f"Epoch {epochs}/{epochs}" in text and "Traceback" not in text

    # The reference: the same run resized from its epoch-1 checkpoint (3 ranks) to 2 by --resume.
    reference = str(tmp_path / "reference")
    os.makedirs(os.path.join(reference, "checkpoints"))
    shutil.copytree(checkpoint.checkpoint_dir(run_dir, 1), checkpoint.checkpoint_dir(reference, 1))
    for name in ("config.yaml", "metrics.json"):
        shutil.copy(os.path.join(run_dir, name), reference)
    proc = horovodrun([TRAIN, "--resume", reference, "--no-elastic", *COMMON], np=2, timeout=150)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resuming at 2 ranks from a checkpoint of 3" in proc.stdout
    ours, theirs = final_state(run_dir, epochs), final_state(reference, epochs)
    assert sorted(ours) == sorted(theirs)
    for key in ours:
        np.testing.assert_allclose(ours[key], theirs[key], rtol=1e-6, atol=1e-7, err_msg=key)


def test_a_replacement_on_a_new_host_grows_the_job_back_to_3(tmp_path):
    run_dir = str(tmp_path / "grow")
    added = []

    def add_a_host_once_the_survivors_continue(text):
        if not added and "elastic: continuing at 2 ranks" in text:
            (tmp_path / "hosts").write_text(f"localhost:2\n{VICTIM_HOST}:1\n{NEW_HOST}:1\n")
            added.append(True)

    # Commits every 4 micro-batches: the ranks learn of the new host at the next one (Horovod's
    # driver looks every second). At 2 ranks each micro-batch sleeps 0.1 s (the pace hook), so
    # the 5 epochs left give the driver at least 11 s: without it, a CI run's survivors finished
    # all 6 epochs in 2 s, before the new host was seen.
    status, text = elastic_run(tmp_path, run_dir, epochs=6, die_at=STEPS_AT_3 + 1,
                               watch=add_a_host_once_the_survivors_continue, extra=["--elastic-commit-every", "4"],
                               hooks={elastic.TEST_PACE_BELOW_SIZE: "3:0.1"})
    assert status == 0, text[-4000:]
    sizes = [int(c[0]) for c in CONTINUED.findall(text)]
    assert sizes[:1] == [2] and sizes[-1] == 3, text[-4000:]
    assert "Epoch 6/6" in text and "Traceback" not in text
