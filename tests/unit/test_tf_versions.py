"""The supported TensorFlow versions agree everywhere they are written down:
tools/tf_versions.txt, requirements.txt, setup.py's range, the setup script's
refusal and the committed support page (docs/supported-versions.md)."""
import importlib.util
import os
import subprocess

import pytest
from packaging.specifiers import SpecifierSet

from tests.helpers import ROOT
from tools import tf_matrix

pytestmark = pytest.mark.unit


def test_the_committed_support_page_is_what_the_renderer_makes_of_the_committed_results():
    with open(tf_matrix.PAGE) as f:
        committed = f.read()
    assert committed == tf_matrix.render(), f"docs/supported-versions.md is stale: run {tf_matrix.RENDER_COMMAND}"


def test_every_listed_version_has_a_committed_result():
    results = tf_matrix.load_results()
    assert [v for v, _ in tf_matrix.supported_versions() if v not in results] == []


def test_the_first_listed_version_is_requirements_txt_tensorflow_pin():
    with open(os.path.join(ROOT, "requirements.txt")) as f:
        pins = [line.strip().split("==")[1] for line in f if line.startswith("tensorflow-cpu==")]
    assert len(pins) == 1
    assert tf_matrix.supported_versions()[0][0] == pins[0]


def test_every_listed_version_is_inside_setup_py_tensorflow_range():
    # setup.py's setup() runs only under __main__, so loading it as a module just defines the range.
    spec = importlib.util.spec_from_file_location("setup", os.path.join(ROOT, "setup.py"))
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    allowed = SpecifierSet(setup.TENSORFLOW_RANGE)
    listed = [v for v, _ in tf_matrix.supported_versions()]
    assert len(listed) >= 2
    assert [v for v in listed if v not in allowed] == []


def test_an_unlisted_version_is_refused_in_one_line_naming_it():
    out = subprocess.run(["bash", os.path.join(ROOT, "tools", "setup_env.sh"), "--plan"], capture_output=True,
                         text=True, env=dict(os.environ, TF="2.17.0"), timeout=60)
    assert out.returncode != 0
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "2.17.0" in lines[0], out.stderr


def test_a_listed_version_plans_its_own_venv_and_overrides():
    version, overrides = tf_matrix.supported_versions()[-1]
    out = subprocess.run(["bash", os.path.join(ROOT, "tools", "setup_env.sh"), "--plan"], capture_output=True,
                         text=True, env=dict(os.environ, TF=version), timeout=60)
    assert out.returncode == 0, out.stderr
    plan = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert plan["venv"] == tf_matrix.venv_for(version) == os.path.join(ROOT, f".venv-tf{version}")
    assert f"tensorflow-cpu=={version}" in plan["requirements"].split()
    for pin in overrides:
        assert pin in plan["requirements"].split()


def test_an_aspect_is_a_difference_only_where_versions_disagree():
    base = {"result": "passed", "smoke": {"passed": 3, "failed": 0, "seconds": 10, "failed_tests": []},
            "horovod_build_seconds": 125, "horovod_wheel": "built", "notes": []}
    results = {
        "2.2.0": dict(base, tensorflow="2.2.0", observed={"same": "S", "differs": "new"}),
        "2.1.0": dict(base, tensorflow="2.1.0", observed={"same": "S", "differs": "old"},
                      notes=["needs a pin"], horovod_wheel="cached", conditions="on a busy machine"),
    }
    page = tf_matrix.render(results, [("2.2.0", []), ("2.1.0", []), ("2.0.0", [])])
    rows = {line.split(" | ")[0].strip("| "): line for line in page.splitlines() if line.startswith("| 2.")}
    assert "new" in rows["2.2.0 (default)"] and "S" not in rows["2.2.0 (default)"].split(" | ")[6]
    assert "needs a pin<br>old" in rows["2.1.0"]
    assert "2 min 05 s |" in rows["2.2.0 (default)"] and "2 min 05 s (cached wheel reused)" in rows["2.1.0"]
    assert "| not run |" in rows["2.0.0"]
    assert page.endswith("- 2.1.0: on a busy machine\n")
