"""The TensorFlow support matrix: `make matrix` and docs/supported-versions.md.

    python3 -m tools.tf_matrix run [VERSION ...]   setup + smoke per version (all of
                                                   hvd_easgd/install/tf_versions.txt by default),
                                                   then render
    python3 -m tools.tf_matrix render              docs/supported-versions.md from the
                                                   committed results, nothing run

`run` drives the Makefile, one version at a time (two cores: builds in parallel
would only slow each other): `make setup TF=<v>` (which builds Horovod against
<v> unless its wheel is cached) and `make smoke TF=<v>`. It writes
docs/results/tf-versions/<v>.json: the stack found in the venv, how long the
Horovod build took (`hvd-easgd setup` records it beside the cached wheel), the
smoke counts and what was observed about the version ("observed"). The
hand-written "notes" (differences found by reading logs) and "conditions" (how
the figures were measured) of an earlier results file are kept across re-runs.

Standard library only (hvd_easgd.install.stack is too): it runs with the system Python, outside
every venv.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

from hvd_easgd.install import stack  # standard library only, as this module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSIONS_FILE = stack.TF_VERSIONS  # the package's list (tools/tf_versions.txt links to it)
RESULTS_DIR = os.path.join(ROOT, "docs", "results", "tf-versions")
PAGE = os.path.join(ROOT, "docs", "supported-versions.md")
LOG_DIR = os.path.join(ROOT, "runs", "tf-matrix")  # runs/ is not committed
RENDER_COMMAND = "python3 -m tools.tf_matrix render"


def supported_versions(path=VERSIONS_FILE):
    """hvd_easgd/install/tf_versions.txt's versions, the default first, with their pin overrides."""
    return stack.supported_tensorflow(path)


def venv_for(version):
    default = supported_versions()[0][0]
    return os.path.join(ROOT, ".venv" if version == default else f".venv-tf{version}")


def _make(target, version, log_path, extra=()):
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.run(["make", "-C", ROOT, target, f"TF={version}", *extra], stdout=log,
                              stderr=subprocess.STDOUT, text=True)
    with open(log_path) as log:
        return proc.returncode, time.monotonic() - started, log.read()


def _plan(version):
    out = subprocess.run(["bash", os.path.join(ROOT, "tools", "setup_env.sh"), "--plan"], capture_output=True,
                         text=True, env=dict(os.environ, TF=version))
    return dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)


def _build_seconds(version):
    """Seconds the cached Horovod wheel for ``version`` took to build; None where it
    was built before its build time was recorded."""
    wheel_dir = _plan(version).get("horovod wheel cache")
    try:
        with open(os.path.join(wheel_dir, "build-seconds")) as f:
            return int(f.read().strip())
    except (OSError, TypeError, ValueError):
        return None


# Run inside the version's venv: what differs from one TF to the next, as
# plain facts the renderer compares across versions.
_PROBE = r"""
import json, os, platform, subprocess, sys
from importlib import metadata
env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
imported = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True, text=True, env=env, cwd="/")
found = {"python": platform.python_version()}
for dist in ("tensorflow-cpu", "keras", "numpy", "horovod", "tensorboard", "ml-dtypes", "protobuf", "h5py"):
    try:
        found[dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        found[dist] = None
requires = {}
for req in metadata.requires("tensorflow-cpu") or []:
    if "extra ==" in req:
        continue
    name = req.split(";")[0].strip()
    for dist in ("tensorboard", "keras", "numpy", "ml_dtypes", "ml-dtypes", "protobuf"):
        if name.lower().startswith(dist):
            requires[dist.replace("_", "-")] = name[len(dist):].strip() or "any"
check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
print(json.dumps({"found": found, "requires": requires, "import_stderr": imported.stderr.splitlines(),
                  "import_rc": imported.returncode, "pip_check": check.stdout.strip().splitlines()}))
"""


def probe(version):
    python = os.path.join(venv_for(version), "bin", "python")
    out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout.splitlines()[-1])


def observations(facts):
    """What a version is like, one sentence per aspect; the renderer shows an aspect
    only where the versions differ in it."""
    requires = facts["requires"]
    tensorboard = requires.get("tensorboard")
    stderr = [line for line in facts["import_stderr"] if line.strip()]
    info = [line for line in stderr if re.match(r"^[IW]\d{4} ", line) or "absl::InitializeLog" in line]
    pip_check = [line for line in facts["pip_check"] if line != "No broken requirements found."]
    return {
        "tensorboard": (f"tensorflow-cpu requires tensorboard {tensorboard}" if tensorboard else
                        "tensorflow-cpu no longer installs tensorboard (tf.summary needs it: pinned in "
                        "requirements.txt)"),
        "keras": f"tensorflow-cpu requires keras {requires.get('keras', 'none')}",
        "numpy": f"tensorflow-cpu requires numpy {requires.get('numpy', 'any')}",
        "import_output": (f"`import tensorflow` prints {len(stderr)} stderr lines even with TF_CPP_MIN_LOG_LEVEL=2"
                          + (f" (absl/oneDNN INFO: {_short(info[-1])})" if info else f" ({_short(stderr[0])})")
                          if stderr else "`import tensorflow` is silent with TF_CPP_MIN_LOG_LEVEL=2"),
        # A protobuf generated-code bump is what breaks other packages' _pb2 modules in the same venv.
        "protobuf": (f"protobuf {facts['found'].get('protobuf')} (tensorflow-cpu requires "
                     f"{_without_exclusions(requires.get('protobuf', 'any'))})"),
        "pip_check": "pip check: " + "; ".join(pip_check) if pip_check else "pip check: no broken requirements",
    }


def _without_exclusions(spec):
    """``!=4.21.0,...,<6,>=3.20.3`` -> ``<6,>=3.20.3``: the bounds, not the single releases skipped."""
    return ",".join(part for part in spec.split(",") if not part.startswith("!=")) or spec


def _short(line, width=90):
    line = re.sub(r"^[IWE]\d{4} [\d:.]+\s+\d+ ", "", line.strip())  # absl's time and thread prefix
    return line if len(line) <= width else line[:width - 1] + "…"


def _junit_counts(path):
    try:
        suite = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    return {"passed": tests - failures - errors - skipped, "failed": failures + errors, "skipped": skipped,
            "seconds": round(float(suite.get("time", 0))), "failed_tests": failed}


def run_version(version):
    os.makedirs(LOG_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{version}.json")
    previous = json.load(open(path)) if os.path.exists(path) else {}
    result = {"tensorflow": version, "date": datetime.date.today().isoformat(),
              "notes": previous.get("notes", [])}
    if previous.get("conditions"):
        result["conditions"] = previous["conditions"]

    print(f"[matrix] {version}: make setup TF={version}", flush=True)
    setup_log = os.path.join(LOG_DIR, f"{version}-setup.log")
    rc, seconds, text = _make("setup", version, setup_log)
    result["setup_seconds"] = round(seconds)
    result["horovod_wheel"] = "built" if "[setup] building horovod" in text else "cached"
    result["horovod_build_seconds"] = _build_seconds(version)
    if rc != 0:
        errors = [line for line in text.splitlines() if "[setup] error:" in line]
        result.update(result="setup failed", reason=(errors or text.strip().splitlines()[-1:] or ["?"])[-1])
        return result, setup_log

    facts = probe(version)
    if facts is not None:
        found = facts["found"]
        result.update(python=found["python"], keras=found["keras"], numpy=found["numpy"],
                      horovod=found["horovod"], tensorboard=found["tensorboard"], observed=observations(facts))

    print(f"[matrix] {version}: make smoke TF={version}", flush=True)
    xml = os.path.join(LOG_DIR, f"{version}-smoke.xml")
    if os.path.exists(xml):
        os.remove(xml)
    smoke_log = os.path.join(LOG_DIR, f"{version}-smoke.log")
    rc, seconds, text = _make("smoke", version, smoke_log, [f"SMOKE_ARGS=--junitxml={xml}"])
    counts = _junit_counts(xml) or {"passed": 0, "failed": 0, "skipped": 0, "seconds": None, "failed_tests": []}
    counts["make_seconds"] = round(seconds)  # with the mpi-direct ops build, when it was not cached
    result["smoke"] = counts
    if rc == 0 and counts["failed"] == 0 and counts["passed"] > 0:
        result["result"] = "passed"
    else:
        result["result"] = "smoke failed"
        if not counts["failed_tests"]:
            result["reason"] = (text.strip().splitlines() or ["?"])[-1]
    return result, smoke_log


def write_result(result):
    os.makedirs(RESULTS_DIR, exist_ok=True)
    with open(os.path.join(RESULTS_DIR, f"{result['tensorflow']}.json"), "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")


# --- the page ---------------------------------------------------------------------------------------------
def load_results(results_dir=RESULTS_DIR):
    results = {}
    if os.path.isdir(results_dir):
        for name in sorted(os.listdir(results_dir)):
            if name.endswith(".json"):
                with open(os.path.join(results_dir, name)) as f:
                    result = json.load(f)
                results[result["tensorflow"]] = result
    return results


def _build_cell(result):
    seconds = result.get("horovod_build_seconds")
    if seconds is None:
        return "cached (built before build times were recorded)"
    minutes, rest = divmod(seconds, 60)
    built = f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"
    return built if result.get("horovod_wheel") == "built" else f"{built} (cached wheel reused)"


def _result_cell(result):
    if result is None:
        return "not run"
    smoke = result.get("smoke")
    if result["result"] == "passed":
        return f"passed: smoke {smoke['passed']}/{smoke['passed'] + smoke['failed']} in {smoke['seconds']} s"
    if smoke:
        return f"**{result['result']}**: {smoke['failed']} of {smoke['passed'] + smoke['failed']} smoke tests failed"
    return f"**{result['result']}**: {result.get('reason', '')}"


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(results=None, versions=None):
    """docs/supported-versions.md's text from the results files, deterministically."""
    results = load_results() if results is None else results
    versions = supported_versions() if versions is None else versions
    listed = [v for v, _ in versions]
    # An aspect goes in "differences found" only where it is not the same in every version run.
    aspects = {}
    for result in results.values():
        for key, text in result.get("observed", {}).items():
            aspects.setdefault(key, set()).add(text)
    differing = sorted(key for key, texts in aspects.items() if len(texts) > 1)

    # The answer first, from the same results as the table.
    passed = [v for v in listed if (results.get(v) or {}).get("result") == "passed"]
    other = [v for v in listed if v not in passed]
    answer = (f"hvd_easgd supports TensorFlow {', '.join(listed)}: {len(passed)} of {len(listed)} listed versions "
              "passed the smoke subset with Horovod built against them"
              + (f"; not passed: {', '.join(other)}." if other else ".")
              + f" The default is {listed[0]}; another is one command, in its own venv:")
    lines = [
        "# Supported TensorFlow versions",
        "",
        answer,
        "",
        "```bash",
        f"make setup TF={listed[-1]}    # .venv-tf{listed[-1]}, with Horovod 0.28.1 built against it",
        "```",
        "",
        "<!-- Generated by `make matrix` (results) and `" + RENDER_COMMAND + "` (this page) from",
        "     docs/results/tf-versions/*.json; do not edit by hand: edit the results' \"notes\" or",
        "     \"conditions\" and re-render. -->",
        "",
        "Generated from `docs/results/tf-versions/<version>.json`; regenerate this page with",
        f"`{RENDER_COMMAND}`, and the results themselves with `make matrix` (setup and the smoke",
        "subset, `make smoke TF=<version>`, for every version in `hvd_easgd/install/tf_versions.txt`).",
        "",
        f"The default is TensorFlow {listed[0]} (`make setup`); another one is `make setup TF=<version>`",
        "in its own venv `.venv-tf<version>`. Horovod 0.28.1 is built from source against each one",
        "(`hvd-easgd setup`); its build time is the one-off cost of a version, the wheel is cached after.",
        "\"Differences found\" lists the notes written for a version and what was observed of it",
        "wherever the versions differ.",
        "",
        "| TensorFlow | Result | Keras | NumPy | Python | Horovod build | Differences found | Run on |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for version in listed + sorted(set(results) - set(listed)):
        result = results.get(version)
        name = version + (" (default)" if version == listed[0] else "") + ("" if version in listed else " (not listed)")
        if result is None:
            lines.append(f"| {name} | not run | | | | | | |")
            continue
        differences = list(result.get("notes", []))
        differences += [result["observed"][key] for key in differing if key in result.get("observed", {})]
        if result.get("smoke", {}).get("failed_tests"):
            differences.append("failed: " + ", ".join(t.split("::")[-1] for t in result["smoke"]["failed_tests"]))
        lines.append("| " + " | ".join(_cell(c) for c in (
            name, _result_cell(result), result.get("keras", ""), result.get("numpy", ""), result.get("python", ""),
            _build_cell(result), "<br>".join(differences) or "none", result.get("date", ""))) + " |")
    # How a number was measured (a shared machine, a wheel built earlier): hand-written, beside the table
    # rather than in it, because it qualifies the figures instead of describing the version.
    conditions = [(v, results[v]["conditions"]) for v in listed if results.get(v, {}).get("conditions")]
    if conditions:
        lines += ["", "How the figures were measured:", ""]
        lines += [f"- {version}: {text}" for version, text in conditions]
    lines.append("")
    return "\n".join(lines)


def write_page():
    os.makedirs(os.path.dirname(PAGE), exist_ok=True)
    with open(PAGE, "w") as f:
        f.write(render())
    print(f"[matrix] wrote {os.path.relpath(PAGE, ROOT)}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m tools.tf_matrix", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="setup + smoke per version, then render")
    run_parser.add_argument("versions", nargs="*", help="default: every version in hvd_easgd/install/tf_versions.txt")
    sub.add_parser("render", help="docs/supported-versions.md from the committed results")
    args = parser.parse_args(argv)
    if args.command == "render":
        write_page()
        return 0
    listed = [v for v, _ in supported_versions()]
    unknown = [v for v in args.versions if v not in listed]
    if unknown:
        parser.error(f"not in hvd_easgd/install/tf_versions.txt: {' '.join(unknown)}")
    failed = []
    for version in args.versions or listed:
        result, log = run_version(version)
        write_result(result)
        print(f"[matrix] {version}: {result['result']} (log: {os.path.relpath(log, ROOT)})", flush=True)
        if result["result"] != "passed":
            failed.append(version)
    write_page()
    # Every version is tried and recorded; the exit status says whether all passed.
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
