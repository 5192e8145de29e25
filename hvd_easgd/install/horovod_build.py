"""Horovod 0.28.1 for this environment: found installed, installed from the cache, or built.

The build is the sdist, patched (``stack.PATCH``), then ``pip wheel`` against
the TensorFlow in this environment with ``stack.horovod_build_switches``;
the wheel goes to the cache (``stack.wheel_dir``) with its log and how long it
took (``build-seconds``, which ``make matrix`` reports). Installing it writes
the build record beside Horovod's TensorFlow extension
(``_compat.HOROVOD_BUILD_RECORD``: the TF and the patch), which tells a later
set-up that the installed Horovod is this build, and tells a job at start-up
(``_compat.horovod_problem``) that it was built for another TF.

Nothing here imports TensorFlow or Horovod: the installed build is read from
its files (``hvd-easgd setup`` then loads it, to check what it was built with).
"""
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata

from .. import _compat
from . import stack
from .errors import Failed, Refused

# Horovod's setup.py builds with the venv's own setuptools (--no-build-isolation: it
# must see this TensorFlow); 0.28.1's setup.py predates setuptools 76.
BUILD_REQUIREMENTS = ("setuptools<76", "wheel")
LOG_TAIL_LINES = 30


def _pip(*args):
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]


def installed():
    """``(version, build record, package directory)`` of the Horovod this Python would import
    (the record None where none was written), or None when there is none."""
    spec = importlib.util.find_spec("horovod")  # finds, does not import
    if spec is None or spec.origin is None:
        return None
    directory = os.path.dirname(spec.origin)
    try:
        version = metadata.version("horovod")
    except metadata.PackageNotFoundError:
        version = None
    return version, _compat.horovod_build_record(directory), directory


def installed_is_this_build(tensorflow):
    """True when the installed Horovod is ``stack.HOROVOD_VERSION`` built against ``tensorflow`` with this patch."""
    found = installed()
    return found is not None and found[0] == stack.HOROVOD_VERSION and found[1] == stack.build_record(tensorflow)


def build_wheel(tensorflow, variant, say, environ=None):
    """Builds the patched Horovod wheel into the cache; returns its path. Takes several minutes."""
    environ = dict(os.environ if environ is None else environ)
    for tool, why in (("cmake", "Horovod's build runs CMake (Debian: apt-get install cmake)"),
                      ("patch", "hvd_easgd's patch is applied with it (Debian: apt-get install patch)")):
        if shutil.which(tool, path=environ.get("PATH")) is None:
            raise Refused(f"no `{tool}` on PATH, and no cached Horovod wheel for this stack: {why}")
    _install_build_requirements(say)
    directory = stack.wheel_dir(tensorflow, variant, environ)
    os.makedirs(directory, exist_ok=True)
    build_env = dict(environ, **dict(s.split("=", 1) for s in stack.horovod_build_switches(variant)),
                     MAKEFLAGS=f"-j{len(os.sched_getaffinity(0))}")
    if variant == "cuda":
        build_env.update(_cuda_build_env(environ))
    log_path = os.path.join(directory, "build.log")
    say(f"building horovod=={stack.HOROVOD_VERSION} against TF {tensorflow} ({variant}, patched: "
        f"{os.path.basename(stack.PATCH)}); takes several minutes, log: {log_path}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as source_dir, open(log_path, "w") as log:
        def run(step, command, env):
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            if subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env).returncode:
                log.flush()
                with open(log_path) as f:
                    sys.stderr.writelines(f.readlines()[-LOG_TAIL_LINES:])
                raise Failed(f"the Horovod build against TF {tensorflow} failed at its {step}; "
                             f"full log: {log_path}")

        # --no-cache-dir: pip's wheel cache is keyed by the sdist alone, and would hand back a
        # build made against another TensorFlow, or without the patch.
        run("download of the sdist", _pip("download", "--no-deps", "--no-binary", "horovod", "--no-cache-dir",
                 f"horovod=={stack.HOROVOD_VERSION}", "-d", source_dir), environ)
        source = os.path.join(source_dir, f"horovod-{stack.HOROVOD_VERSION}")
        run("unpacking", ["tar", "-xzf", f"{source}.tar.gz", "-C", source_dir], environ)
        run("patch", ["patch", "-d", source, "-p1", "--forward", "-i", stack.PATCH], environ)
        run("compilation", _pip("wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir", source,
                                "-w", directory), build_env)
    with open(os.path.join(directory, "build-seconds"), "w") as f:
        f.write(f"{round(time.monotonic() - started)}\n")
    wheel = stack.cached_wheel(tensorflow, variant, environ)
    if wheel is None:
        raise Failed(f"the Horovod build left no wheel in {directory}; log: {log_path}")
    return wheel


def _install_build_requirements(say):
    def ok(name, below=None):
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            return False
        return below is None or int(version.split(".")[0]) < below

    if not (ok("setuptools", below=76) and ok("wheel")):
        say(f"installing Horovod's build requirements: {' '.join(BUILD_REQUIREMENTS)}")
        if subprocess.run(_pip("install", *BUILD_REQUIREMENTS)).returncode:
            raise Failed(f"could not install Horovod's build requirements ({' '.join(BUILD_REQUIREMENTS)})")


def _cuda_build_env(environ):
    """Where Horovod's GPU build finds CUDA and NCCL: the toolkit's nvcc, and NCCL from the
    nvidia-nccl-cu12 wheel unless ``HOROVOD_NCCL_HOME`` names a system one."""
    found = {"HOROVOD_CUDA_HOME": os.path.dirname(os.path.dirname(stack.nvcc(environ)))}
    nccl_home = environ.get("HOROVOD_NCCL_HOME")
    if not nccl_home:
        try:
            import nvidia.nccl  # the nvidia-nccl-cu12 wheel, no TensorFlow

            nccl_home = os.path.dirname(nvidia.nccl.__file__)
        except ImportError:
            return found
        # The wheel ships lib/libnccl.so.2 only; Horovod's CMake looks for libnccl.so.
        link = os.path.join(nccl_home, "lib", "libnccl.so")
        if not os.path.lexists(link):
            os.symlink("libnccl.so.2", link)
    found.update(HOROVOD_NCCL_HOME=nccl_home, HOROVOD_NCCL_LINK="SHARED")
    return found


def install(wheel, tensorflow):
    """Installs ``wheel`` into this environment (Horovod's runtime needs are hvd_easgd's own
    requirements, hence ``--no-deps``) and writes its build record."""
    if subprocess.run(_pip("install", "--no-deps", "--force-reinstall", wheel)).returncode:
        raise Failed(f"pip could not install {wheel}")
    importlib.invalidate_caches()
    found = installed()
    if found is None:
        raise Failed(f"{wheel} installed, but this Python does not find horovod")
    with open(os.path.join(found[2], "tensorflow", _compat.HOROVOD_BUILD_RECORD), "w") as f:
        f.write(stack.build_record(tensorflow) + "\n")
