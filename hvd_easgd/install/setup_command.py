"""``hvd-easgd setup``: Horovod and the direct MPI ops, built for the environment it runs in.

The environment is this Python's (``sys.executable``, a venv as a rule), with
the TensorFlow already installed in it. In order:

1. refusals, each one line before anything is built: no TensorFlow, or one
   outside ``tf_versions.txt``; no C++ compiler (``g++``); no MPI (``mpicc``,
   ``mpirun``); a GPU without the CUDA toolkit;
2. Horovod 0.28.1 (``horovod_build``): kept if the installed one is this
   build, else installed from the cache (``~/.cache/hvd_easgd``, or
   ``$HVD_EASGD_CACHE``), else built from its sdist (several minutes) into the
   cache and installed;
3. the direct MPI ops (``comm/_mpi_ops``), compiled into the same cache unless
   they are there for this TensorFlow, MPI, Python and source;
4. a check that the installed Horovod loads under this TensorFlow, with MPI and
   Gloo (and NCCL for the GPU variant).

Run again, it finds everything done and changes nothing: step 3 and 4 load
TensorFlow, a few seconds. ``make setup`` runs it in the repository's venv
(tools/setup_env.sh, after the apt packages and the pinned stack).
"""
import os
import shutil
import sys

from .. import _compat
from . import horovod_build, stack
from .errors import Failed, Refused

# What every set-up compiles with, and what to install where it is missing (Debian's names).
TOOLS = (("g++", "no C++ compiler (g++) on PATH: Horovod and the direct MPI ops are compiled here "
                 "(Debian: apt-get install g++)"),
         ("mpicc", "no MPI (mpicc) on PATH: Horovod is built with MPI and the direct ops are compiled against it "
                   "(Debian: apt-get install libopenmpi-dev openmpi-bin)"),
         ("mpirun", "no MPI launcher (mpirun) on PATH: Horovod's MPI build and MPI launches need it "
                    "(Debian: apt-get install openmpi-bin)"))


def tensorflow_to_build_for(tensorflow=None):
    """The TensorFlow to build for: ``tensorflow`` as given (a plan made before it is installed),
    else the one installed here; ``Refused`` when there is none or it is not supported."""
    if tensorflow is None:
        tensorflow = _compat.installed_tensorflow_version()
        if tensorflow is None:
            default = stack.supported_tensorflow()[0][0]
            raise Refused(f"no TensorFlow in this environment ({sys.prefix}): install a supported one first, e.g. "
                          f"pip install tensorflow-cpu=={default} (or tensorflow[and-cuda]=={default} with a GPU)")
    problem = stack.unsupported_tensorflow(tensorflow)
    if problem:
        raise Refused(problem)
    return tensorflow


def check_tools(variant, environ=None):
    """``Refused`` naming the first tool of ``TOOLS`` missing from PATH (and the CUDA toolkit for
    the GPU variant)."""
    environ = os.environ if environ is None else environ
    for tool, refusal in TOOLS:
        if shutil.which(tool, path=environ.get("PATH")) is None:
            raise Refused(refusal)
    if variant == "cuda" and stack.nvcc(environ) is None:
        raise Refused("nvidia-smi sees a GPU but there is no CUDA toolkit (nvcc) to build Horovod's NCCL ops: "
                      "install the CUDA 12 toolkit or set CUDA_HOME; HVD_EASGD_FORCE_CPU=1 builds for CPU instead")


def plan(tensorflow=None, environ=None):
    """What ``setup`` would build, as ``[(field, value)]``; builds and installs nothing."""
    tensorflow = tensorflow_to_build_for(tensorflow)
    variant = stack.variant(environ)
    fields = [("tensorflow", tensorflow), ("variant", variant)]
    if variant == "cuda":
        fields.append(("cuda toolkit", stack.nvcc(environ) or "missing (install the CUDA 12 toolkit or set CUDA_HOME)"))
    wheel = stack.cached_wheel(tensorflow, variant, environ)
    fields += [("horovod build", " ".join(stack.horovod_build_switches(variant))),
               ("horovod wheel cache", stack.wheel_dir(tensorflow, variant, environ)),
               ("horovod wheel", f"cached ({os.path.basename(wheel)})" if wheel else "to build (several minutes)")]
    return fields


def setup(say, environ=None):
    """Steps 1-4 of the module's docstring for this environment; ``say`` prints a line of progress."""
    environ = os.environ if environ is None else environ
    tensorflow = tensorflow_to_build_for()
    variant = stack.variant(environ)
    check_tools(variant, environ)
    if horovod_build.installed_is_this_build(tensorflow):
        say(f"horovod {stack.HOROVOD_VERSION} for TF {tensorflow} ({variant}, patch-{stack.patch_hash()}) "
            "is installed")
    else:
        wheel = stack.cached_wheel(tensorflow, variant, environ)
        if wheel:
            say(f"reusing cached {wheel}")
        else:
            wheel = horovod_build.build_wheel(tensorflow, variant, say, environ)
        say(f"installing {os.path.basename(wheel)} into {sys.prefix}")
        horovod_build.install(wheel, tensorflow)
    say(f"direct MPI ops: {_build_ops()}")
    _check_horovod(variant)
    say(f"ready: tensorflow {tensorflow}, horovod {stack.HOROVOD_VERSION} ({variant}) in {sys.prefix}")


def _build_ops():
    """Builds the direct MPI ops unless they are cached for this stack; says which, and where."""
    try:
        from ..comm import _mpi_ops
        from ..comm._mpi_ops import build
    except ImportError as err:  # mpi4py is an install requirement; a broken one lands here
        raise Refused(f"the direct MPI ops need mpi4py, and it does not import ({err})") from None
    path = _mpi_ops.library_path(_mpi_ops.mpi_library_version())
    if os.path.exists(path):
        return f"cached {path}"
    try:
        build.build()
    except build.OpsBuildError as err:
        sys.stderr.write(str(err) + "\n")
        raise Failed("building the direct MPI ops failed (the compiler's errors are above)") from None
    return f"built {path}"


def _check_horovod(variant):
    """``Failed`` unless the installed Horovod loads under this TensorFlow with MPI and Gloo (and NCCL
    for the GPU variant). TensorFlow is loaded already (the ops' step), so this costs little."""
    problem = _compat.horovod_problem()
    if problem:
        raise Failed(problem)
    import horovod.tensorflow as hvd

    built = {"MPI": hvd.mpi_built(), "Gloo": hvd.gloo_built(), "NCCL": bool(hvd.nccl_built())}
    wanted = ("MPI", "Gloo") + (("NCCL",) if variant == "cuda" else ())
    missing = [name for name in wanted if not built[name]]
    if missing:
        raise Failed(f"the installed Horovod was built without {' and '.join(missing)}")
