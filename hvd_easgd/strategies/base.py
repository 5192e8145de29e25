"""The sync-strategy protocol: how workers combine their work over allreduce.

A strategy is small and explicit, in the spirit of optax's init/update pair:

* ``bind(comm)``: receives the communicator it will use (injected, so tests
  can hand in a one-process or a simulated many-rank one);
* ``build(trainable_variables, non_trainable_variables)``: creates the
  strategy's state as TF variables (eagerly, once), so it checkpoints with the
  model;
* ``step(grad_sums, variables, apply_update, sample_count=None, mean=True)``:
  one optimizer step. It decides what to reduce, calls ``apply_update(grads)``
  (the inner optimizer) zero or one time, and may then act on the weights
  (EASGD's elastic pull). It runs inside the training step's ``tf.function``;
* ``children()``: the strategies it contains and steps through (EASGD's
  warm-up SyncAverage, the strategy GradientAccumulation wraps), so callbacks
  walk the tree (``walk``) instead of guessing from attributes.

What ``grads`` and ``sample_count`` mean
----------------------------------------
Users call ``DistributedOptimizer.apply(grads, variables, sample_count=n)``
with ``grads`` the gradient of the loss *averaged over the n samples* of that
call (what a Keras loss gives), or ``sample_count=None`` for "weight 1 per
call, take the grads as they are". Strategies work on *sums*: the optimizer
converts once, in ``gradient_sums``, and every strategy receives the same
thing:

* ``grad_sums``: S = n·g per rank (S = g when the count is None);
* ``sample_count``: n, an int64 tensor, or None for "1 on every rank" (then
  it need not travel: every rank knows it).

With ``mean=True`` a strategy applies the per-sample mean over what it
combines, ΣS / Σn (summed over ranks and accumulated calls); with
``mean=False`` it applies the sum ΣS. A count of zero means "this rank has
nothing this step": its S is exactly zero even when its g is NaN (the mean of
an empty batch is 0/0), it never counts as a non-finite step, and it must
never desynchronise the ranks.

What a strategy knows about itself (the hooks)
----------------------------------------------
Everything the application and the benchmarks need to know about a strategy
is asked of the strategy, never looked up in a table of names; each hook has
a default here and composites answer by asking their children:
``lr_scale_factor(size, accumulate=1)`` (the factor ``--scale-lr``
multiplies ``--lr`` by, or ``NoScaleRule`` with the reason there is none; the
default refuses; asked of the configured strategy, so a rule that needs its
options is an instance method, Hierarchical's, and one that needs none a
classmethod, callable on the class too), ``resize_refusal(saved_ranks, ranks)``
(why a checkpoint saved at ``saved_ranks`` cannot resume at ``ranks``, or
None; the default refuses, as per-rank state has no rule) and
``resize_notice(saved_ranks, ranks)`` (what such a resume changes, or None),
``resize_rules()`` (what each of its state variables becomes at the new size:
``hvd_easgd.resize``'s rules, declared per variable with ``set_resize_rule``;
the rest follow ``resize.DEFAULT``) and ``resized_weights()`` (the variables
every rank's weights restart from after such a resume, or None: the weights
follow their own rule, the mean of the saved ranks' where they differ),
``needs_process_groups()`` (whether it splits the ranks into groups, asked
before the ranks start) and ``process_groups()`` (those groups once bound, or
None), the class attribute ``across_groups`` (whether ``Hierarchical`` may run
it across its groups, each group acting as one worker), and
``expected_traffic(trainable_variables, non_trainable_variables, hosts,
ranks_per_host, sample_counts)`` (one rank's bytes and calls per training
step, per level, as ``ExpectedTraffic``), and ``weights_synchronised()`` /
``weight_synchronisations_per_step()`` (whether a step changed the weights
beyond its update, and how often: Hierarchical gathers a sharded inter
strategy's weights after such a step). With ``name``, ``description`` and
``cli_options`` these are all a strategy defined outside the package needs to
work wherever a built-in does (docs/plugins.md).
"""
from dataclasses import dataclass, field

import keras
import tensorflow as tf

from .. import validation
from . import sample_shares
from ..comm import Compression, LocalCommunicator
from ..comm import quantised_allreduce, sparse_allreduce
from ..comm.communicator import WIRE_FACTORS
from ..comm.compression import GRADIENTS


@dataclass(frozen=True)
class CliOption:
    """A command-line flag of a strategy; the CLI builds its parser from these.

    ``switch`` flags take no value and pass ``switch_value`` to ``kwarg``. A
    flag that names another strategy sets ``strategies_where``, a predicate on
    strategy classes: its choices are the registered strategies it holds for
    (``registry.choices``), so a plugin's strategy can be chosen too.
    """

    flag: str
    kwarg: str
    help: str
    type: object = None
    choices: tuple = None
    switch: bool = False
    switch_value: object = True
    strategies_where: object = None


class NoScaleRule(ValueError):
    """``--scale-lr`` has no rule for this strategy; the message says why."""


@dataclass(frozen=True)
class Traffic:
    """One rank's collective traffic per training step (one call of ``step``):
    payload bytes, collective calls and wire bytes (what the rank sends under
    the collectives' algorithms: ``comm/communicator.py``), averaged over the
    strategy's period (τ steps, k micro-batches) once any warm-up is over.

    ``by_collective`` splits the same totals by the collective that carries
    them (``Traffic.of``): ``((kind, bytes, calls, wire_bytes), ...)`` sorted
    by kind, a kind being a key of ``WIRE_FACTORS`` (allreduce, allgather,
    alltoall, reducescatter, broadcast). A cost model charges each kind by its
    own algorithm (``hvd_easgd/choosing/cost_model.py``): a quantised allreduce is an
    alltoall and an allgather, not an allreduce. Equality compares the totals.
    """

    bytes: float = 0.0
    calls: float = 0.0
    wire_bytes: float = 0.0
    by_collective: tuple = field(default=(), compare=False)

    @classmethod
    def of(cls, collective, sent, calls, wire_bytes):
        """``calls`` calls of the collective ``collective`` carrying ``sent`` payload bytes."""
        if collective not in WIRE_FACTORS:
            raise ValueError(f"`collective` must be one of {', '.join(WIRE_FACTORS)}. "
                             f"Received: collective={collective!r}")
        sent, calls, wire_bytes = float(sent), float(calls), float(wire_bytes)
        return cls(sent, calls, wire_bytes, ((collective, sent, calls, wire_bytes),))

    def __add__(self, other):
        merged = {}
        for kind, *values in self.by_collective + other.by_collective:
            merged[kind] = [a + b for a, b in zip(merged.get(kind, (0.0, 0.0, 0.0)), values)]
        return Traffic(self.bytes + other.bytes, self.calls + other.calls, self.wire_bytes + other.wire_bytes,
                       tuple((kind, *merged[kind]) for kind in sorted(merged)))

    def per(self, steps):
        """This traffic spread over ``steps`` training steps (once every ``steps``)."""
        return Traffic(self.bytes / steps, self.calls / steps, self.wire_bytes / steps,
                       tuple((kind, b / steps, c / steps, w / steps) for kind, b, c, w in self.by_collective))


NO_TRAFFIC = Traffic()


@dataclass(frozen=True)
class ExpectedTraffic:
    """A strategy's expected traffic per rank and training step, by level.

    The ranks form groups of ``ranks_per_group`` (Hierarchical's groups); a
    flat strategy's groups are single ranks, so all of its traffic is
    ``across_groups`` and ``ranks_per_group`` is 1. The ``across_groups``
    collectives run in ``ranks_per_group`` sets side by side (the j-th rank of
    every group), each over one rank per group. ``overlapped`` is the share w
    of the steps' compute during which that communication runs (0: none; a
    δ-step overlap of F syncs per τ steps: F·δ/τ), so a cost model charges a
    step c + max(0, comm − w·c) (``hvd_easgd/choosing/cost_model.py``).
    """

    within_group: Traffic = NO_TRAFFIC
    across_groups: Traffic = NO_TRAFFIC
    ranks_per_group: int = 1
    overlapped: float = 0.0

    @property
    def total(self):
        """Both levels: what ``comm.account()`` of one rank grows by per step."""
        return self.within_group + self.across_groups


def payload_bytes(variables, compression=Compression.none):
    """Σ elements · bytes per element over ``variables`` (anything with ``shape``
    and ``dtype``), each element as ``compression`` puts its dtype on the wire."""
    total = 0
    for v in variables:
        elements = 1
        for dim in v.shape:
            elements *= int(dim)
        total += elements * compression.wire_itemsize(v.dtype)
    return total


def allreduce_traffic(variables, size, compression=Compression.none, exact_values=0, has_alltoall=True):
    """One allreduce of tensors shaped like ``variables`` plus ``exact_values``
    one-element tensors (a flag, a sample count) of the first one's dtype, at
    ``size`` ranks, as ``Communicator.allreduce`` sends it with ``compression``.

    Returns:
      A ``Traffic``: one allreduce of ``payload_bytes`` and its ring figure
      2(p−1)/p on the wire for a summable format; the quantised allreduce's
      alltoall and allgather (``comm/quantised_allreduce.py``) for bf16, int8
      and int4; the sparse allreduce's allgather (``comm/sparse_allreduce.py``)
      for topk.
    """
    if compression.summable:
        sent = payload_bytes(variables, compression) + exact_values * element_bytes(variables, compression)
        return Traffic.of("allreduce", sent, 1, sent * WIRE_FACTORS["allreduce"](size))
    elements, exact = quantised_allreduce.split_payload([v.shape for v in variables])
    if compression.sparse:
        parts = sparse_allreduce.expected_collectives(elements, exact + exact_values, compression, size)
    else:
        parts = quantised_allreduce.expected_collectives(elements, exact + exact_values, compression, size,
                                                         has_alltoall)
    return sum((Traffic.of(*part) for part in parts), NO_TRAFFIC)


def compression_for(compression, kind, strategy_name):
    """The format ``compression`` (a name, a format, or ``compression.config_of``'s form of one) for a
    strategy sending ``kind``.

    Raises the Keras-form ``ValueError`` when the format does not apply to
    that kind of payload (``powersgd`` outside SyncAverage, ``topk`` outside
    DiLoCo and EASGD).
    """
    choice = Compression.of(compression)
    if kind not in choice.applies_to:
        raise ValueError(f"`compression` must be a format that applies to {kind} (what --strategy {strategy_name} "
                         f"sends); {choice.name} applies to {', '.join(sorted(choice.applies_to))} only. "
                         f"Received: compression={choice.name!r}")
    return choice


def gradient_format(compression):
    """What a warm-up's SyncAverage sends its gradients in: ``compression``'s name where it applies to
    gradients, else ``"none"`` (topk applies to pseudo-gradients and elastic differences only)."""
    return compression.name if GRADIENTS in compression.applies_to else "none"


def element_bytes(variables, compression=Compression.none):
    """The bytes of one element of the first variable's dtype on the wire: what a
    flag or a sample count riding in the same grouped call costs."""
    return compression.wire_itemsize(variables[0].dtype)


def as_dense(grad, variable):
    """Densifies IndexedSlices and stands zeros in for None, so every rank
    hands the same list of tensors to the collective."""
    if grad is None:
        return tf.zeros_like(variable)
    if isinstance(grad, tf.IndexedSlices):
        return tf.convert_to_tensor(grad)
    return grad


def all_finite(tensors):
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


def zeros_unless(condition, make_tensors):
    """``make_tensors()`` where the scalar ``condition`` holds, else zeros of
    the same shapes.

    A ``tf.cond``, not ``tf.where``: a where with a scalar condition allocates
    the zeros and makes one more pass over every tensor on every call, which on
    a 5 M-parameter model measured about a quarter of EASGD's elastic
    arithmetic. It also never multiplies by the condition: 0 · NaN is NaN.
    """
    def zeros():
        return [tf.zeros_like(t) for t in make_tensors()]

    return tf.cond(condition, lambda: [tf.identity(t) for t in make_tensors()], zeros)


def gradient_sums(grads, variables, sample_count=None):
    """The one conversion from the public contract to the strategies' one.

    Args:
      grads: per variable, the gradient of the loss averaged over the call's
        ``sample_count`` samples (None or IndexedSlices allowed).
      variables: the variables, in the same order.
      sample_count: n, a non-negative integer (Python or tensor), or None.

    Returns:
      ``(grad_sums, count)``: dense S = n·g (exactly zero when n = 0, even
      for a NaN g) and n as an int64 tensor; or the dense grads and None when
      ``sample_count`` is None.
    """
    dense = [as_dense(g, v) for g, v in zip(grads, variables)]
    if sample_count is None:
        return dense, None
    # A Python number is checked here; a tensor is the caller's (it is traced).
    if isinstance(sample_count, bool) or (validation.is_number(sample_count) and not (
            sample_count >= 0 and float(sample_count).is_integer())):
        raise validation.refusal("sample_count", "an integer >= 0 (the number of samples the grads are averaged "
                                 "over) or None", sample_count)
    count = count_as(sample_count, tf.int64)
    # Zeros, not a product, without samples: an empty batch's mean is NaN.
    sums = zeros_unless(count > 0, lambda: [g * tf.cast(count, g.dtype) for g in dense])
    return sums, count


def count_as(sample_count, dtype):
    """The sample count n as a scalar tensor of ``dtype``: the one conversion of a count.

    Args:
      sample_count: n (a Python integer or a tensor), or None for "no count",
        which weighs every call 1.
      dtype: the dtype wanted: int64 to keep n, the gradients' dtype to divide
        by it or to send it (``count_on_the_wire``).

    Returns:
      n (1 for None) as a scalar tensor of ``dtype``.
    """
    if sample_count is None:
        return tf.constant(1, dtype)
    return tf.cast(sample_count, dtype)


def count_on_the_wire(sample_count, dtype):
    """n as the one-element tensor that rides in the gradients' allreduce.

    Horovod groups one dtype per call, so the count travels in the gradients'
    dtype, as one more tensor of their grouped call (exact to 2**24 in fp32;
    to 2048 under fp16 compression). ``count_off_the_wire`` reads the sum back.

    Args:
      sample_count: n (a Python integer or a tensor; not None).
      dtype: the gradients' dtype.

    Returns:
      n as a tensor of shape [1] and ``dtype``.
    """
    return tf.reshape(count_as(sample_count, dtype), [1])


def count_off_the_wire(summed):
    """Σn, from the reduced tensor ``count_on_the_wire`` sent, as an int64 scalar."""
    return tf.cast(tf.round(summed[0]), tf.int64)


def state_variable_name(prefix, variable):
    """``prefix/<the variable's Keras path>``: unique per model, unlike
    ``variable.name`` (every Dense layer's kernel is named "kernel")."""
    path = getattr(variable, "path", None) or variable.name
    return f"{prefix}/{path}".replace(":", "_")


class SyncStrategy:
    """Base class. Subclasses set ``name`` and ``description`` and implement
    ``step``; they override the hooks below whose default does not fit them."""

    name = None
    description = ""
    # Command-line flags (CliOption). Strategies may share a flag (``--tau``).
    cli_options = ()
    # Whether Hierarchical may run this strategy across its groups (``--inter``):
    # it must take a group's gradient sums and sample count as one worker's.
    across_groups = False
    # ``(kwarg, default name)`` for a strategy that contains another one chosen
    # by name on the command line (Hierarchical's ``--inter``): the CLI builds
    # that one from the flags it declares and passes it as ``kwarg``.
    cli_delegate = None

    @classmethod
    def implied_options(cls, options):
        """``{option key: value}`` that a command line giving ``options`` (its strategy options, keyed as
        config.yaml names them) leaves to a default which config.yaml must name anyway: a default that
        changed, so that a run saved before the change can tell, and resume with what it ran
        (``app.config_compare.CHANGED_DEFAULTS``). None here."""
        return {}

    @classmethod
    def default_warmup_steps(cls, options, lr_warmup_updates):
        """train.py's ``--warmup-steps`` for a run that does not give it: the synchronous steps this
        strategy starts with, given its ``options`` (keyed as config.yaml names them) and the learning
        rate schedule's warm-up (``lr_warmup_updates`` updates). None: the strategy has no such rule,
        and its constructor's default stands."""
        return None

    def __init__(self):
        self.comm = None
        self._built = False
        self.step_counter = None
        self.skip_counts = None
        # Set by DistributedOptimizer when its inner optimizer is a Keras
        # LossScaleOptimizer: a callable returning the current loss scale. The
        # gradients a step receives are then multiplied by that scale, and the
        # inner optimizer takes the overflow decision itself (see _apply_if).
        self.loss_scale = None
        # {id(variable): (variable, resize rule)} for the state whose rule is not resize.DEFAULT
        # (set_resize_rule); by id, as Keras variables are not hashable by value, and holding the variable.
        self._resize_rules = {}
        # p·w_r, this rank's weight in an average (set_sample_shares); None: every rank weighs 1.
        self._share_weight = None

    # --- the tree of strategies -----------------------------------------------
    def children(self):
        """The strategies this one contains and steps through; leaves have none."""
        return ()

    # --- wiring ---------------------------------------------------------------
    def bind(self, comm):
        """Hands ``comm`` to this strategy and every strategy it contains."""
        self.comm = comm
        for child in self.children():
            child.bind(comm)
        return self

    def _ensure_comm(self):
        if self.comm is None:
            self.bind(LocalCommunicator())
        return self.comm

    @property
    def built(self):
        return self._built

    def build(self, trainable_variables, non_trainable_variables=()):
        """Creates the state. Always called outside any trace (under init_scope)."""
        self._ensure_comm()
        with tf.init_scope():
            # Optimizer steps taken (or skipped) through this strategy.
            self.step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{type(self).__name__}_step")
            # [steps whose update was dropped because it held NaN/Inf, the
            # current run of such steps]: one variable, so a step pays one update.
            self.skip_counts = tf.Variable([0, 0], dtype=tf.int64, trainable=False,
                                           name=f"{type(self).__name__}_skips")
            self._build_state(list(trainable_variables), list(non_trainable_variables))
        self._built = True

    def _build_state(self, trainable_variables, non_trainable_variables):
        """Subclass hook: create extra state variables (and build the children)."""
        return None

    def state_variables(self):
        """Every variable the strategy and its children own, in a stable
        order; checkpoints must hold them."""
        if not self._built:
            return []
        own = [self.step_counter, self.skip_counts] + self._extra_state()
        return own + [v for child in self.children() for v in child.state_variables()]

    def _extra_state(self):
        """Subclass hook: this strategy's own variables beyond the counters."""
        return []

    @property
    def skipped_steps(self):
        """Steps skipped because their update held NaN/Inf."""
        return self.skip_counts[0]

    @property
    def consecutive_skips(self):
        """The current run of such steps (0 after any finite step)."""
        return self.skip_counts[1]

    def on_initial_state_synced(self):
        """Called once every rank holds rank 0's initial weights."""
        for child in self.children():
            child.on_initial_state_synced()

    def on_warmup_end(self):
        """Called inside the traced step when a warm-up hands over to this
        strategy (``warmup.run_phases``): every rank now holds the same
        weights, and a strategy that keeps a copy of them (EASGD's center,
        DiLoCo's synced weights) takes it from them here. The default asks
        the children."""
        for child in self.children():
            child.on_warmup_end()

    def on_state_restored(self):
        """Called eagerly once a checkpoint's values are in ``state_variables()``:
        a strategy whose saved state changed meaning reads an older one here."""
        for child in self.children():
            child.on_state_restored()

    def drain(self):
        """Eager, on every rank alike: completes and merges a synchronisation in flight
        (``overlap``), so that the state holds nothing pending. Called before a
        checkpoint is written and before the kept model is evaluated or saved;
        the default asks the children."""
        for child in self.children():
            child.drain()

    def merge_at_end(self):
        """Eager, on every rank alike, once training is over (after ``drain``): merges what
        the ranks hold since their last synchronisation into the kept model, so that the
        model you keep holds every update (DiLoCo: an outer step on the partial period;
        PeriodicAverage: an average; EASGD: the center onto the workers' mean). The
        training state a checkpoint holds is never merged: the merge comes after the
        last one. The default asks the children (nothing to merge without any)."""
        for child in self.children():
            child.merge_at_end()

    def kept_variables(self):
        """The variables of the model you keep, one per trainable variable, in
        the order ``build`` received them; ``None`` when the kept model is the
        model's own weights (SyncAverage). EASGD keeps its center x̃."""
        return None

    def weights_synchronised(self):
        """A boolean tensor, read inside the trace right after ``step``: whether
        that step changed the variables other than through ``apply_update``
        (EASGD's elastic pull, PeriodicAverage's average, DiLoCo's outer step).
        Hierarchical gathers a sharded inter strategy's weights within the group
        when it did. The default asks the children (False without any)."""
        flags = [child.weights_synchronised() for child in self.children()]
        return tf.reduce_any(tf.stack(flags)) if flags else tf.constant(False)

    def weight_synchronisations_per_step(self):
        """How often ``weights_synchronised`` holds, per optimizer step once any
        warm-up is over (1/τ for a τ-strategy): for ``expected_traffic``. The
        default: the children's largest (0 without any)."""
        return max((child.weight_synchronisations_per_step() for child in self.children()), default=0.0)

    # --- ranks of unequal speed (hvd_easgd/strategies/sample_shares.py) ------------
    # Whether the strategy weighs what each rank contributes by its share of the samples.
    # A strategy that averages with a different rule (EASGD's center, Hierarchical's groups) says no.
    takes_sample_shares = True

    def set_sample_shares(self, shares):
        """Weighs this rank's contribution to every average by its share of the global batch.

        Args:
          shares: rank r's micro-batch b_r, one integer per rank, the same list on
            every rank (``sample_shares.from_speeds``).

        From then on the strategy averages Σ_r w_r t_r with w_r = b_r / Σ b (its
        tensors scaled by p·w_r into the Sum it already makes; a rank of share 0
        sends zeros). Equal shares give exactly the unweighted average. Call it
        before the first step is traced (the trace holds whether to weigh) and
        again with new shares at any step boundary: the weight is a variable.
        Every strategy this one contains weighs alike.
        """
        comm = self._ensure_comm()
        shares = sample_shares.check(shares, comm.size)
        if not self.takes_sample_shares:
            if not sample_shares.equal(shares):
                raise ValueError(f"{_equal_shares_only(self)} Received: shares={list(shares)!r}")
            return  # equal shares are the unweighted average it makes
        weight = sample_shares.weight(shares, comm.rank)
        with tf.init_scope():
            if self._share_weight is None:
                self._share_weight = tf.Variable(weight, dtype=tf.float32, trainable=False,
                                                 name=f"{type(self).__name__}_share_weight")
            else:
                self._share_weight.assign(weight)
        for child in self.children():
            child.set_sample_shares(shares)

    # Why a strategy that does not take unequal shares refuses them (its set_sample_shares message).
    sample_shares_refusal = ""

    def weighed(self, tensors):
        """``tensors`` as this rank sends them into an average: scaled by p·w_r
        (``set_sample_shares``; as they are without shares). A rank of weight 0
        sends zeros, never 0·NaN."""
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        if self._share_weight is None:
            return tensors
        weight = self._share_weight
        return zeros_unless(weight > 0, lambda: [t * tf.cast(weight, t.dtype) for t in tensors])

    # --- what the strategy knows about itself (the hooks) -------------------------
    @classmethod
    def lr_scale_factor(cls, size, accumulate=1, adaptive=False):
        """The factor ``--scale-lr`` multiplies ``--lr`` by for this strategy.

        train.py asks the strategy it built (an instance, options and all); a
        classmethod here answers for any options, and an override whose rule
        depends on the options (Hierarchical's n and inter strategy) is a plain
        method. An override's first docstring line is its rule in one line (train.py's
        ``--help`` lists it); the lines after it give the measurements.

        Args:
          size: the number of ranks.
          accumulate: k, micro-batches per update (1 without accumulation).
          adaptive: the rule for an adaptive optimizer (Adam: its step is set
            by the rate, not by the gradient's size, so a rule derived for SGD
            does not carry over); False: SGD's, with or without momentum.

        Returns:
          The factor, a float >= 1.

        Raises:
          NoScaleRule: the strategy has no measured rule for that optimizer
            (this default: a strategy that declares none); the message says why.
        """
        check_count("size", size)
        check_count("accumulate", accumulate)
        raise NoScaleRule(f"--strategy {cls.name} has no --scale-lr rule: it declares none "
                          "(lr_scale_factor); tune --lr")

    def resize_refusal(self, saved_ranks, ranks):
        """Why a checkpoint of this strategy saved at ``saved_ranks`` ranks cannot
        resume at ``ranks`` ranks, or None when it can (``checkpoint.restore``
        then maps the saved shards). The default refuses: per-rank state has
        no rule for another number of ranks. Whether the checkpoint is at an
        epoch end is not the strategy's business (``config_compare``)."""
        return (f"--strategy {self.name} keeps state per rank that has no rule for another number of ranks "
                "(resize_refusal)")

    def set_resize_rule(self, rule, variables):
        """Declares what ``variables`` (one variable or a list) become at another
        number of ranks: a ``hvd_easgd.resize`` rule (``RESTART_AT_ZERO`` for an
        error-feedback residual, ``SUM_ON_FIRST`` for a partial sum, ...).
        State without a declared rule follows ``resize.DEFAULT``."""
        for variable in variables if isinstance(variables, (list, tuple)) else [variables]:
            self._resize_rules[id(variable)] = (variable, rule)

    def resize_rules(self):
        """``{id(variable): rule}`` for this strategy's and its children's state
        whose rule is not ``resize.DEFAULT`` (``checkpoint.resize_rules`` keys them)."""
        rules = {key: rule for key, (_, rule) in self._resize_rules.items()}
        for child in self.children():
            rules.update(child.resize_rules())
        return rules

    def saved_state_in_layout(self, saved):
        """``saved`` (p lists of arrays: each saved rank's values of
        ``state_variables()`` as the saving run held them) as this run's
        ``state_variables()`` hold them, entry for entry, before the resize
        rules map them. The same lists unless a strategy's state changes shape
        with its groups of ranks (``Hierarchical``'s shards); a composite hands
        each child its part of every list (only the last child's part may
        change length: it is the rest)."""
        children = self.children()
        if not children:
            return saved
        start = len(self.state_variables()) - sum(len(child.state_variables()) for child in children)
        out = [list(state[:start]) for state in saved]
        for i, child in enumerate(children):
            end = None if i == len(children) - 1 else start + len(child.state_variables())
            for state, part in zip(out, child.saved_state_in_layout([s[start:end] for s in saved])):
                state.extend(part)
            start = end
        return out

    def resized_weights(self):
        """The variables (one per trainable variable) every rank's weights restart
        from after a resume at another number of ranks, read once the resized
        state is in place; None: the weights follow their own rule
        (``resize.DEFAULT``: kept where the ranks agreed, else their mean).
        The default asks the children, the first answer wins."""
        return next((w for w in (c.resized_weights() for c in self.children()) if w is not None), None)

    def resize_notice(self, saved_ranks, ranks):
        """What a resume from ``saved_ranks`` to ``ranks`` ranks changes in this
        strategy's state, for the one line train.py prints; None: nothing to say.
        The default joins the children's notices."""
        notes = [n for n in (c.resize_notice(saved_ranks, ranks) for c in self.children()) if n]
        return "; ".join(notes) or None

    def needs_process_groups(self):
        """Whether this strategy splits the ranks into process groups (Horovod's
        dynamic process sets must be on before the ranks start). Asked before
        ``bind``; the default asks the children."""
        return any(child.needs_process_groups() for child in self.children())

    def process_groups(self):
        """The groups of ranks this strategy combines in, once bound (lists of
        ranks), or None; the default asks the children, the first answer wins."""
        return next((g for g in (c.process_groups() for c in self.children()) if g is not None), None)

    def expected_traffic(self, trainable_variables, non_trainable_variables=(), hosts=1, ranks_per_host=1,
                         sample_counts=False):
        """One rank's expected collective traffic per training step, by level.

        Args:
          trainable_variables: the model's trainable variables (their shapes
            and dtypes are all that is read).
          non_trainable_variables: its non-trainable ones.
          hosts: H, hosts in the job.
          ranks_per_host: ranks on each host (p = H · ranks_per_host).
          sample_counts: whether ``step`` receives a ``sample_count``
            (GradientAccumulation always passes one): a count may ride along.

        Returns:
          An ``ExpectedTraffic``; at p = 1 nothing (a one-rank communicator
          returns a collective's inputs without a call). The default: a
          strategy that never communicates.
        """
        return ExpectedTraffic()

    # --- one step ----------------------------------------------------------------
    def step(self, grad_sums, variables, apply_update, sample_count=None, mean=True):
        """One optimizer step on per-rank sums (see the module docstring)."""
        raise NotImplementedError

    def _apply_if(self, finite_and_wanted, finite, apply_update, grads):
        """Applies ``grads`` when ``finite_and_wanted``; counts non-finite skips.

        ``finite`` must be a value every rank agrees on whenever the ranks are
        meant to stay identical (i.e. computed after the reduction).

        Under loss scaling (``self.loss_scale`` set) non-finite gradients are
        handed to the inner LossScaleOptimizer anyway: it skips the update and
        halves its scale, on every rank that saw them. Skipping here instead
        would leave the scale where it is, and every later step would overflow
        too. Such a step counts as skipped, but it extends the run of
        consecutive bad steps (``--max-bad-steps``) only while the scale was
        already <= 1: until then halving the scale can still cure it.
        """
        if self.loss_scale is not None:
            return self._hand_to_loss_scaling(finite_and_wanted, finite, apply_update, grads)

        def apply():
            apply_update(grads)
            # A finite step ends any run of skipped ones.
            self.skip_counts.assign(self.skip_counts * tf.constant([1, 0], tf.int64))
            return tf.constant(True)

        def skip():
            # Not wanted (no samples anywhere) is not a fault; non-finite is.
            bad = tf.cast(tf.logical_not(finite), tf.int64)
            self.skip_counts.assign((self.skip_counts + bad) * tf.stack([tf.constant(1, tf.int64), bad]))
            return tf.constant(False)

        return tf.cond(finite_and_wanted, apply, skip)

    def _hand_to_loss_scaling(self, finite_and_wanted, finite, apply_update, grads):
        def hand_over():
            scale_before = tf.convert_to_tensor(self.loss_scale())
            apply_update(grads)
            overflow = tf.cast(tf.logical_not(finite), tf.int64)
            fault = tf.cast(tf.logical_and(tf.logical_not(finite), scale_before <= 1.0), tf.int64)
            # A finite step ends the run; an overflow the scale can still cure leaves it alone.
            run = (self.skip_counts[1] + fault) * overflow
            self.skip_counts.assign(tf.stack([self.skip_counts[0] + overflow, run]))
            return finite

        # Non-finite gradients come from samples (a window with none anywhere
        # holds zeros), so "wanted" is "finite and wanted, or not finite".
        return tf.cond(tf.logical_or(finite_and_wanted, tf.logical_not(finite)), hand_over,
                       lambda: tf.constant(False))

    def scaled(self, value):
        """``value`` times the current loss scale (itself without loss scaling):
        what a term added to the received gradients must be multiplied by."""
        if self.loss_scale is None:
            return value
        return value * tf.cast(self.loss_scale(), value.dtype)

    # --- configuration (serialised through keras.saving) -----------------------
    def get_config(self):
        return {}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in cls.contained_config_keys:
            config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)

    # The get_config keys that hold contained strategies (a composite's children),
    # serialised through keras.saving (``contained_config``) and restored by from_config.
    contained_config_keys = ()

    def contained_config(self):
        """``{key: serialised strategy}`` for ``contained_config_keys``: the part of a
        composite's ``get_config`` that its children are."""
        return {key: keras.saving.serialize_keras_object(getattr(self, key)) for key in self.contained_config_keys}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


def check_count(name, value):
    """``value`` as an int, or the Keras-form refusal: an integer >= 1."""
    return validation.integer(name, value, minimum=1)


def unequal_shares_refusal(strategy):
    """Why ``strategy`` cannot weigh the ranks by unequal shares of the global batch
    (``set_sample_shares``): the first strategy it contains that takes equal shares only; None when it can."""
    refusing = next((s for s in walk(strategy) if not s.takes_sample_shares), None)
    return None if refusing is None else _equal_shares_only(refusing)


def _equal_shares_only(strategy):
    return f"{type(strategy).__name__} takes equal shares of the global batch only: {strategy.sample_shares_refusal}"


def walk(strategy):
    """``strategy`` and every strategy it contains, depth first, parents first."""
    yield strategy
    for child in strategy.children():
        yield from walk(child)
