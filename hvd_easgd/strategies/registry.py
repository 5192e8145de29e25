"""Strategies by name, for the command line. The CLI takes its ``--strategy``
choices from here, so the list of strategies exists exactly once.

Serialisation does not go through this registry: strategies are Keras
serialisables (``keras.saving.serialize_keras_object``), as Keras's
``LossScaleOptimizer`` serialises its inner optimizer.
"""
from .diloco import DiLoCo
from .easgd import EASGD
from .hierarchical import Hierarchical
from .periodic_average import PeriodicAverage
from .sync_average import SyncAverage

_REGISTRY = {}


def register(cls, name=None, description=None):
    name = name or cls.name
    if name in _REGISTRY:
        raise ValueError(f"`name` must be one no registered strategy has ({name!r} is already registered, by "
                         f"{_REGISTRY[name]['cls'].__module__}.{_REGISTRY[name]['cls'].__qualname__}). "
                         f"Received: name={name!r}")
    _REGISTRY[name] = {"cls": cls, "description": description or cls.description}
    return cls


def available():
    """``{name: description}`` of every registered strategy."""
    return {name: entry["description"] for name, entry in _REGISTRY.items()}


def get(name):
    if name not in _REGISTRY:
        raise ValueError(f"`name` must be a registered strategy, one of {sorted(_REGISTRY)} (unknown strategy "
                         f"{name!r}). Received: name={name!r}")
    return _REGISTRY[name]["cls"]


def create(name, **kwargs):
    return get(name)(**kwargs)


register(SyncAverage)
register(EASGD)
register(PeriodicAverage)
register(DiLoCo)
register(Hierarchical)
