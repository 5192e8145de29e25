"""train.py end to end under horovodrun -np 2: the run directory, accuracy,
resume (exact), bad input, and ranks that disagree or die."""
import json
import os
import re
import signal
import subprocess
import time
from importlib import metadata

import numpy as np
import pytest
import yaml

from hvd_easgd import checkpoint
from tests.helpers import PYTHON, ROOT, STOPPED_BY_LAUNCHER, bounded, horovodrun, horovodrun_command, quiet_env, run, script
from tests.multiproc.helpers import (PAIR_LAUNCH_SECONDS, assert_run_ended_well, assert_same_state, pair_argv,
                                     pair_launch, stopped_at, train_runs)

pytestmark = pytest.mark.multiproc
TRAIN = os.path.join(ROOT, "train.py")
FINAL = re.compile(r"final test accuracy: (\d\.\d{4})")


def installed_tensorflow():
    """The TF distribution's version as pip installed it (tensorflow-cpu, or tensorflow with CUDA)."""
    for dist in ("tensorflow-cpu", "tensorflow"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return None


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """`horovodrun -np 2 python train.py` with no options but the run directory."""
    run_dir = str(tmp_path_factory.mktemp("default") / "run")
    proc = horovodrun([TRAIN, "--run-dir", run_dir], controller="mpi", timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run_dir, proc


@pytest.mark.smoke  # train.py on the Horovod path (the direct path's is in test_mpi_direct.py)
def test_defaults_reach_095_and_write_the_run_directory(default_run):
    run_dir, proc = default_run
    last = [line for line in proc.stdout.splitlines() if line.strip()][-1]
    match = FINAL.search(last)
    assert match and last.startswith("[1,0]<stdout>:"), last  # rank 0's line, with the launcher's prefix
    accuracy = float(match.group(1))
    assert accuracy >= 0.95
    # one progress report, from rank 0 only
    assert "Epoch 10/10" in proc.stdout
    assert not re.search(r"\[1,1\]<stdout>:.*(Epoch|accuracy)", proc.stdout)

    config = yaml.safe_load(open(os.path.join(run_dir, "config.yaml")))
    assert config["num_ranks"] == 2 and config["config"]["strategy"] == "sync"
    # the defaults as resolved: --scale-lr auto on (x2 at 2 ranks), 10 epochs (220 updates >= 100)
    assert (config["config"]["lr"], config["config"]["scale_lr"], config["config"]["epochs"]) == (0.02, True, 10)
    assert config["learning_rate"]["rate"] == pytest.approx(0.04)
    assert set(config["versions"]) >= {"python", "tensorflow", "keras", "horovod", "hvd_easgd"}
    # The TF of this venv (make smoke TF=<version> runs this in any supported one), not a fixed version.
    assert config["versions"]["horovod"] == "0.28.1" and config["versions"]["tensorflow"] == installed_tensorflow()

    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert len(metrics["epochs"]) == 10
    keys = {"epoch", "loss", "accuracy", "test_loss", "test_accuracy", "samples_per_sec", "bytes_sent_per_step",
            "collective_calls_per_step", "wire_bytes_per_step", "seconds", "rss_mb", "samples"}
    for row in metrics["epochs"]:
        assert set(row) == keys and all(row[k] is not None for k in keys)
        assert row["samples"] == 22 * 64  # the epoch's 22 updates of 2 ranks x 32 (1437 training samples)
        assert len(row["rss_mb"]) == 2 and min(row["rss_mb"]) > 100  # each rank's resident memory, in MB
        assert row["collective_calls_per_step"] == 1.0
        assert row["bytes_sent_per_step"] == 4 * 38282  # the digits CNN's gradients
        assert row["wire_bytes_per_step"] == 4 * 38282  # a ring allreduce at p = 2: 2(p-1)/p S = S
    assert metrics["final"]["test_accuracy"] == pytest.approx(accuracy, abs=1e-4)
    assert set(metrics["final"]) == {"test_accuracy", "test_loss", "samples_per_sec", "seconds"}

    assert os.listdir(os.path.join(run_dir, "tensorboard"))
    kept = sorted(os.listdir(os.path.join(run_dir, "checkpoints")))
    assert kept == ["epoch-000008", "epoch-000009", "epoch-000010"]  # --keep-checkpoints 3
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints", kept[-1]))) == [
        "manifest.json", "rank-00000.npz", "rank-00001.npz"]


@pytest.mark.smoke  # the kept model, saved by train.py, reloaded by plain Keras
def test_model_keras_loads_with_plain_keras_and_reproduces_accuracy(default_run, tmp_path):
    run_dir, _ = default_run
    from hvd_easgd.app import data

    digits = data.digits()
    np.savez(tmp_path / "test.npz", x=digits.x_test, y=digits.y_test)
    code = ("import sys, numpy as np, keras; m = keras.models.load_model(sys.argv[1]); d = np.load(sys.argv[2]); "
            "print(m.evaluate(d['x'], d['y'], verbose=0)[1], 'hvd_easgd' in sys.modules)")
    out = run([PYTHON, "-c", code, os.path.join(run_dir, "model.keras"), str(tmp_path / "test.npz")],
              env=quiet_env(PYTHONPATH=""), cwd=str(tmp_path), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    accuracy, imported = out.stdout.split()[-2:]
    final = json.load(open(os.path.join(run_dir, "metrics.json")))["final"]["test_accuracy"]
    assert float(accuracy) == pytest.approx(final, abs=1e-6) and imported == "False"


# In the smoke subset as its train.py on Horovod's path: a Gloo launch takes that path whatever
# --collectives defaults to, while default_run's MPI launch may take the direct one.
@pytest.mark.smoke
def test_accumulation_with_scale_lr_trains_as_well_as_sync(tmp_path):
    # k = 4 gives 4x fewer updates of a 4x larger batch: at the default --lr it ends near
    # 0.88; --scale-lr's rule (x4*sqrt(2) for sync at 2 ranks x 4) brings it to the 0.95 of plain sync
    # in the same 10 epochs (the default --epochs would make them 20: 5 updates an epoch)
    run_dir = str(tmp_path / "run")
    proc = horovodrun([TRAIN, "--accumulate", "4", "--scale-lr", "--epochs", "10", "--run-dir", run_dir],
                      timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert len(metrics["epochs"]) == 10 and metrics["final"]["test_accuracy"] >= 0.95


def test_resume_is_refused_with_another_strategy(default_run):
    run_dir, _ = default_run
    out = horovodrun([TRAIN, "--resume", run_dir, "--strategy", "easgd", "--epochs", "12"], timeout=120)
    assert out.returncode != 0
    messages = [line for line in (out.stdout + out.stderr).splitlines() if "train.py: error" in line]
    assert len(messages) == 1 and "differs: strategy" in messages[0]
    assert "Exit code: 2" in out.stderr or "exit code: 2" in out.stderr.lower()


RESUMED_OPTIONS = {
    "sync": ["--strategy", "sync"],
    "easgd": ["--strategy", "easgd", "--tau", "4"],
    "accumulate": ["--strategy", "sync", "--accumulate", "3"],
    "periodic": ["--strategy", "periodic", "--tau", "4"],
    "diloco": ["--strategy", "diloco", "--tau", "4"],
    # the sparse payload: its per-rank residuals (mid-period, mid-epoch) saved and resumed exactly
    "diloco_topk": ["--strategy", "diloco", "--tau", "4", "--compression", "topk"],
    # unequal shares of the global batch: the uninterrupted run's rank 1 is slow (RESUMED_ENV), so its
    # measured shares differ; the resumed runs take them from the saved config, not from a measurement
    "balance": ["--strategy", "diloco", "--tau", "4", "--balance", "speed"],
}
RESUMED_ENV = {"balance": {"HVD_EASGD_TEST_SLOW_RANKS": "1:0.002"}}
COMMON = ["--threads-per-rank", "1", "--eval-every", "2", "--seed", "3", "--epochs", "2"]
# np=2 on digits: 22 micro-batches per epoch (21 with --accumulate 3). Global micro-batch 25 is
# mid-epoch (epoch 1, micro-batch 3, or 4 with k=3), mid-window (25 % 3 = 1) and off the tau
# phase of EASGD, PeriodicAverage and DiLoCo (25 % 4 = 1: the ranks' local weights differ there).
MID_EPOCH = {"sync": "epoch-000001-step-000003", "easgd": "epoch-000001-step-000003",
             "accumulate": "epoch-000001-step-000004", "periodic": "epoch-000001-step-000003",
             "diloco": "epoch-000001-step-000003", "diloco_topk": "epoch-000001-step-000003",
             "balance": "epoch-000001-step-000003"}


STRAIGHT_OPTIONS = {name: [*options, *COMMON, "--checkpoint-every-steps", "5", "--keep-checkpoints", "100",
                           "--collectives", "horovod"] for name, options in RESUMED_OPTIONS.items()}
WHERES = ("epoch-end", "mid-epoch")
# A deadlock's bound: what each run's own launch had (150 s); the shared launch's is every run's together.
RUN_SECONDS = 150
RESUME_LAUNCH_SECONDS = RUN_SECONDS * len(RESUMED_OPTIONS) * (1 + len(WHERES)) + 60


def stop_point(name, where):
    return "epoch-000001" if where == "epoch-end" else MID_EPOCH[name]


def straight_dir(out, name):
    return os.path.join(out, name, "run")


def resumed_key(name, where):
    return f"{name}-{where}"


def resume_runs(out):
    """The resume launch's runs, in order: per configuration, its uninterrupted 2-epoch run (OUT/NAME/run; a
    checkpoint every 5 micro-batches, all kept: the states a stopped run leaves on disk); then per configuration
    and stop point, a run stopped there (rank 0 copies the uninterrupted run's checkpoints up to it, to
    OUT/NAME-WHERE/run) and resumed with `train.py --resume`. The stop checkpoint stays in place, so a resume that
    does not find it fails as its own launch did; a stopped run that cannot be made (its uninterrupted run failed)
    is recorded as not run."""
    runs = [{"name": name, "argv": [*STRAIGHT_OPTIONS[name], "--run-dir", straight_dir(out, name)],
             "env": RESUMED_ENV.get(name, {})} for name in RESUMED_OPTIONS]
    for name in RESUMED_OPTIONS:
        for where in WHERES:
            broken = os.path.join(out, resumed_key(name, where), "run")
            runs.append({"name": resumed_key(name, where), "argv": ["--resume", broken, "--run-dir", broken],
                         "stopped_at": [straight_dir(out, name), stop_point(name, where), broken]})
    return runs


@pytest.fixture(scope="module")
def resume_launch(tmp_path_factory):
    """``(OUT, {run: its train.py argv}, the launch)``: resume_runs() in ONE `horovodrun -np 2 --mpi` launch,
    train.py's main() once per run on each rank (scripts/train_runs.py). Why: each launch of 2 ranks spends
    8-12 s of the 2 cores importing TensorFlow, as long as a 2-epoch run trains; 15 launches became 1 (issue 41
    section 4). ``--collectives horovod`` in every run keeps the Horovod path these runs took under their own
    Gloo launches."""
    out = str(tmp_path_factory.mktemp("resume"))
    runs = resume_runs(out)
    return out, {run["name"]: run["argv"] for run in runs}, train_runs(out, runs, "mpi", step_seconds=RUN_SECONDS)


def resume_run_ended_well(resume_launch, key):
    """Run ``key`` of the resume launch ended well on both ranks (helpers.assert_run_ended_well); returns its
    run directory."""
    out, argvs, proc = resume_launch
    assert_run_ended_well(out, key, argvs[key], proc, 2)
    return os.path.join(out, key, "run")


@pytest.fixture(scope="module")
def uninterrupted(resume_launch):
    """``uninterrupted(name)``: the run directory of configuration ``name``'s uninterrupted run, which ended well."""
    return lambda name: resume_run_ended_well(resume_launch, name)


# The first test sets up the launch: its bound, and a margin.
@pytest.mark.timeout(RESUME_LAUNCH_SECONDS + 60)
@pytest.mark.parametrize("where", WHERES)
@pytest.mark.parametrize("name", list(RESUMED_OPTIONS))
def test_resume_is_bit_identical_to_an_uninterrupted_run(name, where, uninterrupted, resume_launch):
    straight = uninterrupted(name)
    # the stop checkpoint, as the uninterrupted run left it and the stopped run got it
    with open(os.path.join(straight, "checkpoints", stop_point(name, where), "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["global_step"] == (manifest["steps_per_epoch"] if where == "epoch-end" else 25)
    broken = resume_run_ended_well(resume_launch, resumed_key(name, where))
    # weights, optimizer slots, strategy state (accumulators, EASGD's center and step counter)
    expected = assert_same_state(straight, broken, "epoch-000002")
    # under EASGD the local weights really differ per rank: a rank-0-only checkpoint would lose them
    if name == "easgd":
        model_keys = [k for k in expected if k.startswith("0:model/")]
        assert any(not np.array_equal(expected[k], expected["1" + k[1:]]) for k in model_keys)
    if name == "diloco_topk":  # its options recorded; one allgather of 10 chunks' top 64 every tau = 4 steps
        saved = yaml.safe_load(open(os.path.join(broken, "config.yaml")))["config"]
        assert (saved["compression"], saved["density"], saved["bits"]) == ("topk", 1 / 64, 2)
        message = 3 * 640 // 2 + 640 * 2 // 8 + 4 * 10 + 4  # 38,282 weights: 10 chunks, 640 slots; the flag
        epochs = json.load(open(os.path.join(straight, "metrics.json")))["epochs"]
        assert sum(row["bytes_sent_per_step"] * 22 for row in epochs) == pytest.approx(11 * message, rel=1e-12)
    if name == "balance":  # the slow rank took the smaller share, and the resume took the same shares
        shares = [yaml.safe_load(open(os.path.join(d, "config.yaml")))["config"]["sample_shares"]
                  for d in (straight, broken)]
        assert shares[0] == shares[1] and sum(shares[0]) == 64 and shares[0][1] < shares[0][0]
    # the resumed run's step checkpoints fall on the same micro-batches as the uninterrupted run's
    later = sorted(os.listdir(os.path.join(broken, "checkpoints")))
    assert later == sorted(os.listdir(os.path.join(straight, "checkpoints")))
    metrics = json.load(open(os.path.join(broken, "metrics.json")))
    assert [row["epoch"] for row in metrics["epochs"]] == [1, 2]


# The first test may set up the shared launch: its bound, and a margin.
@pytest.mark.timeout(PAIR_LAUNCH_SECONDS + 60)
@pytest.mark.parametrize("strategy", ["periodic", "diloco"])
def test_low_communication_strategies_reach_095_with_their_defaults(strategy, tmp_path_factory):
    # tau = 10: one grouped call every 10 steps, the 38282 weights (or pseudo-gradients) and the flag.
    # The run: `train.py --strategy S` in helpers.pair_launch(), one Gloo launch of 2 ranks shared with other runs.
    out, proc = pair_launch(tmp_path_factory)
    run_dir = os.path.join(out, strategy, "run")
    assert_run_ended_well(out, strategy, ["--strategy", strategy, "--run-dir", run_dir], proc, 2)
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    print(f"{strategy}: final test accuracy {metrics['final']['test_accuracy']:.4f}")
    assert len(metrics["epochs"]) == 10 and metrics["final"]["test_accuracy"] >= 0.95
    steps = 22  # per epoch at np=2: 220 steps, 22 synchronisations
    assert sum(row["bytes_sent_per_step"] * steps for row in metrics["epochs"]) == pytest.approx(22 * 4 * 38283)
    assert sum(row["collective_calls_per_step"] * steps for row in metrics["epochs"]) == pytest.approx(22)


@pytest.mark.timeout(PAIR_LAUNCH_SECONDS + 60)
def test_a_warning_about_the_shared_arguments_is_printed_once_by_rank_0_on_one_line(tmp_path_factory):
    # `--tau 1` under PeriodicAverage warns (it communicates as often as sync). Every rank builds the strategy,
    # but the ranks share their arguments: rank 0 says it, once, and rank 1 says nothing (it used to repeat it).
    out, proc = pair_launch(tmp_path_factory)
    assert_run_ended_well(out, "tau-1", pair_argv(out, "tau-1"), proc, 2)
    said = {rank: [line for line in open(os.path.join(out, "tau-1", f"rank{rank}.stderr")).read().splitlines()
                   if "period=1" in line] for rank in (0, 1)}
    assert said == {0: ["train.py: warning: PeriodicAverage with period=1 averages the weights every step: it "
                        "communicates as often as SyncAverage (and with plain SGD computes the same)"], 1: []}, said


@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_bad_input_under_horovodrun_every_rank_exits_2_one_message(controller):
    # Both ranks find the error; whichever exits first makes the launcher stop the other,
    # so rank 0 must be the one that exits first (it used to lose that race now and then).
    out = horovodrun([TRAIN, "--tau", "5"], controller=controller, timeout=120)
    assert out.returncode != 0
    text = out.stdout + out.stderr
    messages = [line for line in text.splitlines() if "train.py: error" in line]
    assert len(messages) == 1 and "error: --tau is an option of --strategy diloco or easgd" in messages[0], text[-3000:]
    # no rank printed a traceback (the launcher's own summary may follow, unprefixed)
    assert not re.search(r"^\[\d+(,\d+)?\]<std(err|out)>:\s*Traceback", text, re.M), text[-3000:]
    if controller == "gloo":
        exit_codes = dict(re.findall(r"Process (\d+) exit with status code (\d+)", text))  # the launcher's summary
        assert exit_codes.get("0") == "2" and set(exit_codes.values()) <= {"2"} | STOPPED_BY_LAUNCHER, exit_codes
    else:
        assert re.search(r"Process name: \[\[\d+,\d+\],0\]\s+Exit code:\s+2", text), text[-2000:]


def test_ranks_with_different_configs_stop_before_training(tmp_path):
    out = horovodrun([script("rank_dependent_argv.py"), "--run-dir", str(tmp_path / "r"), "--epochs", "1"],
                     timeout=120)
    assert out.returncode != 0
    messages = [line for line in (out.stdout + out.stderr).splitlines() if "train.py: error" in line]
    assert len(messages) == 1
    assert "ranks disagree on the effective config: `lr` differs between ranks [0]; ranks [1]" in messages[0]
    assert "Epoch 1/1" not in out.stdout


@pytest.mark.timeout(200)
def test_killing_a_rank_ends_the_job_within_60s(tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    run_dir = tmp_path / "run"
    cmd = horovodrun_command([script("record_pid_then_train.py"), str(pid_dir), "--run-dir", str(run_dir),
                              "--epochs", "400", "--threads-per-rank", "1"], controller="gloo")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        # A complete checkpoint (manifest written), not just its directory: a kill between the
        # first shard and the manifest would leave nothing to check below.
        deadline = time.time() + bounded(120)
        while not checkpoint.complete_checkpoints(str(run_dir)) and time.time() < deadline:
            time.sleep(0.5)
        assert checkpoint.complete_checkpoints(str(run_dir)), "training never completed its first checkpoint"
        os.kill(int((pid_dir / "pid1").read_text()), signal.SIGKILL)
        killed_at = time.time()
        out, _ = proc.communicate(timeout=bounded(90))
        elapsed = time.time() - killed_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0
    assert elapsed <= 60, f"the job took {elapsed:.0f}s to end after a rank died"
    assert "Process 1 exit with status code" in out or "exited with non-zero status" in out, out[-2000:]
    # the checkpoints written before the kill are complete and usable
    manifest, _ = checkpoint.latest(str(run_dir))
    assert manifest["num_ranks"] == 2 and manifest["epoch"] >= 1


STOPPED = re.compile(r"\[(?:1,)?(\d)\]<stderr>:train\.py: stopped on a signal after the checkpoint at epoch (\d+), "
                     r"micro-batch (\d+); exit status 75")


@pytest.mark.timeout(240)
def test_sigterm_to_one_rank_checkpoints_every_rank_at_one_step_then_auto_resume_finishes(uninterrupted, tmp_path):
    straight = uninterrupted("sync")
    pid_dir, run_dir = tmp_path / "pids", tmp_path / "run"
    pid_dir.mkdir()
    options = [*RESUMED_OPTIONS["sync"], *COMMON, "--checkpoint-every-steps", "5", "--keep-checkpoints", "100",
               "--checkpoint-on-signal", "TERM", "--agree-every", "3", "--run-dir", str(run_dir)]
    cmd = horovodrun_command([script("record_pid_then_train.py"), str(pid_dir), *options])
    proc = subprocess.Popen(cmd, cwd=ROOT, env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        first = run_dir / "checkpoints" / "epoch-000000-step-000005"
        deadline = time.time() + bounded(150)
        while not (first / "manifest.json").is_file() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert (first / "manifest.json").is_file(), "training never reached its first step checkpoint"
        os.kill(int((pid_dir / "pid1").read_text()), signal.SIGTERM)  # rank 1 only
        signalled_at = time.time()
        out, _ = proc.communicate(timeout=bounded(90))
        elapsed = time.time() - signalled_at
        print(f"stopped {elapsed:.1f}s after the signal")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    # Bound: the agreement comes within --agree-every (3) micro-batches, then one checkpoint and the exit.
    assert elapsed <= 30, f"the job took {elapsed:.0f}s to stop after the signal"
    stops = {rank: (int(epoch), int(step)) for rank, epoch, step in STOPPED.findall(out)}
    assert set(stops) == {"0", "1"} and stops["0"] == stops["1"], out[-3000:]  # every rank, the same step
    epoch, step = stops["0"]
    assert epoch == 0 and step % 3 == 0 and step > 5, stops  # at an agreement, after the signal
    # the first rank to exit reports 75; the launcher then stops the other (if it had not exited yet)
    statuses = dict(re.findall(r"Process (\d+) exit with status code (\d+)", out))
    assert "75" in statuses.values() and set(statuses.values()) <= {"75"} | STOPPED_BY_LAUNCHER, statuses
    assert proc.returncode != 0

    manifest, directory = checkpoint.latest(str(run_dir))
    assert (manifest["epoch"], manifest["step_in_epoch"]) == (epoch, step)
    assert sorted(os.listdir(directory)) == ["manifest.json", "rank-00000.npz", "rank-00001.npz"]

    resumed = horovodrun([TRAIN, "--auto-resume", "--run-dir", str(run_dir)], timeout=150)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert_same_state(straight, str(run_dir), "epoch-000002")


def iterations(run_dir, name, rank=0):
    """The inner optimizer's update count in a checkpoint's shard: the largest integer scalar
    among the optimizer's variables (the wrapper's own counter stays 0)."""
    with np.load(os.path.join(run_dir, "checkpoints", name, f"rank-{rank:05d}.npz")) as shard:
        return max(int(shard[k]) for k in shard.files
                   if k.startswith("optimizer/") and shard[k].ndim == 0 and shard[k].dtype == np.int64)


def strategy_steps(run_dir, name, rank=0):
    """EASGD's step counter (the tau counter's source) in a checkpoint's shard: the strategy group's first array."""
    with np.load(os.path.join(run_dir, "checkpoints", name, f"rank-{rank:05d}.npz")) as shard:
        return int(shard["strategy/00000"])


# The resumes at another number of ranks: name: (that number, the configuration whose uninterrupted run is
# stopped, the checkpoint it is stopped after, train.py's options after `--resume DIR`).
RESIZED = {
    "sync-at-1": (1, "sync", "epoch-000002", ["--epochs", "8"]),
    "easgd-at-1": (1, "easgd", "epoch-000002", ["--epochs", "10"]),
    "diloco-at-1": (1, "diloco", MID_EPOCH["diloco"], ["--epochs", "3", "--checkpoint-every-steps", "16"]),
    "sync-at-3": (3, "sync", "epoch-000002", ["--epochs", "8"]),
    "periodic-at-3": (3, "periodic", MID_EPOCH["periodic"], []),
}
RESIZED_RUN_SECONDS = 200  # each run's own launch's bound
# The first test of a size sets up that size's launch: every run's bound at that size, and a margin.
RESIZED_TIMEOUT = RESIZED_RUN_SECONDS * max(sum(size == s for size, *_ in RESIZED.values()) for s in (1, 3)) + 100


@pytest.fixture(scope="module")
def resized_launch(resume_launch, tmp_path_factory):
    """``resized_launch(size)``: ``(OUT, {run: (its stop checkpoint's update count, EASGD's step count), read
    before the resume}, the launch)``, the RESIZED runs of ``size`` ranks whose uninterrupted run ended well, each
    a run stopped (its checkpoints copied from the uninterrupted run's, in OUT/NAME/run) and resumed there, one
    after the other in ONE launch: plain python at 1 rank, `horovodrun -np 3 --gloo` at 3 (scripts/train_runs.py).
    Why: one process start of TensorFlow per size, not one per run. Launched at the first test that asks."""
    straight_out, _, _ = resume_launch
    launches = {}

    def launched(size):
        if size not in launches:
            out, before, runs = str(tmp_path_factory.mktemp(f"resized-{size}")), {}, []
            for name, (run_size, source, checkpoint_name, options) in RESIZED.items():
                straight = straight_dir(straight_out, source)
                if run_size != size or not os.path.isfile(os.path.join(straight, "metrics.json")):
                    continue  # another size's, or its own test says why
                run_dir = stopped_at(straight, checkpoint_name, os.path.join(out, name, "run"))
                steps = strategy_steps(run_dir, checkpoint_name) if source == "easgd" else None
                before[name] = iterations(run_dir, checkpoint_name), steps
                runs.append({"name": name, "argv": ["--resume", run_dir, *options]})
            proc = train_runs(out, runs, None if size == 1 else "gloo", np=size, step_seconds=RESIZED_RUN_SECONDS)
            launches[size] = out, before, proc
        return launches[size]
    return launched


def resumed_at_another_size(name, uninterrupted, resized_launch):
    """Run ``name`` of RESIZED, ended well on each rank: ``(its run directory, (the update count, EASGD's step
    count) of its stop checkpoint before the resume, the run as its own launch would have returned it)``."""
    size, source, _, options = RESIZED[name]
    uninterrupted(source)  # ended well, else says why
    out, before, proc = resized_launch(size)
    run_dir = os.path.join(out, name, "run")
    return run_dir, before[name], assert_run_ended_well(out, name, ["--resume", run_dir, *options], proc, size)


@pytest.mark.timeout(RESIZED_TIMEOUT)
@pytest.mark.parametrize("size, steps_per_epoch", [(1, 44), (3, 14)])
def test_sync_resumes_at_another_number_of_ranks(size, steps_per_epoch, uninterrupted, resized_launch):
    # saved at np=2 after 2 epochs of 22 updates; continued to epoch 8 at np=1 (44 per epoch) or np=3 (14)
    run_dir, (saved, _), _ = resumed_at_another_size(f"sync-at-{size}", uninterrupted, resized_launch)
    assert saved == 2 * 22
    manifest, _ = checkpoint.latest(run_dir)
    assert (manifest["epoch"], manifest["num_ranks"], manifest["steps_per_epoch"]) == (8, size, steps_per_epoch)
    for rank in range(size):  # the update count continues: 44 saved, then 6 epochs at this size
        assert iterations(run_dir, "epoch-000008", rank) == 2 * 22 + 6 * steps_per_epoch
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert [row["epoch"] for row in metrics["epochs"]] == list(range(1, 9))
    assert metrics["final"]["test_accuracy"] >= 0.95


@pytest.mark.timeout(RESIZED_TIMEOUT)
def test_easgd_resumes_at_another_number_of_ranks_from_the_center(uninterrupted, resized_launch):
    # saved at np=2 after 2 epochs of 22 updates (tau 4); continued to epoch 10 at np=1 (44 updates per epoch)
    run_dir, (saved, saved_steps), out = resumed_at_another_size("easgd-at-1", uninterrupted, resized_launch)
    assert saved == saved_steps == 2 * 22
    assert ("train.py: resuming at 1 ranks from a checkpoint of 2 (epoch 2): the update count continues, the data "
            "are resharded for 1 ranks; every rank's local weights restart from the center, optimizer slots are the "
            "mean of the 2 saved ranks', moving rate alpha = 0.9") in out.stdout, out.stdout[-2000:]
    manifest, _ = checkpoint.latest(run_dir)
    assert (manifest["epoch"], manifest["num_ranks"], manifest["steps_per_epoch"]) == (10, 1, 44)
    # the update count and EASGD's step count (so its tau phase) continue: 44 saved, then 8 epochs of 44
    assert iterations(run_dir, "epoch-000010") == strategy_steps(run_dir, "epoch-000010") == 2 * 22 + 8 * 44
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert [row["epoch"] for row in metrics["epochs"]] == list(range(1, 11))
    assert metrics["final"]["test_accuracy"] >= 0.95


def test_a_resume_at_another_size_that_cannot_be_exact_is_refused_naming_the_reason(uninterrupted, tmp_path):
    # EASGD with --moving-rate 0.6 fixed (the shards do not depend on it): stable at 2 ranks (0.6 <= 2/3), and
    # at 3 it diverges (0.6 > 2/4): refused by EASGD's one rule, as a fresh run at 3 ranks would be. (0.45 at 3
    # ranks, q * alpha = 1.35 >= 1, only warns, as EASGD(moving_rate=0.45) does: test_checkpoint.py.)
    fixed = stopped_at(uninterrupted("easgd"), "epoch-000001", str(tmp_path / "easgd"))
    manifest_path = os.path.join(fixed, "checkpoints", "epoch-000001", "manifest.json")
    manifest = json.load(open(manifest_path))
    manifest["config"]["moving_rate"] = 0.6
    json.dump(manifest, open(manifest_path, "w"))
    out = horovodrun([TRAIN, "--resume", fixed], np=3, timeout=120)
    messages = [line for line in (out.stdout + out.stderr).splitlines() if "train.py: error" in line]
    assert out.returncode != 0 and len(messages) == 1, (out.stdout + out.stderr)[-3000:]
    assert ("`moving_rate` (alpha) must satisfy 0 < alpha <= 2/(p+1) = 0.5 with p=3 ranks, else the elastic step "
            "diverges. Received: moving_rate=0.6") in messages[0], messages


@pytest.mark.timeout(RESIZED_TIMEOUT)
def test_diloco_resumes_mid_epoch_at_another_number_of_ranks_without_a_launcher(uninterrupted, resized_launch):
    # saved at np=2 after 22 + 3 micro-batches of 32 (tau 4: mid-period, the local weights differ): at np=1
    # the rest of epoch 2 is its order from sample 2 * 3 * 32 = 192 on, (1437 - 192) // 32 = 38 micro-batches,
    # counted as steps 6..43 of an epoch of 44; then epoch 3 holds 44
    run_dir, _, out = resumed_at_another_size("diloco-at-1", uninterrupted, resized_launch)
    assert ("train.py: resuming at 1 ranks from a checkpoint of 2 (epoch 1): the update count continues, the data "
            "are resharded for 1 ranks; the synced weights and the outer optimizer are kept, the local weights and "
            "inner slots are the mean of the 2 saved ranks'; the tau phase continues") in out.stdout, out.stdout[-2000:]
    manifest, _ = checkpoint.latest(run_dir)
    assert (manifest["epoch"], manifest["num_ranks"], manifest["steps_per_epoch"]) == (3, 1, 44)
    # every micro-batch counted once: 25 at np=2, 38 to end epoch 2, 44 in epoch 3
    assert iterations(run_dir, "epoch-000003") == strategy_steps(run_dir, "epoch-000003") == 25 + 38 + 44
    # the step checkpoint inside the rest of epoch 2 (global step 64 = 44 + 20) records the prefix of the
    # epoch's order seen, 192 + (20 - 6) * 32, so that a resume from it continues where this run was
    rest = json.load(open(os.path.join(run_dir, "checkpoints", "epoch-000001-step-000020", "manifest.json")))
    assert (rest["num_ranks"], rest["global_step"], rest["samples_in_epoch"]) == (1, 64, 640)
    metrics = json.load(open(os.path.join(run_dir, "metrics.json")))
    assert [row["epoch"] for row in metrics["epochs"]] == [1, 2, 3]


@pytest.mark.timeout(RESIZED_TIMEOUT)
def test_periodic_resumes_mid_epoch_at_more_ranks(uninterrupted, resized_launch):
    # saved at np=2 after 22 + 3 micro-batches (tau 4: mid-period); at np=3 the rest of epoch 2 is
    # (1437 - 192) // 3 // 32 = 12 micro-batches per rank, steps 2..13 of an epoch of 14
    run_dir, _, out = resumed_at_another_size("periodic-at-3", uninterrupted, resized_launch)
    assert ("resuming at 3 ranks from a checkpoint of 2 (epoch 1): the update count continues, the data are "
            "resharded for 3 ranks; the weights are the mean of the 2 saved ranks' (their last average, at an "
            "average), optimizer slots too; the tau phase continues") in out.stdout, out.stdout[-2000:]
    manifest, _ = checkpoint.latest(run_dir)
    assert (manifest["epoch"], manifest["num_ranks"], manifest["steps_per_epoch"]) == (2, 3, 14)
    for rank in range(3):
        assert iterations(run_dir, "epoch-000002", rank) == strategy_steps(run_dir, "epoch-000002", rank) == 25 + 12
