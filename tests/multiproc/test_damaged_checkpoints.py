"""train.py under horovodrun -np 2 when checkpoints are damaged or the disk fills: it falls
back to the newest intact checkpoint with one line per skipped one, refuses in one line
(exit 2) when none is intact, and keeps training when a save fails.

One training run leaves six checkpoints; each resume works on a copy of its run
directory, damaged one way per checkpoint, so one launch checks every kind of damage."""
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from hvd_easgd import checkpoint
from hvd_easgd.checkpoint import verification
from tests.helpers import HOROVODRUN, PYTHON, ROOT, STOPPED_BY_LAUNCHER, horovodrun, quiet_env, run

pytestmark = pytest.mark.multiproc
TRAIN = os.path.join(ROOT, "train.py")
# np=2 on digits: 22 micro-batches in the epoch, a checkpoint every 4 of them and at its end.
OPTIONS = ["--epochs", "1", "--checkpoint-every-steps", "4", "--keep-checkpoints", "100", "--threads-per-rank",
           "1", "--seed", "3", "--no-tensorboard"]
NAMES = ["epoch-000000-step-000004", "epoch-000000-step-000008", "epoch-000000-step-000012",
         "epoch-000000-step-000016", "epoch-000000-step-000020", "epoch-000001"]
RANK0_LINE = re.compile(r"^\[(1,)?0\]<std(out|err)>:")
TRACEBACK = re.compile(r"^\[\d+(,\d+)?\]<std(err|out)>:\s*Traceback", re.M)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("straight") / "run")
    proc = horovodrun([TRAIN, *OPTIONS, "--run-dir", run_dir], timeout=150)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == NAMES
    return run_dir


def copy_run(straight, run_dir):
    shutil.copytree(straight, run_dir)
    return run_dir


def shard(run_dir, name, rank=1):
    return os.path.join(run_dir, "checkpoints", name, f"rank-{rank:05d}.npz")


def truncate(path):
    os.truncate(path, os.path.getsize(path) // 2)


def alter(path):
    # One byte in the middle of the arrays' data: same size, another content.
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))


def lines_with(text, word):
    return [line for line in text.splitlines() if word in line]


def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(straight, tmp_path):
    run_dir = copy_run(straight, str(tmp_path / "damaged"))
    manifest = os.path.join(run_dir, "checkpoints", NAMES[5], checkpoint.MANIFEST)
    with open(manifest, "w") as f:
        f.write('{"format": 2, "epoch": ')  # a manifest cut short
    truncate(shard(run_dir, NAMES[4]))
    alter(shard(run_dir, NAMES[3]))
    os.remove(shard(run_dir, NAMES[2]))
    os.remove(os.path.join(run_dir, "checkpoints", NAMES[1], checkpoint.MANIFEST))  # an interrupted save
    proc = horovodrun([TRAIN, "--auto-resume", "--run-dir", run_dir], timeout=150)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    skipped = lines_with(text, "skipping checkpoint")
    assert all(RANK0_LINE.match(line) for line in skipped), skipped
    reasons = {name: [line for line in skipped if name in line] for name in NAMES[1:]}
    assert all(len(found) == 1 for found in reasons.values()), skipped
    assert "manifest.json does not parse" in reasons[NAMES[5]][0]
    assert "rank-00001.npz holds" in reasons[NAMES[4]][0] and "bytes, the manifest says" in reasons[NAMES[4]][0]
    assert "rank-00001.npz: SHA-256" in reasons[NAMES[3]][0]
    assert "rank-00001.npz is missing" in reasons[NAMES[2]][0]
    assert "interrupted save (no manifest.json)" in reasons[NAMES[1]][0]
    assert len(lines_with(text, f"resuming from checkpoint {NAMES[0]}")) == 1
    assert not TRACEBACK.search(text), text[-3000:]
    # From micro-batch 4 the resumed run retrains the rest of the epoch exactly
    # as the straight run did: the same state at its end, on both ranks.
    for rank in range(2):
        with np.load(shard(straight, NAMES[5], rank)) as expected, np.load(shard(run_dir, NAMES[5], rank)) as got:
            assert expected.files == got.files
            assert all(np.array_equal(expected[k], got[k]) for k in expected.files)


def test_no_intact_checkpoint_refuses_in_one_line_with_exit_2(straight, tmp_path):
    run_dir = copy_run(straight, str(tmp_path / "ruined"))
    for name in NAMES:
        truncate(shard(run_dir, name, rank=0))
    proc = horovodrun([TRAIN, "--resume", run_dir], timeout=120)
    text = proc.stdout + proc.stderr
    errors = lines_with(text, "train.py: error")
    assert len(errors) == 1 and RANK0_LINE.match(errors[0]), text[-3000:]
    assert f"--resume {run_dir}: no intact checkpoint" in errors[0] and "rank-00000.npz holds" in errors[0]
    assert "collective failed" not in text and not TRACEBACK.search(text), text[-3000:]
    exit_codes = dict(re.findall(r"Process (\d+) exit with status code (\d+)", text))  # Gloo's summary
    assert exit_codes.get("0") == "2" and set(exit_codes.values()) <= {"2"} | STOPPED_BY_LAUNCHER, exit_codes


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs in a private mount namespace needs root")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_a_full_disk_keeps_the_previous_checkpoint_and_training_goes_on(tmp_path):
    # A 1200 KiB tmpfs holds one checkpoint of the digits CNN at np=2 (two shards of 0.31 MB) and the
    # final model.keras (0.5 MB), but not a second checkpoint: in one epoch of 22 micro-batches, the
    # save at micro-batch 11 fits and the epoch end's fails.
    mount = tmp_path / "small"
    mount.mkdir()
    run_dir, kept = mount / "run", tmp_path / "kept"
    train = subprocess.list2cmdline([HOROVODRUN, "-np", "2", "--gloo", "--network-interface", "lo", PYTHON, TRAIN,
                                     "--epochs", "1", "--checkpoint-every-steps", "11", "--threads-per-rank", "1",
                                     "--no-tensorboard", "--run-dir", str(run_dir)])
    inside = (f"mount -t tmpfs -o size=1200k tmpfs {mount} && {{ {train}; status=$?; cp -r {run_dir} {kept}; "
              f"umount {mount}; exit $status; }}")
    proc = run(["unshare", "--mount", "--propagation", "private", "sh", "-c", inside], timeout=150, env=quiet_env())
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert not os.path.ismount(mount) and os.listdir(mount) == []
    failed = lines_with(text, "not saved")
    assert len(failed) == 1 and RANK0_LINE.match(failed[0]), text[-3000:]
    assert "checkpoint epoch-000001 not saved" in failed[0] and "No space left on device" in failed[0]
    assert "epoch-000000-step-000011 stays the newest" in failed[0]
    assert not TRACEBACK.search(text), text[-3000:]
    # The failed save left nothing behind; the previous checkpoint is whole.
    assert sorted(os.listdir(kept / "checkpoints")) == ["epoch-000000-step-000011"]
    manifest, directory = checkpoint.latest(str(kept))
    assert manifest["step_in_epoch"] == 11 and verification.problem(directory, manifest) is None
    assert [row["epoch"] for row in json.load(open(kept / "metrics.json"))["epochs"]] == [1]  # training went on
    assert os.path.isfile(kept / "model.keras")
