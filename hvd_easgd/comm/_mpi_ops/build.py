"""Builds the mpi-direct TF ops once per TensorFlow, MPI, Python and source.

    python -m hvd_easgd.comm._mpi_ops.build [--force]

Prints the library's path; does nothing but that when it is already built.
``hvd-easgd setup`` (hvd_easgd/install/) calls ``build`` after Horovod.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import mpi4py

# Only the library's version is needed here: MPI need not (and, outside a
# launcher, should not) start.
mpi4py.rc.initialize = False
mpi4py.rc.finalize = False
from mpi4py import MPI  # noqa: E402

from . import compile_command, library_path  # noqa: E402


class OpsBuildError(RuntimeError):
    """The compiler failed; the message holds its command line and the end of its errors."""


def build(force=False):
    path = library_path(MPI.Get_library_version())
    if os.path.exists(path) and not force:
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Built beside its final name and renamed: a reader never sees half a library.
    fd, partial = tempfile.mkstemp(suffix=".so.partial", dir=os.path.dirname(path))
    os.close(fd)
    try:
        cmd = compile_command(partial)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            raise OpsBuildError(f"building the mpi-direct ops failed:\n{' '.join(cmd)}\n{proc.stderr[-4000:]}")
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--force", action="store_true", help="rebuild even if the library exists")
    args = p.parse_args(argv)
    try:
        print(build(args.force))
    except OpsBuildError as err:
        raise SystemExit(str(err)) from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
