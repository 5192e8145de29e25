"""No code outside tests/ imports tests: the library, train.py, the benchmarks and tools stand on their own."""
import ast
import os

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.unit
# Every tree of non-test code, and train.py.
SCANNED = ("benchmarks", "tools", "hvd_easgd", "train.py")


def _python_files():
    for entry in SCANNED:
        path = os.path.join(ROOT, entry)
        if os.path.isfile(path):
            yield path
        for directory, _, files in os.walk(path):
            yield from (os.path.join(directory, name) for name in files if name.endswith(".py"))


def imports_of_tests(path):
    """``[(line, imported module)]`` for every import of ``tests`` or a module below it in ``path``."""
    found = []
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [(node.lineno, name) for name in names if name == "tests" or name.startswith("tests.")]
    return found


def test_the_scan_finds_an_import_of_tests(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nfrom tests.helpers import ROOT\ndef f():\n    import tests.reference\n"
                      "from testsuite import x\n")
    assert imports_of_tests(str(sample)) == [(2, "tests.helpers"), (4, "tests.reference")]


def test_no_module_outside_tests_imports_tests():
    files = list(_python_files())
    assert any(f.endswith(os.path.join("benchmarks", "suite", "runner.py")) for f in files)  # the scan sees the trees
    offenders = [f"{os.path.relpath(path, ROOT)}:{line} imports {name}"
                 for path in files for line, name in imports_of_tests(path)]
    assert offenders == []
