"""The sbatch templates without a cluster: syntax, headers, and the shared
set-up in slurm/common.sh run by bash under a faked SLURM job environment."""
import os
import re
import subprocess
import sys

import pytest

from tests.slurm.helpers import REPO

pytestmark = pytest.mark.slurm

TEMPLATES = ("train.sbatch", "train-gpu.sbatch", "benchmark.sbatch")
# What slurm/common.sh sets, and the tests assert on: never inherited from the
# shell that runs the tests (`TF_CPP_MIN_LOG_LEVEL=3 make test` must pass too).
SET_BY_COMMON_SH = ("TF_CPP_MIN_LOG_LEVEL", "OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
                    "SRUN_CPUS_PER_TASK", "VIRTUAL_ENV")


def _headers(name):
    text = (REPO / "slurm" / name).read_text()
    return dict(re.findall(r"^#SBATCH --([\w-]+)(?:=(\S+))?", text, re.MULTILINE))


def _fake_job_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "HVD_EASGD_")) and k not in SET_BY_COMMON_SH}
    env.update(SLURM_JOB_ID="4242", SLURM_JOB_NAME="hvd-easgd-train", SLURM_SUBMIT_DIR=str(REPO),
               SLURM_JOB_NODELIST="n1", SLURM_NTASKS="2", HVD_EASGD_VENV=sys.prefix)
    env.update(extra)
    return env


def _bash(snippet, env, *args):
    """``bash -c SNIPPET bash ARGS...`` from /, as a job's shell would start elsewhere than the project."""
    return subprocess.run(["bash", "-c", snippet, "bash", *args], env=env, cwd="/", capture_output=True, text=True,
                          timeout=30)


@pytest.mark.parametrize("name", TEMPLATES + ("common.sh",))
def test_bash_syntax(name):
    done = subprocess.run(["bash", "-n", str(REPO / "slurm" / name)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", TEMPLATES)
def test_headers(name):
    headers = _headers(name)
    assert headers["output"] == "slurm-%x-%j.out"
    assert {"job-name", "nodes", "time"} <= set(headers)
    if name == "train-gpu.sbatch":
        assert headers["gpus-per-node"] == headers["ntasks-per-node"], "one rank per GPU"
    else:
        assert not any("gpu" in key or "gres" in key for key in headers), f"{name} must run on CPU-only clusters"


def test_run_dir_default_unless_chosen():
    script = 'source "$SLURM_SUBMIT_DIR/slurm/common.sh" >/dev/null; run_dir_default "$@" | tr "\\n" " "'
    env = _fake_job_env()

    def default(*args):
        done = _bash(script, env, *args)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert default("--epochs", "3") == "--run-dir runs/hvd-easgd-train-4242"
    for chosen in (["--run-dir", "x"], ["--run-dir=x"], ["--resume", "runs/a"], ["--config", "c.yaml"]):
        assert default("--epochs", "3", *chosen) == ""


@pytest.mark.parametrize("name", ["train.sbatch", "train-gpu.sbatch"])
def test_train_templates_are_warned_and_requeue_with_auto_resume(name):
    headers = _headers(name)
    assert re.fullmatch(r"B:USR1@\d+", headers["signal"]) and headers["open-mode"] == "append"
    text = (REPO / "slurm" / name).read_text()
    assert 'launch_requeueable train.py "${run_dir[@]}" --auto-resume --checkpoint-on-signal USR1 "$@"' in text


def test_run_dir_of_finds_the_run_directory(tmp_path):
    script = 'source "$SLURM_SUBMIT_DIR/slurm/common.sh" >/dev/null; run_dir_of "$@"'
    # --config naming the run directory: the warning must reach horovodrun's ranks through RUN_DIR/STOP too
    (tmp_path / "named.yaml").write_text("epochs: 3\nrun-dir: runs/c\n")
    (tmp_path / "unnamed.yaml").write_text("epochs: 3\n")
    named, unnamed = str(tmp_path / "named.yaml"), str(tmp_path / "unnamed.yaml")
    for args, expected in ((["--run-dir", "a", "--epochs", "3"], "a"), (["--resume=b"], "b"),
                           (["--epochs", "3"], ""), (["--config", named], "runs/c"), ([f"--config={named}"], "runs/c"),
                           (["--config", named, "--run-dir", "a"], "a"), (["--config", unnamed], "")):
        done = _bash(script, _fake_job_env(), *args)
        assert done.returncode == 0 and done.stdout.strip() == expected, (args, done.stdout, done.stderr)


@pytest.mark.parametrize("chosen_level, expected_level", [(None, "2"), ("3", "3")], ids=["default", "user-set"])
def test_common_sets_up_environment(chosen_level, expected_level):
    snippet = ('source "$SLURM_SUBMIT_DIR/slurm/common.sh" >/dev/null; '
               'echo "$PWD|$(command -v python)|$TF_CPP_MIN_LOG_LEVEL|${OMPI_ALLOW_RUN_AS_ROOT:-}|$SRUN_CPUS_PER_TASK"')
    env = _fake_job_env(SLURM_CPUS_PER_TASK="3")
    if chosen_level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = chosen_level  # the user's level wins over the default
    done = _bash(snippet, env)
    assert done.returncode == 0, done.stderr
    cwd, python, tf_level, as_root, srun_cpus = done.stdout.strip().split("|")
    assert cwd == str(REPO) and python == os.path.join(sys.prefix, "bin", "python")
    assert tf_level == expected_level and srun_cpus == "3"
    assert as_root == ("1" if os.geteuid() == 0 else "")


@pytest.mark.parametrize("env, message", [
    ({"SLURM_JOB_ID": ""}, "not inside a SLURM job; HINT: submit with sbatch"),
    ({"HVD_EASGD_VENV": "/nonexistent/venv"}, "no virtual environment at /nonexistent/venv; HINT: run 'make setup'"),
    ({"HVD_EASGD_LAUNCH": "mpirun"}, "HVD_EASGD_LAUNCH=mpirun; HINT: use srun or horovodrun"),
    ({"SLURM_SUBMIT_DIR": "/tmp"}, "no /tmp/slurm/common.sh; HINT: submit from the project root"),
])
def test_template_refuses_with_hint(env, message):
    done = subprocess.run(["bash", str(REPO / "slurm" / "train.sbatch"), "--epochs", "1"],
                          env=_fake_job_env(**env), cwd="/", capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr
