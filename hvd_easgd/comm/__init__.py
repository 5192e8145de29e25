"""Communicators: the one object every collective of hvd_easgd goes through.

Strategies receive a communicator instead of importing Horovod, so their
logic runs unchanged on one process (``LocalCommunicator``), on p simulated
ranks in one process for unit tests (``SimulatedCluster``), and on many
processes (``HorovodCommunicator``).

Imports the top-level modules only: every other part may import it.
"""
from .communicator import Communicator, RanksDisagreeError
from .compression import Compression
from .local_comm import LocalCommunicator
from .simulated_comm import CollectiveMismatchError, SimulatedCluster, SimulatedCommunicator

__all__ = ["CollectiveMismatchError", "Communicator", "Compression", "LocalCommunicator", "RanksDisagreeError",
           "SimulatedCluster", "SimulatedCommunicator", "horovod_communicator"]


def horovod_communicator(**kwargs):
    """Imported lazily so that a machine without Horovod can still unit-test."""
    from .horovod_comm import HorovodCommunicator

    return HorovodCommunicator(**kwargs)
