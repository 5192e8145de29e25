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
        raise ValueError(f"a strategy named {name!r} is already registered")
    _REGISTRY[name] = {"cls": cls, "description": description or cls.description}
    return cls


def available():
    """``{name: description}`` of every registered strategy."""
    return {name: entry["description"] for name, entry in _REGISTRY.items()}


def get(name):
    if name not in _REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]["cls"]


def create(name, **kwargs):
    return get(name)(**kwargs)


register(SyncAverage)
register(EASGD)
register(PeriodicAverage)
register(DiLoCo)
register(Hierarchical)
