"""Choosing how a job's collectives travel: horovod or mpi-direct (no MPI started here)."""
import pytest

from hvd_easgd import _compat
from hvd_easgd.startup import runtime
from hvd_easgd.app import cli
from hvd_easgd.app.config_compare import config_differences
from hvd_easgd.app.errors import UsageError

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
    runtime.check_collectives("auto", GLOO)
    with pytest.raises(ValueError, match="needs an MPI launch .* Received: collectives='mpi-direct'"):
        runtime.check_collectives("mpi-direct", GLOO)
    with pytest.raises(ValueError, match=r"`collectives` must be one of \('auto', 'horovod', 'mpi-direct'\). "
                                         r"Received: collectives='nccl'"):
        runtime.check_collectives("nccl", MPI)


def test_train_py_refuses_mpi_direct_under_gloo_before_anything_starts(monkeypatch):
    for key, value in GLOO.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UsageError, match=r"^`collectives` must be \"auto\" or \"horovod\" under a Gloo launch "
                                         r"\(horovodrun --gloo\): mpi-direct needs an MPI launch .*"
                                         r"Received: collectives='mpi-direct'$"):
        cli.parse_args(["--collectives", "mpi-direct"])
    assert cli.parse_args([]).collectives == "auto"


SRUN_PMIX = {"PMIX_RANK": "0", "SLURM_PROCID": "0"}


@pytest.mark.parametrize("environ", [MPI, SRUN_PMIX, dict(MPI, HOROVOD_CONTROLLER="mpi")],
                         ids=["mpirun", "srun-pmix", "horovodrun-mpi"])
def test_auto_takes_the_direct_path_under_an_mpi_launch_on_cpu_with_its_ops_built(environ):
    assert runtime.choose_collectives(environ, gpu=False, direct_ops=True)[0] == "mpi-direct"


@pytest.mark.parametrize("environ, gpu, ops, reason", [
    (GLOO, False, True, "Gloo launch"),
    ({}, False, True, "not an MPI launch"),  # one process: nothing to reduce, Horovod's path as before
    ({"SLURM_PROCID": "0"}, False, True, "not an MPI launch"),  # srun without --mpi: no MPI job
    (MPI, True, True, "NCCL"),
    (dict(MPI, HOROVOD_TIMELINE="/tmp/t.json"), False, True, "HOROVOD_TIMELINE asks for Horovod's own tools"),
    (dict(MPI, HOROVOD_AUTOTUNE="1"), False, True, "HOROVOD_AUTOTUNE"),
    (MPI, False, "the direct ops are not built for this TensorFlow", "not built"),
], ids=["gloo", "alone", "srun-no-mpi", "gpu", "timeline", "autotune", "ops-missing"])
def test_auto_keeps_horovods_path_elsewhere_and_says_why(environ, gpu, ops, reason):
    path, why = runtime.choose_collectives(environ, gpu=gpu, direct_ops=ops)
    assert path == "horovod" and reason in why, why


def test_a_tool_variable_set_to_zero_asks_for_nothing():
    assert runtime.choose_collectives(dict(MPI, HOROVOD_AUTOTUNE="0"), gpu=False, direct_ops=True)[0] == "mpi-direct"


def test_auto_finds_missing_ops_by_their_cache_path(tmp_path, monkeypatch):
    # An empty cache: the ops are not built, so auto stays on Horovod's path and names the missing library.
    monkeypatch.setenv("HVD_EASGD_CACHE", str(tmp_path))
    path, why = runtime.choose_collectives(MPI, gpu=False)
    assert path == "horovod" and str(tmp_path) in why and "hvd-easgd setup" in why, why


def test_the_choice_is_recorded_and_a_resume_may_change_it(monkeypatch):
    for key in GLOO:
        monkeypatch.delenv(key, raising=False)
    saved = cli.effective_config(cli.parse_args(["--collectives", "mpi-direct"]))
    assert saved["collectives"] == "mpi-direct"
    now = cli.effective_config(cli.parse_args([]))
    assert config_differences(saved, now) == []  # how the bytes travel is not what is trained


def test_the_mpi_direct_ops_are_cached_per_stack_and_source_and_missing_ones_say_run_hvd_easgd_setup(
        tmp_path, monkeypatch):
    import sys

    import tensorflow as tf

    from hvd_easgd.comm import _mpi_ops

    version = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022\x00"
    path = _mpi_ops.library_path(version, environ={"HVD_EASGD_CACHE": str(tmp_path)})
    key = f"tf-{tf.__version__}-open-mpi-v4.1.4-cp{sys.version_info[0]}{sys.version_info[1]}"
    assert path.startswith(str(tmp_path / "ops" / f"mpi-direct-ops-{key}-")) and path.endswith(_mpi_ops.LIBRARY_NAME)
    assert _mpi_ops.library_path("MPICH Version: 4.0\x00", environ={"HVD_EASGD_CACHE": str(tmp_path)}) != path
    monkeypatch.setenv("HVD_EASGD_CACHE", str(tmp_path))
    with pytest.raises(_mpi_ops.MissingOpsLibrary, match="run `hvd-easgd setup`"):
        _mpi_ops.load.__wrapped__(version)


def _fake_horovod(tmp_path, built_against):
    package = tmp_path / "horovod"
    (package / "tensorflow").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tensorflow" / _compat.HOROVOD_BUILD_RECORD).write_text(f"{built_against} patch-0000\n")
    return package


def test_a_horovod_built_against_another_tensorflow_is_named_in_one_line(tmp_path, monkeypatch):
    import importlib.util
    import types

    import tensorflow as tf

    package = _fake_horovod(tmp_path, "2.18.1")
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: types.SimpleNamespace(
        origin=str(package / "__init__.py")) if name == "horovod" else real_find_spec(name, *a))
    _compat.horovod_problem.cache_clear()
    try:
        problem = _compat.horovod_problem()
    finally:
        _compat.horovod_problem.cache_clear()
    assert problem.startswith(f"Horovod was built against TensorFlow 2.18.1 but TensorFlow {tf.__version__} is "
                              "running; rebuild it with `hvd-easgd setup`"), problem
    assert "\n" not in problem
    assert _compat.horovod_built_against(str(package)) == "2.18.1"
    assert _compat.horovod_built_against(str(tmp_path / "nowhere")) is None


def test_under_a_launcher_a_horovod_that_cannot_serve_stops_the_job_instead_of_training_ranks_apart(monkeypatch):
    monkeypatch.setitem(runtime._STATE, "comm", None)
    monkeypatch.setattr(_compat, "horovod_problem", lambda: "Horovod was built against TensorFlow 2.18.1 ...")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    with pytest.raises(_compat.StackMismatchError, match="built against TensorFlow 2.18.1"):
        runtime.init(collectives="horovod")


def test_train_py_reports_a_stack_mismatch_in_one_line_with_exit_2(monkeypatch, capsys):
    def mismatched(*args, **kwargs):
        raise _compat.StackMismatchError("Horovod was built against TensorFlow 2.18.1 but TensorFlow 2.21.0 is running")

    monkeypatch.setattr(cli, "train", mismatched)
    with pytest.raises(SystemExit) as stopped:
        cli.main(["--epochs", "1", "--no-tensorboard"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["train.py: error: Horovod was built against TensorFlow 2.18.1 but TensorFlow 2.21.0 is running"]
