"""Sync strategies: the rule for how workers combine their work."""
from . import registry
from .accumulation import GradientAccumulation
from .base import SyncStrategy, walk
from .easgd import EASGD
from .hierarchical import Hierarchical
from .sync_average import SyncAverage

__all__ = ["EASGD", "GradientAccumulation", "Hierarchical", "SyncAverage", "SyncStrategy", "registry", "walk"]
