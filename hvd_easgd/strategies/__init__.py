"""Sync strategies: the rule for how workers combine their work."""
from . import registry
from .accumulation import GradientAccumulation
from .base import SyncStrategy, unequal_shares_refusal, walk
from .diloco import DiLoCo
from .easgd import EASGD
from .hierarchical import Hierarchical
from .periodic_average import PeriodicAverage
from .sync_average import SyncAverage
from .warmup import WarmUp

__all__ = ["DiLoCo", "EASGD", "GradientAccumulation", "Hierarchical", "PeriodicAverage", "SyncAverage", "SyncStrategy",
           "WarmUp", "registry", "walk"]
