"""train.py --strategy auto across two virtual hosts, one rank each: on the unshaped link it keeps
SyncAverage, across a 10 Mbit/s link it chooses a local-update strategy, from the link it measured.

The digits CNN at a batch of 256 computes for milliseconds a step; its 153 KB of gradients cross a
10 Mbit/s link in about 120 ms, so SyncAverage's predicted utilisation there is a few percent, and on
the unshaped veth pair above 0.5, the target both launches ask for (robust on a loaded machine)."""
import os

import pytest
import yaml

from tests.multinode.helpers import HOSTS, RANKS_PER_HOST, horovodrun_on_hosts, launch

pytestmark = pytest.mark.multinode
LAUNCH_TIMEOUT = 150


@pytest.mark.timeout(2 * LAUNCH_TIMEOUT + 120)
def test_auto_chooses_sync_on_a_fast_link_and_a_local_update_strategy_on_a_slow_one(virtual_cluster, tmp_path):
    found = {}
    try:
        for rate in (None, "10mbit"):
            virtual_cluster.up(HOSTS, RANKS_PER_HOST, rate)
            run_dir = str(tmp_path / f"run-{rate}")
            args = ["--strategy", "auto", "--auto-utilisation", "0.5", "--batch-size", "256", "--epochs", "1",
                    "--run-dir", run_dir, "--threads-per-rank", "1"]
            out = launch(virtual_cluster, horovodrun_on_hosts("node1:1,node2:1", "mpi", args, np=2),
                         timeout=LAUNCH_TIMEOUT)
            assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
            with open(os.path.join(run_dir, "config.yaml")) as f:
                config = yaml.safe_load(f)
            found[rate] = config["config"]["auto_choice"]
            assert found[rate]["reason"] in out.stdout
    finally:
        virtual_cluster.up(HOSTS, RANKS_PER_HOST)
    fast, slow = found[None], found["10mbit"]
    assert fast["candidate"]["strategy"] == "sync" and fast["hosts"] == 2, fast
    assert slow["candidate"]["strategy"] == "diloco" and slow["hosts"] == 2, slow
    # the link it priced is the one it crossed: 10 Mbit/s measured at 4-10.5 (Open MPI's TCP over tbf)
    assert 4e6 / 8 < slow["across"]["bandwidth"] < 10.5e6 / 8, slow["across"]
    assert slow["predictions"][0]["candidate"] == "sync" and slow["predictions"][0]["utilisation"] < 0.5
