"""What the strategies that step locally share (EASGD, PeriodicAverage, DiLoCo):
a rank's own optimizer step, and the one grouped Sum allreduce that keeps a
non-finite contribution off the wire while every rank learns of it.
"""
import math

import tensorflow as tf

from .. import validation
from ..comm import Compression
from .base import all_finite, as_dense, check_count, count_as, zeros_unless


def check_period(period, name="period"):
    """τ, the optimizer steps between synchronisations: an integer >= 1.

    Args:
      period: the value received.
      name: the argument it was given as (EASGD also takes TF1's
        ``communication_period``).

    Returns:
      τ as a Python int.
    """
    # TF1's name gets the gloss: the rest of the package calls τ `period`.
    return validation.integer(name, period, minimum=1, gloss="(tau)" if name != "period" else "")


def local_lr_factor(size, accumulate):
    """``--scale-lr``'s factor for a strategy whose local update averages one
    rank's k micro-batches while the ranks meet in the weights (PeriodicAverage;
    EASGD up to 2 ranks, see its ``lr_scale_factor``): linear in the ranks, the square root of k::

        factor = size * sqrt(k)

    Linear in the ranks because the ranks' mean moves as one SyncAverage step
    over ``size`` batches would (the center averages ``size`` workers); the
    square root of k because gradients are never averaged across ranks, only
    a rank's own micro-batches (the square-root rule for larger batches:
    Krizhevsky 2014, arXiv:1404.5997; Hoffer et al. 2017, arXiv:1705.08741).
    The measurements behind it are in the strategies' ``lr_scale_factor``.
    """
    return check_count("size", size) * math.sqrt(check_count("accumulate", accumulate))


# The ranks up to which the local-update strategies' Adam rules (PeriodicAverage's, EASGD's) were measured to
# hold; beyond, each rule stays at its value there, as SyncAverage's rules stay flat beyond what was measured.
# On the language model at 8 ranks (seed 0) the rules carried on (8 x and 9 x 1e-3) ended 24 % and 19 %
# behind SyncAverage: each rank's own Adam steps on its own batch grow too large to average back.
ADAPTIVE_RANKS_UP_TO = 2


def local_adaptive_factor(size, accumulate, baseline):
    """The rate factor under Adam for a strategy whose ranks step on their own batches and meet in
    the weights (PeriodicAverage; EASGD before its drag): √p times the baseline's own Adam factor,
    p at most ``ADAPTIVE_RANKS_UP_TO``, whatever k::

        p = min(size, ADAPTIVE_RANKS_UP_TO)
        factor = sqrt(p) * baseline(p, accumulate, adaptive=True)

    ``baseline`` is SyncAverage's ``lr_scale_factor`` (this module sits below the strategies and
    imports none of them): the ranks' mean then keeps pace with SyncAverage at SyncAverage's rate.

    Why √p: Adam's step is the rate times the gradient over the root of its running square, and
    where the batch's noise dominates that square (σ²/b per coordinate for a batch of b), a step moves
    η·sqrt(b)/σ times the gradient's mean. One SyncAverage step on the p ranks' batches (b = p·k·B)
    then moves √p times as far along the mean as each rank's own step (b = k·B), and averaging the
    p ranks' steps keeps their common part and cancels their noise as the larger batch does: the
    ranks' mean advances 1/√p of SyncAverage's pace at the same rate, whatever k. The square-root
    rule for Adam's rate against its batch (Malladi et al. 2022, arXiv:2205.10287) gives the same
    √p. Where the mean dominates the noise the factor this asks for falls to 1.
    """
    ranks = adaptive_ranks(size)
    check_count("accumulate", accumulate)
    return math.sqrt(ranks) * baseline(ranks, accumulate, adaptive=True)


def adaptive_ranks(size):
    """The ranks a local-update strategy's Adam rule is evaluated at: ``size``, at most
    ``ADAPTIVE_RANKS_UP_TO`` (the rule stays at its value there beyond)."""
    return min(check_count("size", size), ADAPTIVE_RANKS_UP_TO)


def local_step(strategy, grad_sums, variables, apply_update, sample_count, mean, adjust=None):
    """One rank's own optimizer step on its own gradients, no communication.

    With a count the rank applies its per-sample mean S/n (or S when not
    ``mean``); a rank with no samples keeps its weights. A non-finite update
    is dropped on this rank alone: nothing of it leaves the rank, so the
    other ranks are unaffected. The step counter advances either way, so τ
    stays aligned across ranks. ``adjust(grads)``, if given, changes the
    per-sample gradients before the step (EASGD's elastic force ρ(x − x̃)).
    """
    grads = [as_dense(g, v) for g, v in zip(grad_sums, variables)]
    wanted = tf.constant(True)
    if sample_count is not None:
        count = count_as(sample_count, grads[0].dtype)
        if mean:
            grads = [tf.math.divide_no_nan(g, count) for g in grads]
        wanted = count > 0
    if adjust is not None:
        grads = adjust(grads)
    finite = all_finite(grads)
    strategy._apply_if(tf.logical_and(wanted, finite), finite, apply_update, grads)
    strategy.step_counter.assign_add(1)


def allreduce_unless_non_finite(comm, tensors, compression=Compression.none, with_errors=False):
    """``(Σ over ranks of tensors, ranks whose tensors held NaN/Inf)``, in ONE grouped Sum allreduce.

    A non-finite contribution never reaches the wire: it is sent as zeros,
    and a flag (one element of the first tensor's dtype) counts it in the same
    call, so every rank learns the same count and takes the same decision.
    The check comes before any quantisation (``compression``): one Inf would
    poison its block's scale. The flag is a one-element tensor, which the
    quantised allreduce carries exactly.

    With ``with_errors`` a third value: this rank's compression error per
    tensor (``Communicator.allreduce_with_errors``), for error feedback.
    """
    payload = _unless_non_finite(tensors)
    if with_errors:
        summed, errors = comm.allreduce_with_errors(payload, op="sum", compression=compression)
        return summed[:-1], summed[-1][0], errors[:-1]
    summed = comm.allreduce(payload, op="sum", compression=compression)
    return summed[:-1], summed[-1][0]


def _unless_non_finite(tensors):
    finite = all_finite(tensors)
    flag = tf.reshape(tf.cast(tf.logical_not(finite), tensors[0].dtype), [1])
    return zeros_unless(finite, lambda: tensors) + [flag]


def start_allreduce_unless_non_finite(comm, tensors, compression=Compression.none):
    """``allreduce_unless_non_finite`` started (``Communicator.start_allreduce``), for an overlap.

    Returns:
      ``(handle, errors)``: the collective's handle, and this rank's compression
      error per tensor (zeros without compression).
    """
    handle, errors = comm.start_allreduce(_unless_non_finite(tensors), op="sum", compression=compression,
                                          with_errors=True)
    return handle, errors[:-1]


def finish_allreduce_unless_non_finite(comm, handle, like):
    """``(sums, ranks whose tensors held NaN/Inf)`` of the allreduce started as ``handle`` on tensors
    shaped as ``like``."""
    summed = comm.finish_allreduce(handle, [tf.convert_to_tensor(t) for t in like]
                                   + [tf.zeros([1], tf.convert_to_tensor(like[0]).dtype)])
    return summed[:-1], summed[-1][0]


# The --overlap flag's help, one text for every strategy that takes it.
OVERLAP_HELP = "delta: merge a synchronisation delta steps after its collective starts, 0 <= delta < tau (default 0)"


def check_overlap(overlap, period):
    """δ, the steps between a synchronisation's start and its merge: an integer with 0 <= δ < τ.

    ``True`` and ``False`` (EASGD's switch before δ) mean 1 and 0.
    """
    if isinstance(overlap, bool):
        overlap = int(overlap)
    return validation.integer("overlap", overlap, minimum=0, maximum=period - 1,
                              condition=f" (below period={period}: a merge lands before the next start)")


def check_overlap_schedule(overlap, schedule):
    """Refuses δ > 0 with an adaptive period: the start step t ≡ −δ (mod τ) is
    fixed δ steps before a sync, and an adaptive τ is only known at the sync."""
    if overlap and schedule.adaptive:
        raise ValueError("`overlap` > 0 needs a fixed period: a synchronisation starts overlap steps before it is "
                         "due, and an adaptive period is only decided at the previous one. "
                         f"Received: overlap={overlap!r}, period='adaptive...'")


def overlapped_share(strategy):
    """``ExpectedTraffic.overlapped`` of an overlapping strategy: F·δ/τ where its
    communicator ``reduces_in_background``, else 0. Each of the F syncs per τ
    steps (F fragments; 1 without) runs behind the δ steps that follow its
    start, so per period τ·c + F·max(0, T/F − δ·c): per step
    c + max(0, comm − (F·δ/τ)·c), with comm = T/τ.

    Asked without a communicator, the hook answers for the default multi-rank
    transports (Horovod's and the direct path's), which do, as ``has_alltoall``
    does. A format that is not summed as it travels (bf16, int8, int4) reduces
    at the start on every transport (comm/background.py), so it hides nothing.
    """
    in_background = strategy.comm.reduces_in_background if strategy.comm is not None else True
    summable = getattr(strategy, "compression", Compression.none).summable
    if not (strategy.overlap and in_background and summable):
        return 0.0
    return min(1.0, getattr(strategy, "fragments", 1) * strategy.overlap / strategy.period)


def starts_this_step(strategy):
    """Right after a main-phase local step: whether it starts an overlapped
    synchronisation, t ≡ −δ (mod τ), which merges at the next t ≡ 0."""
    return tf.logical_and(strategy.step_counter > strategy.warmup_steps,
                          tf.equal((strategy.local_steps() + strategy.overlap) % strategy.period, 0))


def synchronised_this_step(strategy):
    """For a τ-strategy (``period``, ``warmup_steps``, ``local_steps()``) right
    after its step: whether that step synchronised the weights, i.e. it was a
    main-phase step at which its schedule synchronised (t ≡ 0 mod τ for a fixed
    τ; ``period_schedule``) (its ``weights_synchronised`` hook)."""
    return tf.logical_and(strategy.step_counter > strategy.warmup_steps,
                          strategy.schedule.just_synced(strategy.local_steps()))


class MergesOnDrain:
    """A mixin for the strategies that overlap a synchronisation (``overlap`` = δ >= 1):
    ``drain()`` merges the one in flight at once.

    The strategy keeps ``pending_handle`` (0: nothing in flight) as state and
    implements ``_merge_pending()``, the merge its schedule runs δ steps after
    the start. Eager, on every rank alike (before a checkpoint is written and
    before the kept model is evaluated), so a saved state holds nothing
    pending. Listed before ``SyncStrategy`` in the bases.
    """

    def drain(self):
        super().drain()
        if self.overlap and self._built and int(self.pending_handle.numpy()) > 0:
            self._merge_pending()

    def _merge_pending(self):
        raise NotImplementedError


class KeepsSyncedWeights:
    """A mixin for the strategies that keep a copy of the weights as of their last
    synchronisation (DiLoCo's θ; PeriodicAverage's x̄ under compression).

    Every rank holds the same weights right after the initial broadcast and at
    the end of a warm-up, so the copy is taken there (``_sync_to_weights``,
    the strategy's own): the first synchronisation then measures the local
    steps alone, not the warm-up's. Listed before ``SyncStrategy`` in the bases.
    """

    def on_initial_state_synced(self):
        super().on_initial_state_synced()
        self._sync_to_weights()

    def on_warmup_end(self):
        super().on_warmup_end()
        self._sync_to_weights()

    def _sync_to_weights(self):
        raise NotImplementedError
