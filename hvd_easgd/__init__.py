"""hvd_easgd: pluggable sync strategies for TensorFlow 2 / Keras 3 over Horovod.

Workers combine their work over ring-allreduce (MPI or Gloo on CPU, NCCL on
GPU): ``SyncAverage`` averages gradients every step, ``EASGD`` takes an
elastic-averaging step every τ steps against a center replicated on every
rank, and ``GradientAccumulation`` runs k backward passes per update on top
of either.
"""
from . import _compat

_compat.quiet_tensorflow()

from . import callbacks, data, models  # noqa: E402
from .comm import Compression, LocalCommunicator  # noqa: E402
from .initial_state import broadcast_initial_state  # noqa: E402
from .kept_model import KeptWeights, kept_weights, save_kept_model  # noqa: E402
from .optimizer import DistributedOptimizer  # noqa: E402
from .sharding import shard_dataset  # noqa: E402
from .runtime import communicator, init, local_rank, local_size, rank, size  # noqa: E402
from .strategies import EASGD, GradientAccumulation, SyncAverage, SyncStrategy, registry  # noqa: E402
from .version import __version__  # noqa: E402

__all__ = [
    "EASGD", "Compression", "DistributedOptimizer", "GradientAccumulation", "LocalCommunicator",
    "SyncAverage", "SyncStrategy", "broadcast_initial_state", "callbacks", "communicator", "init",
    "data", "KeptWeights", "kept_weights", "save_kept_model", "shard_dataset", "local_rank", "local_size", "models", "rank", "registry", "size", "__version__",
]
