"""hvd_easgd's modules import in layers: no cycles, not even ones hidden in functions."""
import ast
import functools
import os

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.unit
PACKAGE = os.path.join(ROOT, "hvd_easgd")
# train.py's application: everything under hvd_easgd.app.
APP = "hvd_easgd.app"
# The package face re-exports the app's datasets and models by name (PEP 562,
# on first use): it is the one module above both layers.
FACE = "hvd_easgd"
# The library's parts, top to bottom. A part imports only from the layers below its own: never a part
# beside it or above it. Every part may import the top-level modules, which import only each other.
TOP = "the top-level modules"
LAYERS = [
    {"app"},                                  # train.py's application
    {"callbacks", "install"},                 # Keras callbacks; the hvd-easgd set-up command
    {"training", "checkpoint", "choosing"},   # the optimizer wrapper; checkpoints and faults; --strategy auto
    {"strategies", "startup"},                # the sync strategies; process start-up
    {"comm"},                                 # communicators
    {TOP},
]
# What stays at the top level beside the face: small modules every part may use. A new module goes in a part.
TOP_LEVEL = {"_compat", "version", "validation", "atomic", "statistics", "resize", "compute_timing"}


def _modules():
    found = {}
    for directory, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                dotted = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


@functools.cache  # parsed once for the module's tests, which only read it
def import_graph():
    """``{module: modules it imports}``, counting imports inside functions too."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
        edges = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{parent}.{base}" if base else parent
                # `from package import submodule` imports the submodule; the package itself only where a
                # name is not a submodule (its __init__ must have run to hold it). `from . import sibling`
                # from inside the package needs only the package begun, which importing any module of it
                # has done: it is no edge to the package.
                submodules = [f"{base}.{alias.name}" for alias in node.names]
                inside = node.level and package == base
                targets = submodules + ([] if inside and all(m in modules for m in submodules) else [base])
            else:
                continue
            edges |= {t for t in targets if t in modules and t != module}
        graph[module] = edges
    return graph


def cycles(graph):
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_finder_sees_a_cycle_hidden_in_a_function():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _in_app(module):
    return module == APP or module.startswith(APP + ".")


def test_cli_imports_trainer_and_nothing_imports_cli():
    graph = import_graph()
    assert "hvd_easgd.app.trainer" in graph["hvd_easgd.app.cli"]
    assert not [module for module, edges in graph.items() if "hvd_easgd.app.cli" in edges]


def test_the_library_never_imports_the_application():
    graph = import_graph()
    assert any(_in_app(m) for m in graph), "the application moved: update APP"
    crossing = {module: sorted(e for e in edges if _in_app(e)) for module, edges in graph.items()
                if not _in_app(module) and module != FACE}
    assert {m: e for m, e in crossing.items() if e} == {}


def test_the_finder_sees_a_library_module_importing_the_app():
    # The check above, on a graph where it must fail.
    graph = {"hvd_easgd.checkpoint": {"hvd_easgd.app.errors"}, "hvd_easgd.app.errors": set()}
    assert [m for m, edges in graph.items() if not _in_app(m) and any(_in_app(e) for e in edges)] == [
        "hvd_easgd.checkpoint"]


def part_of(module):
    """``app``, ``strategies``, ... for a module in a part; TOP for a top-level module; None for the face."""
    if module == FACE:
        return None
    name = module.split(".")[1]
    return name if os.path.isdir(os.path.join(PACKAGE, name)) else TOP


def layer_of(part):
    return next(i for i, parts in enumerate(LAYERS) if part in parts)


def upward_imports(graph):
    """``[(module, imported module)]`` where a module imports its own layer's other parts or a layer
    above its own (an import of the face is only of what it imports at once: the top-level modules)."""
    found = []
    for module, edges in graph.items():
        if part_of(module) is None:
            continue
        for target in edges:
            if part_of(target) is None or part_of(target) == part_of(module):
                continue
            if layer_of(part_of(target)) <= layer_of(part_of(module)):
                found.append((module, target))
    return sorted(found)


def test_every_part_and_top_level_module_is_placed():
    parts = {name for name in os.listdir(PACKAGE) if os.path.isfile(os.path.join(PACKAGE, name, "__init__.py"))}
    assert parts == set().union(*LAYERS) - {TOP}
    top_level = {name[: -len(".py")] for name in os.listdir(PACKAGE) if name.endswith(".py")} - {"__init__"}
    assert top_level == TOP_LEVEL
    assert len(top_level) + 1 <= 8  # with the face: the top level stays short


def test_each_part_imports_only_the_layers_below_it():
    assert upward_imports(import_graph()) == []


def test_the_finder_sees_an_import_upward_and_one_beside():
    graph = {"hvd_easgd.strategies.base": {"hvd_easgd.training.optimizer", "hvd_easgd.comm", "hvd_easgd"},
             "hvd_easgd.startup.runtime": {"hvd_easgd.strategies.base", "hvd_easgd.validation"},
             "hvd_easgd.resize": {"hvd_easgd.comm"},
             "hvd_easgd.app.cli": {"hvd_easgd.training.optimizer", "hvd_easgd.resize"}}
    assert upward_imports(graph) == [
        ("hvd_easgd.resize", "hvd_easgd.comm"),
        ("hvd_easgd.startup.runtime", "hvd_easgd.strategies.base"),
        ("hvd_easgd.strategies.base", "hvd_easgd.training.optimizer")]


def test_the_package_has_no_import_cycle():
    # strategies.accumulation <-> strategies.registry was the last one: strategies now
    # serialise through keras.saving and the registry only names them for the CLI.
    assert cycles(import_graph()) == []
