"""Communicators: the one object every collective of hvd_easgd goes through.

Strategies receive a communicator instead of importing Horovod, so their
logic runs unchanged on one process (``LocalCommunicator``) and on many
(``HorovodCommunicator``).
"""
from .communicator import Communicator, RanksDisagreeError
from .compression import Compression
from .local_comm import LocalCommunicator

__all__ = ["Communicator", "Compression", "LocalCommunicator", "RanksDisagreeError", "horovod_communicator"]


def horovod_communicator(**kwargs):
    """Imported lazily so that a machine without Horovod can still unit-test."""
    from .horovod_comm import HorovodCommunicator

    return HorovodCommunicator(**kwargs)
