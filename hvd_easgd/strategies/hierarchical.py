"""Hierarchical: reduce-scatter within groups of ranks, ``inter`` across them on shards, allgather back.

The ranks form G groups of n (by default a group is a host: its ranks share
a fast link, the hosts a slower one). The trainable variables, flattened
into one vector of N elements, are cut into n shards of m = ⌈N/n⌉ (zero
padding at the end; ``shards.FlatShards``): rank j of every group owns
shard j. Every step, on every rank of a group:

  1. intra, within the group (``intra``, a SyncAverage): ONE reduce-scatter
     of the ranks' gradient sums, each shard followed by the rank's sample
     count and a non-finite flag, so rank j holds shard j of the group's sum
     S_G, the group's count n_G and the number of its ranks whose gradients
     held NaN/Inf.
  2. inter, across the groups (``inter``, any strategy with
     ``across_groups``): ``inter.step`` on shard j alone, as if the G groups
     were its G ranks, in the cross-group set {rank j of each group} (n sets
     of G ranks, side by side). The inter strategy is built on a flat shard
     variable (the shard view): its state (EASGD's center, DiLoCo's synced
     weights and outer optimizer, ...) is 1/n of the model on each rank. Its
     ``apply_update`` is the shard's: an allgather within the group puts the
     n updated shards together, and the inner optimizer applies the full
     update to the full weights (identical on every rank of the group).
  3. when the inter strategy changed the weights beyond the update (its
     ``weights_synchronised()``: EASGD's elastic pull, PeriodicAverage's
     average, DiLoCo's outer step, every τ steps), an allgather within the
     group puts the n weight shards back into the weights.

So each host's payload crosses between groups once, in n parallel streams of
1/n: Horovod's NCCL hierarchical allreduce (reduce-scatter in the node, the
cross-node allreduce on each rank's shard, allgather). With
``inter=SyncAverage()`` this is the two-level allreduce, and every rank
applies the mean over all p = G·n ranks: flat SyncAverage's mean to float
tolerance, not bit for bit (the sums are added per group first, then across
the groups: another order than one ring's). The inter strategy sees p = G:
EASGD's α defaults to β/G and its bound 0 < α ≤ 2/(G+1) is checked at G.

Without sample counts the intra level reduces by the intra strategy's
``reduce_op`` (the group's mean by default) and the inter level receives no
count; with ``mean=False`` under ``reduce_op="average"`` S_G is divided by n,
so that the inter level's average over the groups gives ΣS/p, as SyncAverage
over all the ranks would.

The account, per rank and per optimizer step (``account_by_level()``; these
are the payloads handed to the collectives), with e = 4 bytes an element
(fp32, no compression), c = 2 columns with sample counts (the count and the
flag) else 1, and r = ``inter.weight_synchronisations_per_step()`` (1/τ for
a τ-strategy, 0 for SyncAverage):

* ``intra``: the reduce-scatter n·(m + c)·e bytes, the update's allgather
  m·e, every step (2 calls); the weights' allgather m·e in 1 call at rate r.
  Total n(m + c)e + (1 + r)·m·e bytes in 2 + r calls. (The wire carries
  (n−1)/n of a reduce-scatter's payload and (n−1)·m·e of an allgather's: the
  reduce-scatter and the update's allgather together are one ring allreduce
  of the gradients, 2(n−1)/n·M.)
* ``inter``: what ``inter`` alone sends at p = G on one variable of m
  elements (``inter.expected_traffic``). SyncAverage: m·e (+ e with counts),
  1 call, every step; EASGD(τ), PeriodicAverage(τ), DiLoCo(τ):
  (m·e + e)/τ (the shard and the non-finite flag). 1/n of what each rank
  sent across the groups before the shards (M + e per call).

``comm.account()`` (the process's total) is the sum of the two levels.

Why a group's ranks cannot hang, unlike the leader scheme first built here
(a leader per group held the cross-group collective and broadcast the result
in its group; under Horovod 0.28.1 its traced step hung: the ranks of a
group traced different collectives): every rank of a group runs the same
collectives in the same order, the reduce-scatter, its cross-group set's
inter collective, the allgathers. The allgathers inside a decision (the
update's, under the inter strategy's non-finite test; the weights', under
``weights_synchronised``) are reached alike because the decision is taken on
numbers every rank of the group agrees on: the counts are the group's, the
step counters are equal, and the shards are finite on every rank or on none.

NaN/Inf: a rank's non-finite gradients reach only the shard they fall in,
so the reduce-scatter carries each rank's flag in every shard, and a group
whose flag is set hands the inter strategy an all-NaN shard on every rank:
the inter strategy's own rule then decides alike on every rank (SyncAverage
skips the step in every group, the NaN reaching every shard through the
cross-group sum; a local-step strategy drops that group's update). One case
is not covered: finite gradients whose sum overflows to Inf in one shard
only; then the ranks would decide differently, and the stall inspector
(Horovod's, or the direct path's) ends the job after its timeout instead of
letting it hang.

Degenerate layouts are exactly one level, unsharded: one group is ``intra``
alone (a group allreduce; the inter level does nothing, sends 0 bytes, and
the kept model is the intra strategy's, i.e. the weights); one rank per
group is ``inter`` alone at p ranks on the full variables (the intra level
sends 0 bytes in 0 calls).

The kept model (``kept_variables()``: EASGD's center, DiLoCo's θ) is the
inter strategy's shards gathered within the group, eagerly, once per step
it is asked at: a collective of the group's ranks, which evaluate and
predict (``SwapKeptWeights``) reach on every rank; model.keras, saved by
rank 0 alone after the final evaluation, reads what that gathered.

At another number of ranks or in other groups (``resize_refusal``, derived
there), the inter state is mapped through each saved group's whole value
(``regroup``): its n shards joined in rank order, padding stripped (or its
per-weight variables, unsharded), the inter strategy's rule across the groups,
then the new rank's shard (``shards.ReCut``) or per-weight pieces; between
any group sizes, one group per host included.

Limits of the shard view: the trainable variables must share one dtype; the
inter strategy must not clip by the global norm (each rank holds 1/n of the
gradients); PeriodicAverage averages the trainable weights only (the
BatchNorm statistics follow their own rule, ``hvd_easgd.statistics``).

Horovod's own ``HOROVOD_HIERARCHICAL_ALLREDUCE`` works with NCCL only, i.e.
on GPUs; on CPUs (Gloo, MPI) ``Hierarchical(SyncAverage(), SyncAverage())``
is the two-level allreduce.
"""
import keras
import numpy as np
import tensorflow as tf

from .. import resize, validation
from ..comm.local_comm import solo_communicator
from .accumulation import GradientAccumulation
from .base import WIRE_FACTORS, CliOption, ExpectedTraffic, SyncStrategy, Traffic, all_finite, as_dense, \
    check_count, count_off_the_wire, count_on_the_wire, element_bytes, walk
from .easgd import EASGD
from .regroup import LayoutMismatch, in_this_layout, saved_shard_layout
from .shards import FlatShards, NewLayout, ReCut
from .sync_average import SyncAverage


def _runs_across_groups(cls):
    """What --inter may name: strategies that take a group's gradients as one worker's."""
    return cls.across_groups


@keras.saving.register_keras_serializable(package="hvd_easgd")
class Hierarchical(SyncStrategy):
    """Two levels: ``intra`` within groups of ranks every step, ``inter`` across the groups.

    Args:
      intra: the strategy within a group; a ``SyncAverage`` (default
        ``SyncAverage()``) without ``clip_norm`` (clip at the inter level, which
        can only when a group holds one rank: with n > 1 each rank holds a shard).
      inter: the strategy across the groups (default ``EASGD()``); it sees
        the G groups as its ranks.
      ranks_per_group: n, consecutive ranks per group (must divide p).
        Default None: a group is a host, which needs the same number of ranks
        on every host.

    Example (2 hosts × 2 ranks: SyncAverage within a host, EASGD every 10
    steps between hosts, α = 0.9/2)::

        strategy = hvd_easgd.Hierarchical(inter=hvd_easgd.EASGD(period=10))

    Under Horovod the groups are process sets: start with
    ``hvd_easgd.init(process_sets="dynamic")`` (train.py does).
    """

    name = "hierarchical"
    description = "sync within each host (or --ranks-per-group ranks) every step, --inter across them"
    contained_config_keys = ("intra", "inter")
    cli_options = (
        CliOption("--inter", "inter", "the strategy across groups; it takes its own options (default easgd)",
                  strategies_where=_runs_across_groups),
        CliOption("--ranks-per-group", "ranks_per_group",
                  "consecutive ranks per group (default: one group per host)", type=int),
    )
    cli_delegate = ("inter", "easgd")

    takes_sample_shares = False
    sample_shares_refusal = "a group's ranks would need their shares summed into the group's weight across groups."

    def __init__(self, intra=None, inter=None, ranks_per_group=None):
        super().__init__()
        intra = SyncAverage() if intra is None else intra
        inter = EASGD() if inter is None else inter
        if type(intra) is not SyncAverage:
            raise ValueError("`intra` must be a SyncAverage: the intra level combines the gradients within "
                             f"a group every step. Received: intra={intra!r}")
        if intra.clip_norm is not None:
            raise ValueError("`intra` must not clip (the group's gradients are not yet the step's): give "
                             f"clip_norm to the inter strategy. Received: intra={intra!r}")
        if not isinstance(inter, SyncStrategy) or isinstance(inter, Hierarchical):
            raise ValueError(f"`inter` must be a SyncStrategy other than Hierarchical. Received: inter={inter!r}")
        if isinstance(inter, GradientAccumulation):
            raise ValueError("`inter` must not be a GradientAccumulation: wrap the Hierarchical strategy instead "
                             f"(GradientAccumulation(k, strategy=Hierarchical(...))). Received: inter={inter!r}")
        # Checked here, not at build: the inter strategy is built on one flat shard variable, and a
        # layout of whole variables has nothing to split there (with one rank per group it is flat DiLoCo).
        fragmented = [s for s in walk(inter) if getattr(s, "fragments", 1) > 1]
        if fragmented:
            raise ValueError("`inter` must not split the variables into fragments: fragments do not apply across "
                             "groups, where the inter strategy holds one flat shard of the variables; use "
                             f"--strategy diloco --fragments F (flat) instead. Received: inter={inter!r}")
        self.ranks_per_group = validation.integer("ranks_per_group", ranks_per_group, minimum=1, allow_none=True,
                                                  condition=", or None for one group per host")
        self.intra = intra
        self.inter = inter
        self.groups = None

    def children(self):
        return (self.intra, self.inter)

    # --- wiring -----------------------------------------------------------------------
    def bind(self, comm):
        """Splits ``comm`` into the groups and the cross-group sets (a collective under Horovod)."""
        if comm is self.comm:
            return self
        self.comm = comm
        self.groups = self._groups(comm)
        group_count, group_size = len(self.groups), len(self.groups[0])
        self.group_index = next(i for i, group in enumerate(self.groups) if comm.rank in group)
        self.cross_comm = None
        if group_count == 1:  # intra alone: the inter level has nothing to combine
            self.group_comm = comm.split(self.groups)
            inter_comm = solo_communicator(comm, comm.rank)
        elif group_size == 1:  # inter alone, over every rank
            self.group_comm = solo_communicator(comm, comm.rank)
            self.cross_comm = inter_comm = comm.split([range(comm.size)])
        else:
            self.group_comm = comm.split(self.groups)
            # The j-th ranks of the groups: G ranks each, n sets.
            self.cross_comm = inter_comm = comm.split([[group[j] for group in self.groups]
                                                       for j in range(group_size)])
        if self.sharded:
            clipping = [s for s in walk(self.inter) if getattr(s, "clip_norm", None) is not None]
            if clipping:
                raise ValueError("`inter` must not clip by the global norm when a group holds n > 1 ranks: each rank "
                                 f"holds 1/n of the gradients (groups of {group_size}). "
                                 f"Received: inter={self.inter!r}")
        self.intra.bind(self.group_comm)
        self.inter.bind(inter_comm)
        return self

    def _groups(self, comm):
        """The groups' ranks, ordered by their first rank; each group sorted."""
        if self.ranks_per_group is not None:
            n = self.ranks_per_group
            if comm.size % n:
                raise ValueError(f"`ranks_per_group` must divide the number of ranks p={comm.size}. "
                                 f"Received: ranks_per_group={n}")
            return [list(range(start, start + n)) for start in range(0, comm.size, n)]
        hosts = comm.host_groups()
        sizes = [len(host) for host in hosts]
        if not comm.homogeneous or len(set(sizes)) > 1:
            raise ValueError("`ranks_per_group` must be an integer >= 1 here: None makes one group per host, which "
                             f"needs the same number of ranks on every host; the hosts run {sizes} ranks. Pass "
                             "ranks_per_group (--ranks-per-group N) to form the groups explicitly. "
                             "Received: ranks_per_group=None")
        return hosts

    @property
    def inter_active(self):
        return self.groups is not None and len(self.groups) > 1

    @property
    def intra_active(self):
        return self.groups is not None and len(self.groups[0]) > 1

    @property
    def sharded(self):
        """Both levels run: the inter strategy runs on this rank's shard (module docstring)."""
        return self.inter_active and self.intra_active

    def _build_state(self, trainable_variables, non_trainable_variables):
        self.variables = trainable_variables
        self.intra.build(trainable_variables, non_trainable_variables)
        if not self.sharded:
            self.inter.build(trainable_variables, non_trainable_variables)
            return
        self.layout = FlatShards(trainable_variables, len(self.groups[0]), self.group_comm.rank)
        # The shard view the inter strategy is built on: this rank's shard of the
        # weights, refreshed from them whenever they change (never saved: the weights are).
        self.shard = tf.Variable(self.layout.shard_of(trainable_variables), trainable=False,
                                 name="hierarchical_weights_shard")
        # The layout the inter strategy's state is cut by: saved, and checked on restore.
        self.shard_layout = tf.Variable(self.layout.describe(), dtype=tf.int64, trainable=False,
                                        name="hierarchical_shard_layout")
        self._kept_cache = None
        self.inter.build([self.shard], [])

    def _extra_state(self):
        return [self.shard_layout] if self.sharded else []

    def _refresh_shard(self):
        self.shard.assign(self.layout.shard_of(self.variables))

    def on_initial_state_synced(self):
        if self.sharded:
            self._refresh_shard()  # before the inter strategy copies it (EASGD's x̃ <- x)
        super().on_initial_state_synced()

    def on_state_restored(self):
        if self.sharded:
            saved = [int(x) for x in self.shard_layout.numpy()]
            if saved != self.layout.describe():
                names = "[ranks per group n, shard index j, shard length m, elements N]"
                raise ValueError(f"the checkpoint's Hierarchical shards were cut as {names} = {saved}, and this "
                                 f"run cuts them as {self.layout.describe()}: its manifest predates the saved "
                                 "process groups, so resume with the groups it was saved with (the same "
                                 "--ranks-per-group and number of ranks)")
            self._refresh_shard()
            self._kept_cache = None  # gathered from the state before
        super().on_state_restored()

    def kept_variables(self):
        """The kept model: the inter strategy's (its shards gathered within the
        group, eagerly: every rank of a group must ask at the same step), or the
        intra strategy's in a single group."""
        if not self.inter_active:
            return self.intra.kept_variables()
        if not self.sharded:
            return self.inter.kept_variables()
        kept = self.inter.kept_variables()
        if kept is None:
            self._kept_cache = None
            return None
        step = int(self.step_counter.numpy())
        if self._kept_cache is None or self._kept_cache[0] != step:
            # Bookkeeping for evaluation and saving, not training traffic: left out of the account.
            self._kept_cache = (step, self.layout.unflatten(self.group_comm.allgather(kept[0], record=False)))
        return self._kept_cache[1]

    def merge_at_end(self):
        """The level that runs merges (``SyncStrategy.merge_at_end``): the inter strategy across the
        groups, on this rank's shard when sharded (the kept model then gathers the merged shards), or
        the intra strategy in a single group. An inactive level's state is a leftover (a resume into
        one group keeps the inter strategy's, unused) and is never merged."""
        self._kept_cache = None  # a kept model gathered before the merge is not the merged one
        if not self.inter_active:
            self.intra.merge_at_end()
        else:
            if self.sharded:
                self._refresh_shard()
            self.inter.merge_at_end()

    def account_by_level(self):
        """This rank's ``{"intra": {"bytes", "calls"}, "inter": {...}}`` so far
        (formulas in the module docstring); they add up to the rank's total."""
        return {"intra": self.group_comm.account(),
                "inter": self.cross_comm.account() if self.cross_comm is not None else {"bytes": 0, "calls": 0}}

    def reset_account(self):
        for comm in (self.group_comm, self.cross_comm):
            if comm is not None:
                comm.reset_account()

    # --- one step -----------------------------------------------------------------------
    def step(self, grad_sums, variables, apply_update, sample_count=None, mean=True):
        if not self.inter_active:
            self.intra.step(grad_sums, variables, apply_update, sample_count, mean)
        elif not self.intra_active:
            self.inter.step(grad_sums, variables, apply_update, sample_count, mean)
        else:
            self._sharded_step(grad_sums, variables, apply_update, sample_count, mean)
        self.step_counter.assign_add(1)

    def _sharded_step(self, grad_sums, variables, apply_update, sample_count, mean):
        shard_sums, count = self._reduce_scatter_within_group(grad_sums, variables, sample_count, mean)
        self._refresh_shard()

        def apply_shard(shard_updates):
            # The n shards of the update, put together in the group, go through
            # the inner optimizer on the full weights; the shard view follows them.
            full = self.group_comm.allgather(shard_updates[0])
            apply_update(self.layout.unflatten(full))
            self._refresh_shard()

        self.inter.step([shard_sums], [self.shard], apply_shard, count, mean)
        self.intra.step_counter.assign_add(1)
        tf.cond(self.inter.weights_synchronised(), self._gather_weights, tf.no_op)

    def _gather_weights(self):
        """The weights <- the n weight shards of the group, after the inter strategy changed its shard."""
        for variable, value in zip(self.variables, self.layout.unflatten(self.group_comm.allgather(self.shard))):
            variable.assign(value)
        return tf.no_op()

    def _reduce_scatter_within_group(self, grad_sums, variables, sample_count, mean):
        """``(shard j of the group's gradient sums, the group's sample count)``: ONE reduce-scatter.

        Each shard row carries the rank's count (with counts) and its
        non-finite flag, so every rank of the group receives the group's
        count and the number of its faulty ranks; a faulty group's shard is
        all NaN on every rank (module docstring). With counts the op is Sum,
        and for ``mean=False`` under ``reduce_op="average"`` the sums are
        divided by n; without, the intra strategy's ``reduce_op``.
        """
        intra = self.intra
        grads = [as_dense(g, v) for g, v in zip(grad_sums, variables)]
        faulty = tf.cast(tf.logical_not(all_finite(grads)), grads[0].dtype)
        extras = [faulty] if sample_count is None else [count_on_the_wire(sample_count, grads[0].dtype)[0], faulty]
        op = intra.reduce_op if sample_count is None else "sum"
        row = self.group_comm.reducescatter([self.layout.rows(grads, extras)], op=op,
                                            compression=intra.compression)[0]
        m = self.layout.length
        sums = row[:m]
        count = None if sample_count is None else count_off_the_wire(row[m:m + 1])
        if sample_count is not None and not mean and intra.reduce_op == "average":
            sums = sums / self.group_comm.size
        group_faulty = row[-1] > 0
        sums = tf.cond(group_faulty, lambda: tf.fill(tf.shape(sums), tf.constant(float("nan"), sums.dtype)),
                       lambda: tf.identity(sums))
        return sums, count

    # --- the hooks (base.py) ------------------------------------------------------------------
    def lr_scale_factor(self, size, accumulate=1, adaptive=False):
        """the inter strategy's rule at G = ranks/n groups of n*K batches each; sync's for n ranks when G = 1.

        An instance's rule, not the class's: it needs n (``ranks_per_group``,
        or the groups once bound) and the inter strategy. Derivation: the
        intra level is a SyncAverage of the n ranks of a group, so a group's
        update is the mean over its n·k batches, as one worker's would be
        with n·k micro-batches; the inter level then meets the G = size/n
        groups as its G ranks. So the factor is the inter strategy's own rule
        at G ranks and n·k micro-batches::

            factor = inter.lr_scale_factor(G, n * k)        for G > 1
                   = SyncAverage.lr_scale_factor(n, k)      for G = 1 (intra alone)

        With ``inter=SyncAverage()`` it is flat SyncAverage's at size·k
        batches (the two-level allreduce applies the same mean); with EASGD
        it is 2·sqrt(n·k) at G = 2 (EASGD's √k, the group's n·k batches
        being one worker's), which at 8 ranks, n = 4, k = 1 is 4.0: sync's
        factor for the 4 ranks of one group. An inter strategy without a
        rule (DiLoCo) refuses, at every G. Fewer ranks than n (train.py asks
        at one rank before the ranks start) are one group of them all.

        Measured on digits (``horovodrun -np 8 --mpi train.py --strategy
        hierarchical --ranks-per-group 4 --inter easgd``, defaults, seed 0,
        2026-12-02): ×1 (lr 0.02, no rule) ends at 0.944; ×4 (this rule,
        lr 0.08) at 0.978.
        """
        size = check_count("size", size)
        accumulate = check_count("accumulate", accumulate)
        n = self.ranks_per_group or (len(self.groups[0]) if self.groups is not None else None)
        if n is None and size > 1:
            raise ValueError("`ranks_per_group` must be known for --scale-lr's rule: None makes one group per host, "
                             "known once the strategy is bound to the ranks. Received: ranks_per_group=None")
        n = min(n or 1, size)
        if size % n:
            raise ValueError(f"`ranks_per_group` must divide the number of ranks p={size}. "
                             f"Received: ranks_per_group={n}")
        groups = size // n
        # Asked at every G, so that an inter strategy without a rule refuses at any layout.
        across = self.inter.lr_scale_factor(groups, n * accumulate, adaptive=adaptive)
        return across if groups > 1 else self.intra.lr_scale_factor(n, accumulate, adaptive=adaptive)

    def needs_process_groups(self):
        """True: under Horovod the groups are dynamic process sets."""
        return True

    def process_groups(self):
        return self.groups

    def resize_refusal(self, saved_ranks, ranks):
        """The rule at p -> q ranks (or at p ranks in other groups): the groups
        are rebuilt from the new layout when the strategy is bound at q
        (``ranks_per_group`` must divide q, as for a fresh run; by default one
        group per host), of any size n' (the saved n need not be n'). The state
        is the two levels' (``resize_rules`` collects the children's rules): the
        intra level's counters are kept; the inter strategy's state follows its
        own rule with the G groups as its ranks. The ranks of a group held the
        same state, so the mean over the p saved ranks is the mean over the
        saved groups, each counted n times: the inter strategy's mean at G. The
        weights restart from the inter strategy's kept model where the new
        layout has several groups (EASGD's center), else they are the mean
        (one group: the intra SyncAverage alone; the inter strategy's step
        counter restarts at 0 there, as it never steps).

        Where the inter state lies differs with the layout: sharded (n > 1
        ranks per group and G > 1 groups) rank j of a group holds shard j of
        each per-weight state (EASGD's center; DiLoCo's θ and outer slots;
        PeriodicAverage's synced copy; the error-feedback residuals), one flat
        vector of m = ⌈N/n⌉; unsharded (n = 1, or G = 1) each rank holds one
        variable per weight. So neither the entries nor their shapes pair up
        across layouts, and the per-variable mean over the saved ranks would
        mix different shards. The mapping goes through the whole value v_g of
        each such state in saved group g (``regroup``; the saved [n, j, m, N]
        is read from the shards, so a group per host needs no saved group
        size): its n shards joined in shard order, the padding stripped (the
        first N elements), or, unsharded, its k variables flattened and
        joined. The inter strategy's rule maps v_1..v_G to the new value with
        the groups as its ranks, and rank j of a new group of n' keeps shard j
        of that, cut at m' = ⌈N/n'⌉ (``shards.ReCut``), or, with n' = 1 or one
        group, its pieces reshaped as the variables. EASGD's x̃, DiLoCo's θ and
        its outer slots, PeriodicAverage's synced copy are identical across
        groups (the cross-group collective leaves every group with the same
        value): kept exactly at any layout; the residuals are per group and
        follow the inter strategy's rule (``RESTART_AT_ZERO``: zeros); the model
        weights and the inner optimizer's slots are whole variables (their
        mean over the saved ranks). The inter strategy's verdict is asked at
        G' = q/n' when ``ranks_per_group`` fixes n' (EASGD's fixed
        ``--moving-rate`` against 2/(G'+1)); with a group per host G' is known
        only when bound, where the same check refuses it."""
        n = self.ranks_per_group
        if n is None:
            return None
        if ranks % n:
            return f"--ranks-per-group {n} does not divide the {ranks} ranks of the resumed run"
        return self.inter.resize_refusal(max(saved_ranks // n, 1), ranks // n)

    def _sharded_state(self):
        """The inter strategy's state cut like the shard view: its [m] floating variables."""
        return [v for v in self.inter.state_variables()
                if tuple(v.shape) == (self.layout.length,) and tf.as_dtype(v.dtype) == self.layout.dtype]

    def _layout_of(self, rank):
        """``(group index, groups, FlatShards)`` of ``rank`` in this (the new) layout."""
        group = next(i for i, members in enumerate(self.groups) if rank in members)
        return group, len(self.groups), FlatShards(self.variables, len(self.groups[group]),
                                                   self.groups[group].index(rank))

    def saved_state_in_layout(self, saved):
        """The saved ranks' state in this run's layout (``regroup``): where either
        layout is sharded, each per-weight state of the inter strategy becomes
        the whole value of the saved rank's group (its n shards joined, or its
        k variables flattened), held whole where this run keeps a shard (then
        ``ReCut`` cuts it) and in pieces where it keeps one per weight; the saved
        shard layout ``[n, j, m, N]`` is read from the shards, so a group per
        host needs no saved group size."""
        layouts = [saved_shard_layout(state[2]) if len(state) > 2 else None for state in saved]
        saved_sharded = layouts[0] is not None
        if not (saved_sharded or self.sharded):
            return super().saved_state_in_layout(saved)
        if not all(layouts) and saved_sharded:
            raise LayoutMismatch("some saved ranks hold no Hierarchical shard layout")
        own = 3 if saved_sharded else 2  # step_counter, skip_counts (, shard_layout)
        intra_end = own + len(self.intra.state_variables())
        inter = in_this_layout([state[intra_end:] for state in saved], layouts if saved_sharded else None,
                               self.inter.state_variables(), [tuple(v.shape) for v in self.variables],
                               tf.as_dtype(self.variables[0].dtype).as_numpy_dtype,
                               self.layout.length if self.sharded else None)
        layout = [np.zeros(4, np.int64)] if self.sharded else []  # replaced by the new layout (NewLayout)
        return [list(state[:2]) + layout + list(state[own:intra_end]) + whole for state, whole in zip(saved, inter)]

    def resize_rules(self):
        """The children's rules; sharded, the inter strategy's shard state re-cut
        from its group's whole value (``shards.ReCut`` of one part, around the
        inter strategy's rule for it: ``saved_state_in_layout`` joined the saved
        shards) and the saved layout replaced by the new one. In one group the
        inter strategy never steps: its step counter restarts at 0, so that a
        later resume onto several groups starts it from the weights."""
        rules = super().resize_rules()
        if self.built and self.sharded:
            for variable in self._sharded_state():
                rules[id(variable)] = ReCut(rules.get(id(variable), resize.DEFAULT), 1, self._layout_of)
            rules[id(self.shard_layout)] = NewLayout(self._layout_of)
        if self.built and not self.inter_active:
            rules[id(self.inter.step_counter)] = resize.RESTART_AT_ZERO
        return rules

    def resized_weights(self):
        """The inter strategy's where the new layout has several groups, else None (the mean).

        A run saved with one group never stepped its inter strategy, whose
        kept model is then the initial weights: it takes its start from the
        resized weights instead, as a fresh run does after the broadcast.
        Sharded, the inter strategy's answer is this rank's shard of it,
        gathered within the group (eagerly: every rank of the group restores)."""
        if not self.inter_active:
            return self.intra.resized_weights()
        if int(self.inter.step_counter.numpy()) == 0:
            self.inter.on_initial_state_synced()
            return None
        weights = self.inter.resized_weights()
        if weights is None or not self.sharded:
            return weights
        return self.layout.unflatten(self.group_comm.allgather(weights[0], record=False))

    def resize_notice(self, saved_ranks, ranks):
        groups = f"{len(self.groups)} groups of {len(self.groups[0])}" if self.groups is not None else "new groups"
        inner = self.inter.resize_notice(saved_ranks, ranks) if self.inter_active else None
        return f"the ranks form {groups}" + (f"; across them: {inner}" if inner else "")

    def expected_traffic(self, trainable_variables, non_trainable_variables=(), hosts=1, ranks_per_host=1,
                         sample_counts=False):
        """Groups of n = ``ranks_per_group`` (default: ``ranks_per_host``), G = p/n
        of them: within a group the reduce-scatter and the allgathers, across the
        groups the inter strategy's traffic over G ranks on one shard of m
        elements (the formulas in the module docstring); one level alone in a
        degenerate layout."""
        size = hosts * ranks_per_host
        n = self.ranks_per_group or ranks_per_host
        if size % n:
            raise ValueError(f"`ranks_per_group` must divide the number of ranks p={size}. "
                             f"Received: ranks_per_group={n}")
        group_count = size // n
        if group_count == 1 or n == 1:
            within = self.intra.expected_traffic(trainable_variables, non_trainable_variables, 1, n, sample_counts)
            across = self.inter.expected_traffic(trainable_variables, non_trainable_variables, group_count, 1,
                                                 sample_counts)
            return ExpectedTraffic(within.total, across.total, n)
        layout = FlatShards(trainable_variables, n, 0)
        e = element_bytes(trainable_variables)
        columns = 2 if sample_counts else 1
        scatter = n * (layout.length + columns) * element_bytes(trainable_variables, self.intra.compression)
        rate = self.inter.weight_synchronisations_per_step()
        gather = float(layout.length * e)
        # Wire: (n−1)/n of the reduce-scatter's payload, (n−1)× each allgather's (comm/communicator.py).
        scattered = Traffic.of("reducescatter", scatter, 1, scatter * WIRE_FACTORS["reducescatter"](n))
        gathered = Traffic.of("allgather", gather, 1, gather * WIRE_FACTORS["allgather"](n))
        within = scattered + gathered + Traffic.of("allgather", gather * rate, rate,
                                                   gather * rate * WIRE_FACTORS["allgather"](n))
        across = self.inter.expected_traffic([layout.spec], (), group_count, 1, sample_counts)
        return ExpectedTraffic(within, across.total, n)

    # --- configuration ---------------------------------------------------------------------
    def get_config(self):
        return {**self.contained_config(), "ranks_per_group": self.ranks_per_group}

    def __repr__(self):
        return f"Hierarchical(intra={self.intra!r}, inter={self.inter!r}, ranks_per_group={self.ranks_per_group!r})"
