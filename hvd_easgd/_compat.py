"""Every version, backend and hardware switch of hvd_easgd, in one place.

Feature code asks these functions; it never inspects versions itself.
"""
import functools
import os
import sys


def quiet_tensorflow():
    """Silences TF's C++ INFO/WARNING spam unless the user set a level.

    Must run before TensorFlow is imported to take effect.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# What Keras imports as it loads, whenever installed, for features a training rank never uses: its
# ``keras.visualization`` galleries (matplotlib.pyplot) and its scikit-learn wrappers (sklearn).
_RANK_UNUSED = ("matplotlib", "sklearn")


def import_keras_for_ranks():
    """Imports TensorFlow and Keras with matplotlib and scikit-learn hidden from them, then lets
    both be imported again.

    Keras 3 imports matplotlib.pyplot and scikit-learn as it loads: about 2 s of each rank's 6-9 s
    start on a 2-core machine (8 ranks on one host pay it 8 times), for plots and wrappers a rank
    never uses. Hidden, Keras takes them as absent, so its galleries and its scikit-learn wrappers
    are unavailable in this process; ``import matplotlib`` and ``import sklearn`` work as before (the
    digits loader imports sklearn.datasets, paying for scikit-learn only where its data is used).
    Nothing is hidden once TensorFlow or Keras is loaded, nor a package already imported. train.py
    and the tests' rank scripts call it first; nothing in the library does.
    """
    if {"tensorflow", "keras"} & set(sys.modules):
        return
    hidden = [name for name in _RANK_UNUSED if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # `import NAME` now raises ImportError
    try:
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]


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


# `hvd-easgd setup` (hvd_easgd/install/) writes this beside horovod/tensorflow/ when
# it installs its build: "<TF version the wheel was built against> patch-<hash>".
HOROVOD_BUILD_RECORD = "hvd_easgd_build.txt"


class StackMismatchError(RuntimeError):
    """A native library was built against another TensorFlow than the one running."""


def horovod_build_record(horovod_dir):
    """The build record of the Horovod installed at ``horovod_dir``, e.g. ``"2.21.0 patch-d26ad9e1"``
    (None if unrecorded)."""
    try:
        with open(os.path.join(horovod_dir, "tensorflow", HOROVOD_BUILD_RECORD)) as f:
            return f.read().strip() or None
    except OSError:
        return None


def horovod_built_against(horovod_dir):
    """The TF version recorded for the Horovod installed at ``horovod_dir`` (None if unrecorded)."""
    record = horovod_build_record(horovod_dir)
    return record.split()[0] if record else None


@functools.lru_cache(maxsize=None)
def horovod_problem():
    """Why Horovod's TensorFlow extension cannot serve this process, in one line;
    None when it can. ``"not installed"`` is a problem only where a launcher
    started several ranks (``init`` decides)."""
    import importlib.util

    spec = importlib.util.find_spec("horovod")
    if spec is None:
        return "Horovod is not installed (`hvd-easgd setup` builds it; `make setup` in a clone)"
    import tensorflow as tf

    running = tf.__version__
    built = horovod_built_against(os.path.dirname(spec.origin))
    if built is not None and built != running:
        return (f"Horovod was built against TensorFlow {built} but TensorFlow {running} is running; "
                "rebuild it with `hvd-easgd setup` in this environment (`make setup` in a clone)")
    try:
        import horovod.tensorflow  # noqa: F401
    except Exception as err:  # a symbol error from a library built for another TF, or a missing extension
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        return (f"Horovod's TensorFlow extension does not load under TensorFlow {running} ({first}); "
                "it was most likely built against another TensorFlow: rebuild it with `hvd-easgd setup`")
    return None


def horovod_available():
    return horovod_problem() is None


def installed_tensorflow_version():
    """The installed TensorFlow's version, read from its distribution's metadata
    (no import: the benchmark driver never loads TensorFlow). None if absent."""
    from importlib import metadata

    for distribution in ("tensorflow-cpu", "tensorflow", "tensorflow-gpu"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


# The Keras 2 release for each supported TF series (the MWMS baseline runs on it);
# each tf_keras release is built for its TF series only.
_TF_KERAS = {"2.18": "2.18.0", "2.19": "2.19.0", "2.20": "2.20.1", "2.21": "2.21.0"}


def tf_keras_requirement(tensorflow_version):
    """``tf_keras==X`` for a TensorFlow version, e.g. ``"2.21.0"`` -> ``"tf_keras==2.21.0"``."""
    series = ".".join(str(tensorflow_version).split(".")[:2])
    if series not in _TF_KERAS:
        raise ValueError(f"`tensorflow_version` must be of a series with a known tf_keras, one of "
                         f"{sorted(_TF_KERAS)} (no tf_keras is known for TensorFlow {tensorflow_version}). "
                         f"Received: tensorflow_version={tensorflow_version!r}")
    return f"tf_keras=={_TF_KERAS[series]}"


LAUNCHER_MARKERS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def under_launcher(environ=None):
    """True when started by horovodrun/mpirun/srun with more than one rank possible."""
    environ = os.environ if environ is None else environ
    return any(m in environ for m in LAUNCHER_MARKERS)


def launcher_rank():
    """This process's rank as the launcher tells it, before Horovod starts.

    Lets argument errors be printed by rank 0 alone without any collective.
    """
    for var in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        value = os.environ.get(var)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def cache_dir(environ=None):
    """Where builds made for this machine's stack are kept, outside any clone
    (``hvd-easgd setup`` keeps the Horovod wheel there too)."""
    environ = os.environ if environ is None else environ
    return environ.get("HVD_EASGD_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "hvd_easgd")


def native_build_key(mpi_library_version):
    """``tf-<version>-<MPI library>-<version>-cp<python>``: what a native library
    built against TensorFlow's and MPI's headers must match to load and run.

    ``mpi_library_version`` is ``MPI_Get_library_version``'s text (mpi4py's
    ``MPI.Get_library_version()``, callable before MPI starts).
    """
    import re
    import sys

    import tensorflow as tf

    mpi = mpi_library_version.split("\x00")[0].split(",")[0].strip()  # "Open MPI v4.1.4"
    mpi = re.sub(r"[^A-Za-z0-9.]+", "-", mpi).strip("-").lower()
    return f"tf-{tf.__version__}-{mpi}-cp{sys.version_info[0]}{sys.version_info[1]}"


def keras_loss_tracker(model):
    """The ``Mean`` Keras 3's ``train_step`` adds each batch's loss to (weighted by
    its samples) before it applies the gradients, or None (a model that never
    compiled a loss). A private attribute of Keras 3's Trainer, read here only."""
    return getattr(model, "_loss_tracker", None)
