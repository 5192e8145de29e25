"""hvd_easgd.startup.slurm: SLURM's compressed lists and job environment, without a cluster."""
import io
import os
import subprocess
import sys
from unittest import mock

import pytest

from hvd_easgd.startup.slurm import SlurmEnvironment, SlurmEnvironmentError, expand_nodelist, expand_tasks_per_node, \
    main

pytestmark = pytest.mark.unit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What SLURM sets in a batch script and in each srun task of a 2-node job.
JOB = {
    "SLURM_JOB_ID": "77",
    "SLURM_JOB_NODELIST": "node[01-02]",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_NTASKS": "4",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_CPUS_PER_TASK": "4",
}


def _without_slurm():
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}


# --------------------------------------------------------------------- node lists

@pytest.mark.parametrize("text, hosts", [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("a1,b[2-3]", ["a1", "b2", "b3"]),
    ("gpu-[1,3-4]-ib", ["gpu-1-ib", "gpu-3-ib", "gpu-4-ib"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("login1", ["login1"]),
    ("c[5],d[1-2],e", ["c5", "d1", "d2", "e"]),
])
def test_expand_nodelist(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text, message", [
    ("", "empty node list"),
    ("node[01-", "unbalanced '['"),
    ("node01]", "unbalanced ']'"),
    ("node[[1]]", "nested '['"),
    ("node[4-2]", "descending range '4-2'"),
    ("node[a-b]", "bad range 'a-b'"),
    ("node[]", "bad range ''"),
    ("a,,b", "empty name"),
])
def test_expand_nodelist_rejects(text, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        expand_nodelist(text)


@pytest.mark.parametrize("text, counts", [
    ("2(x3),1", [2, 2, 2, 1]),
    ("4", [4]),
    ("1,3(x2)", [1, 3, 3]),
    ("8(x1)", [8]),
])
def test_expand_tasks_per_node(text, counts):
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "2(3)", "x", "2(x)", "-1"])
def test_expand_tasks_per_node_rejects(text):
    with pytest.raises(ValueError):
        expand_tasks_per_node(text)


# -------------------------------------------------------------------- environment

def test_job_environment():
    with mock.patch.dict(os.environ, JOB):
        env = SlurmEnvironment()
        assert SlurmEnvironment.detect()
        assert env.job_id == "77"
        assert env.nodes == ["node01", "node02"]
        assert env.tasks_per_node == [2, 2]
        assert (env.rank, env.world_size, env.local_rank, env.node_rank) == (3, 4, 1, 1)
        assert env.cpus_per_task == 4
        assert env.hosts_string(this_host="node01") == "node01:2,node02:2"


def test_hosts_string_uneven_nodes():
    environ = dict(JOB, SLURM_JOB_NODELIST="node[01-04,07]", SLURM_TASKS_PER_NODE="2(x3),1,4", SLURM_NTASKS="12")
    assert SlurmEnvironment(environ).hosts_string(this_host="login") == (
        "node01:2,node02:2,node03:2,node04:1,node07:4")


def test_one_node_on_this_host_is_localhost():
    environ = dict(JOB, SLURM_JOB_NODELIST="node07", SLURM_TASKS_PER_NODE="3", SLURMD_NODENAME="node07")
    assert SlurmEnvironment(environ).hosts_string() == "localhost:3"
    # Fully qualified names match by their short name.
    assert SlurmEnvironment(environ).hosts_string(this_host="node07.cluster.example") == "localhost:3"
    # A one-node allocation elsewhere (asked from a login node) keeps its name.
    assert SlurmEnvironment(environ).hosts_string(this_host="login1") == "node07:3"


def test_old_variable_names_are_read():
    environ = {"SLURM_JOBID": "5", "SLURM_NODELIST": "x[1-2]", "SLURM_NPROCS": "2", "SLURM_TASKS_PER_NODE": "1(x2)"}
    env = SlurmEnvironment(environ)
    assert (env.job_id, env.nodes, env.world_size) == ("5", ["x1", "x2"], 2)


def test_cpus_per_task_defaults_to_one():
    environ = {k: v for k, v in JOB.items() if k != "SLURM_CPUS_PER_TASK"}
    assert SlurmEnvironment(environ).cpus_per_task == 1


def test_outside_slurm_errors_carry_a_hint():
    with mock.patch.dict(os.environ, _without_slurm(), clear=True):
        env = SlurmEnvironment()
        assert not SlurmEnvironment.detect()
        with pytest.raises(SlurmEnvironmentError) as err:
            env.nodes
    assert str(err.value) == ("not inside a SLURM allocation: SLURM_JOB_NODELIST is not set; "
                              "HINT: run under sbatch/salloc")


@pytest.mark.parametrize("missing, attribute, hint", [
    ("SLURM_PROCID", "rank", "HINT: SLURM_PROCID is set per task: launch the ranks with srun"),
    ("SLURM_LOCALID", "local_rank", "HINT: SLURM_LOCALID is set per task: launch the ranks with srun"),
    ("SLURM_NTASKS", "world_size", "HINT: request tasks, e.g. sbatch --ntasks=4"),
    ("SLURM_TASKS_PER_NODE", "tasks_per_node", "HINT: request tasks, e.g. sbatch --ntasks-per-node=2"),
])
def test_missing_variable(missing, attribute, hint):
    environ = {k: v for k, v in JOB.items() if k != missing}
    with pytest.raises(SlurmEnvironmentError, match=f"{missing} is not set; {hint}"):
        getattr(SlurmEnvironment(environ), attribute)


def test_missing_rank_says_not_a_task():
    with pytest.raises(SlurmEnvironmentError, match="^not a SLURM task: SLURM_PROCID is not set; HINT"):
        SlurmEnvironment({k: v for k, v in JOB.items() if k != "SLURM_PROCID"}).rank


def test_malformed_values():
    with pytest.raises(SlurmEnvironmentError, match=r"SLURM_PROCID='x' is not a non-negative integer; HINT"):
        SlurmEnvironment(dict(JOB, SLURM_PROCID="x")).rank
    with pytest.raises(SlurmEnvironmentError,
                       match=r"cannot parse SLURM_JOB_NODELIST: unbalanced '\[' .*; HINT: expected SLURM syntax"):
        SlurmEnvironment(dict(JOB, SLURM_JOB_NODELIST="node[01-02")).nodes
    with pytest.raises(SlurmEnvironmentError, match=r"cannot parse SLURM_TASKS_PER_NODE: .*HINT: expected"):
        SlurmEnvironment(dict(JOB, SLURM_TASKS_PER_NODE="2(y2)")).tasks_per_node


def test_node_and_count_lists_must_agree():
    environ = dict(JOB, SLURM_TASKS_PER_NODE="2(x3)")
    with pytest.raises(SlurmEnvironmentError, match="gives 3 nodes but SLURM_JOB_NODELIST has 2; HINT"):
        SlurmEnvironment(environ).hosts_string()


# -------------------------------------------------------------------- command line

@pytest.mark.parametrize("command, printed", [
    ("hosts", "node01:2,node02:2"), ("np", "4"), ("nodes", "node01 node02"), ("rank", "3"),
    ("local-rank", "1"), ("cpus-per-task", "4"),
])
def test_main_prints(command, printed):
    out = io.StringIO()
    with mock.patch.dict(os.environ, dict(JOB, SLURMD_NODENAME="login")):
        assert main([command], out=out) == 0
    assert out.getvalue() == printed + "\n"


def test_main_error_and_usage(capsys):
    assert main(["hosts"], environ={}) == 2
    assert "error: not inside a SLURM allocation: SLURM_JOB_NODELIST is not set; HINT:" in capsys.readouterr().err
    assert main(["bogus"], environ=JOB) == 2
    assert "usage: python -m hvd_easgd.startup.slurm" in capsys.readouterr().err


def test_module_entry_point():
    """`python -m hvd_easgd.startup.slurm hosts` as the sbatch template calls it."""
    environ = dict(_without_slurm(), **JOB, SLURMD_NODENAME="node01", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-m", "hvd_easgd.startup.slurm", "hosts"], env=environ, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "node01:2,node02:2\n"
