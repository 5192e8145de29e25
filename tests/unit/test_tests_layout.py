"""The test tree's own rules: helpers come from helpers modules, and the unit tier launches nothing.

conftest.py is pytest's hook file, loaded by pytest itself: a test that imports one gets a second
copy of the module (and of its hooks' state) under another name. Helpers live in tests/helpers.py and
each tier's helpers.py. The unit tier is `make test-unit`: in-process only, so it stays within two
minutes and needs no C++ op build; tests that start train.py, horovodrun or mpirun go in a
launching tier (tests/multiproc and up).
"""
import ast
import os

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.unit

TESTS = os.path.join(ROOT, "tests")
# What only a launch needs, as tests/helpers.py names it.
LAUNCHERS = {"run", "launch", "horovodrun", "horovodrun_command", "mpirun_command", "HOROVODRUN",
             "horovodrun_elastic_command", "run_watching"}
# Programs a unit test must not start, as they appear in a command line.
LAUNCHED = ("train.py", "horovodrun", "mpirun")
SUBPROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output"}


def python_files(top):
    for directory, _, names in os.walk(top):
        for name in sorted(names):
            if name.endswith(".py"):
                yield os.path.join(directory, name)


def parse(path):
    with open(path) as f:
        return ast.parse(f.read(), filename=path)


def conftest_imports(tree):
    """The ``import`` statements in ``tree`` that name a conftest module, as ``(line, module)``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if "conftest" in alias.name.split(".")]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if "conftest" in (node.module or "").split("."):
                found.append((node.lineno, module))
            separator = "." if node.module else ""
            found += [(node.lineno, module + separator + alias.name) for alias in node.names
                      if alias.name == "conftest"]
    return sorted(found)


def launches(tree):
    """Where ``tree`` imports a launcher from tests.helpers, or hands a subprocess call a command
    line naming train.py, horovodrun or mpirun, as ``(line, what)``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "tests.helpers":
            found += [(node.lineno, f"imports {alias.name}") for alias in node.names if alias.name in LAUNCHERS]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in SUBPROCESS_CALLS and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "subprocess":
            words = [leaf.value for arg in node.args for leaf in ast.walk(arg)
                     if isinstance(leaf, ast.Constant) and isinstance(leaf.value, str)]
            found += [(node.lineno, f"starts {word}") for word in words if word.endswith(LAUNCHED)]
    return sorted(found)


def test_the_scanners_find_what_they_look_for():
    # Each form a test could use, so a scanner that found nothing proves something.
    imports = conftest_imports(ast.parse("import tests.conftest\nfrom .conftest import REPO\n"
                                         "from tests.slurm.conftest import SlurmCluster\nfrom . import conftest\n"
                                         "from tests.multinode import conftest, helpers\n"
                                         "from tests.helpers import ROOT\nimport conftest_like\n"))
    assert imports == [(1, "tests.conftest"), (2, ".conftest"), (3, "tests.slurm.conftest"), (4, ".conftest"),
                       (5, "tests.multinode.conftest")]
    starts = launches(ast.parse("import subprocess\nfrom tests.helpers import PYTHON, run, quiet_env\n"
                                "subprocess.run([PYTHON, 'train.py', '--epochs', '1'])\n"
                                "subprocess.Popen(['/venv/bin/horovodrun', '-np', '2'])\n"
                                "subprocess.run([PYTHON, '-c', 'import hvd_easgd.startup.slurm'])\n"))
    assert starts == [(2, "imports run"), (3, "starts train.py"), (4, "starts /venv/bin/horovodrun")]


def test_no_test_module_imports_a_conftest():
    found = [f"{os.path.relpath(path, ROOT)}:{line}: {module}"
             for path in python_files(TESTS) for line, module in conftest_imports(parse(path))]
    assert found == [], "import helpers from tests/helpers.py or the tier's helpers.py instead:\n" + "\n".join(found)


def test_the_unit_tier_launches_nothing():
    found = [f"{os.path.relpath(path, ROOT)}:{line}: {what}"
             for path in python_files(os.path.join(TESTS, "unit")) for line, what in launches(parse(path))]
    assert found == [], "move tests that launch to tests/multiproc (pytest.mark.multiproc):\n" + "\n".join(found)
