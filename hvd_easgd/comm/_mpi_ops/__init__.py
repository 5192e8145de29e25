"""The mpi-direct TF ops (mpi_ops.cc): where the built library lives, how it is
built, and loading it.

The library is compiled against the installed TensorFlow's headers and the
system MPI, as Horovod's ops are, so it is built on each machine (``hvd-easgd
setup``, which ``make setup`` runs, calls ``build.build``) and kept outside the
clone, beside the Horovod wheel, in a directory named after the TF, MPI and
Python versions and a hash of the source and compile flags: a clean clone
reuses it, and a changed source or stack never loads a stale build.
"""
import functools
import hashlib
import os
import shutil
import subprocess

from ... import _compat

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_ops.cc")
LIBRARY_NAME = "mpi_direct_ops.so"
# Besides TF's and MPI's own flags. -O2: the packing loops and the 16-bit reductions.
CXXFLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-Wall", "-Wno-sign-compare")


class MissingOpsLibrary(RuntimeError):
    """The mpi-direct ops are not built for this TensorFlow, MPI and Python."""


def _mpi_flags(which):
    """MPI's compile (``which="compile"``) or link flags, from its C compiler wrapper."""
    for wrapper, args in (("mpicc", [f"--showme:{which}"]),  # Open MPI
                          ("mpicc", [f"-{which}_info"])):  # MPICH
        if shutil.which(wrapper) is None:
            break
        proc = subprocess.run([wrapper, *args], capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip():
            flags = proc.stdout.split()
            return flags[1:] if flags and not flags[0].startswith("-") else flags  # MPICH names the compiler first
    raise MissingOpsLibrary("cannot find MPI's compile flags: `mpicc` (Open MPI or MPICH) is not installed")


def mpi_library_version():
    """MPI's ``MPI_Get_library_version`` text, read without starting MPI.

    If mpi4py's MPI module is not loaded yet, it is loaded with automatic
    initialisation off: choosing the collectives (runtime.choose_collectives)
    reads the version before either path starts MPI; Horovod's then starts it
    itself, and comm/mpi_direct.py starts it explicitly.
    """
    import sys

    import mpi4py

    if "mpi4py.MPI" not in sys.modules:
        mpi4py.rc.initialize = False
    from mpi4py import MPI

    return MPI.Get_library_version()


def compile_command(output):
    import tensorflow as tf

    return ["g++", *CXXFLAGS, SOURCE, "-o", output, *tf.sysconfig.get_compile_flags(), *_mpi_flags("compile"),
            *tf.sysconfig.get_link_flags(), *_mpi_flags("link")]


def _recipe_hash():
    digest = hashlib.sha256()
    with open(SOURCE, "rb") as f:
        digest.update(f.read())
    digest.update(" ".join(CXXFLAGS).encode())
    return digest.hexdigest()[:12]


def library_path(mpi_library_version, environ=None):
    """The cached library for this stack and this source."""
    key = f"mpi-direct-ops-{_compat.native_build_key(mpi_library_version)}-{_recipe_hash()}"
    return os.path.join(_compat.cache_dir(environ), "ops", key, LIBRARY_NAME)


@functools.lru_cache(maxsize=None)
def load(mpi_library_version):
    """The ops module (``tf.load_op_library``); raises ``MissingOpsLibrary`` if it is not built."""
    import tensorflow as tf

    path = library_path(mpi_library_version)
    if not os.path.exists(path):
        raise MissingOpsLibrary(
            f"--collectives mpi-direct needs its TF ops built for this TensorFlow, MPI and Python, and {path} "
            "does not exist: run `hvd-easgd setup` (`make setup` in a clone runs it)")
    return tf.load_op_library(path)
