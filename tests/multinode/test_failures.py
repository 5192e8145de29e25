"""What a multi-host job does when a host dies, or when the hosts do not share the run directory."""
import json
import os
import re
import time

import pytest

from hvd_easgd import checkpoint
from tests.helpers import bounded
from tests.multinode.helpers import HOSTS, RANKS_PER_HOST, horovodrun_on_hosts, launch, popen

pytestmark = pytest.mark.multinode


@pytest.mark.timeout(280)
def test_a_host_dies_the_job_ends_within_60s_and_its_checkpoint_resumes(cluster, tmp_path):
    run_dir = tmp_path / "run"
    args = ["--run-dir", str(run_dir), "--epochs", "400", "--threads-per-rank", "1"]
    proc = popen(cluster, horovodrun_on_hosts("node1:1,node2:1", "gloo", args, np=2))
    try:
        # Wait for a *complete* checkpoint (its manifest written): the directory exists as soon as
        # the first shard is being written, and a kill then would leave nothing to resume from.
        deadline = time.monotonic() + bounded(120)
        while (not checkpoint.complete_checkpoints(str(run_dir)) and proc.poll() is None
               and time.monotonic() < deadline):
            time.sleep(0.5)
        assert checkpoint.complete_checkpoints(str(run_dir)), "training never completed its first checkpoint"
        killed = cluster.kill_host("node2")  # every process of node2: its sshd, the session, the rank
        killed_at = time.monotonic()
        out, _ = proc.communicate(timeout=bounded(90))
        elapsed = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.communicate()
    assert len(killed) >= 3, killed
    assert proc.returncode != 0
    assert elapsed <= 60, f"the job took {elapsed:.0f}s to end after node2 died"
    # The launcher names the host and the rank that went away. Rank 0 may add its own line (a failed
    # collective) or be stopped by the launcher first; either way no rank floods the output.
    # (ssh's own line: "Connection to node2 closed by remote host", or a reset if data was in flight.)
    assert re.search(r"^\[1\]<stderr>:.*node2", out, re.M), out[-3000:]
    assert "Process 1 exit with status code 255" in out, out[-3000:]  # 255: ssh lost its host
    errors = [line for line in out.splitlines() if "train.py: error" in line]
    assert len(errors) <= 1 and all("another rank died" in line for line in errors), out[-3000:]
    assert not re.search(r"^\[\d+\]<std(err|out)>:\s*Traceback", out, re.M), out[-3000:]

    manifest, _ = checkpoint.latest(str(run_dir))
    assert manifest["num_ranks"] == 2 and manifest["epoch"] >= 1
    # The latest complete checkpoint resumes on a rebuilt cluster (node2 is back).
    cluster.up(HOSTS, RANKS_PER_HOST)
    epochs = str(manifest["epoch"] + 1)
    resumed = launch(cluster, horovodrun_on_hosts("node1:1,node2:1", "gloo", ["--resume", str(run_dir),
                                                                               "--epochs", epochs], np=2),
                     timeout=150)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    with open(run_dir / "metrics.json") as f:
        assert json.load(f)["epochs"][-1]["epoch"] == int(epochs)


@pytest.mark.timeout(200)
def test_a_run_directory_the_hosts_do_not_share_is_refused_before_any_checkpoint(cluster, tmp_path):
    # cluster.scratch is node-local: node2 (rank 1) does not see what node1 (rank 0) writes there.
    run_dir = os.path.join(cluster.scratch, f"run-{tmp_path.name}")
    out = launch(cluster, horovodrun_on_hosts("node1:1,node2:1", "gloo", [
        "--run-dir", run_dir, "--epochs", "1", "--threads-per-rank", "1"], np=2), timeout=150)
    text = out.stdout + out.stderr
    errors = [line for line in text.splitlines() if "train.py: error" in line]
    assert out.returncode != 0 and len(errors) == 1, text[-3000:]
    assert re.search(r"Process 0 exit with status code 2", text), text[-3000:]  # rank 0: a usage error
    assert f"--run-dir {run_dir} is not shared" in errors[0] and "rank 1 on node2" in errors[0], errors[0]
    assert "HINT" in errors[0], errors[0]
    for host in cluster.hosts:  # no checkpoint on either host's scratch
        written = [os.path.join(d, f) for d, _, files in os.walk(cluster.host_scratch(host)) for f in files]
        assert not [path for path in written if "checkpoints" in path], (host, written)
