"""End to end on a real one-node SLURM: srun + PMIx ranks, and slurm/train.sbatch
in both launch modes, submitted with sbatch and followed with scontrol."""
import json
import re
import sys
import time
from pathlib import Path

import pytest

from tests.slurm.helpers import POLL, REPO

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

JOB_TIMEOUT = 180  # seconds; a 2-rank, 8-epoch digits run takes 30-80 s on 2 busy cores
# Under horovodrun each chunk a rank writes gets a "[1,0]<stdout>:" tag, and an
# unbuffered print writes its newline as a chunk of its own: so no end anchor.
ACCURACY_LINE = re.compile(r"^(?:\[\d+,\d+\]<stdout>:)?final test accuracy: (\d+\.\d+)", re.MULTILINE)

RANK_PROBE = """
import json, horovod.tensorflow as hvd
from hvd_easgd.startup.slurm import SlurmEnvironment
hvd.init()
env = SlurmEnvironment()
print(json.dumps({"hvd": [hvd.rank(), hvd.size(), hvd.local_rank()], "mpi": hvd.mpi_enabled(),
                  "slurm": [env.rank, env.world_size, env.local_rank], "hosts": env.hosts_string()}), flush=True)
"""


def _sbatch_args(cluster, tmp_path, ntasks=2):
    return ["--nodes=1", f"--ntasks={ntasks}", f"--ntasks-per-node={ntasks}",
            f"--cpus-per-task={max(1, cluster.cpus // ntasks)}", "--time=00:05:00",
            f"--output={tmp_path}/slurm-%x-%j.out"]


def _output(info):
    path = Path(info["StdOut"])
    return path.read_text(errors="replace") if path.is_file() else f"(no output file {path})"


def test_srun_pmix_ranks_agree_with_horovod(slurm_cluster):
    """Two srun tasks become one Horovod world over MPI/PMIx, and the ranks
    hvd_easgd.startup.slurm reads from SLURM's environment are Horovod's ranks."""
    done = slurm_cluster.run(["srun", "--nodes=1", "--ntasks=2", "--mpi=pmix", "--kill-on-bad-exit=1",
                              "--time=00:03:00", sys.executable, "-c", RANK_PROBE], timeout=120, check=False)
    assert done.returncode == 0, f"srun --mpi=pmix failed ({done.returncode}):\n{done.stdout}\n{done.stderr[-3000:]}"
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["hvd"][0] for r in reports) == [0, 1], done.stdout
    for report in reports:
        assert report["mpi"] is True
        rank, size, local_rank = report["hvd"]
        assert report["slurm"] == [rank, size, local_rank] and size == 2
        assert report["hosts"] == "localhost:2"


def assert_completed_training(info, launch, run_dir, min_accuracy):
    """What every train.sbatch job that trains to its end shows: COMPLETED with exit 0, the launch
    mode it was given, rank 0's one final accuracy line at ``min_accuracy`` or above, and the
    run directory named after the script's name (so those options reached train.py).

    Returns:
        The job's output, for the caller's own checks.
    """
    output = _output(info)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (
        f"job {info.get('JobId')} ({launch}): JobState={info['JobState']} ExitCode={info['ExitCode']} "
        f"Restarts={info.get('Restarts')}\n{output[-4000:]}")
    assert f"launch={launch}" in output
    accuracies = [float(a) for a in ACCURACY_LINE.findall(output)]
    assert len(accuracies) == 1, f"expected one 'final test accuracy' line (rank 0's):\n{output[-4000:]}"
    assert accuracies[0] >= min_accuracy, output[-4000:]
    assert run_dir.is_dir(), f"--run-dir after the script name did not reach train.py:\n{output[-2000:]}"
    return output


# A job from start to end, in either launch mode, is one of the requeue tests below: each job
# starts from scratch, and its end passes these checks (srun mode at 0.95, horovodrun mode at 0.9),
# so one job per launch mode serves both.


def test_train_sbatch_without_venv_fails_with_hint(slurm_cluster, tmp_path):
    job_id = slurm_cluster.submit(REPO / "slurm" / "train.sbatch", _sbatch_args(slurm_cluster, tmp_path),
                                  env={"HVD_EASGD_VENV": str(tmp_path / "no-such-venv")})
    info = slurm_cluster.wait(job_id, timeout=60)
    output = _output(info)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", output
    assert f"no virtual environment at {tmp_path / 'no-such-venv'}" in output
    assert "HINT:" in output


def test_benchmark_sbatch_reaches_the_suite(slurm_cluster, tmp_path):
    """benchmark.sbatch as one exclusive task; --help keeps the suite itself out of the tier's time budget."""
    assert (REPO / "benchmarks" / "suite" / "compare.py").is_file(), "slurm/benchmark.sbatch runs benchmarks/suite/compare.py"
    job_id = slurm_cluster.submit(REPO / "slurm" / "benchmark.sbatch",
                                  ["--time=00:03:00", f"--output={tmp_path}/slurm-%x-%j.out"], ["--help"],
                                  env={"HVD_EASGD_VENV": sys.prefix})
    info = slurm_cluster.wait(job_id, timeout=90)
    output = _output(info)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", output[-4000:]
    assert "usage:" in output.lower(), output[-4000:]


def _wait_for_requeue(cluster, job_id, timeout):
    """Polls until the job has requeued itself (Restarts >= 1); fails with its output if it has not by ``timeout``."""
    deadline = time.monotonic() + timeout
    while int(cluster.job(job_id).get("Restarts", 0)) < 1 and time.monotonic() < deadline:
        time.sleep(POLL)
    info = cluster.job(job_id)
    assert int(info.get("Restarts", 0)) >= 1, f"job {job_id} did not requeue itself: {info.get('JobState')}\n" + (
        _output(info)[-3000:])


@pytest.mark.timeout(600)
def test_train_sbatch_is_warned_checkpoints_requeues_itself_and_completes(slurm_cluster, tmp_path):
    """A two-minute job warned 75 s before its limit (slurmctld sends the warning at a periodic
    check, every 30 s, once now >= end - warning - 30 s: 15-45 s after the start, before or soon
    after the ranks are up; train.sbatch has them checkpoint at their first agreement then).
    A step takes 13-400 ms here depending on the load of the machine, so the first attempt gets
    an endless --epochs from its --config file; once the job has requeued itself, the test
    lowers --epochs there (a resumed run may change it) to a few epochs past the checkpoint,
    and lengthens the job's time limit (`scontrol update`, as a user or admin would), so the
    requeued attempt is not warned in turn before its end; it resumes from the checkpoint
    (--auto-resume) and completes."""
    run_dir, config = tmp_path / "run", tmp_path / "config.yaml"
    config.write_text("epochs: 100000\n")
    sbatch_args = [a for a in _sbatch_args(slurm_cluster, tmp_path) if not a.startswith("--time")]
    job_id = slurm_cluster.submit(
        REPO / "slurm" / "train.sbatch", [*sbatch_args, "--time=00:02:00", "--signal=B:USR1@75"],
        ["--config", str(config), "--run-dir", str(run_dir), "--eval-every", "1000", "--no-tensorboard",
         "--agree-every", "5"],
        env={"HVD_EASGD_LAUNCH": "srun", "HVD_EASGD_VENV": sys.prefix})
    _wait_for_requeue(slurm_cluster, job_id, timeout=150)
    from hvd_easgd import checkpoint

    manifest, _ = checkpoint.latest(str(run_dir))
    epochs = max(manifest["epoch"] + 2, 10)
    # Both before the requeued job starts (cred_expire holds it 6 s; train.py reads its --config
    # once its ranks are up, seconds later), or early in it: a warning comes 15 s after a start
    # at the earliest.
    config.write_text(f"epochs: {epochs}\n")
    slurm_cluster.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=00:10:00"])
    info = slurm_cluster.wait(job_id, timeout=240)
    # srun mode's whole run: completed, launch=srun, one final accuracy line (>= 0.95), --run-dir reached train.py
    output = assert_completed_training(info, "srun", run_dir, min_accuracy=0.95)
    assert int(info["Restarts"]) >= 1
    assert "requeueing job " + job_id in output
    stop = re.search(r"stopped on a signal after the checkpoint at epoch (\d+), micro-batch (\d+); exit status 75",
                     output)
    assert stop and (int(stop.group(1)), int(stop.group(2))) == (manifest["epoch"], manifest["step_in_epoch"])
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [row["epoch"] for row in metrics["epochs"]] == list(range(1, epochs + 1))


@pytest.mark.timeout(500)
def test_horovodrun_mode_checkpoints_on_the_batch_scripts_warning_and_requeues(slurm_cluster, tmp_path):
    """horovodrun forwards no signal to the ranks it starts (on other hosts they are not even in the
    job's steps): the warning SLURM sends the batch script (--signal=B:USR1) reaches them through
    RUN_DIR/STOP, here with the run directory named only in the --config file. The warning is sent
    by hand, as SLURM sends it (`scancel --batch --signal=USR1`: the batch shell alone), once the
    first step checkpoint exists, so the test does not wait for a time limit.

    The requeued job then trains to 8 epochs at least: horovodrun mode's job from start to end,
    which passes assert_completed_training's checks (at 0.9) as a job of 8 epochs from scratch does."""
    run_dir, config = tmp_path / "run", tmp_path / "config.yaml"
    config.write_text(f"epochs: 100000\nrun_dir: {run_dir}\n")
    job_id = slurm_cluster.submit(
        REPO / "slurm" / "train.sbatch", _sbatch_args(slurm_cluster, tmp_path),
        ["--config", str(config), "--eval-every", "1000", "--no-tensorboard", "--agree-every", "5",
         "--checkpoint-every-steps", "10"],
        env={"HVD_EASGD_LAUNCH": "horovodrun", "HVD_EASGD_VENV": sys.prefix})
    from hvd_easgd import checkpoint

    # Any complete checkpoint will do: on a quiet machine a step takes ~12 ms, and keep=3 prunes
    # the first step checkpoint within a second of its writing, before a poll may see it.
    deadline = time.monotonic() + 150
    while not checkpoint.complete_checkpoints(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(POLL)
    assert checkpoint.complete_checkpoints(str(run_dir)), (
        f"job {job_id} wrote no checkpoint:\n" + _output(slurm_cluster.job(job_id))[-3000:])
    slurm_cluster.run(["scancel", "--batch", "--signal=USR1", job_id])
    _wait_for_requeue(slurm_cluster, job_id, timeout=120)
    manifest, _ = checkpoint.latest(str(run_dir))
    epochs = max(manifest["epoch"] + 1, 8)
    config.write_text(f"epochs: {epochs}\nrun_dir: {run_dir}\n")  # before the requeued job's ranks read it
    info = slurm_cluster.wait(job_id, timeout=JOB_TIMEOUT)
    # horovodrun mode's whole run: completed, launch=horovodrun, one final accuracy line (>= 0.9), and
    # the run directory of the --config file given after the script name
    output = assert_completed_training(info, "horovodrun", run_dir, min_accuracy=0.9)
    assert "launch=horovodrun" in output and "requeueing job " + job_id in output
    stop = re.search(r"stopped on a signal after the checkpoint at epoch (\d+), micro-batch (\d+); exit status 75",
                     output)
    assert stop and (int(stop.group(1)), int(stop.group(2))) == (manifest["epoch"], manifest["step_in_epoch"])
    assert manifest["global_step"] % 5 == 0 and manifest["num_ranks"] == 2  # at an agreement (--agree-every 5)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [row["epoch"] for row in metrics["epochs"]] == list(range(1, epochs + 1))
