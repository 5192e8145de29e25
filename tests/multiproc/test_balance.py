"""train.py --balance speed under horovodrun --gloo -np 2 with rank 1 made slow (the test hook
HVD_EASGD_TEST_SLOW_RANKS): the ranks measure their speeds at start-up and agree on their shares of
the global batch, the slow rank takes fewer samples, every outer step leaves both ranks the same
weights, and the run learns. The throughput this buys is a benchmark's to measure
(benchmarks/accuracy/slow_rank.py), not a test's.

The run is "balance" of tests/multiproc/helpers.py's pair_launch(): one Gloo launch of 2 ranks shared
with other modules' runs (scripts/train_runs.py calls train.py's main() for each on every rank)."""
import os
import re

import numpy as np
import pytest
import yaml

from tests.multiproc.helpers import PAIR_LAUNCH_SECONDS, assert_run_ended_well, pair_argv, pair_launch

pytestmark = pytest.mark.multiproc
BALANCE = re.compile(r"train\.py: balance: ranks' speeds (\d+), (\d+) samples/s -> micro-batches (\d+), (\d+) of 64")
FINAL = re.compile(r"final test accuracy: (\d\.\d{4})")


@pytest.mark.timeout(PAIR_LAUNCH_SECONDS + 60)  # may set up the shared launch: its bound, and a margin
def test_a_slow_rank_takes_a_smaller_share_and_every_outer_step_leaves_the_ranks_equal(tmp_path_factory):
    out, launch = pair_launch(tmp_path_factory)
    argv = pair_argv(out, "balance")
    proc = assert_run_ended_well(out, "balance", argv, launch, 2)
    run_dir = argv[-1]
    lines = BALANCE.findall(proc.stdout)
    assert len(lines) == 1, proc.stdout[-3000:]  # rank 0 alone says it
    fast, slow, fast_share, slow_share = map(int, lines[0])
    # rank 1 sleeps 2 ms a sample: far slower than the CNN's own compute on digits
    assert slow < fast / 2
    assert fast_share + slow_share == 64 and slow_share < fast_share
    with open(os.path.join(run_dir, "config.yaml")) as f:
        assert yaml.safe_load(f)["config"]["sample_shares"] == [fast_share, slow_share]
    # 3 epochs of 22 steps at tau 11: each epoch ends on an outer step, so both ranks hold θ, bit for bit
    for epoch in (1, 3):
        name = os.path.join(run_dir, "checkpoints", f"epoch-{epoch:06d}")
        with np.load(os.path.join(name, "rank-00000.npz")) as a, np.load(os.path.join(name, "rank-00001.npz")) as b:
            weights = [k for k in a.files if k.startswith("model/")]
            assert weights and all(np.array_equal(a[k], b[k]) for k in weights)
    assert float(FINAL.search(proc.stdout).group(1)) >= 0.85
