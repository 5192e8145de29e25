"""Strategies by name. The CLI takes its ``--strategy`` choices from here,
so the list of strategies exists exactly once."""
from .easgd import EASGD
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


def serialize_strategy(strategy):
    return {"class_name": type(strategy).__name__, "config": strategy.get_config()}


def deserialize_strategy(spec):
    from .accumulation import GradientAccumulation

    classes = {entry["cls"].__name__: entry["cls"] for entry in _REGISTRY.values()}
    classes["GradientAccumulation"] = GradientAccumulation
    return classes[spec["class_name"]].from_config(spec["config"])


register(SyncAverage)
register(EASGD)
