"""Stop requests: signals and the stop file, the second signal, and checkpoint directories by global step."""
import os
import signal
import subprocess

import pytest

from hvd_easgd import checkpoint, preemption
from tests.conftest import PYTHON, ROOT, quiet_env

pytestmark = pytest.mark.unit


def test_a_signal_or_the_stop_file_is_a_request(tmp_path):
    stop_file = tmp_path / preemption.STOP_FILE
    requests = preemption.StopRequests(("USR1",), stop_file=str(stop_file))
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        requests.install()
        assert not requests.requested
        stop_file.write_text("")
        assert requests.requested
        requests.consume()
        assert not stop_file.exists() and not requests.requested
        requests.grace_seconds = 60  # the grace timer is a daemon thread: it dies with the test process
        os.kill(os.getpid(), signal.SIGUSR1)
        assert requests.received == signal.SIGUSR1 and requests.requested
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_the_second_signal_exits_at_once_with_exit_forced():
    code = ("import os, signal, time; from hvd_easgd import preemption; "
            "preemption.StopRequests(('TERM',)).install(); "
            "os.kill(os.getpid(), signal.SIGTERM); os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)")
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=quiet_env(), capture_output=True, timeout=60)
    assert out.returncode == preemption.EXIT_FORCED == 76


def test_the_grace_period_exits_with_exit_forced():
    code = ("import os, signal, time; from hvd_easgd import preemption; "
            "preemption.StopRequests(('TERM',), grace_seconds=0.5).install(); "
            "os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)")
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=quiet_env(), capture_output=True, timeout=60)
    assert out.returncode == preemption.EXIT_FORCED


def test_unknown_signal_names_are_refused():
    with pytest.raises(ValueError, match=r"`names` must be among .* Received: names=\['KILL'\]"):
        preemption.StopRequests(("KILL",))


def test_checkpoint_directories_sort_by_global_step(tmp_path):
    names = ["epoch-000002", "epoch-000001-step-000017", "epoch-000001", "epoch-000000-step-000003"]
    for name in names:
        os.makedirs(tmp_path / "checkpoints" / name)
        (tmp_path / "checkpoints" / name / checkpoint.MANIFEST).write_text("{}")
    found = [os.path.basename(path) for _, path in checkpoint.complete_checkpoints(str(tmp_path))]
    assert found == sorted(names) == ["epoch-000000-step-000003", "epoch-000001", "epoch-000001-step-000017",
                                      "epoch-000002"]
    assert checkpoint.checkpoint_dir("r", 1, 17) == os.path.join("r", "checkpoints", "epoch-000001-step-000017")
