"""SyncAverage: average (or sum) the gradients across ranks every step.

Every rank applies the same reduced gradient, so the ranks' weights stay
bit-identical. All gradients travel in ONE grouped allreduce per step: the
per-step collective latency, not bandwidth, is the main cost at small scale.

Compressed (``compression``): fp16 is summed as it travels; bf16, int8 and
int4 go through the quantised allreduce (``comm/quantised_allreduce.py``)
with error feedback (``error_feedback.py``: the gradient sums plus each
rank's residual are sent, the residual keeps what quantisation cut). Their
NaN/Inf check runs before quantising: a rank with a non-finite gradient
sends zeros and a flag in the same call, and every rank then sees the
step as non-finite (the usual skip rule, or the loss scale's). Clipping by
global norm applies to the decoded, reduced gradients. The collective
completes inside the step, so a checkpoint between steps never meets one in
flight.

Under ``compression="powersgd"`` the gradient matrices travel as rank-R
factors instead, in two allreduces a step, after an uncompressed warm-up
(``hvd_easgd.comm.powersgd``).
"""
import math

import keras
import tensorflow as tf

from .. import resize, validation
from ..comm.communicator import REDUCE_OPS
from ..comm.compression import GRADIENTS, POWERSGD_DEFAULT_RANK, Compression
from ..comm.powersgd import PowerSGD
from .error_feedback import ErrorFeedback, error_feedback_wanted
from .base import WIRE_FACTORS, CliOption, ExpectedTraffic, SyncStrategy, Traffic, all_finite, allreduce_traffic, \
    as_dense, check_count, compression_for, count_on_the_wire, element_bytes
from .local_updates import allreduce_unless_non_finite

# The batches per update up to which --scale-lr's rule is linear (measured; see lr_scale_factor).
LINEAR_UP_TO = 4
# ... and by the square root up to m = 8 batches: flat beyond (lr_scale_factor's measurements).
SQUARE_ROOT_UP_TO = 8
# Adam's rule is the square root from m = 1, flat beyond the largest m measured (8).
ADAPTIVE_SQUARE_ROOT_UP_TO = 8


@keras.saving.register_keras_serializable(package="hvd_easgd")
class SyncAverage(SyncStrategy):
    """Synchronous data parallelism.

    Args:
      reduce_op: ``"average"`` (default) or ``"sum"`` across ranks.
      clip_norm: clip the reduced gradients to this global norm. Clipping
        after the reduction means every rank takes the same decision.
      compression: what crosses the wire: ``"none"``, ``"fp16"``, ``"bf16"``,
        ``"int8"``, ``"int4"`` (``hvd_easgd.comm.compression``) or
        ``"powersgd"`` (rank ``powersgd_rank`` factors).
      powersgd_rank: R of ``compression="powersgd"`` (default 4).
      powersgd_warmup_steps: steps sent uncompressed first (default 10;
        PyTorch's 1,000 is sized for runs far longer than this project's).
      powersgd_min_compression_rate: matrices compressed less than this
        (n·m / ((n+m)·R)) are sent whole (default 2).

    Example::

        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.05),
                                             strategy=hvd_easgd.SyncAverage())
    """

    name = "sync"
    description = "average the gradients across ranks every step (one grouped allreduce)"
    cli_options = (
        CliOption("--clip-norm", "clip_norm", "clip the reduced gradients to this global norm", type=float),
        CliOption("--fp16-allreduce", "compression", "send gradients as fp16 (half the bytes)",
                  switch=True, switch_value="fp16"),
        CliOption("--reduce-op", "reduce_op", "combine gradients across ranks by average (default) or sum",
                  choices=REDUCE_OPS),
        CliOption("--powersgd-warmup-steps", "powersgd_warmup_steps",
                  "steps sent uncompressed before --compression powersgd starts (default 10)", type=int),
    )
    across_groups = True

    payload_kind = GRADIENTS

    def __init__(self, reduce_op="average", clip_norm=None, compression="none", powersgd_rank=POWERSGD_DEFAULT_RANK,
                 powersgd_warmup_steps=None, powersgd_min_compression_rate=None):
        super().__init__()
        self.reduce_op = validation.one_of("reduce_op", reduce_op, REDUCE_OPS)
        validation.number("clip_norm", clip_norm, minimum=0, min_inclusive=False, allow_none=True,
                          condition=" or None")
        self.clip_norm = clip_norm
        self.compression = compression_for(Compression.by_name(compression, rank=powersgd_rank)
                                           if compression == "powersgd" else compression, self.payload_kind, self.name)
        self.compression_name = self.compression.name
        self.powersgd_rank = powersgd_rank
        self._powersgd_args = {"warmup_steps": powersgd_warmup_steps,
                               "min_compression_rate": powersgd_min_compression_rate}
        self.powersgd = None
        self.error_feedback = None
        if self.compression_name == "powersgd":
            # The warm-up steps and the steps the factors travel are told
            # apart by step_counter (checkpointed), so a resume never repeats it.
            self.powersgd = PowerSGD(rank=powersgd_rank,
                                     **{k: v for k, v in self._powersgd_args.items() if v is not None})
            self.compression = Compression.none  # what the warm-up and the uncompressed tensors travel as
        else:
            given = next((k for k, v in self._powersgd_args.items() if v is not None), None)
            if given is not None:
                raise validation.refusal(f"powersgd_{given}", "None unless compression='powersgd'",
                                         self._powersgd_args[given], gloss=f"(compression={compression!r})")

    def _build_state(self, trainable_variables, non_trainable_variables):
        if self.powersgd is not None:
            self.powersgd.build(trainable_variables, name=f"{type(self).__name__}_powersgd")
            # The mean, not a restart at zero: see resize_notice. Q is the same on
            # every rank and so kept by resize.DEFAULT.
            self.set_resize_rule(resize.MEAN, [self.powersgd.residuals[i] for i in sorted(self.powersgd.residuals)])
        elif error_feedback_wanted(self.compression):
            self.error_feedback = ErrorFeedback(self, "sync_residual", trainable_variables)

    def _extra_state(self):
        if self.powersgd is not None:
            return self.powersgd.state_variables()
        return self.error_feedback.residuals if self.error_feedback is not None else []

    def reduce(self, grad_sums, variables, sample_count=None, mean=True):
        """Returns ``(reduced_grads, apply_wanted)``, identical on every rank.

        ``grad_sums`` are per-rank sums S_r over n_r samples (base.py).
        Without a count (n_r = 1 on every rank, known everywhere): one
        allreduce with ``reduce_op``, so ``"average"`` gives ΣS_r / p, the
        per-sample mean. With it: S_r and n_r travel in the SAME Sum
        allreduce, and the result is ΣS_r / Σn_r (``mean``), else ΣS_r
        combined by ``reduce_op``. A step in which no rank saw a sample is
        skipped everywhere.
        """
        grads = [as_dense(g, v) for g, v in zip(grad_sums, variables)]
        if sample_count is None:
            # Without counts a rank's share of the global batch is its weight (set_sample_shares);
            # with them the counts are the weights, exactly.
            grads = self.weighed(grads)
        if not self.compression.summable:
            return self._reduce_quantised(grads, sample_count, mean)
        if self.powersgd is not None and self.comm.size > 1:
            reduced, wanted = tf.cond(self.step_counter < self.powersgd.warmup_steps,
                                      lambda: self._allreduce(grads, sample_count, mean),
                                      lambda: self._allreduce_powersgd(grads, sample_count, mean))
        else:
            reduced, wanted = self._allreduce(grads, sample_count, mean)
        if self.clip_norm is not None:
            # Under loss scaling the gradients carry the scale: so does the norm.
            reduced, _ = tf.clip_by_global_norm(reduced, self.scaled(tf.constant(self.clip_norm, tf.float32)))
        return reduced, wanted

    def _allreduce(self, grads, sample_count, mean):
        """The exact path: one grouped allreduce of every gradient (and the count)."""
        if sample_count is None:
            reduced = self.comm.allreduce(grads, op=self.reduce_op, compression=self.compression)
            wanted = tf.constant(True)
        else:
            summed = self.comm.allreduce(grads + [count_on_the_wire(sample_count, grads[0].dtype)], op="sum",
                                         compression=self.compression)
            total = summed[-1][0]
            reduced = self._divided(summed[:-1], total, mean)
            wanted = total > 0
        return reduced, wanted

    def _allreduce_powersgd(self, grads, sample_count, mean):
        """The compressed path: PowerSGD's sums, divided as ``_allreduce`` divides.

        The residuals and Q move on only in a step that is applied (finite, with
        samples somewhere); a skipped step leaves them as they were, on every
        rank, since the decision is taken on summed values."""
        riders = [] if sample_count is None else [count_on_the_wire(sample_count, grads[0].dtype)]
        sums, rider_sums, commit = self.powersgd.allreduce_sums(self.comm, grads, riders)
        total = None if sample_count is None else rider_sums[0][0]
        reduced = self._divided(sums, total, mean)
        wanted = tf.constant(True) if total is None else total > 0
        commit(tf.logical_and(wanted, all_finite(reduced)))
        return reduced, wanted

    def _divided(self, sums, total, mean):
        """ΣS_r as applied: / Σn_r (``mean`` with a count ``total``), / p (``reduce_op``
        average), or as it is (sum)."""
        if total is not None and mean:
            return [tf.math.divide_no_nan(g, tf.cast(total, g.dtype)) for g in sums]
        if self.reduce_op == "average":
            return [g / self.comm.size for g in sums]
        return sums

    def _reduce_quantised(self, grads, sample_count, mean):
        """``reduce`` through the quantised allreduce: NaN/Inf kept off the wire, the
        count exact, error feedback (the module docstring)."""
        self._pending_errors = None
        if not self.built:  # used as another strategy's warm-up before that one built it
            raise RuntimeError("a compressed SyncAverage must be built before it reduces")
        payload = self.error_feedback.add(grads)
        if sample_count is not None:
            payload.append(count_on_the_wire(sample_count, grads[0].dtype))
        sums, bad_ranks, errors = allreduce_unless_non_finite(self.comm, payload, self.compression,
                                                              with_errors=True)
        if sample_count is not None:
            total, sums, errors = sums[-1][0], sums[:-1], errors[:-1]
            reduced = [tf.math.divide_no_nan(g, tf.cast(total, g.dtype)) for g in sums] if mean else sums
            wanted = total > 0
        else:
            reduced, wanted = sums, tf.constant(True)
        if (sample_count is None or not mean) and self.reduce_op == "average":
            reduced = [g / self.comm.size for g in reduced]
        # A rank that held NaN/Inf sent zeros: every rank sees a non-finite step,
        # so the skip rule (or the loss scale) acts as it does without compression.
        nan = tf.constant(float("nan"), grads[0].dtype)
        reduced = [tf.where(bad_ranks > 0, nan, g) for g in reduced]
        self._pending_errors = errors
        if self.clip_norm is not None:
            reduced, _ = tf.clip_by_global_norm(reduced, self.scaled(tf.constant(self.clip_norm, tf.float32)))
        return reduced, wanted

    def step(self, grad_sums, variables, apply_update, sample_count=None, mean=True):
        reduced, wanted = self.reduce(grad_sums, variables, sample_count, mean)
        # Checked after the reduction: every rank sees the same numbers and
        # takes the same decision, so a NaN on one rank cannot split them.
        finite = all_finite(reduced)
        took_effect = tf.logical_and(wanted, finite)
        self._apply_if(took_effect, finite, apply_update, reduced)
        if self.error_feedback is not None and self.comm.size > 1:
            self.error_feedback.keep(self._pending_errors, took_effect)
        self.step_counter.assign_add(1)

    # --- the hooks (base.py) ----------------------------------------------------------
    @classmethod
    def lr_scale_factor(cls, size, accumulate=1, adaptive=False):
        """m = ranks*K batches per update: factor m up to 4, then 4*sqrt(m/4) up to 8, 4*sqrt(2) beyond; Adam: sqrt(m) up to 8.

        An update averages the gradients of m = size · k batches. The rate
        scales linearly with m up to m = 4 (Goyal et al. 2017,
        arXiv:1706.02677) and by the square root beyond (Krizhevsky 2014,
        arXiv:1404.5997; Hoffer et al. 2017, arXiv:1705.08741), continuous at
        the bend::

            factor = m                   for m <= 4
                   = 4 * sqrt(m / 4)     for 4 < m <= 8
                   = 4 * sqrt(2)         for m > 8

        Measured on digits (``horovodrun -np 2 train.py``, lr 0.02, momentum
        0.9, 10 epochs) at m = 8 (size 2, k 4), three seeds: ×8 diverges
        (with or without warm-up), ×4 ends at 0.88-0.95, ×5.66 at
        0.956-0.972. ``lr_scale_factor(2, 4)`` is 5.657; ``(2, 1)`` is 2.0.
        At 8 ranks (``horovodrun -np 8 train.py``, seed 0, 2026-12-02) m = 8
        at ×5.66 ends at 0.983, and m = 32 (``--accumulate 4``, 100 epochs of
        1-2 updates) at the square root's ×11.3 (lr 0.226) reaches 0.72 by
        epoch 5, collapses to chance and ends at 0.903, while ×5.66 ends at
        0.983: beyond m = 8 the factor stays flat (one seed measured).

        Under Adam (``adaptive``): ``sqrt(min(m, 8))``. Adam's step does not grow with the
        gradient, so the linear part has no ground; where the batch's noise dominates Adam's
        second moment, m times the batch calls for √m times the rate (Malladi et al. 2022,
        arXiv:2205.10287). Measured on the language model at the budget (2.5 passes, 26.2 M
        tokens; ``python -m benchmarks parity --workload language_model``, docs/language-model.md):
        at 2 ranks, 3 seeds, ×1 ends at 1.4191 nats/token (1.4178-1.4205) and ×√2 at 1.3812
        (1.3773-1.3845); at 8 ranks, seed 0, ×1 at 1.7882, ×√8 at 1.5418 and the linear ×8 at
        1.6727: past √m the rate costs again, so what 8 ranks lack at the same tokens is updates,
        not rate. Beyond m = 8 nothing is measured, and the factor stays flat, as SGD's does.
        """
        batches = check_count("size", size) * check_count("accumulate", accumulate)
        if adaptive:
            return math.sqrt(min(batches, ADAPTIVE_SQUARE_ROOT_UP_TO))
        if batches <= LINEAR_UP_TO:
            return float(batches)
        return LINEAR_UP_TO * math.sqrt(min(batches, SQUARE_ROOT_UP_TO) / LINEAR_UP_TO)

    def resize_refusal(self, saved_ranks, ranks):
        """None: every rank saved the same state, so every variable keeps it
        (``resize.DEFAULT``: the weights, the optimizer's slots and counters,
        the step counter); a quantising format's error-feedback residuals
        restart at zero (``ErrorFeedback``), PowerSGD's resume as their mean
        (``resize.MEAN``, see ``resize_notice``). Nothing is rescaled in the strategy; under
        ``--scale-lr`` the saved constant rate comes back with the optimizer's
        variables (train.py; docs/checkpoints.md). Mid-epoch, the epoch's
        samples not yet seen are split over the new ranks (``data.rest_of_epoch``)."""
        return None

    def resize_notice(self, saved_ranks, ranks):
        """Under PowerSGD: each of the q ranks resumes with the mean of the p saved
        residuals (``resize.MEAN``, declared in ``_build_state``). An averaged step then feeds
        back Σ_q mean_r e_r / q = mean_r e_r, what the p ranks' step would have
        fed back (a summed step, ``reduce_op="sum"``, q/p of their total); Q (the
        same on every rank) and the step counter are kept, so neither the warm
        start nor the warm-up restarts."""
        if self.powersgd is None:
            return None
        return (f"PowerSGD's error-feedback residuals resume as the mean of the {saved_ranks} saved ranks'; "
                "its factors Q and its warm-up count are kept")

    def expected_traffic(self, trainable_variables, non_trainable_variables=(), hosts=1, ranks_per_host=1,
                         sample_counts=False):
        """Every step, ONE call: the gradients (2 bytes an element under fp16
        compression), plus the sample count in their dtype when one is passed.
        bf16, int8 and int4: the quantised allreduce's figures with the
        non-finite flag (and the count) as exact values.

        Under PowerSGD, once its warm-up is over, TWO calls a step (one if no
        tensor is compressed) carrying ``PowerSGD.payload_bytes``: Σ over the
        compressed matrices (n + m)·R'·4 bytes (fp32) plus the uncompressed
        tensors' bytes, plus the sample count; each an allreduce, 2(p−1)/p of
        it on the wire. The warm-up steps cost what an uncompressed step costs."""
        size = hosts * ranks_per_host
        if size == 1:
            return ExpectedTraffic()
        if self.powersgd is not None:
            sent = self.powersgd.payload_bytes(trainable_variables)
            calls = 1.0 + any(self.powersgd.factor_rank(v.shape) is not None for v in trainable_variables)
            if sample_counts:
                sent += element_bytes(trainable_variables, self.compression)
            return ExpectedTraffic(across_groups=Traffic.of("allreduce", sent, calls,
                                                            float(sent) * WIRE_FACTORS["allreduce"](size)))
        exact = int(sample_counts) + (0 if self.compression.summable else 1)
        return ExpectedTraffic(across_groups=allreduce_traffic(trainable_variables, size, self.compression, exact,
                                                               self._has_alltoall()))

    def _has_alltoall(self):
        return self.comm.has_alltoall if self.comm is not None else True

    def get_config(self):
        config = {"reduce_op": self.reduce_op, "clip_norm": self.clip_norm, "compression": self.compression_name}
        if self.compression_name == "powersgd":
            config["powersgd_rank"] = self.powersgd_rank
            config.update({f"powersgd_{k}": v for k, v in self._powersgd_args.items()})
        return config
