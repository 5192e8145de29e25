"""train.py with one option that differs by rank (`--lr 0.0<rank+1>`): how a
node with another config file, or a stale copy of the job script, looks."""
import sys

from hvd_easgd import _compat
from hvd_easgd.app import cli

rank = _compat.launcher_rank()
cli.main(sys.argv[1:] + ["--lr", f"0.0{rank + 1}"])
