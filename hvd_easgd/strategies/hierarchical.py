"""Hierarchical: combine within groups of ranks every step, across groups by another strategy.

The ranks form G groups of n (by default a group is a host: its ranks share
a fast link, the hosts a slower one). Every step:

  1. intra level, within each group (``intra``, a SyncAverage): the ranks'
     gradient sums and sample counts are summed in ONE grouped allreduce over
     the group. The group now acts as one worker holding the group's sum S_G
     over its n_G samples, and its ranks stay bit-identical.
  2. inter level, across the groups (``inter``, any strategy: EASGD every τ
     steps, SyncAverage every step, ...): ``inter.step(S_G, n_G)`` as if the
     G groups were its G ranks. The rank of local index j in every group
     takes part, in the cross-group set {j-th rank of each group} (n such
     sets of G ranks, run side by side). The ranks of a group hold the same
     inputs, and the n sets compute the same reduction, so the ranks of a
     group stay bit-identical without a broadcast. The inter strategy sees
     p = G: EASGD's α defaults to β/G and its bound 0 < α ≤ 2/(G+1) is
     checked at G.

Without sample counts the intra level combines the gradients by the intra
strategy's ``reduce_op`` (the group's mean by default), and the inter level
receives them without a count; with ``inter=SyncAverage()`` either way every
rank applies the mean over all p = G·n ranks: the two-level allreduce.

Degenerate layouts are exactly one level: one group is ``intra`` alone (the
inter level does nothing, sends 0 bytes, and the kept model is the intra
strategy's, i.e. the weights); one rank per group is ``inter`` alone at p
ranks (the intra level sends 0 bytes in 0 calls).

The account, per rank and per optimizer step (``account_by_level()``), with
M the bytes of the trainable variables (fp32, no compression), c = 4 when
sample counts are passed (the count rides in the gradients' call) else 0:

* ``intra`` (the group's allreduce), every rank, every step:
  M + c bytes, 1 call; 0 and 0 when n = 1.
* ``inter`` (its cross-group set's collectives), every rank: what ``inter``
  alone sends at p = G. EASGD(τ): M + 4 bytes (the differences and the
  non-finite flag) in 1 call on every τ-th step, 0 otherwise, i.e.
  (M + 4)/τ per step, 1/τ of SyncAverage's with counts; SyncAverage: M + c,
  1 call, every step. 0 and 0 when G = 1.

No rank sits out of the inter level, and nothing is broadcast after it.
``comm.account()`` (the process's total) is the sum of the two.

Why every rank and not one leader per group that broadcasts the result
within its group: a leader scheme sends 1/n of these inter bytes over the
link between groups (then M + 4 per rank within the group), but its ranks
trace different steps (the leader's holds the cross-group collective, the
others' do not). Built that way first, a traced step under Horovod 0.28.1
hung (Gloo, np = 4, groups of 2: Horovod's trace log showed a non-leader
enqueue its group broadcast and never the group allreduce before it), and
neither explicit collective names nor ordering the non-leader's broadcast
after its inputs cured it. Every rank in a cross-group set keeps every
rank's traced step the same, as in the flat strategies. The price: with n
ranks per host, the cross-host link carries n·(M + 4)/τ bytes per host and
step for EASGD instead of (M + 4)/τ.

Why only SyncAverage inside a group: the intra level must hand the inter
level one worker's gradient per group, on every rank of the group, and the
inter collective must be reached by every group whatever happens in another
(a NaN in one group skips that group's update, not the inter collective).

NaN/Inf follow each level's own rule: a NaN within a group travels in the
group's sums, as SyncAverage's gradients do (every rank of the group learns
of it from the reduced values, so all take the same decision), and the inter strategy decides on the group's numbers,
identical on every rank of a group. EASGD's elastic differences are masked
before they leave a rank, and its skip flag reaches every rank. So the ranks
of a group never split, and the center is identical on every rank.

Horovod's own ``HOROVOD_HIERARCHICAL_ALLREDUCE`` (allreduce within the node,
then across nodes) works with NCCL only, i.e. on GPUs; on CPUs (Gloo, MPI)
``Hierarchical(SyncAverage(), SyncAverage())`` is the two-level allreduce.
Unlike NCCL's, whose local ranks each carry 1/n of the gradients across
nodes, each rank's cross-group allreduce here carries all of them.
"""
import keras

from .. import validation
from ..comm.local_comm import solo_communicator
from .accumulation import GradientAccumulation
from .base import CliOption, ExpectedTraffic, NoScaleRule, SyncStrategy, as_dense, check_count, count_off_the_wire, \
    count_on_the_wire
from .easgd import EASGD
from .sync_average import SyncAverage


def _runs_across_groups(cls):
    """What --inter may name: strategies that take a group's gradients as one worker's."""
    return cls.across_groups


@keras.saving.register_keras_serializable(package="hvd_easgd")
class Hierarchical(SyncStrategy):
    """Two levels: ``intra`` within groups of ranks every step, ``inter`` across the groups.

    Args:
      intra: the strategy within a group; a ``SyncAverage`` (default
        ``SyncAverage()``) without ``clip_norm`` (clip at the inter level).
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

    def _build_state(self, trainable_variables, non_trainable_variables):
        self.intra.build(trainable_variables, non_trainable_variables)
        self.inter.build(trainable_variables, non_trainable_variables)

    def kept_variables(self):
        return self.inter.kept_variables() if self.inter_active else self.intra.kept_variables()

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
            sums, count = self._combine_within_group(grad_sums, variables, sample_count, mean)
            self.intra.step_counter.assign_add(1)
            self.inter.step(sums, variables, apply_update, count, mean)
        self.step_counter.assign_add(1)

    def _combine_within_group(self, grad_sums, variables, sample_count, mean):
        """The group as one worker: ``(its gradient sums, its sample count)``, identical on the group's ranks.

        With counts: S_G = Σ S_r and n_G = Σ n_r over the group, in one Sum
        allreduce (the count rides in the gradients' dtype, as in SyncAverage);
        for ``mean=False`` under ``reduce_op="average"`` S_G is divided by the
        group's size, so that the inter level's average over the groups gives
        ΣS/p, as SyncAverage over all the ranks would. Without counts: the
        gradients combined by ``reduce_op`` (the group's mean), no count.
        """
        intra = self.intra
        grads = [as_dense(g, v) for g, v in zip(grad_sums, variables)]
        if sample_count is None:
            return self.group_comm.allreduce(grads, op=intra.reduce_op, compression=intra.compression), None
        summed = self.group_comm.allreduce(grads + [count_on_the_wire(sample_count, grads[0].dtype)], op="sum",
                                           compression=intra.compression)
        sums = summed[:-1]
        if not mean and intra.reduce_op == "average":
            sums = [s / self.group_comm.size for s in sums]
        return sums, count_off_the_wire(summed[-1])

    # --- the hooks (base.py) ------------------------------------------------------------------
    @classmethod
    def lr_scale_factor(cls, size, accumulate=1):
        """Refused: the two levels average different things (the gradients of
        a group's ranks; the groups by the inter strategy's rule), and no
        factor for the pair was measured."""
        check_count("size", size)
        check_count("accumulate", accumulate)
        raise NoScaleRule(f"--strategy {cls.name} has no --scale-lr rule: its intra level averages the gradients of "
                          "the ranks in a group (SyncAverage's rule would count those) while its inter level meets "
                          "the groups by its own rule (--inter), and no factor for the pair was measured. Tune "
                          "--lr, e.g. starting from --strategy sync's factor for the ranks in one group")

    def needs_process_groups(self):
        """True: under Horovod the groups are dynamic process sets."""
        return True

    def process_groups(self):
        return self.groups

    def resize_refusal(self, saved_ranks, ranks):
        """The rule at p -> q ranks: the groups are rebuilt from the new layout
        when the strategy is bound at q (``ranks_per_group`` must divide q, as
        for a fresh run; by default one group per host). The state is the two
        levels' (``resize_rules`` collects the children's rules): the intra
        level's counters are kept; the inter strategy's state follows its own
        rule with the G groups as its ranks. The ranks of a group held the same
        state, so the mean over the p saved ranks is the mean over the saved
        groups, each counted n times: the inter strategy's mean at G. The
        weights restart from the inter strategy's kept model where the new
        layout has several groups (EASGD's center), else they are the mean
        (one group: the intra SyncAverage alone). The inter strategy's verdict
        is asked at G = p/n -> q/n when ``ranks_per_group`` fixes n (EASGD's
        fixed ``--moving-rate`` against 2/(G+1))."""
        n = self.ranks_per_group
        if n is not None and ranks % n:
            return f"--ranks-per-group {n} does not divide the {ranks} ranks of the resumed run"
        if n is not None and saved_ranks % n == 0:
            return self.inter.resize_refusal(saved_ranks // n, ranks // n)
        return None

    def resized_weights(self):
        """The inter strategy's where the new layout has several groups, else None (the mean).

        A run saved with one group never stepped its inter strategy, whose
        kept model is then the initial weights: it takes its start from the
        resized weights instead, as a fresh run does after the broadcast."""
        if not self.inter_active:
            return self.intra.resized_weights()
        if int(self.inter.step_counter.numpy()) == 0:
            self.inter.on_initial_state_synced()
            return None
        return self.inter.resized_weights()

    def resize_notice(self, saved_ranks, ranks):
        groups = f"{len(self.groups)} groups of {len(self.groups[0])}" if self.groups is not None else "new groups"
        inner = self.inter.resize_notice(saved_ranks, ranks) if self.inter_active else None
        return f"the ranks form {groups}" + (f"; across them: {inner}" if inner else "")

    def expected_traffic(self, trainable_variables, non_trainable_variables=(), hosts=1, ranks_per_host=1,
                         sample_counts=False):
        """Groups of n = ``ranks_per_group`` (default: ``ranks_per_host``), G = p/n
        of them: within a group the intra strategy's traffic over n ranks, across
        the groups the inter strategy's over G ranks (module docstring)."""
        size = hosts * ranks_per_host
        n = self.ranks_per_group or ranks_per_host
        if size % n:
            raise ValueError(f"`ranks_per_group` must divide the number of ranks p={size}. "
                             f"Received: ranks_per_group={n}")
        group_count = size // n
        within = self.intra.expected_traffic(trainable_variables, non_trainable_variables, 1, n, sample_counts)
        across = self.inter.expected_traffic(trainable_variables, non_trainable_variables, group_count, 1,
                                             sample_counts)
        return ExpectedTraffic(within.total, across.total, n)

    # --- configuration ---------------------------------------------------------------------
    def get_config(self):
        return {**self.contained_config(), "ranks_per_group": self.ranks_per_group}

    def __repr__(self):
        return f"Hierarchical(intra={self.intra!r}, inter={self.inter!r}, ranks_per_group={self.ranks_per_group!r})"
