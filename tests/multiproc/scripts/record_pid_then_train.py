"""train.py that first writes its pid to DIR/pid<rank>, so a test can kill one rank."""
import os
import sys

from hvd_easgd import _compat

_compat.import_keras_for_ranks()  # as train.py's ranks

from hvd_easgd.app import cli  # noqa: E402

pid_dir = sys.argv[1]
with open(os.path.join(pid_dir, f"pid{_compat.launcher_rank()}"), "w") as f:
    f.write(str(os.getpid()))
cli.main(sys.argv[2:])
