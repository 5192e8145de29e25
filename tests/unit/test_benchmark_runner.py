"""The benchmarks' one runner (benchmarks/suite/runner.py) and entry point (benchmarks/__main__.py).

In-process, or with ``sh``/``sleep`` children only: no launcher starts here.
"""
import os
import shlex
import time

import pytest

from benchmarks import __main__ as entry
from benchmarks.suite import compare, runner

pytestmark = pytest.mark.unit


def _alive(pid):
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for_file(path, seconds=10):
    deadline = time.monotonic() + seconds
    while not (os.path.exists(path) and open(path).read().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return open(path).read().strip()


# --- bounded run ------------------------------------------------------------------------------------
def test_a_bounded_run_ends_a_sleeping_child_and_its_children_within_its_timeout(tmp_path):
    pid_file, log = tmp_path / "grandchild.pid", tmp_path / "run.log"
    # The shell is the launcher; the sleep it starts stands for a rank it started.
    cmd = ["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"]
    started = time.monotonic()
    outcome = runner.run_bounded(cmd, str(log), timeout=1.0, grace_seconds=2)
    took = time.monotonic() - started
    assert outcome.status is None and not outcome.ok
    assert outcome.why == "timed out"
    assert 1.0 <= outcome.seconds and took < 1.0 + 2 + 2  # the timeout, at most one grace, some slack
    grandchild = int(_wait_for_file(pid_file))
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:  # its reaper may need a moment
        time.sleep(0.05)
    assert not _alive(grandchild)
    assert log.read_text().splitlines()[0].endswith(shlex.join(cmd))  # the log opens with the command


def test_a_bounded_run_reports_the_exit_status_and_keeps_the_output_in_its_log(tmp_path):
    log = tmp_path / "run.log"
    outcome = runner.run_bounded(["sh", "-c", "echo to-the-log; exit 3"], str(log), timeout=30)
    assert (outcome.status, outcome.ok, outcome.why, outcome.log_path) == (3, False, "exit status 3", str(log))
    lines = log.read_text().splitlines()
    assert lines[0].startswith("$ ") and lines[0].endswith("sh -c 'echo to-the-log; exit 3'")
    assert lines[1:] == ["to-the-log"]
    assert runner.run_bounded(["true"], str(tmp_path / "ok.log"), timeout=30).ok


def test_one_failing_process_of_several_ends_the_others_at_once(tmp_path):
    env = runner.launch_env()
    started = time.monotonic()
    outcome = runner.run_bounded([(["sh", "-c", "sleep 0.3; exit 4"], env), (["sleep", "60"], env)],
                                 str(tmp_path / "run.log"), timeout=30, grace_seconds=2)
    assert outcome.status == 4
    assert time.monotonic() - started < 10  # not the 30 s timeout, nor the sleeper's 60 s


def test_a_bounded_run_goes_through_the_callers_route_and_cleans_up_once(tmp_path):
    log = tmp_path / "run.log"
    routed, cleaned, polls = [], [], []

    def through(cmd, env):  # what the virtual cluster does: another command line and environment
        routed.append(cmd)
        return ["env", "ROUTE=launcher"] + cmd, dict(env, EXTRA="1")

    outcome = runner.run_bounded(["sh", "-c", "sleep 0.5; echo $ROUTE $EXTRA"], str(log), timeout=30,
                                 through=through, cleanup=lambda: cleaned.append(True),
                                 while_running=lambda: polls.append(True))
    assert outcome.ok
    assert routed == [["sh", "-c", "sleep 0.5; echo $ROUTE $EXTRA"]]
    assert cleaned == [True]
    assert polls  # called while the child slept
    assert log.read_text().splitlines()[-1] == "launcher 1"
    assert "env ROUTE" not in log.read_text().splitlines()[0]  # the log shows the command as given


def test_a_failed_launch_is_one_line_with_its_log(tmp_path, capsys):
    failures = []
    runner.report_failed_launch(failures, "np=2 mpi", runner.Outcome(None, 12.0, str(tmp_path / "hvd-np2.log")))
    runner.report_failed_launch(failures, "np=2 gloo", runner.Outcome(1, 3.0, str(tmp_path / "hvd-gloo.log")))
    assert failures == ["np=2 mpi: timed out (log: logs/hvd-np2.log)",
                        "np=2 gloo: exit status 1 (log: logs/hvd-gloo.log)"]
    assert "np=2 mpi timed out; log tail:" in capsys.readouterr().out


def test_the_log_tail_is_the_end_of_the_log(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("a" * 10 + "the end")
    assert runner.log_tail(str(log), 7) == "the end"
    assert runner.log_tail(str(tmp_path / "missing.log")) == ""


# --- launch ---------------------------------------------------------------------------------------------
def test_launch_environment_puts_the_repository_first_and_the_extra_last(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "5")
    env = runner.launch_env({"HOROVOD_CYCLE_TIME": "1", "NEW": "x"})
    assert env["PYTHONPATH"] == os.pathsep.join([runner.REPO_ROOT, "/elsewhere"])
    assert (env["HOROVOD_CYCLE_TIME"], env["NEW"], env["PYTHONUNBUFFERED"]) == ("1", "x", "1")
    assert "HOROVOD_CYCLE_TIME" not in runner.launch_env(drop=("HOROVOD_CYCLE_TIME",))
    assert runner.launch_env(base={})["PYTHONPATH"] == runner.REPO_ROOT


def test_a_local_launch_keeps_every_rank_on_loopback():
    assert runner.local_launch(2, "mpi")[1:] == ["-np", "2", "-H", "localhost:2", "--network-interface", "lo",
                                                 "--mpi"]
    assert runner.mpirun_launch(3)[:3] == ["mpirun", "-np", "3"]
    assert runner.LOOPBACK_ENV == {"OMPI_MCA_oob_tcp_if_include": "lo", "OMPI_MCA_btl_tcp_if_include": "lo"}


# --- summary -------------------------------------------------------------------------------------------
def test_the_summary_is_median_min_max_of_hand_made_samples():
    assert runner.summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "repeats": [3.0, 1.0, 2.0]}
    assert runner.summary([4, 1, 3, 2])["median"] == 2.5  # even count: the mean of the middle two
    assert runner.summary([5.0, None, 7.0]) == {"median": 6.0, "min": 5.0, "max": 7.0, "repeats": [5.0, 7.0]}
    assert runner.summary([]) is None and runner.summary([None]) is None


def test_a_scaled_summary_is_the_summary_of_the_scaled_samples():
    micros = runner.scaled(runner.summary([2e-6, 1e-6, 4e-6]), 1e6)
    assert [micros[k] for k in ("median", "min", "max")] == pytest.approx([2.0, 1.0, 4.0])
    assert micros["repeats"] == pytest.approx([2.0, 1.0, 4.0])
    assert runner.scaled(None, 1e6) is None


# --- Markdown --------------------------------------------------------------------------------------------
def test_the_table_writer_on_a_tiny_table():
    text = runner.table(["config", "samples/s"], [["sync", "1,200"], ["no_comm", 3]], "lr")
    assert text == "| config | samples/s |\n|---|---:|\n| sync | 1,200 |\n| no_comm | 3 |"
    assert runner.table(["a"], []) == "| a |\n|---|"


def test_the_table_writer_refuses_a_row_or_alignment_of_the_wrong_width():
    with pytest.raises(ValueError, match=r"every row must have 2 cells. Received: row=\['x'\]"):
        runner.table(["a", "b"], [["x"]])
    with pytest.raises(ValueError, match=r"`align` must be .* Received: align='lx'"):
        runner.table(["a", "b"], [], "lx")


def test_a_spread_cell_is_median_then_min_max():
    s = {"median": 1234.4, "min": 1000.0, "max": 20000.0}
    assert runner.spread(s, 0) == "1,234 (1,000–20,000)"
    assert runner.spread(runner.summary([0.5, 0.25, 1.0])) == "0.50 (0.25–1.00)"
    assert runner.spread(None) == "—" and runner.spread(None, missing="n/a") == "n/a"


# --- the entry point ------------------------------------------------------------------------------------
def test_every_subcommand_is_a_module_with_main_taking_prog():
    import importlib
    import inspect

    assert set(entry.SUBCOMMANDS) >= {"compare", "defaults-report"}
    for name, sub in entry.SUBCOMMANDS.items():
        parameters = inspect.signature(importlib.import_module(sub.module).main).parameters
        assert list(parameters)[:2] == ["argv", "prog"], name


def test_the_entry_point_lists_refuses_and_dispatches(capsys):
    assert entry.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name}" in out for name in entry.SUBCOMMANDS)
    assert entry.main(["nope"]) == 2
    assert capsys.readouterr().err.strip() == ("python -m benchmarks: `subcommand` must be one of "
                                               "compare, accuracy, parity, parity-by-np, long-run, slow-rank, time-to-target, traffic, project, validate, tta-report, defaults-report. Received: subcommand=nope")
    assert entry.main([]) == 2
    assert entry.main(["defaults-report", "--check"]) == 0  # the committed pages are current


def test_compare_under_the_entry_point_takes_the_same_flags():
    args = compare.parse_args(["--quick", "--np", "2"], prog="python -m benchmarks compare")
    assert (args.np_list, args.controller_list, args.repeats) == ([2], ["mpi"], 3)
    with pytest.raises(SystemExit) as exited:
        compare.parse_args(["--repeats", "0"], prog="python -m benchmarks compare")
    assert exited.value.code == 2


def test_mpi_tcp_links_reach_the_rated_launches_environment_and_bad_values_exit_2(capsys):
    from benchmarks.suite import rated_links

    args = compare.parse_args(["--link-rates", "100mbit", "--mpi-tcp-links", "2"], prog="python -m benchmarks compare")
    assert args.mpi_tcp_links == 2
    env = rated_links.launch_env(args.mpi_tcp_links)
    assert env["OMPI_MCA_btl_tcp_links"] == "2" and env["OMPI_MCA_btl_tcp_if_include"] == "cluster0"
    assert "OMPI_MCA_btl_tcp_links" not in rated_links.launch_env()  # Open MPI's own default otherwise
    for bad in (["--link-rates", "100mbit", "--mpi-tcp-links", "0"], ["--mpi-tcp-links", "2"]):
        with pytest.raises(SystemExit) as exited:
            compare.parse_args(bad, prog="python -m benchmarks compare")
        assert exited.value.code == 2
        assert "--mpi-tcp-links must be an integer >= 1, with --link-rates" in capsys.readouterr().err
