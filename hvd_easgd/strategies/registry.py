"""Strategies by name, for the command line. The CLI takes its ``--strategy``
choices from here, so the list of strategies exists exactly once.

Strategies defined outside hvd_easgd join it in two ways (docs/plugins.md):
a module that calls ``register(cls)`` when imported (``train.py --plugin
MODULE`` imports it: ``import_plugins``), or an installed distribution that
names its classes (or such a module) in the entry-point group
``hvd_easgd.strategies``; those load when the registry is first asked for a
name (``available``, ``get``, ``choices``).

Serialisation does not go through this registry: strategies are Keras
serialisables (``keras.saving.serialize_keras_object``), as Keras's
``LossScaleOptimizer`` serialises its inner optimizer.
"""
import importlib
import inspect
from importlib import metadata

from .base import SyncStrategy
from .diloco import DiLoCo
from .easgd import EASGD
from .hierarchical import Hierarchical
from .periodic_average import PeriodicAverage
from .sync_average import SyncAverage

ENTRY_POINT_GROUP = "hvd_easgd.strategies"

_REGISTRY = {}
_entry_points_loaded = False


def register(cls, name=None, description=None):
    """Makes ``cls`` a ``--strategy`` choice under ``name`` (default ``cls.name``);
    returns ``cls``, so it also serves as a class decorator."""
    name = name or cls.name
    if not (inspect.isclass(cls) and issubclass(cls, SyncStrategy)):
        raise ValueError(f"`cls` must be a SyncStrategy subclass. Received: cls={cls!r}")
    if not name:
        raise ValueError(f"`name` must be a non-empty string (or set the class's `name`). Received: name={name!r}")
    if name in _REGISTRY:
        raise ValueError(f"`name` must be one no registered strategy has ({name!r} is already registered, by "
                         f"{_REGISTRY[name]['cls'].__module__}.{_REGISTRY[name]['cls'].__qualname__}). "
                         f"Received: name={name!r}")
    description = description or cls.description
    if not description:
        raise ValueError(f"`description` must be a non-empty string (or set the class's `description`): "
                         f"--strategy's help lists it. Received: description={description!r}")
    _REGISTRY[name] = {"cls": cls, "description": description}
    return cls


def plugin_modules(values):
    """``--plugin`` values (each a module or a comma-separated list; a saved
    config's may be one string or a list) as one list of module names, first
    seen first, each once."""
    modules = []
    for value in values or ():
        for name in ([value] if isinstance(value, str) else list(value)):
            for module in str(name).split(","):
                if module.strip() and module.strip() not in modules:
                    modules.append(module.strip())
    return modules


def import_plugins(modules):
    """Imports each module of ``modules`` (importable names, e.g. through
    PYTHONPATH); importing one registers its strategies.

    Raises:
      ValueError: a module cannot be imported (one line: which, and why).
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as err:  # any failure of the plugin's own import is the plugin's
            raise ValueError(f"`plugin` must name an importable module. Received: plugin={module!r} "
                             f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None


def load_entry_points():
    """Registers what installed distributions declare in ``ENTRY_POINT_GROUP``:
    a strategy class (registered under its own ``name``) or a module whose
    import registers its strategies. Once per process."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        loaded = entry.load()
        if inspect.isclass(loaded) and _REGISTRY.get(loaded.name, {}).get("cls") is not loaded:
            register(loaded)


def available():
    """``{name: description}`` of every registered strategy."""
    load_entry_points()
    return {name: entry["description"] for name, entry in _REGISTRY.items()}


def choices(option):
    """The values a strategy's ``CliOption`` accepts: its ``choices``, or for
    a flag naming another strategy the registered ones it may name, sorted."""
    if option.strategies_where is None:
        return option.choices
    load_entry_points()
    return tuple(sorted(name for name, entry in _REGISTRY.items() if option.strategies_where(entry["cls"])))


def get(name):
    load_entry_points()
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
