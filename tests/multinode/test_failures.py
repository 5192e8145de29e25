"""What a multi-host job does when a host dies, or when the hosts do not share the run directory."""
import json
import os
import re

import pytest

from hvd_easgd import checkpoint
from tests.multinode.helpers import END_AFTER_KILL_TIMEOUT, FIRST_CHECKPOINT_TIMEOUT, horovodrun_on_hosts, launch

pytestmark = pytest.mark.multinode


# The job is the session's shared Gloo job on the public cluster (conftest.py's
# gloo_job_exposed_then_node2_killed): test_network_exposure.py measures its listeners first, then node2
# is killed under it. Its bound (first checkpoint, the measurement, the end after the kill) and the resume's.
@pytest.mark.timeout(FIRST_CHECKPOINT_TIMEOUT + END_AFTER_KILL_TIMEOUT + 150 + 60)
def test_a_host_dies_the_job_ends_within_60s_and_its_checkpoint_resumes(gloo_job_exposed_then_node2_killed,
                                                                       public_cluster):
    job = gloo_job_exposed_then_node2_killed
    run_dir, out, killed, elapsed = job["run_dir"], job["output"], job["killed"], job["elapsed"]
    assert job["checkpointed"], "training never completed its first checkpoint\n" + out[-3000:]
    assert killed is not None and len(killed) >= 3, (killed, out[-3000:])
    assert job["returncode"] != 0
    assert elapsed is not None, f"the job had not ended {END_AFTER_KILL_TIMEOUT}s after node2 died"
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
    # The latest complete checkpoint resumes on a rebuilt cluster (node2 is back: the public_cluster fixture).
    epochs = str(manifest["epoch"] + 1)
    resumed = launch(public_cluster, horovodrun_on_hosts("node1:1,node2:1", "gloo",
                                                         ["--resume", str(run_dir), "--epochs", epochs], np=2),
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
