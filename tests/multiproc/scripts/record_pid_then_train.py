"""train.py that first writes its pid to DIR/pid<rank>, so a test can kill one rank."""
import os
import sys

from hvd_easgd import _compat
from hvd_easgd.app import cli

pid_dir = sys.argv[1]
with open(os.path.join(pid_dir, f"pid{_compat.launcher_rank()}"), "w") as f:
    f.write(str(os.getpid()))
cli.main(sys.argv[2:])
