"""train.py with one option that differs by rank (`--lr 0.0<rank+1>`): how a
node with another config file, or a stale copy of the job script, looks."""
import sys

from hvd_easgd import _compat

_compat.import_keras_for_ranks()  # as train.py's ranks

from hvd_easgd.app import cli  # noqa: E402

rank = _compat.launcher_rank()
cli.main(sys.argv[1:] + ["--lr", f"0.0{rank + 1}"])
