"""Plain `python train.py` (one process, no launcher) on each kind of data, and its one-line usage error.

These start train.py, so they are in the multiproc tier (the unit tier, `make test-fast`, launches nothing).

Every run but the usage error's shares ONE process (issue 41 §4: a start imports TensorFlow, 4-5 s of CPU):
scripts/train_runs.py calls train.py's main() for each, in order, and each test reads its own run's exit
status, output and run directory; test_a_real_process_exits_2_without_traceback keeps a usage error's path
through a process of its own."""
import json
import os

import numpy as np
import pytest

from tests.helpers import PYTHON, ROOT, run
from tests.multiproc.helpers import assert_run_ended_well, train_run_result, train_runs

pytestmark = pytest.mark.multiproc
TRAIN = os.path.join(ROOT, "train.py")
RUN_SECONDS = 180  # each run's bound, as each had its own process's
# name: train.py's options after "--run-dir OUT/NAME/run --threads-per-rank 2" ("npz": its data file's path added).
TRAINED = {
    "digits": [],  # the defaults
    "synthetic": ["--data", "synthetic", "--image-shape", "16,16,3", "--num-classes", "4", "--epochs", "1",
                  "--batch-size", "64"],
    "npz": ["--epochs", "4"],
}
# The resume's three runs, on one run directory: first, resumed, then a fresh run refused there.
RESUME_RUNS = ("first", "resumed", "again")
# The first test sets up the process: every run's bound, and a margin.
PROCESS_TIMEOUT = RUN_SECONDS * (len(TRAINED) + len(RESUME_RUNS)) + 60


def write_separable_npz(path):
    """400 images of 6x6 in two classes, class 1 bright on top: a separable problem."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 400)
    x = rng.normal(0, 0.3, (400, 6, 6)).astype(np.float32)
    x[y == 1, :3] += 1.0  # class 1 is bright on top
    np.savez(path, x=x, y=y)


def trained_argv(out, name):
    options = TRAINED[name] + (["--data", f"npz:{os.path.join(out, 'd.npz')}"] if name == "npz" else [])
    return ["--run-dir", os.path.join(out, name, "run"), "--threads-per-rank", "2", *options]


def resume_argvs(out):
    run_dir = os.path.join(out, "resume-run")
    first = ["--run-dir", run_dir, "--threads-per-rank", "2", "--epochs", "2", "--strategy", "easgd", "--tau", "5"]
    return run_dir, {"first": first, "resumed": ["--resume", run_dir, "--epochs", "3"], "again": ["--run-dir", run_dir]}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """``(OUT, the process)``: every TRAINED run, then the RESUME_RUNS, in ONE plain `python` process
    (scripts/train_runs.py)."""
    out = str(tmp_path_factory.mktemp("one_process"))
    write_separable_npz(os.path.join(out, "d.npz"))
    _, resume = resume_argvs(out)
    runs = [{"name": name, "argv": trained_argv(out, name)} for name in TRAINED]
    runs += [{"name": name, "argv": resume[name]} for name in RESUME_RUNS]
    return out, train_runs(out, runs, launcher=None, np=1, step_seconds=RUN_SECONDS)


def train(one_process, name):
    """Run ``name`` of TRAINED, ended with status 0: ``(its metrics.json, the run as its own process would have
    returned it, its run directory)``."""
    out, proc = one_process
    result = assert_run_ended_well(out, name, trained_argv(out, name), proc, 1)
    run_dir = os.path.join(out, name, "run")
    with open(os.path.join(run_dir, "metrics.json")) as f:
        return json.load(f), result, run_dir


@pytest.mark.timeout(PROCESS_TIMEOUT)
def test_digits_one_process_reaches_095(one_process):
    metrics, out, _ = train(one_process, "digits")
    assert metrics["final"]["test_accuracy"] >= 0.95
    assert out.stdout.strip().splitlines()[-1] == f"final test accuracy: {metrics['final']['test_accuracy']:.4f}"


@pytest.mark.timeout(PROCESS_TIMEOUT)
def test_synthetic_images_for_throughput(one_process):
    metrics, _, _ = train(one_process, "synthetic")
    row = metrics["epochs"][0]
    # 2,048 training images in steps of 64 on one rank, timed without the evaluation
    assert row["samples_per_sec"] == pytest.approx(2048 / row["seconds"], rel=1e-9)
    # one rank has no one to talk to: no collective, nothing sent
    assert row["collective_calls_per_step"] == 0.0 and row["bytes_sent_per_step"] == 0.0
    # random labels cannot be learnt: the test accuracy is chance (1/4), and the final
    # evaluation sees the same weights and test set as the epoch's validation
    assert abs(metrics["final"]["test_accuracy"] - 0.25) <= 0.1
    assert metrics["final"]["test_accuracy"] == pytest.approx(row["test_accuracy"], abs=1e-6)


@pytest.mark.timeout(PROCESS_TIMEOUT)
def test_npz_data_learns_a_separable_problem(one_process):
    metrics, _, _ = train(one_process, "npz")
    assert metrics["final"]["test_accuracy"] >= 0.9


@pytest.mark.timeout(PROCESS_TIMEOUT)
def test_resume_continues_from_the_last_checkpoint(one_process):
    out, proc = one_process
    run_dir, argvs = resume_argvs(out)
    assert_run_ended_well(out, "first", argvs["first"], proc, 1)
    resumed = assert_run_ended_well(out, "resumed", argvs["resumed"], proc, 1)
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
    assert again.args == argvs["again"]
    assert again.returncode == 2 and "already holds checkpoints; continue it with --resume" in again.stderr


def test_a_real_process_exits_2_without_traceback():
    out = run([PYTHON, TRAIN, "--strategy", "easgd", "--moving-rate", "1.5"], timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == ("train.py: error: `moving_rate` (alpha) must satisfy 0 < alpha <= 2/(p+1) = 1 "
                                                   "with p=1 ranks, else the elastic step diverges. "
                                                   "Received: moving_rate=1.5")
    assert "Traceback" not in out.stderr
