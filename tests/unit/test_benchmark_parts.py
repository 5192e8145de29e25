"""The benchmarks' four parts import one way, checked from the source (imports inside functions count).

The parts, lowest first: ``suite`` (the strategy comparison and the runner every program launches
through), ``costmodel`` (the cost model's inputs, checks and pages), ``accuracy`` (quality and time to
accuracy, and the pages of what a user gets) and ``studies`` (one-off investigations). A part may import
the library (``hvd_easgd``) and any part below it, never one above: the suite does not know what is
built on it, and the cost model's checks do not depend on the accuracy runs. The library never imports
the benchmarks (they are not installed with it). train.py's application (``hvd_easgd.app``) is imported
only where a benchmark builds what train.py builds, listed in ``APP_USERS`` with the reason; no
benchmark imports train.py itself.
"""
import ast
import functools
import importlib
import os
import re

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.unit
PARTS = ("suite", "costmodel", "accuracy", "studies")  # lowest first
APP = "hvd_easgd.app"
# Module or part -> why it may import train.py's application.
APP_USERS = {
    "benchmarks.suite.worker": "builds each configuration's strategy through train.py's own CLI, "
                               "so the suite times what a user's run builds",
    "benchmarks.suite.mwms": "trains train.py's digits CNN under TensorFlow's MWMS, the baseline",
    "benchmarks.accuracy.teacher_calibration": "times train.py's teacher dataset and student model",
    "benchmarks.accuracy.time_to_target": "writes the language model's corpus with train.py's own loader, "
                                          "in a child process (python -c)",
    "benchmarks.studies": "each study trains train.py's models on its datasets",
}


def _modules(top):
    found = {}
    for directory, _, files in os.walk(os.path.join(ROOT, top)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                found[os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".").removesuffix(".__init__")] = path
    return found


DOTTED = re.compile(r"benchmarks(\.\w+)+")


def _launched(tree):
    """Modules ``tree`` runs by name rather than imports: a string that is a benchmark module's dotted
    name (``-m benchmarks.suite.worker``, ``importlib.import_module``), and the imports of a
    ``python -c`` program held in a string. Docstrings are prose, not launches."""
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in prose:
            continue
        if DOTTED.fullmatch(node.value):
            found.add(node.value)
        elif "import " in node.value:
            try:
                program = ast.parse(node.value)
            except SyntaxError:
                continue  # prose that mentions an import
            found |= _imports(program, package="")
    return found


def _imports(tree, package):
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def imports_of(module, path):
    """Every module name ``module`` (at ``path``) imports or launches, anywhere in it; ``from p import n``
    yields ``p`` and ``p.n`` (``n`` may be a submodule), relative imports resolved."""
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    tree = ast.parse(open(path).read(), path)
    return _imports(tree, package) | _launched(tree)


@functools.cache  # parsed once for the module's tests, which only read it
def import_graph():
    """``{module: modules it imports}`` for every module under benchmarks/ and hvd_easgd/."""
    modules = {**_modules("benchmarks"), **_modules("hvd_easgd")}
    return {module: imports_of(module, path) for module, path in modules.items()}


def part_of(module):
    """``benchmarks.<part>`` for a module inside a part, ``hvd_easgd.app``, ``hvd_easgd``, ``train``,
    ``benchmarks`` (the package and its ``__main__``), or None for anything else (stdlib, third party)."""
    head = module.split(".")
    if head[0] == "benchmarks":
        return f"benchmarks.{head[1]}" if len(head) > 1 and head[1] in PARTS else "benchmarks"
    if module == APP or module.startswith(APP + "."):
        return APP
    if head[0] in ("hvd_easgd", "train"):
        return head[0]
    return None


def _may_use_app(module):
    return any(module == user or module.startswith(user + ".") for user in APP_USERS)


def forbidden(graph):
    """``[(importer, imported, rule)]`` for every import the parts' directions forbid."""
    rank = {f"benchmarks.{p}": i for i, p in enumerate(PARTS)}
    found = []
    for module, targets in sorted(graph.items()):
        source = part_of(module)
        for target in sorted(targets):
            to = part_of(target)
            if to is None or to == source:
                continue
            if source in ("hvd_easgd", APP) and to.startswith("benchmarks"):
                found.append((module, target, "the library never imports the benchmarks"))
            elif source in rank and to in rank and rank[to] > rank[source]:
                found.append((module, target, f"{source} sits below {to}"))
            elif source in rank and to == "benchmarks":
                found.append((module, target, "no part imports the benchmarks' entry point"))
            elif source in rank and to == "train":
                found.append((module, target, "no benchmark imports train.py"))
            elif source in rank and to == APP and not _may_use_app(module):
                found.append((module, target, "not listed in APP_USERS"))
    return found


def test_every_module_sits_in_a_part():
    loose = [m for m in _modules("benchmarks") if part_of(m) == "benchmarks" and m not in
             ("benchmarks", "benchmarks.__main__")]
    assert loose == [], "a benchmark module belongs in one of the parts " + ", ".join(PARTS)
    for part in PARTS:
        docstring = ast.get_docstring(ast.parse(open(os.path.join(ROOT, "benchmarks", part, "__init__.py")).read()))
        assert docstring, f"benchmarks/{part}/__init__.py says what it holds"
        assert "May import" in docstring, f"benchmarks/{part}/__init__.py says what it may import"


def test_the_parts_import_one_way():
    graph = import_graph()
    # The scan sees the edges the rules are about: a part importing the one below it, inside a function too.
    assert "benchmarks.suite.runner" in graph["benchmarks.costmodel.format_compute"]
    assert "benchmarks.costmodel.workloads" in graph["benchmarks.accuracy.tta_report"]
    assert "hvd_easgd.app.models" in graph["benchmarks.suite.mwms"]  # imported inside a function
    assert "benchmarks.suite.worker" in graph["benchmarks.suite.compare"]  # launched with -m
    assert "hvd_easgd.app" in graph["benchmarks.accuracy.time_to_target"]  # a python -c program
    assert forbidden(graph) == []


def test_every_app_user_is_real():
    # A stale entry would silently widen the exception.
    graph = import_graph()
    for user in APP_USERS:
        importers = [m for m in graph if m == user or m.startswith(user + ".")]
        assert importers, f"{user} is gone: remove it from APP_USERS"
        assert any(part_of(t) == APP for m in importers for t in graph[m]), f"{user} no longer imports the app"


def test_every_benchmark_import_resolves():
    # Imports inside functions are not run by importing the module: a stale path there would only
    # fail when that code runs. Each must name a module, or a name defined in one.
    graph = import_graph()
    modules = set(graph)
    stale = []
    for module, targets in graph.items():
        for target in targets:
            if part_of(target) not in ("benchmarks",) + tuple(f"benchmarks.{p}" for p in PARTS):
                continue
            if target not in modules and target.rsplit(".", 1)[0] not in modules:
                stale.append((module, target))
    assert stale == []


def test_every_subcommand_runs_a_module_in_a_part():
    entry = importlib.import_module("benchmarks.__main__")
    for name, command in entry.SUBCOMMANDS.items():
        assert part_of(command.module) in {f"benchmarks.{p}" for p in PARTS}, name
        assert command.module in import_graph(), f"{name}: {command.module} does not exist"


@pytest.mark.parametrize("importer,imported,rule", [
    ("benchmarks.suite.report", "benchmarks.costmodel.workloads", "benchmarks.suite sits below benchmarks.costmodel"),
    ("benchmarks.suite.compare", "benchmarks.accuracy.tta_report", "benchmarks.suite sits below benchmarks.accuracy"),
    ("benchmarks.costmodel.projection", "benchmarks.accuracy.parity",
     "benchmarks.costmodel sits below benchmarks.accuracy"),
    ("benchmarks.accuracy.parity", "benchmarks.studies.tuning_ab", "benchmarks.accuracy sits below benchmarks.studies"),
    ("benchmarks.costmodel.cluster_check", "hvd_easgd.app.models", "not listed in APP_USERS"),
    ("benchmarks.suite.compare", "hvd_easgd.app.cli", "not listed in APP_USERS"),
    ("benchmarks.suite.report", "train", "no benchmark imports train.py"),
    ("benchmarks.costmodel.projection", "benchmarks.__main__", "no part imports the benchmarks' entry point"),
    ("hvd_easgd.choosing.cost_model", "benchmarks.costmodel.calibration", "the library never imports the benchmarks"),
])
def test_the_check_finds_a_forbidden_import(importer, imported, rule):
    # The check above, on a graph where it must fail: the real graph plus one forbidden edge.
    graph = {module: set(targets) for module, targets in import_graph().items()}
    graph[importer] = graph[importer] | {imported}
    assert forbidden(graph) == [(importer, imported, rule)]


@pytest.mark.parametrize("importer,imported", [
    ("benchmarks.studies.tuning_ab", "benchmarks.accuracy.parity"),  # down three parts
    ("benchmarks.accuracy.parity", "benchmarks.suite.runner"),  # skipping a part
    ("benchmarks.costmodel.projection", "hvd_easgd.choosing.cost_model"),
    ("benchmarks.studies.direct_path", "hvd_easgd.app.models"),  # a listed user: the whole of studies
])
def test_the_check_allows_a_downward_import(importer, imported):
    graph = {module: set(targets) for module, targets in import_graph().items()}
    graph[importer] = graph[importer] | {imported}
    assert forbidden(graph) == []


def test_the_scan_sees_lazy_relative_and_launched_imports(tmp_path):
    # A synthetic module in the suite: each way of reaching a part above it is an edge the check refuses.
    source = tmp_path / "report.py"
    source.write_text('"""Prose naming benchmarks.studies.tuning_ab is no launch."""\n'
                      "import subprocess, sys\n"
                      "def later():\n"
                      "    from ..costmodel import workloads\n"
                      "    subprocess.run([sys.executable, '-m', 'benchmarks.accuracy.parity'])\n"
                      "    subprocess.run([sys.executable, '-c', 'from hvd_easgd.app import models'])\n")
    imported = imports_of("benchmarks.suite.report", str(source))
    assert {"benchmarks.costmodel.workloads", "benchmarks.accuracy.parity", "hvd_easgd.app.models"} <= imported
    assert "benchmarks.studies.tuning_ab" not in imported
    refused = {(target, rule) for _, target, rule in forbidden({"benchmarks.suite.report": imported})}
    assert refused == {
        ("benchmarks.costmodel", "benchmarks.suite sits below benchmarks.costmodel"),
        ("benchmarks.costmodel.workloads", "benchmarks.suite sits below benchmarks.costmodel"),
        ("benchmarks.accuracy.parity", "benchmarks.suite sits below benchmarks.accuracy"),
        ("hvd_easgd.app", "not listed in APP_USERS"),
        ("hvd_easgd.app.models", "not listed in APP_USERS"),
    }
