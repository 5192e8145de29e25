import os
from unittest import mock

import pytest

from hvd_easgd import _compat
from hvd_easgd.startup import runtime

pytestmark = pytest.mark.unit


def test_threads_share_the_affinity_mask_between_local_ranks():
    with mock.patch.object(runtime, "cores_available", return_value=8):
        assert runtime.threads_per_rank(local_size=2, environ={}) == 4
        assert runtime.threads_per_rank(local_size=16, environ={}) == 1


def test_slurm_cpus_per_task_and_override_take_precedence():
    with mock.patch.object(runtime, "cores_available", return_value=8):
        assert runtime.threads_per_rank(2, environ={"SLURM_CPUS_PER_TASK": "3"}) == 3
        assert runtime.threads_per_rank(2, override=5, environ={"SLURM_CPUS_PER_TASK": "3"}) == 5
    with pytest.raises(ValueError, match="threads_per_rank"):
        runtime.threads_per_rank(2, override=0, environ={})


def test_launcher_rank_from_environment():
    with mock.patch.dict(os.environ, {"OMPI_COMM_WORLD_RANK": "3"}, clear=True):
        assert _compat.launcher_rank() == 3
    with mock.patch.dict(os.environ, {"HOROVOD_RANK": "1", "SLURM_PROCID": "5"}, clear=True):
        assert _compat.launcher_rank() == 1
    with mock.patch.dict(os.environ, {}, clear=True):
        assert _compat.launcher_rank() == 0


# --- init(collectives=...): one parameter for Horovod, mpi-direct, auto or one process alone --------
LAUNCHER_MARKERS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID",
                    "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_CONTROLLER")


@pytest.fixture
def fresh_runtime(monkeypatch):
    """A process where init() has not run, outside any launcher, whose thread pools and GPUs
    init() leaves alone (this test process shares them), and which fails if Horovod starts."""
    for key in ("comm", "collectives", "collectives_reason", "horovod_settings"):
        monkeypatch.setitem(runtime._STATE, key, None)
    for name in LAUNCHER_MARKERS:
        monkeypatch.delenv(name, raising=False)
    for name in ("HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"):
        monkeypatch.setenv(name, os.environ.get(name, "60"))  # restored after the test, whatever init sets
    started = []
    monkeypatch.setattr(runtime, "_configure_threads", lambda local_size, override: started.append(("threads", local_size)))
    monkeypatch.setattr(runtime, "_pin_gpu", lambda local_rank: started.append(("gpu", local_rank)))

    def no_horovod(mpi_built):
        raise AssertionError("Horovod was started")

    monkeypatch.setattr(runtime, "_apply_horovod_defaults", no_horovod)
    return started


def test_local_is_one_process_alone_without_horovod(fresh_runtime):
    from hvd_easgd.comm import LocalCommunicator

    comm = runtime.init(threads_per_rank=1, collectives="local")
    assert isinstance(comm, LocalCommunicator) and (comm.rank, comm.size, comm.local_size) == (0, 1, 1)
    assert runtime.collectives_in_use() == ("local", "chosen by the caller")
    assert fresh_runtime == [("threads", 1), ("gpu", 0)]
    assert runtime.init() is comm  # later calls with the default return it
    with pytest.raises(ValueError, match=r"^`collectives` must be 'local' or \"auto\": hvd_easgd\.init\(\) already started "
                                         r"those, and one process has one kind of collectives\. "
                                         r"Received: collectives='horovod'$"):
        runtime.init(collectives="horovod")


def test_use_horovod_false_is_a_deprecated_alias_of_local(fresh_runtime):
    from hvd_easgd.comm import LocalCommunicator

    with pytest.warns(DeprecationWarning, match=r"`use_horovod` is deprecated .* pass collectives='local' instead "
                                                r"of use_horovod=False"):
        comm = runtime.init(use_horovod=False)
    assert isinstance(comm, LocalCommunicator) and runtime.collectives_in_use()[0] == "local"


@pytest.mark.parametrize("kwargs, message", [
    (dict(use_horovod=False, collectives="mpi-direct"),
     "`use_horovod=False` means collectives='local', and `collectives` asks for another; pass `collectives` "
     "alone. Received: use_horovod=False, collectives='mpi-direct'"),
    (dict(use_horovod=True, collectives="local"),
     "`use_horovod=True` means collectives='horovod', and `collectives` asks for another; pass `collectives` "
     "alone. Received: use_horovod=True, collectives='local'"),
    (dict(use_horovod="no"), "`use_horovod` must be True, False or None. Received: use_horovod='no'"),
    (dict(collectives="nccl"), "`collectives` must be one of ('auto', 'horovod', 'mpi-direct', 'local'). "
                               "Received: collectives='nccl'"),
])
def test_conflicting_or_unknown_choices_are_refused_in_keras_form(kwargs, message, fresh_runtime):
    with pytest.raises(ValueError) as err:
        runtime.init(**kwargs)
    assert str(err.value) == message
    assert runtime._STATE["comm"] is None and fresh_runtime == []  # refused before anything started


def test_auto_trains_one_process_without_a_launcher_alone_when_horovod_cannot_serve(fresh_runtime, monkeypatch,
                                                                                      capsys):
    from hvd_easgd.comm import LocalCommunicator

    monkeypatch.setattr(_compat, "horovod_problem", lambda: "Horovod is not installed")
    comm = runtime.init()
    assert isinstance(comm, LocalCommunicator)
    path, why = runtime.collectives_in_use()
    assert (path, why) == ("local", "one process without a launcher, and Horovod cannot serve it "
                                    "(Horovod is not installed)")
    assert capsys.readouterr().out == (f"hvd_easgd: collectives local, because {why} (train.py --collectives or "
                                       "hvd_easgd.init(collectives=...) forces one)\n")
