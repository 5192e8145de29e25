"""The README's two examples run as a user would paste them, under ``horovodrun -np 2``.

The Keras example runs as written (it is short: 5 epochs of a small MLP on digits). The train.py
example gets ``--epochs 1 --run-dir <tmp>`` appended, so it runs briefly and writes nowhere else; its
options are otherwise the README's. Both go through tests/helpers.py's bounded launcher; each took
20-40 s on this 2-core machine at load 7 and 50-65 s at load 9, hence a bound of 180 s.
"""
import json
import os
import re
import shlex

import pytest

from tests.helpers import ROOT, horovodrun

pytestmark = pytest.mark.multiproc

LAUNCH = re.compile(r"^horovodrun -np (\d+) python (\S+)(.*)$")


def _readme_blocks(language):
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    return re.findall(rf"^```{language}\n(.*?)^```", readme, flags=re.S | re.M)


def _the_example(language, starts_with):
    """The one block of that language that starts with the given text."""
    blocks = [b for b in _readme_blocks(language) if b.lstrip().startswith(starts_with)]
    assert len(blocks) == 1, f"the README should have one {language} block starting with {starts_with!r}"
    return blocks[0]


def test_the_readme_keras_example_runs_under_horovodrun_np_2(tmp_path):
    example = _the_example("python", "import keras")
    assert "hvd_easgd.DistributedOptimizer" in example and "callbacks.defaults()" in example
    (tmp_path / "example.py").write_text(example)
    # The README says: save it as example.py and run `horovodrun -np 2 python example.py`.
    with open(os.path.join(ROOT, "README.md")) as f:
        assert "horovodrun -np 2 python example.py" in f.read()
    result = horovodrun([str(tmp_path / "example.py")], np=2, controller="gloo", timeout=180, cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # Rank 0 saved the kept model (EASGD's center) where the example says, as a plain Keras file.
    assert (tmp_path / "model.keras").is_file()
    assert re.search(r"Epoch 5/5", result.stdout), result.stdout[-2000:]


def test_the_readme_train_py_example_runs_under_horovodrun_np_2(tmp_path):
    block = _the_example("bash", "horovodrun -np")
    (line,) = [l for l in block.splitlines() if "python train.py" in l]
    match = LAUNCH.match(line.strip())
    assert match, line
    np, script, options = int(match.group(1)), match.group(2), shlex.split(match.group(3), comments=True)
    run_dir = tmp_path / "run"
    args = [os.path.join(ROOT, script), *options, "--epochs", "1", "--run-dir", str(run_dir)]
    result = horovodrun(args, np=np, controller="mpi", timeout=180, cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "final test accuracy: " in result.stdout + result.stderr
    # What the README says the run writes.
    for name in ("config.yaml", "metrics.json", "model.keras"):
        assert (run_dir / name).is_file(), name
    with open(run_dir / "metrics.json") as f:
        metrics = json.load(f)
    assert len(metrics["epochs"]) == 1
