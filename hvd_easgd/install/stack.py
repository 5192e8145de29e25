"""What a set-up builds for an environment, decided without importing TensorFlow.

Horovod 0.28.1 is compiled against the exact TensorFlow it runs with, so
``hvd-easgd setup`` builds it from its sdist, with hvd_easgd's patch
(``horovod-0.28.1.patch`` beside this file, which says why), once per

    (Horovod, TensorFlow, Python, GPU variant, patch)

and keeps the wheel under ``~/.cache/hvd_easgd/wheels/<that key>`` (or
``$HVD_EASGD_CACHE``): another venv with the same stack, or a clean clone,
installs the cached wheel instead of building again. The variant is ``cuda``
where ``nvidia-smi -L`` answers (Horovod then reduces with NCCL) and ``cpu``
elsewhere, or when ``HVD_EASGD_FORCE_CPU`` is set.

The patch and ``tf_versions.txt`` (the supported TensorFlow versions) ship in
the package, so a pip-installed user has them; the repository's
``tools/horovod/`` and ``tools/tf_versions.txt`` are links to these files. The
patch's own text still names tools/ as its home: its bytes are part of the
cache key, and rewording it would rebuild every cached Horovod.

Standard library only: ``tools/setup_env.sh --plan`` runs this with the
system Python before any venv exists.
"""
import hashlib
import os
import shutil
import subprocess
import sys

from .. import _compat

HERE = os.path.dirname(os.path.abspath(__file__))
HOROVOD_VERSION = "0.28.1"  # its last release
PATCH = os.path.join(HERE, f"horovod-{HOROVOD_VERSION}.patch")
TF_VERSIONS = os.path.join(HERE, "tf_versions.txt")
VARIANTS = ("cpu", "cuda")
# Horovod's build switches: TensorFlow, MPI and Gloo always; NCCL for the GPU variant.
HOROVOD_WITH = ("HOROVOD_WITH_TENSORFLOW=1", "HOROVOD_WITH_MPI=1", "HOROVOD_WITH_GLOO=1",
                "HOROVOD_WITHOUT_PYTORCH=1", "HOROVOD_WITHOUT_MXNET=1")
HOROVOD_WITH_NCCL = "HOROVOD_GPU_OPERATIONS=NCCL"


def supported_tensorflow(path=TF_VERSIONS):
    """``[(version, [pin overrides])]`` from tf_versions.txt, the default first."""
    versions = []
    with open(path) as f:
        for line in f:
            fields = line.split("#", 1)[0].split()
            if fields:
                versions.append((fields[0], fields[1:]))
    return versions


def unsupported_tensorflow(version, path=TF_VERSIONS):
    """Why TensorFlow ``version`` cannot be set up, in one sentence; None when it is supported."""
    listed = [v for v, _ in supported_tensorflow(path)]
    if version in listed:
        return None
    return (f"TensorFlow {version} is not supported: hvd_easgd is tested on {' '.join(listed)} "
            "(hvd_easgd/install/tf_versions.txt); a version outside that list has no Horovod build recipe here")


def patch_hash(path=PATCH):
    """The patch's first 8 hex digits of SHA-256: its part of the cache key and of the build record."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:8]


def variant(environ=None):
    """``"cuda"`` where a GPU answers ``nvidia-smi -L`` (and ``HVD_EASGD_FORCE_CPU`` is unset), else ``"cpu"``."""
    environ = os.environ if environ is None else environ
    if environ.get("HVD_EASGD_FORCE_CPU"):
        return "cpu"
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        return "cpu"
    try:
        answered = subprocess.run([smi, "-L"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        answered = False
    return "cuda" if answered else "cpu"


def nvcc(environ=None):
    """The CUDA toolkit's compiler, which Horovod's GPU build needs (no pip wheel has all of it); None if absent."""
    environ = os.environ if environ is None else environ
    found = shutil.which("nvcc", path=environ.get("PATH"))
    if found:
        return found
    candidate = os.path.join(environ.get("CUDA_HOME") or "/usr/local/cuda", "bin", "nvcc")
    return candidate if os.access(candidate, os.X_OK) else None


def horovod_build_switches(variant):
    """Horovod's ``HOROVOD_*`` build settings for a variant, as ``NAME=VALUE`` strings."""
    if variant not in VARIANTS:
        raise ValueError(f"`variant` must be one of {VARIANTS}. Received: variant={variant!r}")
    return list(HOROVOD_WITH) + ([HOROVOD_WITH_NCCL] if variant == "cuda" else [])


def python_tag(version_info=None):
    version_info = sys.version_info if version_info is None else version_info
    return f"cp{version_info[0]}{version_info[1]}"


def wheel_key(tensorflow, variant, version_info=None, path=PATCH):
    """``horovod-0.28.1-tf-2.21.0-cp311-cpu-patch-d26ad9e1``: what a Horovod wheel was built for."""
    return (f"horovod-{HOROVOD_VERSION}-tf-{tensorflow}-{python_tag(version_info)}-{variant}"
            f"-patch-{patch_hash(path)}")


def wheel_dir(tensorflow, variant, environ=None):
    """Where the Horovod wheel for this stack is cached (it may not exist yet)."""
    return os.path.join(_compat.cache_dir(environ), "wheels", wheel_key(tensorflow, variant))


def cached_wheel(tensorflow, variant, environ=None):
    """The cached Horovod wheel for this stack, or None."""
    directory = wheel_dir(tensorflow, variant, environ)
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith("horovod-") and n.endswith(".whl"))
    except FileNotFoundError:
        return None
    return os.path.join(directory, names[0]) if names else None


def build_record(tensorflow):
    """What set-up writes beside an installed Horovod's TF extension (``_compat.HOROVOD_BUILD_RECORD``):
    the TensorFlow it was built against and the patch, e.g. ``"2.21.0 patch-d26ad9e1"``."""
    return f"{tensorflow} patch-{patch_hash()}"
