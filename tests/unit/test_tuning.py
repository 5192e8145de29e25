"""hvd_easgd's Horovod defaults: chosen per controller and device, never over the user's own."""
import os
from unittest import mock

import pytest

from hvd_easgd.startup import runtime, tuning

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("environ, mpi_built, controller", [
    ({"HOROVOD_CONTROLLER": "gloo", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1"}, True, "gloo"),  # horovodrun --gloo
    ({"OMPI_COMM_WORLD_RANK": "0"}, True, "mpi"),  # horovodrun --mpi and mpirun set no HOROVOD_CONTROLLER
    ({"SLURM_PROCID": "0"}, True, "mpi"),  # srun
    ({}, True, "mpi"),  # no launcher: Horovod takes MPI when built with it ...
    ({}, False, "gloo"),  # ... and Gloo when not
    ({"HOROVOD_CONTROLLER": "MPI"}, False, "mpi"),  # Horovod compares without case
])
def test_controller_is_known_before_hvd_init(environ, mpi_built, controller):
    assert tuning.controller_from_environ(environ, mpi_built) == controller


def test_unknown_controller_is_named():
    with pytest.raises(ValueError, match="Received: HOROVOD_CONTROLLER='nccl'"):
        tuning.controller_from_environ({"HOROVOD_CONTROLLER": "nccl"})


@pytest.mark.parametrize("device", tuning.DEVICES)
@pytest.mark.parametrize("controller", tuning.CONTROLLERS)
def test_defaults_per_controller_and_device(controller, device):
    chosen = tuning.horovod_defaults(device, controller, {})
    # Open MPI is told to yield only where MPI runs.
    assert chosen == ({"OMPI_MCA_mpi_yield_when_idle": "1"} if controller == "mpi" else {})
    # Measured and left at Horovod's own values (README "Horovod settings hvd_easgd chooses").
    record = tuning.settings_in_force({}, chosen)
    for name in ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY", "HOROVOD_FUSION_THRESHOLD"):
        assert record[name] == {"value": tuning.HOROVOD_OWN_DEFAULTS[name], "set_by": "horovod"}


def test_gloo_ranks_started_by_mpirun_yield_too():
    chosen = tuning.horovod_defaults("cpu", "gloo", {"HOROVOD_CONTROLLER": "gloo", "OMPI_COMM_WORLD_RANK": "1"})
    assert chosen["OMPI_MCA_mpi_yield_when_idle"] == "1"


def test_the_users_own_setting_wins_and_is_recorded_as_theirs():
    environ = {"HOROVOD_CYCLE_TIME": "5", "OMPI_MCA_mpi_yield_when_idle": "0", "HOROVOD_CACHE_CAPACITY": "0"}
    chosen = tuning.horovod_defaults("cpu", "mpi", environ)
    assert chosen == {}
    record = tuning.settings_in_force(environ, chosen)
    assert record["HOROVOD_CYCLE_TIME"] == {"value": "5", "set_by": "user"}
    assert record["HOROVOD_CACHE_CAPACITY"] == {"value": "0", "set_by": "user"}
    assert record["HOROVOD_FUSION_THRESHOLD"] == {"value": str(128 * 2**20), "set_by": "horovod"}


def test_bad_device_is_named():
    with pytest.raises(ValueError, match="Received: device='tpu'"):
        tuning.horovod_defaults("tpu", "mpi", {})


def test_runtime_sets_the_defaults_before_hvd_init_and_records_them():
    """What init() does before hvd.init(), with the device mocked to a GPU."""
    environ = {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CYCLE_TIME": "2"}
    with mock.patch.dict(os.environ, environ, clear=True), \
            mock.patch.object(runtime, "_device", return_value="gpu") as device:
        record = runtime._apply_horovod_defaults(mpi_built=True)
        assert os.environ["HOROVOD_CYCLE_TIME"] == "2"  # the user's
        assert "OMPI_MCA_mpi_yield_when_idle" not in os.environ  # Gloo, not started by mpirun
    device.assert_called_once()
    assert record["controller"] == "gloo"
    assert record["settings"]["HOROVOD_CYCLE_TIME"] == {"value": "2", "set_by": "user"}
    with mock.patch.dict(os.environ, {"OMPI_COMM_WORLD_RANK": "0"}, clear=True), \
            mock.patch.object(runtime, "_device", return_value="cpu"):
        record = runtime._apply_horovod_defaults(mpi_built=True)
        assert "HOROVOD_CYCLE_TIME" not in os.environ
        assert os.environ["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert record["controller"] == "mpi"
    assert record["settings"]["OMPI_MCA_mpi_yield_when_idle"] == {"value": "1", "set_by": "hvd_easgd"}
    assert record["settings"]["HOROVOD_CYCLE_TIME"] == {"value": "1", "set_by": "horovod"}
