"""tools/setup_env.sh's choice of variant, read from its --plan (which installs nothing; the choice is
`hvd-easgd setup --plan`'s, which the script asks before the venv exists).

No GPU machine runs this stack here, so the GPU branch is checked with a
stand-in ``nvidia-smi`` (and ``nvcc``) on a PATH the test controls.
"""
import os
import subprocess
import sys

import pytest

from hvd_easgd.install import stack
from tests.helpers import ROOT
from setup import TENSORFLOW_EXTRAS, requirements

pytestmark = pytest.mark.unit
SETUP = os.path.join(ROOT, "tools", "setup_env.sh")


def _tool(directory, name, body):
    path = directory / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def plan(tmp_path, gpu=None, nvcc=False, **env):
    """``setup_env.sh --plan`` with only the stand-ins and the system's tools on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if gpu == "working":
        _tool(bin_dir, "nvidia-smi", '[ "$1" = -L ] && echo "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-0)"; exit 0')
    elif gpu == "no driver":  # installed, but the driver answers with an error
        _tool(bin_dir, "nvidia-smi", "echo 'NVIDIA-SMI has failed because it could not communicate with the "
                                     "NVIDIA driver' >&2; exit 9")
    if nvcc:
        _tool(bin_dir, "nvcc", "echo 'Cuda compilation tools, release 12.4'")
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "CUDA_HOME": str(tmp_path / "no-cuda"),
               **env}
    proc = subprocess.run(["bash", SETUP, "--plan"], env=environ, capture_output=True, text=True, timeout=60)
    fields = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    return proc, fields


def test_a_working_gpu_plans_tensorflow_and_cuda_and_horovod_with_nccl(tmp_path):
    proc, fields = plan(tmp_path, gpu="working", nvcc=True)
    assert proc.returncode == 0, proc.stderr
    assert fields["variant"] == "cuda"
    requirements_line = fields["requirements"].split()
    assert "tensorflow[and-cuda]==2.21.0" in requirements_line and "nvidia-nccl-cu12" in requirements_line
    assert not any(r.startswith("tensorflow-cpu") for r in requirements_line)
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in fields["horovod build"].split()
    assert {"HOROVOD_WITH_TENSORFLOW=1", "HOROVOD_WITH_MPI=1", "HOROVOD_WITH_GLOO=1"} <= set(
        fields["horovod build"].split())
    # a CUDA build is cached apart from the CPU one
    assert os.path.basename(fields["horovod wheel cache"]).startswith("horovod-0.28.1-tf-2.21.0-cp311-cuda-patch-")
    assert fields["cuda toolkit"].endswith("/bin/nvcc")


@pytest.mark.parametrize("gpu, env", [(None, {}), ("no driver", {}), ("working", {"HVD_EASGD_FORCE_CPU": "1"})],
                         ids=["no-nvidia-smi", "driver-fails", "forced-cpu"])
def test_without_a_usable_gpu_the_plan_is_tensorflow_cpu_without_nccl(tmp_path, gpu, env):
    proc, fields = plan(tmp_path, gpu=gpu, nvcc=True, **env)
    assert proc.returncode == 0, proc.stderr
    assert fields["variant"] == "cpu"
    assert "tensorflow-cpu==2.21.0" in fields["requirements"].split()
    assert "nvidia-nccl-cu12" not in fields["requirements"] and "NCCL" not in fields["horovod build"]
    assert "-cpu-patch-" in fields["horovod wheel cache"]


def test_a_gpu_without_the_cuda_toolkit_is_named_in_the_plan(tmp_path):
    proc, fields = plan(tmp_path, gpu="working", nvcc=False)
    assert fields["variant"] == "cuda" and fields["cuda toolkit"].startswith("missing (install the CUDA 12 toolkit")


def test_the_patch_is_part_of_the_wheel_cache_key(tmp_path):
    import hashlib

    with open(stack.PATCH, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:8]
    _, fields = plan(tmp_path)
    assert fields["horovod wheel cache"].endswith(f"-patch-{digest}")


def test_the_installed_horovod_answers_its_launch_checks_from_the_extensions_library():
    """The patch's second change, as installed: horovodrun's MPI and Gloo checks read the TensorFlow
    extension's C library (no TensorFlow import), and here it answers rather than falling back."""
    code = ("import sys; from horovod.common import util; "
            "answers = [util._tensorflow_library_answer(f, verbose=False) "
            "for f in ('horovod_gloo_built', 'horovod_mpi_built', 'horovod_no_such_function')]; "
            "assert answers == [True, True, None], answers; "
            "assert 'tensorflow' not in sys.modules, 'the launcher imported TensorFlow'")
    # A fresh process, as horovodrun is: the check forks, and this test process may have threads.
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("gpu, distribution", [("working", "tensorflow[and-cuda]"), (None, "tensorflow-cpu")],
                         ids=["cuda", "cpu"])
def test_pip_installs_extra_asks_for_the_tensorflow_distribution_the_setup_script_installs(tmp_path, gpu,
                                                                                           distribution):
    # `pip install hvd_easgd[cpu|cuda]`, named after the variant the plan decides; plain `pip install
    # hvd_easgd` asks for no TensorFlow distribution, so it installs into a venv with any supported one.
    proc, fields = plan(tmp_path, gpu=gpu, nvcc=True)
    assert proc.returncode == 0, proc.stderr
    assert TENSORFLOW_EXTRAS[fields["variant"]] == [f"{distribution}>=2.18.1,<2.22"]
    assert f"{distribution}==2.21.0" in fields["requirements"].split()
    names = {r.split(">")[0].split("[")[0] for r in requirements()}
    assert {"keras", "tensorboard", "numpy", "mpi4py"} <= names
    assert not names & {"horovod", "tensorflow", "tensorflow-cpu"}
