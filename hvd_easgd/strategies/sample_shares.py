"""Ranks of unequal speed: each rank's share of a global batch, in proportion to its speed.

A slow rank sets everyone's pace because every strategy meets at its
synchronisation points: SyncAverage every step, the local-update strategies
every τ steps. hvd_easgd removes the wait by giving each rank as many samples
per step as it can process in the time the others take, so that every rank
reaches each step's end together:

    rank r's micro-batch  b_r ∝ its speed s_r (samples/s),   Σ_r b_r = B (the global batch)

and by weighing what each rank contributes at a synchronisation by its share
of the samples, w_r = b_r / B (``SyncStrategy.set_sample_shares``):

    SyncAverage:       g   = Σ_r w_r g_r         (the per-sample mean of the global batch)
    PeriodicAverage:   x̄   = Σ_r w_r x_r
    DiLoCo:            Δ   = Σ_r w_r (θ − x_r)

Each rank sends its tensor scaled by p·w_r into the average the strategy
already makes (Σ/p), so the weighting costs no byte and no call. At equal
shares p·w_r is exactly 1.0 and every result is bit-identical to the
unweighted one. The weights are normalised (Σ_r w_r = 1): with equal ranks
the update is the plain mean; a rank's weight is the share of the global
batch's samples it processed, so the update is the one the data's objective
asks for (FedNova's concern, arXiv:2007.07481, that unequal local work drifts
the objective, does not arise: every rank takes the same number of steps,
each on its own share of the same permutation).

Why shares of the batch, not a time-budgeted number of local steps: the steps
stay aligned on every rank, so everything that agrees at a step (τ's phase,
step checkpoints, a stop request's agreement, elastic commits, a mid-epoch
resume's ``samples_done = step · B``) holds unchanged, and the rule serves
SyncAverage as well as the local-update strategies. An epoch is still one
pass over the training set by the job: the global batch of step s is
positions [s·B, (s+1)·B) of the epoch's permutation, and rank r takes b_r of
them (``positions``).
"""
import itertools
import os
import time

import numpy as np

from .. import validation
from ..compute_timing import WARM_STEPS, training_step


def check(shares, size):
    """``shares`` as a tuple of ``size`` integers >= 0 whose sum is >= 1, or a clear ValueError."""
    shares = tuple(shares)
    if len(shares) != size or not all(validation.is_number(b) and float(b).is_integer() and b >= 0
                                      and not isinstance(b, bool) for b in shares) or sum(shares) < 1:
        raise ValueError(f"`shares` must hold one integer >= 0 per rank ({size} ranks), at least one of them "
                         f"positive. Received: shares={list(shares)!r}")
    return tuple(int(b) for b in shares)


def weight(shares, rank):
    """p·w_r = p·b_r / Σ b: what rank ``rank`` scales its contribution to a mean over the p ranks by, so
    that the mean becomes Σ_r w_r t_r. Exactly 1.0 at equal shares (the mean unweighted, bit for bit)."""
    return len(shares) * shares[rank] / sum(shares)


def equal(shares):
    """Whether every rank has the same share (the unweighted case, bit for bit)."""
    return len(set(shares)) <= 1


def from_speeds(speeds, global_batch, tolerance=0.1, minimum=1):
    """Each rank's micro-batch for ranks of these speeds, summing to ``global_batch``.

    Args:
      speeds: samples/s per rank, measured alike on every rank (the same list everywhere).
      global_batch: B, the samples of one step over all ranks.
      tolerance: ranks whose speeds all lie within this share of their mean keep equal
        shares: measurement noise must not turn equal ranks into unequal ones.
      minimum: the smallest share a rank is given (1: every rank keeps stepping, so
        every rank's weights keep learning; 0 would park a very slow rank).

    Returns:
      A tuple of integers: B/p each when the speeds are equal within ``tolerance`` (B
      divisible by p), else B·s_r/Σs rounded by largest remainder, at least ``minimum``.
    """
    speeds = [float(s) for s in speeds]
    size = len(speeds)
    if size < 1 or not all(s > 0 and np.isfinite(s) for s in speeds):
        raise ValueError(f"`speeds` must be positive and finite, one per rank. Received: speeds={speeds!r}")
    if global_batch < size * minimum or global_batch < 1:
        raise ValueError(f"`global_batch` must be at least {max(size * minimum, 1)} ({size} ranks, at least "
                         f"{minimum} samples each). Received: global_batch={global_batch}")
    mean = sum(speeds) / size
    if global_batch % size == 0 and max(abs(s - mean) for s in speeds) <= tolerance * mean:
        return (global_batch // size,) * size
    spare = global_batch - minimum * size
    ideal = [spare * s / sum(speeds) for s in speeds]
    shares = [int(np.floor(x)) for x in ideal]
    # Largest remainder, ties to the lower rank: the same answer on every rank.
    for r in sorted(range(size), key=lambda r: (-(ideal[r] - shares[r]), r))[:spare - sum(shares)]:
        shares[r] += 1
    return tuple(minimum + b for b in shares)


def positions(shares):
    """The rank each position of a global batch goes to: an int array of length Σ shares.

    A smooth weighted round robin (at each position, the rank furthest behind its
    share, ties to the lower rank), so that at equal shares position q goes to rank
    q mod p, which is the layout ranks have always had (``data.epoch_indices``):
    equal shares give every rank the same samples as before, in the same order.
    Every prefix of the batch is split within one sample of the shares.
    """
    shares = np.asarray(shares, dtype=np.int64)
    total = int(shares.sum())
    taken = np.zeros_like(shares)
    owner = np.empty(total, dtype=np.int64)
    for q in range(total):
        behind = shares * (q + 1) - taken * total
        r = int(np.argmax(behind))  # argmax takes the first of equals: the lower rank
        owner[q] = r
        taken[r] += 1
    return owner


# --- measuring the ranks' speeds ---------------------------------------------------------------
# The window every rank steps through at once: at least this long, and this many of the slowest
# rank's steps, so that each rank completes several and the measurement is a rate, not one step's noise.
MIN_WINDOW_SECONDS = 1.0
WINDOW_STEPS = 5


def measure_speeds(model, loss, optimizer, batches, comm, warm=WARM_STEPS):
    """Every rank's samples/s, the same list on every rank.

    Each rank steps a copy of ``model`` on its own ``batches`` with no communication
    (``compute_timing.training_step``): ``warm`` steps that trace, then, all ranks at once (an
    allgather of the last warm step's time starts them together), as many steps as fit a window of
    ``WINDOW_STEPS`` of the slowest rank's step (at least ``MIN_WINDOW_SECONDS``); a rank's speed is
    its samples over its time. One window for all: ranks that share cores share them while every rank
    is measured, as they will in training. A rank the test hook slows (``TEST_SLOW_RANKS``) is
    measured slowed.
    """
    run = training_step(model, loss, optimizer)
    cycle = itertools.cycle(list(batches))
    slow = pacer(comm.rank)

    def step():
        x, y = next(cycle)
        run(x, y)
        if slow:
            slow(int(x.shape[0]))
        return int(x.shape[0])

    seconds = 0.0
    for _ in range(warm):
        start = time.perf_counter()
        step()
        seconds = time.perf_counter() - start
    window = max(MIN_WINDOW_SECONDS, WINDOW_STEPS * max(comm.allgather_json(seconds)))
    start, samples = time.perf_counter(), 0
    while time.perf_counter() - start < window:
        samples += step()
    return comm.allgather_json(samples / (time.perf_counter() - start))


# --- the test-only slow rank ----------------------------------------------------------------------
# HVD_EASGD_TEST_SLOW_RANKS="RANK:SECONDS[,RANK:SECONDS...]": after each training step, rank RANK sleeps
# SECONDS per sample of its micro-batch (``pacer``), as a device that much slower per sample would take. Per
# sample, not per step: a rank given fewer samples is slowed less, as a slow device is. Unset (the
# default), nothing sleeps. For tests and benchmarks of ranks of unequal speed only.
TEST_SLOW_RANKS = "HVD_EASGD_TEST_SLOW_RANKS"


def test_slowdown(rank, environ=None):
    """Seconds per sample rank ``rank`` sleeps under ``TEST_SLOW_RANKS`` (0.0 when unset or not named)."""
    setting = (os.environ if environ is None else environ).get(TEST_SLOW_RANKS, "").strip()
    if not setting:
        return 0.0
    slowed = {}
    try:
        for item in setting.split(","):
            r, seconds = item.split(":")
            slowed[int(r)] = float(seconds)
        assert all(s >= 0 and np.isfinite(s) for s in slowed.values())
    except (ValueError, AssertionError):
        raise ValueError(f"{TEST_SLOW_RANKS} must be RANK:SECONDS_PER_SAMPLE[,RANK:SECONDS_PER_SAMPLE...] with "
                         f"seconds >= 0. Received: {setting!r}") from None
    return slowed.get(rank, 0.0)


def pacer(rank):
    """The test hook's sleep for rank ``rank``: a function of a step's samples, or None when the hook does
    not slow this rank (read once, so a slowed rank's steps do not parse the setting again).

    A sleep: the rank's core idles meanwhile, as a slow device leaves the others' devices alone. It
    emulates one only where every rank has a core of its own: with more ranks than cores the ranks
    beside it take its core while it sleeps (and a busy wait would take theirs), so measure slow ranks
    at no more ranks than cores."""
    seconds = test_slowdown(rank)
    if not seconds:
        return None
    return lambda samples: time.sleep(seconds * samples)
