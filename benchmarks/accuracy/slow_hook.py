"""The test hook that makes one rank slow, as the benchmarks of ranks of unequal speed set it: its value,
measured, and a launch that hands it to every rank.

``HVD_EASGD_TEST_SLOW_RANKS=RANK:SECONDS`` (``hvd_easgd.strategies.sample_shares``): after each training step rank RANK
sleeps SECONDS per sample of its micro-batch. ``slow_rank`` (one host, over loopback) and ``time_to_target
--slow-rank`` (the virtual cluster) both make the last rank ``SLOW_FACTOR`` times slower: SECONDS is
(SLOW_FACTOR − 1) × c, c the per-rank compute per sample that a run of equal ranks measured (its N ranks ÷
its samples/s), so each of the slow rank's steps takes SLOW_FACTOR × as long. The hook sleeps: the rank's
core idles, as a slow device leaves the others' alone, which emulates a slow device only where every rank
has a core of its own (``sample_shares.pacer``).

The hook reaches the ranks through the launcher's environment (``env HOOK=... horovodrun ...``): horovodrun
hands its whole environment to the ranks, over ``--mpi`` as one mpirun ``-x NAME`` per variable
(horovod/runner/mpi_run.py, Horovod 0.28.1), which Open MPI sets in every rank, those it starts on other
hosts too. This process never imports TensorFlow.
"""
from typing import NamedTuple

from hvd_easgd.strategies.sample_shares import TEST_SLOW_RANKS, test_slowdown

from .study import kept_runs

HOOK = TEST_SLOW_RANKS
SLOW_FACTOR = 2  # the slow rank's steps take this many times as long


class SlowRankLaunch(NamedTuple):
    """``launch``'s runs (``study.LocalLaunch``, or ``time_to_target.ClusterLaunch``) with the hook set to
    ``setting`` in the launcher's environment for the variants whose names ``slowed(name)`` accepts (None: every
    one)."""
    launch: object
    setting: str
    slowed: object = None

    def _env(self, variant):
        slow = self.setting and (self.slowed is None or self.slowed(variant.name))
        return [f"{HOOK}={self.setting}"] if slow else []

    def command(self, variant, seed, run_dir):
        return ["env", *self._env(variant), *self.launch.command(variant, seed, run_dir)]

    def shown(self, variant, seed):
        return " ".join(self._env(variant) + [self.launch.shown(variant, seed)])

    def run(self, cmd, log, timeout):
        return self.launch.run(cmd, log, timeout)


def hook_setting(directory, name, np_):
    """The hook's ``RANK:SECONDS``: the last of ``np_`` ranks waits, per sample, (SLOW_FACTOR − 1) × the
    per-rank compute per sample of the equal-speed seed-0 run of ``name`` kept in ``directory`` (N ÷ its
    samples per second), so its steps take SLOW_FACTOR × as long."""
    _, runs = kept_runs(directory)
    metrics = next(m for run, m in runs if run["run"] == f"{name}-seed0")
    per_sample = np_ / metrics["final"]["samples_per_sec"]
    return f"{np_ - 1}:{(SLOW_FACTOR - 1) * per_sample:.6f}"


def slowed_seconds(setting, rank):
    """Seconds per sample ``setting`` makes ``rank`` sleep, read as train.py reads the hook."""
    return test_slowdown(rank, {HOOK: setting})
