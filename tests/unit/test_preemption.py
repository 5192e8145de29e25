"""Stop requests: signals and the stop file, the second signal, and checkpoint directories by global step."""
import os
import signal
import subprocess

import pytest

from hvd_easgd import checkpoint
from hvd_easgd.checkpoint import preemption
from tests.helpers import PYTHON, ROOT, quiet_env

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
        os.kill(os.getpid(), signal.SIGUSR1)
        assert requests.received == signal.SIGUSR1 and requests.requested
        timer = requests._grace_timer
        assert timer is not None and timer.is_alive()
    finally:
        # The grace period would end this test process 120 s later with EXIT_FORCED (CI saw
        # pytest exit 76 in a later test): uninstall cancels it and restores the handler.
        requests.uninstall()
    timer.join(timeout=5)
    assert not timer.is_alive() and signal.getsignal(signal.SIGUSR1) is previous


def test_the_second_signal_exits_at_once_with_exit_forced():
    code = ("import os, signal, time; from hvd_easgd.checkpoint import preemption; "
            "preemption.StopRequests(('TERM',)).install(); "
            "os.kill(os.getpid(), signal.SIGTERM); os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)")
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=quiet_env(), capture_output=True, timeout=60)
    assert out.returncode == preemption.EXIT_FORCED == 76


def test_the_grace_period_exits_with_exit_forced():
    code = ("import os, signal, time; from hvd_easgd.checkpoint import preemption; "
            "preemption.StopRequests(('TERM',), grace_seconds=0.5).install(); "
            "os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)")
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=quiet_env(), capture_output=True, timeout=60)
    assert out.returncode == preemption.EXIT_FORCED


def test_uninstall_cancels_the_grace_period():
    # A process that goes on after training must not be ended by a grace period it no longer needs.
    code = ("import os, signal, time; from hvd_easgd.checkpoint import preemption; "
            "r = preemption.StopRequests(('TERM',), grace_seconds=0.5).install(); "
            "os.kill(os.getpid(), signal.SIGTERM); r.uninstall(); time.sleep(1.5)")
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=quiet_env(), capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]


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


def callback_on_a_model(tmp_path, **kwargs):
    import keras

    import hvd_easgd
    from hvd_easgd import LocalCommunicator, SyncAverage, callbacks

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), SyncAverage(),
                                                           comm=LocalCommunicator()), loss="mse")
    model.optimizer.build(model.trainable_variables)
    checkpointer = callbacks.PeriodicCheckpoint(str(tmp_path), model.optimizer.comm, {}, keep=100, **kwargs)
    checkpointer.set_model(model)
    return checkpointer


def saved(tmp_path):
    return sorted(os.listdir(tmp_path / "checkpoints")) if (tmp_path / "checkpoints").is_dir() else []


def test_step_checkpoints_land_on_their_micro_batch_and_an_epoch_end_waits_for_the_epoch(tmp_path):
    checkpointer = callback_on_a_model(tmp_path, every=0, every_steps=4, steps_per_epoch=6, initial_step=2)
    for batch in range(4):  # global micro-batches 3..6: 4 is mid-epoch, 6 ends epoch 0
        checkpointer.on_train_batch_end(batch)
    assert saved(tmp_path) == ["epoch-000000-step-000004"]
    checkpointer.on_epoch_end(0)  # nothing due at micro-batch 6 (not a multiple of 4)
    for batch in range(2):  # 7, 8 (= epoch 1, micro-batch 2)
        checkpointer.on_train_batch_end(batch)
    assert saved(tmp_path) == ["epoch-000000-step-000004", "epoch-000001-step-000002"]
    manifest = checkpoint.latest(str(tmp_path))[0]
    assert (manifest["epoch"], manifest["step_in_epoch"], manifest["global_step"]) == (1, 2, 8)


def test_a_step_checkpoint_on_an_epochs_last_micro_batch_is_written_at_the_epoch_end(tmp_path):
    checkpointer = callback_on_a_model(tmp_path, every=0, every_steps=3, steps_per_epoch=6)
    for batch in range(6):
        checkpointer.on_train_batch_end(batch)
    assert saved(tmp_path) == ["epoch-000000-step-000003"]  # micro-batch 6 waits for the epoch end
    checkpointer.on_epoch_end(0)
    assert saved(tmp_path) == ["epoch-000000-step-000003", "epoch-000001"]


def test_a_stop_request_checkpoints_at_the_next_agreement_and_stops(tmp_path):
    stop_file = tmp_path / preemption.STOP_FILE
    requests = preemption.StopRequests(stop_file=str(stop_file))
    checkpointer = callback_on_a_model(tmp_path, every=0, steps_per_epoch=10, stop_requests=requests,
                                       every_minutes=60, check_every=4)
    assert checkpointer.agrees
    checkpointer.on_train_batch_end(0)
    stop_file.write_text("")  # asked after micro-batch 1: the agreement at 4 sees it
    for batch in range(1, 4):
        checkpointer.on_train_batch_end(batch)
        assert not checkpointer.model.stop_training or batch == 3
    assert checkpointer.model.stop_training and saved(tmp_path) == ["epoch-000000-step-000004"]
    assert not stop_file.exists()  # consumed: the next run does not stop at once
    with pytest.raises(preemption.TrainingPreempted, match="epoch 0, micro-batch 4"):
        checkpointer.raise_if_stopped()


def test_the_minutes_trigger_saves_at_an_agreement_and_trains_on(tmp_path):
    checkpointer = callback_on_a_model(tmp_path, every=0, steps_per_epoch=10, every_minutes=1, check_every=4)
    for batch in range(4):
        checkpointer.on_train_batch_end(batch)
    assert saved(tmp_path) == []  # less than a minute since the start
    checkpointer._last_save -= 61  # rank 0's clock: a minute has passed
    for batch in range(4, 8):
        checkpointer.on_train_batch_end(batch)
    assert saved(tmp_path) == ["epoch-000000-step-000008"] and not checkpointer.model.stop_training
