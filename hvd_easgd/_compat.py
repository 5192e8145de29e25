"""Every version, backend and hardware switch of hvd_easgd, in one place.

Feature code asks these functions; it never inspects versions itself.
"""
import functools
import os
import shutil

# Horovod 0.28.1 builds against TF 2.18 and no later TF (TF 2.19+ wheels lack
# headers its XLA ops include), so the supported window is exactly this one.
SUPPORTED_TF = "2.18"
SUPPORTED_HOROVOD = "0.28.1"


def quiet_tensorflow():
    """Silences TF's C++ INFO/WARNING spam unless the user set a level.

    Must run before TensorFlow is imported to take effect.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@functools.lru_cache(maxsize=None)
def versions():
    """Versions of the stack, for config.yaml and benchmark results."""
    import platform

    import keras
    import tensorflow as tf

    from .version import __version__

    found = {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "hvd_easgd": __version__,
    }
    try:
        import horovod

        found["horovod"] = horovod.__version__
    except ImportError:
        found["horovod"] = None
    return found


def keras_major():
    import keras

    return int(keras.__version__.split(".")[0])


@functools.lru_cache(maxsize=None)
def horovod_available():
    try:
        import horovod.tensorflow  # noqa: F401
    except ImportError:
        return False
    return True


def cuda_present():
    """True where an NVIDIA driver answers (the NCCL build and GPU pinning)."""
    if os.environ.get("HVD_EASGD_FORCE_CPU"):
        return False
    return shutil.which("nvidia-smi") is not None


def under_launcher():
    """True when started by horovodrun/mpirun/srun with more than one rank possible."""
    markers = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
    return any(m in os.environ for m in markers)


def jit_compile_is_safe(jit_compile):
    """Horovod's ops are not XLA-compilable in a default build.

    Keras 3 resolves ``jit_compile="auto"`` to True on some GPUs; a training
    step holding a Horovod collective must then run without XLA.
    """
    return not jit_compile


def launcher_rank():
    """This process's rank as the launcher tells it, before Horovod starts.

    Lets argument errors be printed by rank 0 alone without any collective.
    """
    for var in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        value = os.environ.get(var)
        if value is not None and value.isdigit():
            return int(value)
    return 0
