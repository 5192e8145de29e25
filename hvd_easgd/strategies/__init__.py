"""Sync strategies: the rule for how workers combine their work.

One strategy a module (``base.py`` the protocol, ``registry.py`` their names), with what they share and
``sample_shares.py`` (ranks of unequal speed: each rank's share of the batch, its weight in an average).
Imports ``comm`` and the top-level modules (``resize``, ``statistics``, ...) only.
"""
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
