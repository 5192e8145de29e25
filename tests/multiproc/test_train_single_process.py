"""Plain `python train.py` (one process, no launcher) on each kind of data, and its one-line usage error.

These start train.py, so they are in the multiproc tier (the unit tier, `make test-fast`, launches nothing)."""
import json
import os

import numpy as np
import pytest

from tests.helpers import PYTHON, ROOT, run
from tests.multiproc.helpers import assert_train_run_ended_well, train_run_result, train_runs

pytestmark = pytest.mark.multiproc
TRAIN = os.path.join(ROOT, "train.py")


def train(tmp_path, *options, timeout=180):
    run_dir = str(tmp_path / "run")
    out = run([PYTHON, TRAIN, "--run-dir", run_dir, "--threads-per-rank", "2", *options], timeout=timeout)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    with open(os.path.join(run_dir, "metrics.json")) as f:
        return json.load(f), out, run_dir


def test_digits_one_process_reaches_095(tmp_path):
    metrics, out, _ = train(tmp_path)  # the defaults
    assert metrics["final"]["test_accuracy"] >= 0.95
    assert out.stdout.strip().splitlines()[-1] == f"final test accuracy: {metrics['final']['test_accuracy']:.4f}"


def test_synthetic_images_for_throughput(tmp_path):
    metrics, _, _ = train(tmp_path, "--data", "synthetic", "--image-shape", "16,16,3", "--num-classes", "4",
                          "--epochs", "1", "--batch-size", "64")
    row = metrics["epochs"][0]
    # 2,048 training images in steps of 64 on one rank, timed without the evaluation
    assert row["samples_per_sec"] == pytest.approx(2048 / row["seconds"], rel=1e-9)
    # one rank has no one to talk to: no collective, nothing sent
    assert row["collective_calls_per_step"] == 0.0 and row["bytes_sent_per_step"] == 0.0
    # random labels cannot be learnt: the test accuracy is chance (1/4), and the final
    # evaluation sees the same weights and test set as the epoch's validation
    assert abs(metrics["final"]["test_accuracy"] - 0.25) <= 0.1
    assert metrics["final"]["test_accuracy"] == pytest.approx(row["test_accuracy"], abs=1e-6)


def test_npz_data_learns_a_separable_problem(tmp_path):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    x = rng.normal(0, 0.3, (400, 6, 6)).astype(np.float32)
    x[y == 1, :3] += 1.0  # class 1 is bright on top
    np.savez(tmp_path / "d.npz", x=x, y=y)
    metrics, _, _ = train(tmp_path, "--data", f"npz:{tmp_path / 'd.npz'}", "--epochs", "4")
    assert metrics["final"]["test_accuracy"] >= 0.9


def test_resume_continues_from_the_last_checkpoint(tmp_path):
    # The three runs share one process (issue 41 §4: a start imports TensorFlow, 4-5 s of CPU):
    # scripts/train_runs.py calls train.py's main() for each, in order; test_a_real_process_exits_2
    # keeps a usage error's path through a process of its own.
    out, run_dir = str(tmp_path), str(tmp_path / "run")
    first = ["--run-dir", run_dir, "--threads-per-rank", "2", "--epochs", "2", "--strategy", "easgd", "--tau", "5"]
    proc = train_runs(out, [{"name": "first", "argv": first},
                            {"name": "resumed", "argv": ["--resume", run_dir, "--epochs", "3"]},
                            {"name": "again", "argv": ["--run-dir", run_dir]}], launcher=None, np=1, step_seconds=180)
    assert_train_run_ended_well(out, "first", proc, 1)
    resumed = assert_train_run_ended_well(out, "resumed", proc, 1)
    with open(os.path.join(run_dir, "metrics.json")) as f:
        epochs = [row["epoch"] for row in json.load(f)["epochs"]]
    assert epochs == [1, 2, 3]
    assert "Epoch 3/3" in resumed.stdout and "Epoch 1/3" not in resumed.stdout
    # model.keras is the EASGD center: it reproduces the final (center) test accuracy
    import keras

    from hvd_easgd.app import data

    digits = data.digits()
    saved = keras.models.load_model(os.path.join(run_dir, "model.keras"))
    with open(os.path.join(run_dir, "metrics.json")) as f:
        final = json.load(f)["final"]["test_accuracy"]
    assert saved.evaluate(digits.x_test, digits.y_test, verbose=0)[1] == pytest.approx(final, abs=1e-6)
    again = train_run_result(out, "again", proc, 1)
    assert again.returncode == 2 and "already holds checkpoints; continue it with --resume" in again.stderr


def test_a_real_process_exits_2_without_traceback():
    out = run([PYTHON, TRAIN, "--strategy", "easgd", "--moving-rate", "1.5"], timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == ("train.py: error: `moving_rate` (alpha) must satisfy 0 < alpha <= 2/(p+1) = 1 "
                                                   "with p=1 ranks, else the elastic step diverges. "
                                                   "Received: moving_rate=1.5")
    assert "Traceback" not in out.stderr
