"""Choosing how a job's collectives travel: horovod or mpi-direct (no MPI started here)."""
import pytest

from hvd_easgd import cli, runtime
from hvd_easgd.config_compare import config_differences
from hvd_easgd.errors import UsageError

pytestmark = pytest.mark.unit
GLOO = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": "1234",
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_RANK": "0"}
MPI = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}


def test_gloo_launches_are_told_from_horovodruns_environment():
    assert runtime.gloo_launch(GLOO)
    assert runtime.gloo_launch({"HOROVOD_CONTROLLER": "gloo"})
    assert not runtime.gloo_launch(MPI)
    assert not runtime.gloo_launch(dict(MPI, HOROVOD_CONTROLLER="mpi"))
    assert not runtime.gloo_launch({})


def test_mpi_direct_is_refused_under_gloo_and_unknown_choices_are_refused():
    runtime.check_collectives("mpi-direct", MPI)
    runtime.check_collectives("horovod", GLOO)
    with pytest.raises(ValueError, match="needs an MPI launch .* Received: collectives='mpi-direct'"):
        runtime.check_collectives("mpi-direct", GLOO)
    with pytest.raises(ValueError, match=r"`collectives` must be one of \('horovod', 'mpi-direct'\). "
                                         r"Received: collectives='nccl'"):
        runtime.check_collectives("nccl", MPI)


def test_train_py_refuses_mpi_direct_under_gloo_before_anything_starts(monkeypatch):
    for key, value in GLOO.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UsageError, match="--collectives mpi-direct needs an MPI launch"):
        cli.parse_args(["--collectives", "mpi-direct"])
    assert cli.parse_args([]).collectives == "horovod"


def test_the_choice_is_recorded_and_a_resume_may_change_it(monkeypatch):
    for key in GLOO:
        monkeypatch.delenv(key, raising=False)
    saved = cli.effective_config(cli.parse_args(["--collectives", "mpi-direct"]))
    assert saved["collectives"] == "mpi-direct"
    now = cli.effective_config(cli.parse_args([]))
    assert config_differences(saved, now) == []  # how the bytes travel is not what is trained


def test_the_mpi_direct_ops_are_cached_per_stack_and_source_and_missing_ones_say_run_make_setup(tmp_path,
                                                                                              monkeypatch):
    import sys

    import tensorflow as tf

    from hvd_easgd.comm import _mpi_ops

    version = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022\x00"
    path = _mpi_ops.library_path(version, environ={"HVD_EASGD_CACHE": str(tmp_path)})
    key = f"tf-{tf.__version__}-open-mpi-v4.1.4-cp{sys.version_info[0]}{sys.version_info[1]}"
    assert path.startswith(str(tmp_path / "ops" / f"mpi-direct-ops-{key}-")) and path.endswith(_mpi_ops.LIBRARY_NAME)
    assert _mpi_ops.library_path("MPICH Version: 4.0\x00", environ={"HVD_EASGD_CACHE": str(tmp_path)}) != path
    monkeypatch.setenv("HVD_EASGD_CACHE", str(tmp_path))
    with pytest.raises(_mpi_ops.MissingOpsLibrary, match="run `make setup`"):
        _mpi_ops.load.__wrapped__(version)
