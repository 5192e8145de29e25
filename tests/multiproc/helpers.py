"""Helpers of the multiproc tier: the core checks' launches, shared by the modules that assert on
them; and for the resume tests, a stopped run made from an uninterrupted one's checkpoints, two
runs' checkpoint states compared array by array, and a run of a shared launch (scripts/train_runs.py)
checked as its own launch's return code was."""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from tests.helpers import PYTHON, bounded, launch, read_rank_results, run, script

CORE_SIZE = 2
_CORE_RESULTS = {}


def core_results(launcher, collectives, tmp_path_factory):
    """Every rank's results of scripts/core_checks.py under ``launcher`` with ``collectives``: launched
    once per session, whichever module asks first (test_strategies.py reads the strategy checks,
    test_background.py the background ones), so the ranks pay TensorFlow's start-up once for both."""
    if (launcher, collectives) not in _CORE_RESULTS:
        out = tmp_path_factory.mktemp(f"core-{launcher}-{collectives}")
        proc = launch([script("core_checks.py"), str(out), collectives], launcher, np=CORE_SIZE, timeout=300)
        assert proc.returncode == 0, (f"core_checks failed under {launcher} with {collectives}:\n"
                                      f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        _CORE_RESULTS[launcher, collectives] = read_rank_results(out, CORE_SIZE)
    return _CORE_RESULTS[launcher, collectives]


def stopped_at(straight, checkpoint_name, run_dir):
    """``run_dir`` as a run of ``straight``'s configuration stopped right after ``checkpoint_name``
    leaves it: that checkpoint and the ones before it, config.yaml and metrics.json."""
    os.makedirs(os.path.join(run_dir, "checkpoints"))
    kept = sorted(os.listdir(os.path.join(straight, "checkpoints")))
    for name in kept[:kept.index(checkpoint_name) + 1]:
        shutil.copytree(os.path.join(straight, "checkpoints", name), os.path.join(run_dir, "checkpoints", name))
    for name in ("config.yaml", "metrics.json"):
        shutil.copy(os.path.join(straight, name), run_dir)
    return run_dir


def shard_arrays(run_dir, name, size=2):
    """Every rank's arrays of checkpoint ``name`` in one mapping, keyed ``"rank:array"``."""
    directory = os.path.join(run_dir, "checkpoints", name)
    arrays = {}
    for rank in range(size):
        with np.load(os.path.join(directory, f"rank-{rank:05d}.npz")) as shard:
            arrays.update({f"{rank}:{k}": shard[k] for k in shard.files})
    return arrays


def assert_same_state(expected_dir, got_dir, name):
    """Checkpoint ``name`` of two runs holds the same arrays, bit for bit; returns the expected ones."""
    expected, got = shard_arrays(expected_dir, name), shard_arrays(got_dir, name)
    assert expected.keys() == got.keys()
    differing = [k for k in expected if not np.array_equal(expected[k], got[k])]
    assert not differing, differing[:5]
    return expected


def tail(path, chars=3000):
    """The end of the file at ``path``, or a line saying it is not there."""
    if not os.path.isfile(path):
        return f"({path}: none)"
    with open(path, errors="replace") as f:
        return f.read()[-chars:]


def assert_run_ended_well(out, name, argv, proc, size):
    """Run ``name`` of a train_runs() launch ``proc`` (writing under ``out``) ended with status 0 on each of the
    ``size`` ranks, as its own launch's return code 0 said before, with ``argv`` (train.py's arguments) on every
    rank, and the launch itself ended with 0 (a crash of the launch after the run fails it too, as it failed the
    run's own launch before it was shared); else what the ranks printed. Returns train_run_result()."""
    result = assert_train_run_ended_well(out, name, proc, size)
    # The run is the one named: its own argv, as its own launch had it.
    argvs = [json.load(open(os.path.join(out, name, f"rank{rank}.json")))["argv"] for rank in range(size)]
    assert argvs == [argv] * size, (name, argvs)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return result


def train_runs(out, runs, launcher="gloo", np=2, step_seconds=240):
    """``runs`` (a list of ``{"name", "argv"[, "stopped_at"]}``) one after the other in ONE launch of
    scripts/train_runs.py (its docstring) under ``launcher`` ("gloo", "mpi", "mpirun": tests/helpers.py's
    launch(); None: plain python, one process), so each rank imports TensorFlow once for all of them. A run
    stuck past ``step_seconds`` on a rank ends the launch; the launch's own bound is every run's together.
    Returns the launch's CompletedProcess."""
    args = [script("train_runs.py"), out, str(np), json.dumps(runs), str(bounded(step_seconds))]
    timeout = step_seconds * len(runs) + 60
    return run([PYTHON, *args], timeout=timeout) if launcher is None else launch(args, launcher, np=np,
                                                                                  timeout=timeout)


def train_run_result(out, name, proc, size):
    """Run ``name`` of a train_runs() launch as its own launch of ``size`` ranks would have returned it: a
    CompletedProcess whose returncode is the first rank's non-zero exit status (else 0), its stdout and
    stderr what the ranks printed during that run, rank after rank. Fails if a rank never ended it."""
    directory = os.path.join(out, name)
    outcomes = {}
    for rank in range(size):
        path = os.path.join(directory, f"rank{rank}.json")
        outcomes[rank] = json.load(open(path)) if os.path.isfile(path) else None
    unfinished = [rank for rank, outcome in outcomes.items() if outcome is None or outcome["status"] is None]
    assert not unfinished, (
        f"the launch ended (return code {proc.returncode}) before {name} ended on ranks {unfinished}: "
        f"{[outcomes[rank] and outcomes[rank]['error'] for rank in unfinished]}\n"
        f"rank {unfinished[0]} during {name}:\n{tail(os.path.join(directory, f'rank{unfinished[0]}.stdout'))}\n"
        f"{tail(os.path.join(directory, f'rank{unfinished[0]}.stderr'))}\n"
        f"the launch:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    streams = {}
    for stream in ("stdout", "stderr"):
        texts = []
        for rank in range(size):
            with open(os.path.join(directory, f"rank{rank}.{stream}"), errors="replace") as f:
                texts.append(f.read())
        streams[stream] = "".join(texts)
    statuses = [outcomes[rank]["status"] for rank in range(size)]
    returncode = next((status for status in statuses if status != 0), 0)
    return subprocess.CompletedProcess(outcomes[0]["argv"], returncode, streams["stdout"], streams["stderr"])


def assert_train_run_ended_well(out, name, proc, size):
    """Run ``name`` of a train_runs() launch ended with status 0 on each of the ``size`` ranks, as its own
    launch's return code 0 said before; else what the ranks printed during it. Returns train_run_result()."""
    result = train_run_result(out, name, proc, size)
    if result.returncode != 0:
        errors = [json.load(open(os.path.join(out, name, f"rank{rank}.json")))["error"] for rank in range(size)]
        pytest.fail(f"{name}: exit status {result.returncode}; errors by rank: {errors}\n"
                    f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


# The mission's scale (issue 26 section 5): `horovodrun -np 8 --mpi python train.py` at its defaults, per
# strategy; test_every_strategy_at_np8.py asserts on each run, test_default_schedule.py on "sync" (no option
# at all: the mission's own command). name: train.py's options, before the run directory.
MISSION_SCALE_SIZE = 8
MISSION_SCALE_RUNS = {
    "easgd": ["--strategy", "easgd"],
    "periodic": ["--strategy", "periodic"],
    "diloco": ["--strategy", "diloco"],
    "hierarchical": ["--strategy", "hierarchical", "--ranks-per-group", "4", "--inter", "easgd"],
    "accumulate": ["--accumulate", "4"],
    "sync": [],
}
# A deadlock's bound per run: what each run's own launch had (420 s: 50-90 s idle, 260 s measured with the
# shared machine at load 13); the launch's is every run's together.
MISSION_SCALE_STEP_SECONDS = 420
MISSION_SCALE_LAUNCH_SECONDS = MISSION_SCALE_STEP_SECONDS * len(MISSION_SCALE_RUNS) + 60
_MISSION_SCALE = {}


def mission_scale_argv(out, name):
    """Run ``name``'s train.py argv in mission_scale_launch(): its options, then its run directory."""
    return [*MISSION_SCALE_RUNS[name], "--run-dir", os.path.join(out, name, "run")]


def mission_scale_launch(tmp_path_factory):
    """``(OUT, the launch's CompletedProcess)``: every MISSION_SCALE_RUNS run in ONE train_runs() launch of 8
    ranks under horovodrun --mpi, launched once per session, whichever module asks first. Why: a launch of 8
    ranks on 2 cores spends 35-40 s importing TensorFlow, about twice a run's training."""
    if not _MISSION_SCALE:
        out = str(tmp_path_factory.mktemp("mission_scale"))
        runs = [{"name": name, "argv": mission_scale_argv(out, name)} for name in MISSION_SCALE_RUNS]
        _MISSION_SCALE["launch"] = out, train_runs(out, runs, "mpi", np=MISSION_SCALE_SIZE,
                                                   step_seconds=MISSION_SCALE_STEP_SECONDS)
    return _MISSION_SCALE["launch"]


# `horovodrun -np 2 --gloo python train.py OPTIONS` runs that need no launch of their own (no environment read
# at import, nothing read from the launcher's output, a usage error's exit nowhere), from four modules:
# test_train.py's low-communication strategies at their defaults, test_adaptive_period.py's,
# test_variable_size_images.py's and test_balance.py's. name: train.py's options, before the run directory; "{images}" stands for
# the folder pair_launch() writes with write_image_folder(), OUT/image-data.
PAIR_RUNS = {
    "periodic": ["--strategy", "periodic"],
    "diloco": ["--strategy", "diloco"],
    "adaptive-period": ["--strategy", "periodic", "--tau", "adaptive", "--tau-max", "40", "--epochs", "3"],
    "images": ["--data", "images:{images}", "--batch-size", "1", "--accumulate", "4", "--epochs", "6", "--lr",
               "0.05"],
    "tau-1": ["--strategy", "periodic", "--tau", "1", "--epochs", "1"],
    # test_balance.py's: rank 1 made slow (sample_shares.TEST_SLOW_RANKS), each rank's share measured; 22 steps
    # of 64 an epoch, so tau 11 ends every epoch on an outer step.
    "balance": ["--strategy", "diloco", "--tau", "11", "--balance", "speed", "--epochs", "3"],
}
# A run's environment of its own (scripts/train_runs.py sets it for that run alone).
PAIR_ENV = {"balance": {"HVD_EASGD_TEST_SLOW_RANKS": "1:0.002"}}
# A deadlock's bound per run: the longest any of them had in its own launch (280 s); the launch's is every
# run's together.
PAIR_STEP_SECONDS = 280
PAIR_LAUNCH_SECONDS = PAIR_STEP_SECONDS * len(PAIR_RUNS) + 60
_PAIR = {}


def write_image_folder(root, per_class=24):
    """Two classes that a fully convolutional net can tell apart at any size:
    bright-centred blobs against dark-centred ones, in random sizes."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    for label, cls in enumerate(["bright", "dark"]):
        os.makedirs(os.path.join(root, cls))
        for i in range(per_class):
            h, w = rng.integers(12, 33, size=2)
            img = rng.integers(0, 60, (h, w, 3)).astype(np.uint8)
            if label == 0:
                img[h // 4: 3 * h // 4, w // 4: 3 * w // 4] += 180
            encode = tf.io.encode_png if i % 2 else (lambda x: tf.io.encode_jpeg(x, quality=95))
            ext = "png" if i % 2 else "jpg"
            tf.io.write_file(os.path.join(root, cls, f"{i}.{ext}"), encode(img))


def pair_argv(out, name):
    """Run ``name``'s train.py argv in pair_launch(): its options, then its run directory OUT/NAME/run."""
    options = [option.format(images=os.path.join(out, "image-data")) for option in PAIR_RUNS[name]]
    return [*options, "--run-dir", os.path.join(out, name, "run")]


def pair_launch(tmp_path_factory):
    """``(OUT, the launch's CompletedProcess)``: every PAIR_RUNS run, one after the other in ONE train_runs()
    launch of 2 ranks under horovodrun --gloo, launched once per session, whichever module asks first. Why: a
    launch of 2 ranks spends 8-12 s of the 2 cores importing TensorFlow, as long as a short run trains."""
    if not _PAIR:
        out = str(tmp_path_factory.mktemp("pair"))
        write_image_folder(os.path.join(out, "image-data"))
        runs = [{"name": name, "argv": pair_argv(out, name), "env": PAIR_ENV.get(name, {})} for name in PAIR_RUNS]
        _PAIR["launch"] = out, train_runs(out, runs, "gloo", step_seconds=PAIR_STEP_SECONDS)
    return _PAIR["launch"]
