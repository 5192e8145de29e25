"""How ``hvd-easgd`` stops: one line on stderr and a non-zero exit status.

A refusal (exit 2) is the environment saying no before anything is built: an
unsupported or missing TensorFlow, no compiler, no MPI. A failure (exit 1) is
a step that was tried and failed: Horovod's build, its check, the ops' build.
"""
EXIT_REFUSED = 2
EXIT_FAILED = 1


class Refused(Exception):
    """This environment cannot be set up as it is; the message says what to install or change."""


class Failed(Exception):
    """A set-up step ran and failed; the message names the step and where its log is."""
