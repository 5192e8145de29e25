"""hvd_easgd: pluggable sync strategies for TensorFlow 2 / Keras 3 over Horovod.

Workers combine their work over ring-allreduce (MPI or Gloo on CPU, NCCL on
GPU): ``SyncAverage`` averages gradients every step, ``EASGD`` takes an
elastic-averaging step every τ steps against a center replicated on every
rank, ``PeriodicAverage`` (local SGD) averages the weights every τ steps,
``DiLoCo`` takes an outer optimizer step on the averaged pseudo-gradient every
τ steps, ``Hierarchical`` runs one strategy inside each group of ranks (a
host) and another across the groups, ``GradientAccumulation`` runs k backward
passes per update on top of any of them, and ``WarmUp`` runs SyncAverage
first. Strategies defined outside the package register with
``registry.register`` (docs/plugins.md).

The names below load on first use (PEP 562), so ``import hvd_easgd.startup.slurm``
from a batch script costs the standard library only, not TensorFlow's
seconds of start-up.
"""
import importlib

from . import _compat
from .validation import ConfigurationWarning, say_configuration_warnings_once
from .version import __version__

# Before anything can import TensorFlow: its C++ log level is read once, at load.
_compat.quiet_tensorflow()
# The launcher numbers the ranks before any collective starts: a warning about the arguments they
# share is said by rank 0 alone, not once per rank.
say_configuration_warnings_once(_compat.launcher_rank())

# Public name -> the module that defines it (a submodule when the two are the same).
_LAZY = {
    "DiLoCo": ".strategies",
    "EASGD": ".strategies",
    "GradientAccumulation": ".strategies",
    "Hierarchical": ".strategies",
    "PeriodicAverage": ".strategies",
    "SyncAverage": ".strategies",
    "SyncStrategy": ".strategies",
    "WarmUp": ".strategies",
    "registry": ".strategies",
    "Compression": ".comm",
    "LocalCommunicator": ".comm",
    "DistributedOptimizer": ".training.optimizer",
    "broadcast_initial_state": ".training.initial_state",
    "KeptWeights": ".training.kept_model",
    "kept_weights": ".training.kept_model",
    "merge_at_end": ".training.kept_model",
    "save_kept_model": ".training.kept_model",
    "shard_dataset": ".training.sharding",
    "communicator": ".startup.runtime",
    "init": ".startup.runtime",
    "local_rank": ".startup.runtime",
    "local_size": ".startup.runtime",
    "rank": ".startup.runtime",
    "size": ".startup.runtime",
    "auto": ".choosing.auto_strategy",
    "callbacks": ".callbacks",
    "data": ".app.data",
    "models": ".app.models",
}

__all__ = sorted([*_LAZY, "ConfigurationWarning", "__version__"])


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name], __name__)
    value = module if _LAZY[name].endswith(f".{name}") else getattr(module, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
