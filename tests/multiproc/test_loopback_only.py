"""Every server a multi-process test starts is reachable over loopback only.

The test session runs in a private network namespace with lo alone (see
tools/loopback_network.py), because Open MPI's out-of-band listener, its TCP
BTL and horovodrun's Gloo rendezvous bind to every address whatever we ask.
This test looks at the sockets of a live job, not at our intentions.
"""
import os
import subprocess
import time

import pytest

from tools import loopback_network
from tests.helpers import ROOT, bounded, horovodrun_command, quiet_env, script

pytestmark = pytest.mark.multiproc


@pytest.mark.timeout(150)
@pytest.mark.parametrize("controller", ["gloo", "mpi"])
def test_a_live_job_listens_on_loopback_only(controller, tmp_path, request):
    assert loopback_network.is_loopback_only(), (
        f"the tests run with interfaces {loopback_network.interfaces()}: {request.config.hvd_easgd_network}")
    before = set(loopback_network.listening_tcp_sockets())
    ready, release = tmp_path / "ready", tmp_path / "release"
    cmd = horovodrun_command([script("hold_job_open.py"), str(ready), str(release)], controller=controller)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + bounded(100)
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), f"the job never got past its first allreduce:\n{proc.stdout.read()[-3000:]}"
        during = set(loopback_network.listening_tcp_sockets())
    finally:
        release.touch()
        try:
            out, _ = proc.communicate(timeout=bounded(40))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            out, _ = proc.communicate()
            pytest.fail(f"the job did not end after its release (deadlock?):\n{out[-3000:]}")
    assert proc.returncode == 0, out[-3000:]
    assert ready.read_text() == "3"  # 1 + 2: the ranks really exchanged data
    started = during - before
    assert started, "the job opened no listening socket at all; this test would prove nothing"
    exposed = sorted(s for s in started if loopback_network.reachable_from_outside(s[0]))
    assert not exposed, f"reachable from outside the machine: {exposed}"
