"""Sync strategies: the rule for how workers combine their work."""
from . import registry
from .accumulation import GradientAccumulation
from .base import SyncStrategy, walk
from .easgd import EASGD
from .sync_average import SyncAverage

__all__ = ["EASGD", "GradientAccumulation", "SyncAverage", "SyncStrategy", "registry", "walk"]
