"""hvd_easgd's modules import in layers: no cycles, not even ones hidden in functions."""
import ast
import os

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit
PACKAGE = os.path.join(ROOT, "hvd_easgd")
# The command line and the training job, and the modules they were untangled into.
COMMAND_LINE_LAYER = ("hvd_easgd.cli", "hvd_easgd.trainer", "hvd_easgd.errors", "hvd_easgd.config_compare",
                      "hvd_easgd.checkpoint", "hvd_easgd.atomic", "hvd_easgd.lr_scaling")


def _modules():
    found = {}
    for directory, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                dotted = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


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
                # `from package import submodule` imports the submodule as well
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
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


def test_cli_imports_trainer_and_nothing_imports_cli():
    graph = import_graph()
    assert "hvd_easgd.trainer" in graph["hvd_easgd.cli"]
    assert not [module for module, edges in graph.items() if "hvd_easgd.cli" in edges]


def test_the_command_line_layer_is_in_no_import_cycle():
    in_layer = [c for c in cycles(import_graph()) if set(c) & set(COMMAND_LINE_LAYER)]
    assert not in_layer


def test_the_package_has_no_import_cycle():
    # strategies.accumulation <-> strategies.registry was the last one: strategies now
    # serialise through keras.saving and the registry only names them for the CLI.
    assert cycles(import_graph()) == []
