"""Hierarchical across real ranks: horovodrun -np 4 on this host, groups of 2
(Horovod's dynamic process sets, created differently by Gloo and by MPI), and
the direct MPI path under mpirun (communicators from MPI_Comm_split)."""
import json
import os

import numpy as np
import pytest
import yaml

from tests.helpers import CONTROLLERS, ROOT, horovodrun, launch, read_rank_results, script

pytestmark = pytest.mark.multiproc
SIZE, N, WIDTH, LR = 4, 2, 3, 0.5
M = WIDTH * 4
X0 = np.array([1.0, -2.0, 0.5])
COUNTS = [3, 1, 2, 5]
GROUPS = [[0, 1], [2, 3]]
TRAIN = os.path.join(ROOT, "train.py")


# (launcher, collectives): Horovod under each controller, and the direct path under mpirun.
LAUNCHES = [(controller, "horovod") for controller in CONTROLLERS] + [("mpirun", "mpi-direct")]


@pytest.fixture(scope="module", params=LAUNCHES, ids=["-".join(p) for p in LAUNCHES])
def ranks(request, tmp_path_factory):
    launcher, collectives = request.param
    out = tmp_path_factory.mktemp(f"hierarchical-{launcher}-{collectives}")
    proc = launch([script("hierarchical_checks.py"), str(out), collectives], launcher, np=SIZE, timeout=280)
    assert proc.returncode == 0, f"under {request.param}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return read_rank_results(out, SIZE)


def grads():
    return np.random.default_rng(0).normal(size=(4, SIZE, WIDTH)).astype(np.float32).astype(np.float64)


def test_sync_within_groups_easgd_across_them_on_process_sets(ranks):
    x = np.tile(X0, (2, 1))
    center = X0.copy()
    for t, g in enumerate(grads(), start=1):  # groups as EASGD's workers, tau = 2, alpha = 0.25
        for i, group in enumerate(GROUPS):
            x[i] -= LR * sum(COUNTS[r] * g[r] for r in group) / sum(COUNTS[r] for r in group)
        if t % 2 == 0:
            d = 0.25 * (x - center)
            x, center = x - d, center + d.sum(axis=0)
    runs = [r["easgd"] for r in ranks]
    assert runs[0]["kernel"] == runs[1]["kernel"] and runs[2]["kernel"] == runs[3]["kernel"]  # bit-identical
    assert all(run["center"] == runs[0]["center"] for run in runs)
    np.testing.assert_allclose([runs[0]["kernel"], runs[2]["kernel"]], x, rtol=1e-5)
    np.testing.assert_allclose(runs[0]["center"], center, rtol=1e-5)
    for run in runs:
        assert run["groups"] == GROUPS and run["inter_size"] == 2 and run["moving_rate"] == 0.25
        assert run["levels"] == {"intra": {"bytes": 4 * (M + 4), "calls": 4},
                                 "inter": {"bytes": 2 * (M + 4), "calls": 2}}
        assert run["total"] == {"bytes": 6 * (M + 4), "calls": 6}


def test_sync_within_and_across_groups_is_the_mean_over_every_rank(ranks):
    expected = X0 - LR * grads().mean(axis=1).sum(axis=0)
    runs = [r["sync"] for r in ranks]
    assert all(run["kernel"] == runs[0]["kernel"] for run in runs)
    np.testing.assert_allclose(runs[0]["kernel"], expected, rtol=1e-5)
    # the script passes a count of 1: it rides in each level's call
    assert all(run["levels"] == {"intra": {"bytes": 4 * (M + 4), "calls": 4},
                                 "inter": {"bytes": 4 * (M + 4), "calls": 4}} for run in runs)


def test_train_py_with_one_rank_per_group_runs_the_inter_strategy_alone_to_095(tmp_path):
    # One host: the default groups would be one group (SyncAverage alone); --ranks-per-group 1 is EASGD alone
    run_dir = str(tmp_path / "run")
    proc = horovodrun([TRAIN, "--strategy", "hierarchical", "--ranks-per-group", "1", "--run-dir", run_dir],
                      controller="gloo", timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(os.path.join(run_dir, "config.yaml")) as f:
        run = yaml.safe_load(f)
    assert run["groups"] == [[0], [1]] and run["config"]["strategy"] == "hierarchical"
    with open(os.path.join(run_dir, "metrics.json")) as f:
        assert json.load(f)["final"]["test_accuracy"] >= 0.95
