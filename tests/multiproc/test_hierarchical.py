"""Hierarchical across real ranks: horovodrun -np 4 on this host, groups of 2
(Horovod's dynamic process sets, created differently by Gloo and by MPI), and
the direct MPI path under mpirun (communicators from MPI_Comm_split): the
reduce-scatter, every inter strategy on shards, and train.py's exact resume."""
import json
import os

import numpy as np
import pytest
import yaml

from tests.helpers import CONTROLLERS, ROOT, horovodrun, launch, read_rank_results, script
from tests.reference import hierarchical_reference

pytestmark = pytest.mark.multiproc
SIZE, N, WIDTH, LR = 4, 2, 3, 0.5
SHARD = 2 * 4  # bytes of a rank's shard: m = ceil(3/2) = 2 elements (one of padding)
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


def test_reducescatter_gives_each_rank_its_block_of_the_padded_sum(ranks):
    floats = sum(np.arange(7) * 0.25 + r for r in range(SIZE))
    ints = sum(np.arange(5) * (r + 1) for r in range(SIZE))
    for rank, result in enumerate(ranks):
        got_floats, got_ints = result["reducescatter"]
        assert got_floats == np.append(floats, 0.0)[2 * rank:2 * rank + 2].tolist()  # exact: quarters, 4 ranks
        assert got_ints == np.append(ints, [0, 0, 0])[2 * rank:2 * rank + 2].tolist()


# Per rank with counts, tau = 2, 4 steps (hierarchical.py's docstring): within, the reduce-scatter of
# 2 rows of 2 + 2 and the update's allgather every step, the weights' allgather every tau-th step;
# across, the shard and the flag every tau-th step.
LOCAL_LEVELS = {"intra": {"bytes": 4 * (2 * (SHARD + 8) + SHARD) + 2 * SHARD, "calls": 10},
                "inter": {"bytes": 2 * (SHARD + 4), "calls": 2}}


@pytest.mark.parametrize("inter", ["easgd", "periodic", "diloco"])
def test_every_local_inter_strategy_on_shards_of_process_sets(ranks, inter):
    weights, kept = hierarchical_reference(grads(), COUNTS, GROUPS, LR, X0, inter, tau=2, alpha=0.25)
    runs = [r[inter] for r in ranks]
    assert runs[0]["kernel"] == runs[1]["kernel"] and runs[2]["kernel"] == runs[3]["kernel"]  # bit-identical
    assert all(run["center"] == runs[0]["center"] for run in runs)
    np.testing.assert_allclose([runs[0]["kernel"], runs[2]["kernel"]], weights, rtol=1e-5)
    if kept is not None:
        np.testing.assert_allclose(runs[0]["center"], kept, rtol=1e-5)
    for run in runs:
        assert run["groups"] == GROUPS and run["inter_size"] == 2
        assert run["levels"] == LOCAL_LEVELS
        assert run["total"] == {"bytes": sum(v["bytes"] for v in LOCAL_LEVELS.values()), "calls": 12}
    assert runs[0]["moving_rate"] == (0.25 if inter == "easgd" else None)


def test_sync_within_and_across_groups_is_the_mean_over_every_rank(ranks):
    expected = X0 - LR * grads().mean(axis=1).sum(axis=0)
    runs = [r["sync"] for r in ranks]
    assert all(run["kernel"] == runs[0]["kernel"] for run in runs)
    np.testing.assert_allclose(runs[0]["kernel"], expected, rtol=1e-5)
    # the script passes a count of 1: it rides in the reduce-scatter's rows and in the shard's allreduce
    assert all(run["levels"] == {"intra": {"bytes": 4 * (2 * (SHARD + 8) + SHARD), "calls": 8},
                                 "inter": {"bytes": 4 * (SHARD + 4), "calls": 4}} for run in runs)


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


