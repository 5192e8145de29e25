"""hvd_easgd/checkpoint/elastic.py's rules, worked out by hand: when commits fall, where a commit
continues at another size, where --elastic is refused, and the Gloo timeouts per reset.
The launched behaviour (a kill, a grow-back, the weights against a checkpoint resize) is
in tests/multiproc/test_elastic.py."""
import pytest

from hvd_easgd.checkpoint import elastic
from hvd_easgd.app import cli
from hvd_easgd.app.errors import UsageError
from hvd_easgd.strategies import EASGD, GradientAccumulation, Hierarchical, PeriodicAverage, SyncAverage

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("strategy, accumulate, requested, expected", [
    (SyncAverage(), 1, 50, 50),           # synchronises every update
    (SyncAverage(), 4, 50, 52),           # a commit never falls inside an accumulation window of 4
    (EASGD(period=8), 1, 50, 56),         # after an elastic step: multiples of tau = 8
    (PeriodicAverage(period=3), 2, 5, 6),  # period 3 x accumulate 2
    (EASGD(period=8), 1, 0, 0),           # 0: epoch ends only
    (SyncAverage(), 1, None, elastic.DEFAULT_COMMIT_EVERY),
])
def test_commits_fall_where_the_strategy_has_just_synchronised(strategy, accumulate, requested, expected):
    assert elastic.commit_period(requested, strategy, accumulate) == expected


def test_the_synchronisation_period_asks_the_strategies_in_the_tree():
    wrapped = GradientAccumulation(2, strategy=EASGD(period=4))
    assert elastic.synchronisation_period(wrapped, accumulate=2) == 2 * 4


@pytest.mark.parametrize("step, old, new, expected", [
    (0, 14, 22, 0),     # an epoch end stays an epoch end
    (7, 14, 22, 11),    # half of 14 -> floor(7 * 22 / 14) = 11 of 22
    (13, 14, 22, 20),   # floor(13 * 22 / 14) = 20
    (21, 22, 14, 13),   # growing: floor(21 * 14 / 22) = 13, the last micro-batch of 14 at most
    (5, 14, 14, 5),     # same size: same micro-batch
])
def test_a_mid_epoch_commit_continues_at_the_same_fraction_of_the_epoch(step, old, new, expected):
    assert elastic.continued_step(step, old, new) == expected


def test_elastic_is_refused_in_one_line_where_it_cannot_work():
    sync = SyncAverage()
    mpi = elastic.refusal("auto", gloo=False, mpi=True, elastic=False, strategy=sync)
    assert mpi.startswith("`--elastic` needs horovodrun's elastic mode over Gloo") and "MPI launch" in mpi
    assert "\n" not in mpi and "Received: --elastic" in mpi
    direct = elastic.refusal("mpi-direct", gloo=True, mpi=False, elastic=True, strategy=sync)
    assert "collectives='mpi-direct'" in direct
    plain = elastic.refusal("auto", gloo=True, mpi=False, elastic=False, strategy=sync)
    assert "was not started by it" in plain
    groups = elastic.refusal("auto", gloo=True, mpi=False, elastic=True, strategy=Hierarchical())
    assert "process groups" in groups and "hierarchical" in groups
    assert elastic.refusal("auto", gloo=True, mpi=False, elastic=True, strategy=sync) is None
    assert elastic.refusal("horovod", gloo=True, mpi=False, elastic=True, strategy=EASGD(period=4)) is None


def test_horovods_elastic_launcher_is_recognised_by_its_marker():
    assert elastic.elastic_launch({"HOROVOD_ELASTIC": "1"})
    assert not elastic.elastic_launch({})
    assert not elastic.elastic_launch({"HOROVOD_ELASTIC": "0"})


def test_the_gloo_timeout_is_short_after_a_failure_and_long_while_growing():
    environ = {}
    elastic.configure_environment(environ)
    assert environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] == str(elastic.GLOO_TIMEOUT_SECONDS)
    elastic._timeout_for(growing=True, environ=environ)
    assert environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] == str(elastic.GLOO_TIMEOUT_GROWING_SECONDS)
    elastic._timeout_for(growing=False, environ=environ)
    assert environ["HOROVOD_GLOO_TIMEOUT_SECONDS"] == str(elastic.GLOO_TIMEOUT_SECONDS)
    users = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "300"}  # the user's own setting wins, growing or not
    elastic.configure_environment(users)
    elastic._timeout_for(growing=True, environ=users)
    assert users["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "300"
    elastic._timeout_for(growing=False, environ=users)
    assert users["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "300"


def test_a_failed_horovod_collective_becomes_the_error_horovods_loop_recovers_from():
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

    grouped = RuntimeError("Graph execution error: Detected at node HorovodGroupedAllreduce_grouped_allreduce_0")
    assert isinstance(elastic.as_internal_error(grouped), HorovodInternalError)
    assert elastic.as_internal_error(ValueError("a bug of ours")) is None
    assert elastic.as_internal_error(HostsUpdatedInterrupt(False)) is None


def test_the_cli_takes_elastic_with_a_run_dir_and_refuses_it_without():
    config = cli.parse_args(["--elastic", "--run-dir", "runs/x", "--elastic-commit-every", "20"])
    assert config.elastic and config.elastic_commit_every == 20
    assert cli.parse_args(["--run-dir", "runs/x"]).elastic in (None, False)
    with pytest.raises(UsageError, match=r"^`--elastic` needs --run-dir .*Received: --elastic without --run-dir$"):
        cli.parse_args(["--elastic"])
    with pytest.raises(UsageError, match=r"--elastic-commit-every must be >= 0. Received: --elastic-commit-every=-1"):
        cli.parse_args(["--elastic", "--run-dir", "runs/x", "--elastic-commit-every", "-1"])


def test_train_py_refuses_elastic_under_an_mpi_launch_before_anything_starts():
    from unittest import mock

    from hvd_easgd.app import trainer

    config = cli.parse_args(["--elastic", "--run-dir", "runs/x"])
    with mock.patch.dict("os.environ", {"OMPI_COMM_WORLD_RANK": "0", "HOROVOD_ELASTIC": ""}):
        with pytest.raises(UsageError, match=r"MPI launch \(mpirun, srun, horovodrun --mpi\)"):
            trainer._check_elastic(config, SyncAverage())
