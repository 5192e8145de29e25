"""DiLoCo: τ local steps, then an outer optimizer step on the averaged pseudo-gradient.

Douillard et al., "DiLoCo: Distributed Low-Communication Training of
Language Models" (2023, arXiv:2311.08105), Algorithm 1, with the outer
optimizer's state replicated on every rank instead of kept on a server.

Per rank i of p, local weights x_i, synced weights θ (identical on every
rank), at every optimizer step t = 1, 2, ...:

  1. x_i ← inner_optimizer(x_i, g_i)                  no communication
  2. if t ≡ 0 (mod τ):
       Δ_i = θ − x_i                                   the rank's pseudo-gradient
       Δ   = (1/p) Σ_j Δ_j                             ONE grouped allreduce
       θ   ← outer_optimizer(θ, Δ)                     the same on every rank
       x_i ← θ                                         every rank restarts from θ

The default outer optimizer is the paper's Nesterov SGD at η = 0.7, in Keras's
form (m ← μm − ηΔ; θ ← θ + μm − ηΔ), with momentum μ = 0.7 instead of the
paper's 0.9. An outer step moves θ by up to η/(1 − μ) times the mean
pseudo-gradient: 7 with the paper's pair, 2.33 with ours. Measured on digits
(``horovodrun -np 2 python train.py --strategy diloco``, τ = 10, momentum-SGD
inner optimizer, 10 epochs, final test accuracy): the paper's pair ended at
0.939 and 0.975 (seeds 0, 1); η = 0.4, μ = 0.9 at 0.958 and 0.978 (seed 0),
0.986 (seed 1); η = 0.3, μ = 0.9 at 0.969 (seed 0); μ = 0.7 at 0.983 and
0.978 (seed 0), 0.983 (seed 1), 0.975 (seed 2). Two runs of one seed differ
where they ran at different TF thread counts (another summation order). On the
language model (Adam inner, one epoch of the Python docs, τ = 10, 2 ranks) μ =
0.5 ended about 2 % higher in validation loss than 0.7 on each of seeds 0-2,
though steadier over 8 short epochs (docs/language-model.md, docs/slow-ranks.md);
on Fashion-MNIST's CNN the two were level. With
SGD(1.0) and no momentum as the outer optimizer θ ← θ − Δ = mean_j(x_j): the
outer step is PeriodicAverage's average. The inner optimizer (typically
adaptive, AdamW in the paper) keeps its slots local and is never reset.

Bytes: a synchronisation step sends Δ (one tensor per trainable variable) and
one element of its dtype for the non-finite flag, in one call::

    bytes per synchronisation = Σ_v size(v)·itemsize(v) + itemsize(flag)
                              = 4 · (trainable elements + 1) in float32

and zero bytes and calls on the τ − 1 steps between: 1/τ of that per step.
Compressed (``compression``): Δ_i travels as fp16, bf16, int8 or int4
(INTELLECT-1 all-reduces int8 pseudo-gradients, Streaming DiLoCo 4-bit
ones), or as its top-k per chunk at 2 bits (topk, SparseLoCo's payload:
``comm/compression/topk.py``); with bf16, int8, int4 and topk each rank
keeps what its message did not carry, e_i, and sends Δ_i + e_i next time
(``error_feedback.py``); the outer optimizer steps on the decoded mean.
The bytes are those of ``allreduce_traffic`` (the flag an exact value of
the quantised or sparse allreduce). A warm-up sends its gradients in the
format where it applies to gradients, else in fp32 (topk).

Fragments (Streaming DiLoCo, Douillard et al. 2025, arXiv:2501.18512):
with ``fragments=F`` (1 <= F <= τ) the trainable variables are split into F
fragments and fragment f synchronises alone (steps 2's Δ, mean, outer step
and x ← θ on its variables only) at the local steps t ≡ ⌊f·τ/F⌋ (mod τ),
t >= 1 counted from the end of the warm-up; fragment 0 at t ≡ 0 is today's
schedule, so F = 1 is the plain DiLoCo above, state layout included.
Layout: by whole variables, greedy in variable order to the fragment with
the fewest bytes so far (ties: the lowest index). Whole tensors keep the
grouped allreduce and every compression format unchanged; the paper's
strided layer blocks would need per-element slicing. Each fragment has its
own outer optimizer (a fresh copy of the given one's config: an optimizer
whose step depends on its iteration count, Adam, then counts its own
fragment's steps), its own error-feedback residuals, and one skip count for
all. Bytes: over τ steps the same total as F = 1 plus F − 1 more flags;
one synchronisation sends only its fragment's payload, about 1/F of it
(``peak_sync_traffic``). F must not exceed the number of trainable variables
(refused at build); as Hierarchical's inter strategy (one flat shard
variable, across groups) F > 1 is refused when the Hierarchical is made.

Overlap (``overlap`` = δ >= 1; Streaming DiLoCo, arXiv:2501.18512, its
section on overlapping communication with computation): a synchronisation's
allreduce is started at its step and the inner steps go on; δ steps later
the mean arrives, the outer optimizer steps θ with it, and the local weights
are merged with the new synced ones::

    at s ≡ ⌊f·τ/F⌋ (mod τ), after the inner step:  Δ_i = θ_f − x_if(s), start Σ_j Δ_j
    at s + δ, after the inner step:                θ_f ← outer_f(θ_f, (1/p) Σ_j Δ_j)
        "progress" (the default):                  x_if ← θ_f + x_if − x_if(s)
        "mix" (the paper's):                       x_if ← α·x_if + (1 − α)·θ_f

The progress merge puts the rank's own δ steps since the start on the new θ
(``pending_sent`` keeps x_if(s)); the mix keeps α of them and pulls the rank
back by α of the outer step's reach past its own weights. On the language
model at one pass (3 seeds) the progress merge ended +1.75 % from
SyncAverage, the mix +3.81 % (docs/language-model.md), hence the default.
α (``mixing``, default 0.5, the paper's) is an argument because no one value
is right everywhere: other Streaming DiLoCo implementations default to α = 0,
which on the language model's parity runs did no worse than 0.5. α = 0 drops
those δ steps (every rank restarts from θ, stale by δ); α = 1 never pulls a
rank back to θ, so the ranks drift apart. At δ = 0 nothing is merged but θ:
the blocking rule above (x ← θ). The schedule: one synchronisation in flight
at a time, so a fragment's merge lands before the next fragment starts:

    δ < the shortest gap between two offsets = ⌊τ/F⌋    (δ < τ at F = 1)

refused otherwise in one line, as is overlap with an adaptive τ. Bytes and
calls are those without overlap, recorded at the start. With compression the
error-feedback residual e_i ← u_i − Q(u_i) is known at the start and kept at
the merge (if the step took effect). The in-flight state (its handle, which
fragment, the residual) is strategy state; a checkpoint first drains
(``drain``: the merge happens at once), so a saved state holds nothing in
flight. If a rank's Δ_i held NaN/Inf the outer step is skipped and every
rank restarts from θ, as without overlap.

Floating non-trainable state (BatchNorm's moving statistics) is not part of
the outer step (it is no gradient's weight): it follows the one rule of every
strategy (``hvd_easgd.statistics``), averaged at epoch ends outside the
account.
"""
import inspect

import keras
import numpy as np
import tensorflow as tf

from .. import resize, validation
from ..comm.compression import config_of
from ..comm.compression.kinds import PSEUDO_GRADIENTS
from .error_feedback import ErrorFeedback, error_feedback_wanted
from .base import CliOption, ExpectedTraffic, NoScaleRule, SyncStrategy, allreduce_traffic, check_count, \
    compression_for, gradient_format, state_variable_name
from .local_periods import LocalPeriods
from .local_updates import OVERLAP_HELP, KeepsSyncedWeights, MergesOnDrain, allreduce_unless_non_finite, \
    check_overlap, check_overlap_schedule, finish_allreduce_unless_non_finite, local_step, overlapped_share, \
    start_allreduce_unless_non_finite, synchronised_this_step
from .period_schedule import cli_period, make_schedule, parse_period
from .sync_average import SyncAverage

DEFAULT_OUTER_LEARNING_RATE = 0.7
DEFAULT_OUTER_MOMENTUM = 0.7  # the paper's 0.9 overshot here (module docstring)
# train.py's warm-up (``default_warmup_steps``): SyncAverage through the learning rate's warm-up where that
# warm-up holds fewer than this many periods. The paper's runs start from a data-parallel model; from a
# random one, a long period lets the ranks drift apart while the rate climbs, and the outer steps that
# would pull them together are few. On the language model at 2 ranks (160 warm-up updates of 3,200):
# tau = 50 (3.2 periods in the warm-up) ends 1.96 % behind SyncAverage from the first step, most of it
# made in the first half pass, and 1.23 % with the warm-up synchronous; tau = 10 (16 periods) ends
# 0.50 % ahead with none (docs/language-model.md). Between the two, at 10.
SYNCED_WARMUP_PERIODS = 10
DEFAULT_MIXING = 0.5  # Streaming DiLoCo's α for an overlapped merge (module docstring)
# How an overlapped merge sets the local weights (module docstring): "mix", Streaming DiLoCo's
# α-mix, or "progress", the new θ plus the rank's own steps since the start.
OVERLAP_MERGES = ("mix", "progress")
# "progress" since the language model's 3-seed table (docs/language-model.md): Streaming DiLoCo with it
# ended +1.75 % from SyncAverage, with the mix +3.81 %. A run saved before (its config names an overlap
# and no merge) mixed, and resumes so (app.config_compare.CHANGED_DEFAULTS).
DEFAULT_OVERLAP_MERGE = "progress"


@keras.saving.register_keras_serializable(package="hvd_easgd")
class DiLoCo(LocalPeriods, MergesOnDrain, KeepsSyncedWeights, SyncStrategy):
    """τ inner steps per rank, then one outer step on the mean pseudo-gradient.

    Args:
      period: τ, inner optimizer steps between outer steps (an integer >= 1).
      outer_learning_rate: η of the default outer optimizer (> 0; default 0.7).
      outer_momentum: μ of the default outer optimizer, Nesterov
        (0 <= μ < 1; default 0.7; the paper's 0.9 overshot on digits).
      outer_optimizer: a Keras optimizer to use instead of the default
        ``keras.optimizers.SGD(outer_learning_rate, momentum=outer_momentum,
        nesterov=True)``; then leave the two numbers at their defaults. Its
        slots are strategy state (``state_variables()``, checkpointed), and it
        serialises with the strategy. Each DiLoCo needs its own. The default
        one is made when the strategy is built (``outer_optimizer`` is None
        until then).
      warmup_steps: W, SyncAverage for this many optimizer steps first; at
        the switch θ ← x (every rank holds the same x) and t counts from there
        (``warmup.run_phases``, the rule of every warm-up; ``WarmUp(DiLoCo(...),
        W)`` computes the same). Default 0; train.py's default is
        ``default_warmup_steps``'s.
      compression: the pseudo-gradients' wire format (``"none"``, ``"fp16"``,
        ``"bf16"``, ``"int8"``, ``"int4"``, ``"sign"``, ``"topk"`` or a ``TopKCompression``
        of other density and bits; module docstring).
      fragments: F, Streaming DiLoCo's fragments (1 <= F <= τ; default 1).
      overlap: δ, the inner steps between a synchronisation's start and its
        merge (0 <= δ < ⌊τ/F⌋; default 0, blocking; module docstring).
      mixing: α, at an overlapped merge x ← α·x + (1 − α)·θ (0 <= α <= 1;
        None: 0.5, Streaming DiLoCo's); only with overlap >= 1 and the
        ``"mix"`` merge. Giving it chooses that merge.
      overlap_merge: how an overlapped merge sets the local weights:
        ``"progress"`` (x ← θ + x − x(s): the new θ plus this rank's own steps
        since the start; module docstring) or ``"mix"`` (the α-mix above).
        None: ``"mix"`` if ``mixing`` is given, else ``"progress"``.

    The kept model (``kept_variables()``) is θ, the synced weights: the one
    model every rank agrees on. It is up to τ − 1 inner steps behind the
    ranks' local weights between synchronisations. During a warm-up it is
    the weights themselves (θ is only taken from them at the switch).

    NaN/Inf: between synchronisations a rank drops its own non-finite update.
    At a synchronisation a rank whose Δ_i holds NaN/Inf sends zeros and raises
    the flag in the same call; the outer step is then skipped on every rank
    (``skipped_outer_steps`` counts it) and every rank restarts from the
    unchanged θ, which is finite.

    Example::

        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.AdamW(1e-3),
                                             strategy=hvd_easgd.DiLoCo(period=10))
    """

    name = "diloco"
    payload_kind = PSEUDO_GRADIENTS
    description = ("DiLoCo: tau local steps, then an outer Nesterov step on the averaged pseudo-gradient "
                   "(one grouped allreduce)")
    cli_options = (
        CliOption("--tau", "period", "optimizer steps between synchronisations (default 10), or 'adaptive' / "
                  "'adaptive:T0' for AdaComm's period from T0 (default 10)", type=cli_period),
        CliOption("--tau-max", "max_period", "the largest adaptive tau (required with --tau adaptive)", type=int),
        CliOption("--outer-lr", "outer_learning_rate", "learning rate of the outer Nesterov SGD (default 0.7)",
                  type=float),
        CliOption("--outer-momentum", "outer_momentum", "momentum of the outer Nesterov SGD (default 0.7)",
                  type=float),
        CliOption("--warmup-steps", "warmup_steps", "SyncAverage for this many steps first (default: the learning "
                  f"rate's warm-up where it holds fewer than {SYNCED_WARMUP_PERIODS} periods of tau, else 0)",
                  type=int),
        CliOption("--fragments", "fragments", "Streaming DiLoCo: synchronise F fragments of the variables at "
                  "staggered steps, 1 <= F <= tau (default 1)", type=int),
        CliOption("--overlap", "overlap", OVERLAP_HELP + "; with --fragments F, delta < tau // F", type=int),
        CliOption("--mixing", "mixing", "with --overlap: at a merge the local weights become mixing * local + "
                  "(1 - mixing) * synced, 0 <= mixing <= 1 (default 0.5, Streaming DiLoCo's); chooses "
                  "--overlap-merge mix", type=float),
        CliOption("--overlap-merge", "overlap_merge", "with --overlap: progress (the new synced weights plus the "
                  "rank's own steps since the synchronisation started; the default) or mix (the local weights "
                  "mixed with the new synced ones, --mixing)", choices=OVERLAP_MERGES),
    )
    # On a flat shard of the variables (Hierarchical shards the state across groups).
    across_groups = True

    @classmethod
    def implied_options(cls, options):
        """An overlap's merge: ``progress`` since it became the default, ``mix`` where ``--mixing`` is given."""
        if not options.get("overlap") or "overlap_merge" in options:
            return {}
        return {"overlap_merge": overlap_merge_of(None, "mixing" in options)}

    @classmethod
    def default_warmup_steps(cls, options, lr_warmup_updates):
        """The learning rate's warm-up where it holds fewer than ``SYNCED_WARMUP_PERIODS`` periods (τ, or an
        adaptive τ's start), else 0."""
        period, _ = parse_period(options.get("tau", inspect.signature(cls).parameters["period"].default))
        return lr_warmup_updates if lr_warmup_updates < SYNCED_WARMUP_PERIODS * period else 0

    def __init__(self, period=10, outer_learning_rate=DEFAULT_OUTER_LEARNING_RATE,
                 outer_momentum=DEFAULT_OUTER_MOMENTUM, outer_optimizer=None, warmup_steps=0, compression="none",
                 fragments=1, max_period=None, overlap=0, mixing=None, overlap_merge=None):
        super().__init__()
        self.period, self.schedule = make_schedule(period, max_period)
        self.fragments = validation.integer("fragments", fragments, minimum=1, maximum=self.period,
                                            condition=" (tau)")
        if self.fragments > 1 and self.schedule.adaptive:
            # Each fragment's offset is a fixed fraction of tau; an adaptive tau would move them all mid-interval.
            raise ValueError("`fragments` > 1 needs a fixed period: the fragments' offsets are fractions of tau. "
                             f"Received: fragments={fragments!r}, period={period!r}")
        self.overlap = check_overlap(overlap, self.period)
        check_overlap_schedule(self.overlap, self.schedule)
        if self.overlap >= self.period // self.fragments:
            raise ValueError(f"`overlap` must be below tau // fragments = {self.period // self.fragments} "
                             f"(period={self.period}, fragments={self.fragments}): a fragment's merge must land "
                             f"before the next fragment starts. Received: overlap={overlap!r}")
        if mixing is not None:
            validation.number("mixing", mixing, minimum=0, maximum=1, gloss="(alpha)")
            if not self.overlap:
                raise ValueError("`mixing` applies to an overlapped merge only: give `overlap` >= 1 with it (at "
                                 "overlap=0 every rank restarts from the synced weights). "
                                 f"Received: mixing={mixing!r}, overlap={overlap!r}")
        if overlap_merge is not None:
            validation.one_of("overlap_merge", overlap_merge, OVERLAP_MERGES)
            if not self.overlap:
                raise ValueError("`overlap_merge` applies to an overlapped merge only: give `overlap` >= 1 with "
                                 f"it. Received: overlap_merge={overlap_merge!r}, overlap={overlap!r}")
            if overlap_merge == "progress" and mixing is not None:
                raise ValueError("`mixing` is the \"mix\" merge's α; the \"progress\" merge keeps the rank's own "
                                 f"steps whole. Received: mixing={mixing!r}, overlap_merge='progress'")
        self.overlap_merge = overlap_merge_of(overlap_merge, mixing is not None)
        self.mixing = DEFAULT_MIXING if mixing is None else float(mixing)
        self.compression = compression_for(compression, self.payload_kind, self.name)
        self.error_feedback = None
        self.warmup_steps = validation.integer("warmup_steps", warmup_steps, minimum=0)
        # A child only with a warm-up: a DiLoCo without one keeps the state layout of its older checkpoints.
        self.warmup_strategy = SyncAverage(compression=gradient_format(self.compression)) if self.warmup_steps else None
        validation.number("outer_learning_rate", outer_learning_rate, minimum=0, min_inclusive=False)
        validation.number("outer_momentum", outer_momentum, minimum=0, maximum=1, max_inclusive=False)
        if outer_optimizer is not None:
            if not isinstance(outer_optimizer, keras.optimizers.Optimizer):
                raise validation.refusal("outer_optimizer", "a Keras optimizer or None", outer_optimizer)
            if (outer_learning_rate, outer_momentum) != (DEFAULT_OUTER_LEARNING_RATE, DEFAULT_OUTER_MOMENTUM):
                raise ValueError("`outer_learning_rate` and `outer_momentum` must keep their defaults when "
                                 "`outer_optimizer` is given: they configure the default outer optimizer, so set "
                                 "them on `outer_optimizer` instead. Received: "
                                 f"outer_learning_rate={outer_learning_rate!r}, outer_momentum={outer_momentum!r}, "
                                 f"outer_optimizer={outer_optimizer!r}")
        self.outer_learning_rate = float(outer_learning_rate)
        self.outer_momentum = float(outer_momentum)
        self._outer_optimizer_arg = outer_optimizer
        # The default one is made in build: a Keras optimizer creates TF variables, and train.py
        # builds its strategy before hvd_easgd.init() sets TF's thread counts and pins the GPU,
        # which TF refuses once it holds a variable.
        self.outer_optimizer = outer_optimizer

    def children(self):
        return (self.warmup_strategy,) if self.warmup_strategy is not None else ()

    def _build_state(self, trainable_variables, non_trainable_variables):
        if self.warmup_strategy is not None:
            self.warmup_strategy.build(trainable_variables)
        if self.outer_optimizer is None:
            self.outer_optimizer = keras.optimizers.SGD(self.outer_learning_rate, momentum=self.outer_momentum,
                                                        nesterov=True, name="diloco_outer_sgd")
        elif self.outer_optimizer.built:
            raise ValueError("`outer_optimizer` must not be built yet (used elsewhere?): each DiLoCo needs its own. "
                             f"Received: outer_optimizer={self.outer_optimizer!r}")
        self.variables = trainable_variables
        # θ starts equal to x, identical on all ranks after the initial broadcast.
        self.synced = [tf.Variable(v, trainable=False, name=state_variable_name("synced", v))
                       for v in trainable_variables]
        self.fragment_indices = fragment_layout(trainable_variables, self.fragments)
        self.outer_optimizers = [self.outer_optimizer] + [
            self.outer_optimizer.__class__.from_config({**self.outer_optimizer.get_config(),
                                                        "name": f"{self.outer_optimizer.name}_fragment_{f}"})
            for f in range(1, self.fragments)]
        for optimizer, indices in zip(self.outer_optimizers, self.fragment_indices):
            optimizer.build([self.synced[i] for i in indices])
        self.skipped_outer_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="diloco_skipped_outer_steps")
        self.error_feedbacks = [None] * self.fragments
        self.schedule.build(self)
        if error_feedback_wanted(self.compression):
            prefix = "diloco_residual"
            self.error_feedbacks = [ErrorFeedback(self, prefix, [trainable_variables[i] for i in indices])
                                    for indices in self.fragment_indices]
            self.error_feedback = self.error_feedbacks[0] if self.fragments == 1 else None
        if self.overlap:
            # The synchronisation in flight: its handle (0: none), its fragment, and with error
            # feedback this rank's residual, known at the start and kept at the merge.
            self.pending_handle = tf.Variable(0, dtype=tf.int64, trainable=False, name="diloco_pending_handle")
            self.pending_fragment = tf.Variable(0, dtype=tf.int64, trainable=False, name="diloco_pending_fragment")
            self.pending_errors = []
            # The "progress" merge's x(s): this rank's weights when its synchronisation started.
            self.pending_sent = []
            if self.overlap_merge == "progress":
                self.pending_sent = [tf.Variable(v, trainable=False, name=state_variable_name("diloco_pending_sent", v))
                                     for v in trainable_variables]
                self.set_resize_rule(resize.RESTART_AT_ZERO, self.pending_sent)  # never read once drained
            if error_feedback_wanted(self.compression):
                self.pending_errors = [tf.Variable(tf.zeros_like(v), trainable=False,
                                                   name=state_variable_name("diloco_pending_error", v))
                                       for v in trainable_variables]
                # Never read once drained (a saved state's handle is 0): zeros at another size.
                self.set_resize_rule(resize.RESTART_AT_ZERO, self.pending_errors)

    def _extra_state(self):
        residuals = [e for feedback in self.error_feedbacks if feedback is not None for e in feedback.residuals]
        slots = [v for optimizer in self.outer_optimizers for v in optimizer.variables]
        own = self.synced + slots + [self.skipped_outer_steps] + residuals + self.schedule.state()
        if self.overlap:
            own += [self.pending_handle, self.pending_fragment] + self.pending_errors + self.pending_sent
        return own

    def _sync_to_weights(self):
        """θ ← x (``KeepsSyncedWeights``): the first pseudo-gradient holds the τ local steps alone."""
        for s, v in zip(self.synced, self.variables):
            s.assign(v)

    def kept_variables(self):
        if self.warmup_steps and int(self.step_counter.numpy()) < self.warmup_steps:
            return None
        return self.synced

    # --- one step (LocalPeriods.step: the warm-up's, then _main_step) ----------------

    def fragment_offset(self, f):
        """The local step t (mod τ) at which fragment f synchronises: ⌊f·τ/F⌋."""
        return f * self.period // self.fragments

    def weights_synchronised(self):
        """Whether ANY fragment synchronised this step: the weights then changed beyond the
        update (Hierarchical gathers them); with F = 1 and no overlap the plain τ rule. With
        overlap δ the weights change at the merge, δ steps after a start at t − δ >= 1."""
        if self.fragments == 1 and not self.overlap:
            return synchronised_this_step(self)
        started = self.local_steps() - self.overlap
        phase = started % self.period
        hits = [tf.equal(phase, self.fragment_offset(f)) for f in range(self.fragments)]
        return tf.logical_and(tf.logical_and(self.step_counter > self.warmup_steps, started >= 1),
                              tf.reduce_any(tf.stack(hits)))

    def weight_synchronisations_per_step(self):
        return self.fragments / self.period

    def _main_step(self, grad_sums, variables, apply_update, sample_count, mean):
        local_step(self, grad_sums, variables, apply_update, sample_count, mean)
        if self.overlap:
            # A fixed τ (check_overlap_schedule). Never both at once: δ < ⌊τ/F⌋ puts every merge,
            # offset_f + δ, strictly between fragment f's start and fragment f + 1's.
            phase = self.local_steps() % self.period
            for f in range(self.fragments):
                merges = tf.logical_and(tf.equal(phase, self.fragment_offset(f) + self.overlap),
                                        self.pending_handle > 0)
                tf.cond(merges, lambda f=f: self._merge_fragment(f), tf.no_op)
                tf.cond(tf.equal(phase, self.fragment_offset(f)), lambda f=f: self._start_fragment(f), tf.no_op)
            return
        self.schedule.observe()
        if self.fragments == 1:
            tf.cond(self.schedule.due(self.local_steps()), self._synchronise, tf.no_op)
            return
        phase = self.local_steps() % self.period
        for f in range(self.fragments):
            tf.cond(tf.equal(phase, self.fragment_offset(f)), lambda f=f: self._outer_step(f), tf.no_op)

    def _synchronise(self):
        self._outer_step(0)
        self.schedule.after_sync(self.comm)
        return tf.no_op()

    def merge_at_end(self):
        """The partial period (``SyncStrategy.merge_at_end``): every fragment takes an outer step
        on the mean pseudo-gradient of the local steps since its last synchronisation, and every
        rank restarts from θ. A fragment that synchronised at the last step has no partial period
        and takes no step: θ is already its kept weights. Its Δ is zero then, but a compressed
        payload would still carry the error-feedback residual, and an outer step on it moves θ by
        the momentum's μ²·m besides; that extrapolation cost int8 and int4 DiLoCo 0.3-0.4 % of
        validation loss at the language model's budget. Decided by the step count, the same on
        every rank, so the ranks agree on which allreduces run. With overlap the synchronisation
        in flight is merged first."""
        super().merge_at_end()
        if not self._built or int(self.step_counter.numpy()) <= self.warmup_steps:
            return  # in the warm-up every rank holds the same weights, the kept model
        self.drain()
        for f in range(self.fragments):
            if not self.just_synchronised(f):
                self._outer_step(f)

    def just_synchronised(self, f):
        """Whether fragment f's last synchronisation started at the last local step (eager): its
        schedule's with F = 1 and no overlap (``synchronised_this_step``), else t ≡ ⌊f·τ/F⌋ (mod τ),
        t >= 1."""
        if self.fragments == 1 and not self.overlap:
            return bool(synchronised_this_step(self).numpy())
        t = int(self.local_steps().numpy())
        return t >= 1 and t % self.period == self.fragment_offset(f)

    def _outer_step(self, f=0):
        """Fragment f's synchronisation: its Δ, one allreduce, its outer step, x ← θ on its variables."""
        indices = self.fragment_indices[f]
        synced = [self.synced[i] for i in indices]
        variables = [self.variables[i] for i in indices]
        error_feedback, outer_optimizer = self.error_feedbacks[f], self.outer_optimizers[f]
        pseudo_gradients = self.weighed([s - v for s, v in zip(synced, variables)])
        if error_feedback is not None:
            pseudo_gradients = error_feedback.add(pseudo_gradients)
        if self.compression.name == "none":
            sums, bad_ranks = allreduce_unless_non_finite(self.comm, pseudo_gradients)
        else:
            sums, bad_ranks, errors = allreduce_unless_non_finite(self.comm, pseudo_gradients, self.compression,
                                                                  with_errors=True)

        def apply():
            size = tf.cast(self.comm.size, sums[0].dtype)
            outer_optimizer.apply([total / size for total in sums], synced)
            return tf.no_op()

        def skip():
            self.skipped_outer_steps.assign_add(1)
            return tf.no_op()

        tf.cond(tf.equal(bad_ranks, 0), apply, skip)
        if error_feedback is not None:
            error_feedback.keep(errors, tf.equal(bad_ranks, 0))
        # Every rank restarts from θ: the new one, or after a skip the unchanged one.
        for v, s in zip(variables, synced):
            v.assign(s)
        return tf.no_op()

    # --- overlap (module docstring) ---------------------------------------------------
    def _start_fragment(self, f):
        """Fragment f's Δ (+ e with error feedback) started; this rank's residual kept for the merge."""
        indices = self.fragment_indices[f]
        pseudo_gradients = self.weighed([self.synced[i] - self.variables[i] for i in indices])
        error_feedback = self.error_feedbacks[f]
        if error_feedback is not None:
            pseudo_gradients = error_feedback.add(pseudo_gradients)
        handle, errors = start_allreduce_unless_non_finite(self.comm, pseudo_gradients, self.compression)
        if error_feedback is not None:
            for i, e in zip(indices, errors):
                self.pending_errors[i].assign(e)
        for i in indices if self.pending_sent else ():
            self.pending_sent[i].assign(self.variables[i])
        self.pending_fragment.assign(f)
        self.pending_handle.assign(handle)
        return tf.no_op()

    def _merge_fragment(self, f):
        """Fragment f's outer step on the mean that arrived, then x ← α·x + (1 − α)·θ on its variables."""
        indices = self.fragment_indices[f]
        synced = [self.synced[i] for i in indices]
        variables = [self.variables[i] for i in indices]
        sums, bad_ranks = finish_allreduce_unless_non_finite(self.comm, self.pending_handle, synced)
        took_effect = tf.equal(bad_ranks, 0)

        def apply():
            size = tf.cast(self.comm.size, sums[0].dtype)
            self.outer_optimizers[f].apply([total / size for total in sums], synced)
            if self.pending_sent:  # "progress": the new θ plus this rank's steps since the start
                for v, s, sent in zip(variables, synced, [self.pending_sent[i] for i in indices]):
                    v.assign(s + (v - sent))
            else:
                for v, s in zip(variables, synced):
                    v.assign(self.mixing * v + (1.0 - self.mixing) * s)
            return tf.no_op()

        def skip():
            # As without overlap: every rank restarts from the unchanged θ (finite).
            self.skipped_outer_steps.assign_add(1)
            for v, s in zip(variables, synced):
                v.assign(s)
            return tf.no_op()

        tf.cond(took_effect, apply, skip)
        if self.error_feedbacks[f] is not None:
            self.error_feedbacks[f].keep([self.pending_errors[i] for i in indices], took_effect)
        self.pending_handle.assign(0)
        return tf.no_op()

    def _merge_pending(self):
        """``MergesOnDrain``: eager, the fragment in flight merged now."""
        self._merge_fragment(int(self.pending_fragment.numpy()))

    # --- the hooks (base.py) ----------------------------------------------------------
    @classmethod
    def lr_scale_factor(cls, size, accumulate=1, adaptive=False):
        """Refused: the inner rate sets how far the ranks drift in τ steps and
        ``--outer-lr`` how far the synced weights follow their mean drift; no
        single factor on ``--lr`` stands for both, and none was measured."""
        check_count("size", size)
        check_count("accumulate", accumulate)
        raise NoScaleRule(f"--strategy {cls.name} has no --scale-lr rule: the inner --lr sets the ranks' drift over "
                          "tau steps and --outer-lr how far the synced weights follow it; no one factor on --lr "
                          "scales both. Tune --lr and --outer-lr instead")

    def resize_refusal(self, saved_ranks, ranks):
        """None. The rule at p -> q ranks: the outer state, θ and the outer
        optimizer's slots (identical on every rank), is kept exactly, and so
        are the step counter (the τ phase) and the skip count
        (``resize.DEFAULT``). Every rank's local weights become the mean of
        the p ranks' x_j, and the inner optimizer's per-rank slots their mean.
        Why the mean and not θ: the pseudo-gradient is linear in x, so
        θ − mean_j(x_j) = mean_j(Δ_j) is the part of the next outer step the p
        ranks had already made since the last synchronisation; every new rank
        carries it, and the next outer step averages it once over the q ranks.
        Restarting from θ would drop those up to τ − 1 inner steps. At a
        synchronisation (x_j = θ) both are θ. Nothing is rescaled: Δ is
        averaged over the communicator's size, q.

        With fragments (F > 1) the same rule holds fragment by fragment: the
        layout depends on the variables alone, so it is the same at q; every
        fragment's θ and its own outer optimizer's slots are kept, the shared
        skip count too, the local weights of every fragment become the mean
        (a fragment synchronised at its last offset has x_j = θ there, so its
        mean is θ), and each fragment's error-feedback residuals restart at
        zero (``resize.RESTART_AT_ZERO``). The step counter keeps every
        fragment's phase.

        With overlap the pending state covers nothing: a checkpoint drains
        first, so the saved handle is 0 (nothing in flight, the next start
        falls on its phase) and the pending residuals, never read, restart at
        zero (``resize.RESTART_AT_ZERO``)."""
        return None

    def resize_notice(self, saved_ranks, ranks):
        return (f"the synced weights and the outer optimizer are kept, the local weights and inner slots are the "
                f"mean of the {saved_ranks} saved ranks'; the tau phase continues")

    def expected_traffic(self, trainable_variables, non_trainable_variables=(), hosts=1, ranks_per_host=1,
                         sample_counts=False):
        """On every τ-th step ONE call: Δ and the non-finite flag (module docstring); with
        ``fragments`` F calls per τ steps, one per fragment. With ``overlap`` all of it could
        run behind δ inner steps (``overlapped`` F·δ/τ) where the communicator
        ``reduces_in_background`` (``local_updates.overlapped_share``)."""
        size = hosts * ranks_per_host
        if size == 1:
            return ExpectedTraffic()
        sent = None
        for traffic in self._fragment_traffic(trainable_variables, size):
            sent = traffic if sent is None else sent + traffic
        return ExpectedTraffic(across_groups=sent.per(self.period), overlapped=overlapped_share(self))

    def _fragment_traffic(self, trainable_variables, size):
        has_alltoall = self.comm.has_alltoall if self.comm is not None else True
        return [allreduce_traffic([trainable_variables[i] for i in indices], size, self.compression, 1, has_alltoall)
                for indices in fragment_layout(trainable_variables, self.fragments)]

    def peak_sync_traffic(self, trainable_variables, size):
        """The bytes of the largest ONE synchronisation (the busiest fragment) at ``size`` ranks:
        about 1/F of F = 1's, where ``expected_traffic``'s average per step is unchanged."""
        if size == 1:
            return 0
        return max(traffic.bytes for traffic in self._fragment_traffic(trainable_variables, size))

    def get_config(self):
        outer = self._outer_optimizer_arg
        return {"period": self.schedule.config_period(), "outer_learning_rate": self.outer_learning_rate,
                "outer_momentum": self.outer_momentum,
                "outer_optimizer": None if outer is None else keras.saving.serialize_keras_object(outer),
                "warmup_steps": self.warmup_steps,
                **({"fragments": self.fragments} if self.fragments > 1 else {}),
                **({"overlap": self.overlap, "overlap_merge": self.overlap_merge} if self.overlap else {}),
                **({"mixing": self.mixing} if self.overlap and self.overlap_merge == "mix" else {}),
                **({"max_period": self.schedule.maximum} if self.schedule.adaptive else {}),
                **({"compression": config_of(self.compression)} if self.compression.name != "none" else {})}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if config.get("overlap_merge") == "progress" and config.get("mixing") == DEFAULT_MIXING:
            del config["mixing"]  # written beside every overlap before the merge was chosen by default
        if config.get("outer_optimizer") is not None:
            config["outer_optimizer"] = keras.saving.deserialize_keras_object(config["outer_optimizer"])
        return cls(**config)


def overlap_merge_of(overlap_merge, mixing_given):
    """The overlapped merge a DiLoCo runs: ``overlap_merge`` where given, else ``"mix"`` where a mixing
    factor is (it is that merge's α), else ``DEFAULT_OVERLAP_MERGE``. The one rule of the strategy and of
    the merge train.py names in config.yaml (``DiLoCo.implied_options``)."""
    return overlap_merge or ("mix" if mixing_given else DEFAULT_OVERLAP_MERGE)


def fragment_layout(variables, fragments):
    """The variable indices of each of ``fragments`` fragments: whole variables, in
    variable order, each to the fragment with the fewest bytes so far (ties: the
    lowest fragment). Refuses more fragments than variables (an empty fragment
    would synchronise nothing)."""
    if fragments > len(variables):
        raise ValueError(f"`fragments` must be at most the number of trainable variables ({len(variables)}; "
                         f"1 on Hierarchical's flat shard): a fragment holds whole variables. "
                         f"Received: fragments={fragments}")
    layout, loads = [[] for _ in range(fragments)], [0] * fragments
    for i, v in enumerate(variables):
        f = loads.index(min(loads))
        layout[f].append(i)
        loads[f] += int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size
    return layout
