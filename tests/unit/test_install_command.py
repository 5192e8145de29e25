"""The ``hvd-easgd`` command's arguments, refusals and reports, without building anything.

Each refusal is simulated as a user meets it: another TensorFlow by a distribution's metadata
found first on sys.path, a missing compiler or MPI by a PATH without it (stand-in tools in a
temporary folder). A refusal must come before any step: one line on stderr, exit status 2, and
nothing written to the cache. The doctor's report is formatted from stated facts, and its answer
about collectives is the library's own (runtime.resolve_collectives), asked per launcher.
"""
import os
import subprocess

import pytest

from hvd_easgd import _compat
from hvd_easgd.install import cli, doctor, stack
from tests.helpers import PYTHON, ROOT, quiet_env

pytestmark = pytest.mark.unit

DEFAULT_TF = stack.supported_tensorflow()[0][0]


def _tool(directory, name, body="exit 0"):
    path = directory / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """An empty cache, and a PATH holding only stand-ins (none yet): each test adds the tools it has."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("HVD_EASGD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    monkeypatch.delenv("HVD_EASGD_FORCE_CPU", raising=False)
    return bin_dir


def _refused(capsys, argv, tmp_path):
    status = cli.main(argv)
    out, err = capsys.readouterr()
    assert status == 2, (out, err)
    assert out == "" and len(err.splitlines()) == 1, err
    assert not (tmp_path / "cache").exists()  # nothing built, nothing downloaded
    return err


def test_importing_the_command_loads_no_tensorflow():
    # `hvd-easgd setup --plan` runs with the system Python before the venv exists, and --help must be quick.
    code = ("import sys, hvd_easgd.install.cli, hvd_easgd.install.setup_command, hvd_easgd.install.doctor; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'horovod', 'mpi4py', 'numpy') if m in sys.modules))")
    out = subprocess.run([PYTHON, "-c", code], cwd=ROOT, env=quiet_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_a_command_is_required_and_an_unknown_one_is_a_usage_error(capsys):
    for argv in ([], ["install"], ["setup", "--no-such-option"]):
        with pytest.raises(SystemExit) as stopped:
            cli.main(argv)
        assert stopped.value.code == 2, argv
        assert "usage: hvd-easgd" in capsys.readouterr().err


def test_tensorflow_without_plan_is_refused(machine, capsys, tmp_path):
    err = _refused(capsys, ["setup", "--tensorflow", DEFAULT_TF], tmp_path)
    assert err.startswith("[setup] error: --tensorflow plans for a TensorFlow that is not installed here")


def test_the_plan_for_a_listed_version_names_its_wheel_and_build(machine, capsys, tmp_path):
    version = stack.supported_tensorflow()[-1][0]
    assert cli.main(["setup", "--plan", "--tensorflow", version]) == 0
    fields = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines())
    assert fields["tensorflow"] == version and fields["variant"] == "cpu"
    key = f"horovod-0.28.1-tf-{version}-{stack.python_tag()}-cpu-patch-{stack.patch_hash()}"
    assert fields["horovod wheel cache"] == str(tmp_path / "cache" / "wheels" / key)
    assert fields["horovod wheel"] == "to build (several minutes)"
    assert set(fields["horovod build"].split()) == {"HOROVOD_WITH_TENSORFLOW=1", "HOROVOD_WITH_MPI=1",
                                                    "HOROVOD_WITH_GLOO=1", "HOROVOD_WITHOUT_PYTORCH=1",
                                                    "HOROVOD_WITHOUT_MXNET=1"}


def test_the_plan_sees_a_cached_wheel(machine, capsys, tmp_path):
    wheel_dir = tmp_path / "cache" / "wheels" / stack.wheel_key(DEFAULT_TF, "cpu")
    wheel_dir.mkdir(parents=True)
    (wheel_dir / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    assert cli.main(["setup", "--plan", "--tensorflow", DEFAULT_TF]) == 0
    assert "horovod wheel: cached (horovod-0.28.1-cp311-cp311-linux_x86_64.whl)" in capsys.readouterr().out


def test_an_unlisted_version_is_refused_in_one_line_naming_it(machine, capsys, tmp_path):
    err = _refused(capsys, ["setup", "--plan", "--tensorflow", "2.17.0"], tmp_path)
    assert err.startswith("[setup] error: TensorFlow 2.17.0 is not supported: hvd_easgd is tested on "
                          + " ".join(v for v, _ in stack.supported_tensorflow()))


@pytest.fixture
def installed_tensorflow(tmp_path, monkeypatch):
    """Makes this Python see TensorFlow VERSION installed: a distribution's metadata, first on sys.path."""
    def install(version):
        info = tmp_path / "site" / f"tensorflow_cpu-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorflow-cpu\nVersion: {version}\n")
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
        assert _compat.installed_tensorflow_version() == version

    return install


def test_an_unsupported_installed_tensorflow_is_refused_before_anything_is_built(machine, capsys, tmp_path,
                                                                                  installed_tensorflow):
    for tool in ("g++", "mpicc", "mpirun", "cmake", "patch"):
        _tool(machine, tool)
    installed_tensorflow("2.17.0")
    err = _refused(capsys, ["setup"], tmp_path)
    assert "TensorFlow 2.17.0 is not supported" in err


def test_no_tensorflow_is_refused_naming_what_to_install(machine, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(_compat, "installed_tensorflow_version", lambda: None)
    err = _refused(capsys, ["setup"], tmp_path)
    assert "no TensorFlow in this environment" in err and f"tensorflow-cpu=={DEFAULT_TF}" in err


@pytest.mark.parametrize("tools, missing", [((), "g++"), (("g++",), "mpicc"), (("g++", "mpicc"), "mpirun")],
                         ids=["no-compiler", "no-mpi", "no-mpirun"])
def test_a_missing_compiler_or_mpi_is_refused_in_one_line(machine, capsys, tmp_path, tools, missing):
    for tool in tools:
        _tool(machine, tool)
    err = _refused(capsys, ["setup"], tmp_path)
    assert err.startswith("[setup] error: no ") and f"({missing})" in err and "apt-get install" in err


def test_a_gpu_without_the_cuda_toolkit_is_refused(machine, capsys, tmp_path):
    for tool in ("g++", "mpicc", "mpirun"):
        _tool(machine, tool)
    _tool(machine, "nvidia-smi", 'echo "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-0)"')
    err = _refused(capsys, ["setup"], tmp_path)
    assert "no CUDA toolkit (nvcc)" in err and "HVD_EASGD_FORCE_CPU=1" in err


def test_the_repository_tools_point_at_the_one_packaged_copy():
    # setup.py ships these as package data; tools/ keeps links for the repository's readers.
    assert os.path.realpath(os.path.join(ROOT, "tools", "tf_versions.txt")) == os.path.realpath(stack.TF_VERSIONS)
    assert os.path.realpath(os.path.join(ROOT, "tools", "horovod", "horovod-0.28.1.patch")) == \
        os.path.realpath(stack.PATCH)
    assert os.path.dirname(os.path.realpath(stack.PATCH)) == os.path.join(ROOT, "hvd_easgd", "install")


# --- the doctor ---------------------------------------------------------------------------
READY = {"hvd_easgd": "0.1.0", "python": "3.11.7", "prefix": "/venv", "tensorflow": DEFAULT_TF, "variant": "cpu",
         "gpus": 0, "patch": "d26ad9e1", "horovod": ("0.28.1", f"{DEFAULT_TF} patch-d26ad9e1", "/venv/horovod"),
         "horovod_problem": None, "built": {"MPI": True, "Gloo": True, "NCCL": False}, "ops": "/cache/ops.so",
         "launches": [("horovodrun -np N --gloo python SCRIPT", "horovod", "a Gloo launch")]}


def test_the_doctor_reports_a_ready_environment():
    lines, ready = doctor.report(READY, exists=lambda path: True)
    assert ready and lines[-1] == "ready"
    assert lines[1] == f"TensorFlow: {DEFAULT_TF}, supported; no GPU visible"
    assert lines[2] == (f"Horovod: 0.28.1, built against TensorFlow {DEFAULT_TF} with hvd_easgd's patch-d26ad9e1; "
                        "MPI yes, Gloo yes, NCCL no")
    assert lines[3] == "direct MPI ops: built for this TensorFlow, MPI and Python (/cache/ops.so)"
    assert "  horovodrun -np N --gloo python SCRIPT: horovod, because a Gloo launch" in lines


@pytest.mark.parametrize("changes, says", [
    ({"horovod": None}, "Horovod is not installed: run `hvd-easgd setup`"),
    ({"horovod": ("0.28.1", "2.18.1 patch-d26ad9e1", "/h"), "horovod_problem": "Horovod was built against 2.18.1"},
     "Horovod was built against 2.18.1"),
    ({"built": {"MPI": False, "Gloo": True, "NCCL": False}}, "Horovod was built without MPI"),
    ({"horovod": ("0.28.1", None, "/h")}, "not hvd_easgd's build of 0.28.1"),
    ({"tensorflow": "2.17.0"}, "TensorFlow 2.17.0 is not supported"),
], ids=["no-horovod", "horovod-for-another-tf", "no-mpi", "unrecorded", "unsupported-tf"])
def test_the_doctor_names_what_is_missing_and_is_not_ready(changes, says):
    lines, ready = doctor.report({**READY, **changes}, exists=lambda path: True)
    assert not ready and lines[-1].startswith("not ready: ") and says in lines[-1], lines


def test_the_doctor_says_the_direct_ops_are_missing():
    lines, ready = doctor.report(READY, exists=lambda path: False)
    assert not ready
    assert "direct MPI ops: not built for this TensorFlow, MPI and Python (would be /cache/ops.so)" in lines


def test_the_doctor_without_tensorflow_says_so_and_stops():
    lines, ready = doctor.report({**READY, "tensorflow": None})
    assert not ready and lines[1:] == ["TensorFlow: not installed in this environment",
                                       "not ready: install a supported TensorFlow, then run `hvd-easgd setup`"]


def test_the_doctors_launches_are_the_librarys_own_choice(monkeypatch):
    # Horovod serves: an MPI launch takes the direct path where its ops are built, Gloo and one process Horovod's.
    monkeypatch.setattr(_compat, "horovod_problem", lambda: None)
    user = {"PATH": "/usr/bin", "OMPI_COMM_WORLD_RANK": "1"}  # the doctor itself under a launcher changes nothing
    answers = {name: path for name, path, _ in doctor.launches("mpi", user, gpu=False, direct_ops=True)}
    assert answers == {"horovodrun -np N python SCRIPT (over MPI here: horovodrun's default)": "mpi-direct",
                       "horovodrun -np N --gloo python SCRIPT": "horovod",
                       "horovodrun -np N --mpi, mpirun or srun --mpi=pmix": "mpi-direct",
                       "python SCRIPT (one process, no launcher)": "horovod"}
    # A user's HOROVOD_TIMELINE keeps an MPI launch on Horovod's path, as it does in init().
    timeline = dict(user, HOROVOD_TIMELINE="/tmp/timeline.json")
    (_, path, why), = [a for a in doctor.launches(None, timeline, gpu=False, direct_ops=True) if "mpirun" in a[0]]
    assert path == "horovod" and "HOROVOD_TIMELINE" in why


def test_without_a_usable_horovod_launched_jobs_stop_and_one_process_trains_alone(monkeypatch):
    monkeypatch.setattr(_compat, "horovod_problem", lambda: "Horovod is not installed")
    answers = {name: (path, why) for name, path, why in doctor.launches(None, {}, gpu=False, direct_ops="no ops")}
    assert answers["horovodrun -np N --gloo python SCRIPT"] == (None, "Horovod is not installed")
    assert answers["horovodrun -np N --mpi, mpirun or srun --mpi=pmix"] == (None, "Horovod is not installed")
    assert answers["python SCRIPT (one process, no launcher)"][0] == "local"
    lines, ready = doctor.report({**READY, "launches": doctor.launches(None, {}, gpu=False, direct_ops="no ops")},
                                 exists=lambda path: True)
    assert "  horovodrun -np N --gloo python SCRIPT: stops at start-up: Horovod is not installed" in lines
