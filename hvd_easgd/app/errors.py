"""train.py's errors, and how a rank leaves with one.

Bad input gets one line on rank 0 and exit status 2 on every rank; a failure
during training gets one line per rank that saw it, tagged with the rank, and
exit status 1. Standard library only: the command line reports errors before
TensorFlow has loaded.
"""
import sys
import time

from .. import _compat

EXIT_USAGE = 2
EXIT_FAILURE = 1
# How long a non-zero rank waits for the launcher to stop it after rank 0 has
# reported a usage error (see exit_with_usage_error).
USAGE_ERROR_GRACE_SECONDS = 15


class UsageError(Exception):
    """Bad input: one line on rank 0, exit status 2."""


def exit_with_usage_error(message):
    """Rank 0 says `message` and exits 2; every other rank exits 2 after it.

    Why the other ranks wait: launchers (horovodrun, mpirun, srun --kill-on-bad-exit)
    stop every rank as soon as the first one fails. Had rank 1 exited first, rank 0
    could be killed before its message got out, and the user would see nothing. So
    only rank 0 exits at once; the others wait to be stopped. A rank still alive after
    the grace period found an error rank 0 did not (its input differed), and says it.
    """
    if _compat.launcher_rank() == 0:
        print(f"train.py: error: {message}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USAGE)
    time.sleep(USAGE_ERROR_GRACE_SECONDS)
    exit_with_rank_error(message, EXIT_USAGE)


def exit_with_rank_error(message, status):
    """This rank's own error line, tagged with its rank, then exit ``status``."""
    print(f"train.py: error (rank {_compat.launcher_rank()}): {message}", file=sys.stderr, flush=True)
    sys.exit(status)
