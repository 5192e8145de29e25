"""Helpers of the multiproc tier: the core checks' launches, shared by the modules that assert on
them; and for the resume tests, a stopped run made from an uninterrupted one's checkpoints, and two
runs' checkpoint states compared array by array."""
import os
import shutil

import numpy as np

from tests.helpers import launch, read_rank_results, script

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
