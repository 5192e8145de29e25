"""SyncAverage: average (or sum) the gradients across ranks every step.

Every rank applies the same reduced gradient, so the ranks' weights stay
bit-identical. All gradients travel in ONE grouped allreduce per step: the
per-step collective latency, not bandwidth, is the main cost at small scale.
Under ``compression="powersgd"`` the gradient matrices travel as rank-R
factors instead, in two allreduces a step (``hvd_easgd.comm.powersgd``).
"""
import math

import keras
import tensorflow as tf

from .. import resize, validation
from ..comm import Compression
from ..comm.communicator import REDUCE_OPS
from ..comm.powersgd import PowerSGD
from .base import CliOption, ExpectedTraffic, SyncStrategy, Traffic, all_finite, as_dense, check_count, \
    count_on_the_wire, element_bytes, payload_bytes

# The batches per update up to which --scale-lr's rule is linear (measured; see lr_scale_factor).
LINEAR_UP_TO = 4
COMPRESSIONS = ("none", "fp16", "powersgd")


@keras.saving.register_keras_serializable(package="hvd_easgd")
class SyncAverage(SyncStrategy):
    """Synchronous data parallelism.

    Args:
      reduce_op: ``"average"`` (default) or ``"sum"`` across ranks.
      clip_norm: clip the reduced gradients to this global norm. Clipping
        after the reduction means every rank takes the same decision.
      compression: ``"none"``, ``"fp16"`` (what crosses the wire; cast back
        after) or ``"powersgd"`` (rank-R factors with error feedback, after
        an uncompressed warm-up; ``hvd_easgd.comm.powersgd``).
      powersgd_rank: R, the factors' rank (default 4); only with ``"powersgd"``.
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
        CliOption("--powersgd", "compression", "send gradient matrices as rank-R PowerSGD factors with error "
                  "feedback, after an uncompressed warm-up", switch=True, switch_value="powersgd"),
        CliOption("--powersgd-rank", "powersgd_rank", "the rank R of PowerSGD's factors (default 4)", type=int),
        CliOption("--powersgd-warmup-steps", "powersgd_warmup_steps",
                  "steps sent uncompressed before PowerSGD starts (default 10)", type=int),
    )
    across_groups = True

    def __init__(self, reduce_op="average", clip_norm=None, compression="none", powersgd_rank=None,
                 powersgd_warmup_steps=None, powersgd_min_compression_rate=None):
        super().__init__()
        self.reduce_op = validation.one_of("reduce_op", reduce_op, REDUCE_OPS)
        validation.number("clip_norm", clip_norm, minimum=0, min_inclusive=False, allow_none=True,
                          condition=" or None")
        self.clip_norm = clip_norm
        self.compression_name = validation.one_of("compression", compression, COMPRESSIONS)
        self._powersgd_args = {"rank": powersgd_rank, "warmup_steps": powersgd_warmup_steps,
                               "min_compression_rate": powersgd_min_compression_rate}
        self.powersgd = None
        if compression == "powersgd":
            # The warm-up steps and the steps the factors travel are told
            # apart by step_counter (checkpointed), so a resume never repeats it.
            self.compression = Compression.none
            self.powersgd = PowerSGD(**{k: v for k, v in self._powersgd_args.items() if v is not None})
        else:
            given = next((k for k, v in self._powersgd_args.items() if v is not None), None)
            if given is not None:
                raise validation.refusal(f"powersgd_{given}", "None unless compression='powersgd'",
                                         self._powersgd_args[given], gloss=f"(compression={compression!r})")
            self.compression = Compression.by_name(compression)

    def _build_state(self, trainable_variables, non_trainable_variables):
        if self.powersgd is not None:
            self.powersgd.build(trainable_variables, name=f"{type(self).__name__}_powersgd")
            # The mean, not a restart at zero: see resize_notice. Q is the same on
            # every rank and so kept by resize.DEFAULT.
            self.set_resize_rule(resize.MEAN, [self.powersgd.residuals[i] for i in sorted(self.powersgd.residuals)])

    def _extra_state(self):
        return self.powersgd.state_variables() if self.powersgd is not None else []

    def reduce(self, grad_sums, variables, sample_count=None, mean=True):
        """Returns ``(reduced_grads, apply_wanted)``, identical on every rank.

        ``grad_sums`` are per-rank sums S_r over n_r samples (base.py).
        Without a count (n_r = 1 on every rank, known everywhere): one
        allreduce with ``reduce_op``, so ``"average"`` gives ΣS_r / p, the
        per-sample mean. With it: S_r and n_r travel in the SAME Sum
        allreduce, and the result is ΣS_r / Σn_r (``mean``), else ΣS_r
        combined by ``reduce_op``. A step in which no rank saw a sample is
        skipped everywhere. Under PowerSGD, once its warm-up is over, ΣS_r
        is PowerSGD's rank-R approximation (``PowerSGD.allreduce_sums``),
        divided the same way.
        """
        grads = [as_dense(g, v) for g, v in zip(grad_sums, variables)]
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

    def step(self, grad_sums, variables, apply_update, sample_count=None, mean=True):
        reduced, wanted = self.reduce(grad_sums, variables, sample_count, mean)
        # Checked after the reduction: every rank sees the same numbers and
        # takes the same decision, so a NaN on one rank cannot split them.
        finite = all_finite(reduced)
        self._apply_if(tf.logical_and(wanted, finite), finite, apply_update, reduced)
        self.step_counter.assign_add(1)

    # --- the hooks (base.py) ----------------------------------------------------------
    @classmethod
    def lr_scale_factor(cls, size, accumulate=1):
        """m = ranks*K batches per update: factor m up to 4, then 4*sqrt(m/4).

        An update averages the gradients of m = size · k batches. The rate
        scales linearly with m up to m = 4 (Goyal et al. 2017,
        arXiv:1706.02677) and by the square root beyond (Krizhevsky 2014,
        arXiv:1404.5997; Hoffer et al. 2017, arXiv:1705.08741), continuous at
        the bend::

            factor = m                   for m <= 4
                   = 4 * sqrt(m / 4)     for m > 4

        Measured on digits (``horovodrun -np 2 train.py``, lr 0.02, momentum
        0.9, 10 epochs) at m = 8 (size 2, k 4), three seeds: ×8 diverges
        (with or without warm-up), ×4 ends at 0.88-0.95, ×5.66 at
        0.956-0.972. ``lr_scale_factor(2, 4)`` is 5.657; ``(2, 1)`` is 2.0.
        """
        batches = check_count("size", size) * check_count("accumulate", accumulate)
        if batches <= LINEAR_UP_TO:
            return float(batches)
        return LINEAR_UP_TO * math.sqrt(batches / LINEAR_UP_TO)

    def resize_refusal(self, saved_ranks, ranks):
        """None: every rank saved the same state, so every variable keeps it
        (``resize.DEFAULT``: the weights, the optimizer's slots and counters,
        the step counter), but for PowerSGD's residuals, which resume as
        their mean (``resize.MEAN``, see ``resize_notice``). Nothing is
        rescaled in the strategy; under ``--scale-lr`` the saved constant rate
        comes back with the optimizer's variables (train.py;
        docs/checkpoints.md). Mid-epoch, the epoch's samples not yet seen are
        split over the new ranks (``data.rest_of_epoch``)."""
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

        Under PowerSGD, once its warm-up is over, TWO calls a step (one if no
        tensor is compressed) carrying ``PowerSGD.payload_bytes``: Σ over the
        compressed matrices (n + m)·R'·4 bytes (fp32) plus the uncompressed
        tensors' bytes, plus the sample count. The warm-up steps cost what an
        uncompressed step costs."""
        if hosts * ranks_per_host == 1:
            return ExpectedTraffic()
        if self.powersgd is not None:
            sent = self.powersgd.payload_bytes(trainable_variables)
            calls = 1.0 + any(self.powersgd.factor_rank(v.shape) is not None for v in trainable_variables)
        else:
            sent, calls = payload_bytes(trainable_variables, self.compression), 1.0
        if sample_counts:
            sent += element_bytes(trainable_variables, self.compression)
        return ExpectedTraffic(across_groups=Traffic(float(sent), float(calls)))

    def get_config(self):
        config = {"reduce_op": self.reduce_op, "clip_norm": self.clip_norm, "compression": self.compression_name}
        if self.powersgd is not None:
            config.update({f"powersgd_{k}": v for k, v in self._powersgd_args.items()})
        return config
