"""Started allreduces really run in the background (comm/background.py) under real ranks: on Horovod's
path (horovodrun --gloo and --mpi) and the direct one (--collectives mpi-direct under horovodrun --mpi), exactly
(tests/reference.py's overlap_reference, scripts/background_checks.py, run inside core_checks.py's launches
that test_strategies.py reads too: one TF start-up per rank for both); and train.py --step-timeline shows
the collectives running while the steps compute, with the final weights of the blocking twin
(HVD_EASGD_BACKGROUND=0, the tests' switch)."""
import json
import os

import keras
import numpy as np
import pytest

from hvd_easgd.comm.timeline import overlap_share
from tests.helpers import ROOT, launch, quiet_env
from tests.multiproc.helpers import core_results

pytestmark = pytest.mark.multiproc
TRAIN = os.path.join(ROOT, "train.py")
TAU, DIM, STEPS = 4, 6, 10


def pending_after_each_step(delta):
    """After step t (1-based), is a start in flight? Starts at t ≡ −δ, merges at t ≡ 0 (mod τ); the last
    start of the 10 steps is in flight at the end (the script drains it after)."""
    pending, out = False, []
    for t in range(1, STEPS + 1):
        if t % TAU == 0:
            pending = False
        if (t + delta) % TAU == 0:
            pending = True
        out.append(pending)
    return out


@pytest.mark.parametrize("launcher, collectives", [("gloo", "horovod"), ("mpi", "horovod"), ("mpi", "mpi-direct")])
def test_started_allreduces_run_on_the_worker_and_match_the_reference(launcher, collectives, tmp_path_factory):
    for r in [rank["background"] for rank in core_results(launcher, collectives, tmp_path_factory)]:
        assert r["communicator"] == {"horovod": "HorovodCommunicator", "mpi-direct": "DirectMPICommunicator"}[
            collectives]
        assert r["reduces_in_background"] is True
        assert r["worker_threads"] == ["hvd_easgd-background-allreduce"]  # one worker: start order kept
        for strategy in ("easgd", "periodic"):
            for delta in (1, 2):
                got = r[f"{strategy}_{delta}"]
                assert got["local_relerr"] <= 1e-5, got
                if strategy == "easgd":
                    assert got["center_relerr"] <= 1e-5, got
                starts = sum(1 for t in range(1, STEPS + 1) if (t + delta) % TAU == 0)
                # recorded at the start, as the blocking allreduce: DIM floats + the non-finite flag each
                assert got["account"] == {"bytes": starts * (4 * DIM + 4), "calls": starts}
                # the handle stays with the worker for δ steps, then the merge takes it
                assert [bool(h) for h in got["in_flight_after_step"]] == pending_after_each_step(delta)
                assert got["in_flight_at_end"] == []
                handles = [c["handle"] for c in got["timeline"]["collectives"]]
                assert len(handles) == starts and handles == sorted(handles)


def train_with_timeline(tmp_path, name, background):
    run_dir = str(tmp_path / name)
    env = quiet_env() if background else quiet_env(HVD_EASGD_BACKGROUND="0")
    # The wide MLP's 21.7 MB allreduce against steps of 2 × 176 samples: δ = 2 steps of compute cover it.
    # 4 steps an epoch (1437 // 352): every epoch ends on a merge (t ≡ 0 mod 4), so fit's validation
    # drains nothing in flight.
    proc = launch([TRAIN, "--strategy", "periodic", "--tau", "4", "--overlap", "2", "--model", "wide_mlp",
                   "--batch-size", "176", "--epochs", "4", "--step-timeline", "--run-dir", run_dir,
                   "--no-tensorboard"], "gloo", timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(os.path.join(run_dir, "timeline.json")) as f:
        timeline = json.load(f)
    weights = keras.models.load_model(os.path.join(run_dir, "model.keras")).get_weights()
    return timeline, weights


def test_the_timeline_shows_collectives_during_compute_with_the_weights_of_the_blocking_twin(tmp_path):
    background, weights = train_with_timeline(tmp_path, "background", True)
    blocking, blocking_weights = train_with_timeline(tmp_path, "blocking", False)
    steps = len(background["steps"])
    assert steps == len(blocking["steps"]) == 16
    # a start at every t ≡ 2 (mod 4): one collective each, on both paths
    assert len(background["collectives"]) == len(blocking["collectives"]) == sum(
        1 for t in range(1, steps + 1) if (t + 2) % 4 == 0)
    # The first collective pays the transport's one-time set-up (Gloo's buffers, first-touch memory:
    # 2.3 s against 0.14-0.28 s for the others in a rehearsal on a slow day), longer than the δ = 2
    # steps that follow it; the share is judged on the warm ones.
    warm = overlap_share(dict(background, collectives=background["collectives"][1:]))
    assert warm > 0.5, (warm, background["overlap_share"])
    assert blocking["overlap_share"] == 0.0  # the step waits through each collective
    for w, b in zip(weights, blocking_weights, strict=True):
        np.testing.assert_array_equal(w, b)
