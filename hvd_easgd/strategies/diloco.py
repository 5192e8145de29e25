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
where they ran at different TF thread counts (another summation order). With
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
ones), and with bf16, int8 and int4 each rank keeps its quantisation
residual e_i and sends Δ_i + e_i next time (``error_feedback.py``); the
outer optimizer steps on the decoded mean. The bytes are those of
``allreduce_traffic`` (the flag an exact value of the quantised allreduce).

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
(refused at build); on Hierarchical's flat shard (one variable) F > 1 is
refused.

Floating non-trainable state (BatchNorm's moving statistics) is not part of
the outer step (it is no gradient's weight): it follows the one rule of every
strategy (``hvd_easgd.statistics``), averaged at epoch ends outside the
account.
"""
import keras
import numpy as np
import tensorflow as tf

from .. import validation
from ..comm.compression.kinds import PSEUDO_GRADIENTS
from .error_feedback import ErrorFeedback, error_feedback_wanted
from .base import CliOption, ExpectedTraffic, NoScaleRule, SyncStrategy, allreduce_traffic, check_count, \
    compression_for, state_variable_name
from .local_updates import KeepsSyncedWeights, allreduce_unless_non_finite, check_period, local_step, \
    synchronised_this_step
from .sync_average import SyncAverage
from .warmup import run_phases

DEFAULT_OUTER_LEARNING_RATE = 0.7
DEFAULT_OUTER_MOMENTUM = 0.7  # the paper's 0.9 overshot here (module docstring)


@keras.saving.register_keras_serializable(package="hvd_easgd")
class DiLoCo(KeepsSyncedWeights, SyncStrategy):
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
        W)`` computes the same). Default 0.

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
        CliOption("--tau", "period", "optimizer steps between synchronisations (default 10)", type=int),
        CliOption("--outer-lr", "outer_learning_rate", "learning rate of the outer Nesterov SGD (default 0.7)",
                  type=float),
        CliOption("--outer-momentum", "outer_momentum", "momentum of the outer Nesterov SGD (default 0.7)",
                  type=float),
        CliOption("--warmup-steps", "warmup_steps", "SyncAverage for this many steps first (default 0)", type=int),
        CliOption("--fragments", "fragments", "Streaming DiLoCo: synchronise F fragments of the variables at "
                  "staggered steps, 1 <= F <= tau (default 1)", type=int),
    )
    # On a flat shard of the variables (Hierarchical shards the state across groups).
    across_groups = True

    def __init__(self, period=10, outer_learning_rate=DEFAULT_OUTER_LEARNING_RATE,
                 outer_momentum=DEFAULT_OUTER_MOMENTUM, outer_optimizer=None, warmup_steps=0, compression="none", fragments=1):
        super().__init__()
        self.period = check_period(period)
        self.fragments = validation.integer("fragments", fragments, minimum=1, maximum=self.period,
                                            condition=" (tau)")
        self.compression = compression_for(compression, self.payload_kind, self.name)
        self.error_feedback = None
        self.warmup_steps = validation.integer("warmup_steps", warmup_steps, minimum=0)
        # A child only with a warm-up: a DiLoCo without one keeps the state layout of its older checkpoints.
        self.warmup_strategy = SyncAverage(compression=self.compression.name) if self.warmup_steps else None
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
        if error_feedback_wanted(self.compression):
            prefix = "diloco_residual"
            self.error_feedbacks = [ErrorFeedback(self, prefix, [trainable_variables[i] for i in indices])
                                    for indices in self.fragment_indices]
            self.error_feedback = self.error_feedbacks[0] if self.fragments == 1 else None

    def _extra_state(self):
        residuals = [e for feedback in self.error_feedbacks if feedback is not None for e in feedback.residuals]
        slots = [v for optimizer in self.outer_optimizers for v in optimizer.variables]
        return self.synced + slots + [self.skipped_outer_steps] + residuals

    def _sync_to_weights(self):
        """θ ← x (``KeepsSyncedWeights``): the first pseudo-gradient holds the τ local steps alone."""
        for s, v in zip(self.synced, self.variables):
            s.assign(v)

    def kept_variables(self):
        if self.warmup_steps and int(self.step_counter.numpy()) < self.warmup_steps:
            return None
        return self.synced

    def local_steps(self):
        """t: optimizer steps since the warm-up ended (the τ counter)."""
        return self.step_counter - self.warmup_steps

    # --- one step ----------------------------------------------------------------

    def fragment_offset(self, f):
        """The local step t (mod τ) at which fragment f synchronises: ⌊f·τ/F⌋."""
        return f * self.period // self.fragments

    def weights_synchronised(self):
        """Whether ANY fragment synchronised this step: the weights then changed beyond the
        update (Hierarchical gathers them); with F = 1 the plain τ rule."""
        if self.fragments == 1:
            return synchronised_this_step(self)
        phase = self.local_steps() % self.period
        hits = [tf.equal(phase, self.fragment_offset(f)) for f in range(self.fragments)]
        return tf.logical_and(self.step_counter > self.warmup_steps, tf.reduce_any(tf.stack(hits)))

    def weight_synchronisations_per_step(self):
        return self.fragments / self.period

    def step(self, grad_sums, variables, apply_update, sample_count=None, mean=True):
        run_phases(self.step_counter, self.warmup_steps,
                   lambda: self.warmup_strategy.step(grad_sums, variables, apply_update, sample_count, mean),
                   lambda: self._local_step(grad_sums, variables, apply_update, sample_count, mean),
                   self.on_warmup_end, main_counts=True)

    def _local_step(self, grad_sums, variables, apply_update, sample_count, mean):
        local_step(self, grad_sums, variables, apply_update, sample_count, mean)
        phase = self.local_steps() % self.period
        for f in range(self.fragments):
            tf.cond(tf.equal(phase, self.fragment_offset(f)), lambda f=f: self._outer_step(f), tf.no_op)

    def _outer_step(self, f=0):
        """Fragment f's synchronisation: its Δ, one allreduce, its outer step, x ← θ on its variables."""
        indices = self.fragment_indices[f]
        synced = [self.synced[i] for i in indices]
        variables = [self.variables[i] for i in indices]
        error_feedback, outer_optimizer = self.error_feedbacks[f], self.outer_optimizers[f]
        pseudo_gradients = [s - v for s, v in zip(synced, variables)]
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

    # --- the hooks (base.py) ----------------------------------------------------------
    @classmethod
    def lr_scale_factor(cls, size, accumulate=1):
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
        averaged over the communicator's size, q."""
        return None

    def resize_notice(self, saved_ranks, ranks):
        return (f"the synced weights and the outer optimizer are kept, the local weights and inner slots are the "
                f"mean of the {saved_ranks} saved ranks'; the tau phase continues")

    def expected_traffic(self, trainable_variables, non_trainable_variables=(), hosts=1, ranks_per_host=1,
                         sample_counts=False):
        """On every τ-th step ONE call: Δ and the non-finite flag (module docstring)."""
        size = hosts * ranks_per_host
        if size == 1:
            return ExpectedTraffic()
        sent = None
        for traffic in self._fragment_traffic(trainable_variables, size):
            sent = traffic if sent is None else sent + traffic
        return ExpectedTraffic(across_groups=sent.per(self.period))

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
        return {"period": self.period, "outer_learning_rate": self.outer_learning_rate,
                "outer_momentum": self.outer_momentum,
                "outer_optimizer": None if outer is None else keras.saving.serialize_keras_object(outer),
                "warmup_steps": self.warmup_steps,
                **({"fragments": self.fragments} if self.fragments > 1 else {}),
                **({"compression": self.compression.name} if self.compression.name != "none" else {})}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if config.get("outer_optimizer") is not None:
            config["outer_optimizer"] = keras.saving.deserialize_keras_object(config["outer_optimizer"])
        return cls(**config)


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
