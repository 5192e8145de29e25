"""The strategy hooks (base.py): each strategy answers for its expected traffic,
its --scale-lr rule, its resize rule and notice, its process groups and whether
it may sit across Hierarchical's groups; composites ask their children.

Expected traffic is checked against the exact account of p > 1 simulated ranks
after whole periods of steps; the rules and verdicts against hand-derived values."""
import math
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import DiLoCo, EASGD, GradientAccumulation, Hierarchical, PeriodicAverage, SyncAverage
from hvd_easgd.comm import SimulatedCluster
from hvd_easgd.strategies import registry
from hvd_easgd.strategies.base import ExpectedTraffic, NoScaleRule, SyncStrategy, Traffic, payload_bytes

pytestmark = [pytest.mark.unit, pytest.mark.slow]  # many simulated ranks, seconds together

P = 4
STEPS = 12  # whole periods of every strategy below (tau 2, 3, 4; k 2)


def two_periods(calls_per_step):
    """Two whole periods of a strategy that makes one call per period (``1 / period`` calls a step, by
    hand): the account is seen to repeat, in fewer steps than STEPS (twelve) for the shorter periods."""
    return 2 * round(1 / calls_per_step)


def model_with_statistics(seed=0):
    """Dense(4) → BatchNorm → Dense(2) on 3 inputs: 34 trainable elements
    (12 + 4, 4 + 4, 8 + 2) and 8 floating non-trainable ones (BN's moving statistics)."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.BatchNormalization(),
                             keras.layers.Dense(2)])


TRAINABLE, STATISTICS = 34, 8
M = 4 * TRAINABLE  # float32 bytes of the trainable variables


def measured_per_step(cluster, make_strategy, steps=STEPS, counts=None):
    """Per rank ``comm.account()`` (and Hierarchical's by level) over ``steps`` steps of
    random gradients, divided by ``steps``; the initial broadcast is not counted."""
    models, opts = [], []
    for comm in cluster.communicators:
        model = model_with_statistics()
        strategy = make_strategy()
        strategy.bind(comm)  # in the main thread: no collective in a simulated split
        models.append(model)
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.01), strategy, comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    for comm in cluster.communicators:
        comm.reset_account()
    if isinstance(opts[0].strategy, Hierarchical):
        for opt in opts:
            opt.strategy.reset_account()
    rng = np.random.default_rng(0)
    grads = [[[rng.normal(scale=0.01, size=v.shape).astype(np.float32) for v in models[0].trainable_variables]
              for _ in range(cluster.size)] for _ in range(steps)]

    def run(r):
        for t in range(steps):
            opts[r].apply([tf.constant(g) for g in grads[t][r]], models[r].trainable_variables,
                          sample_count=None if counts is None else counts[r])

    cluster.run(run)
    per_step = [{k: comm.account()[k] / steps for k in ("bytes", "calls")} for comm in cluster.communicators]
    levels = None
    if isinstance(opts[0].strategy, Hierarchical):
        levels = [{level: {k: v / steps for k, v in account.items()}
                   for level, account in opt.strategy.account_by_level().items()} for opt in opts]
    return models[0], per_step, levels


def expected_of(strategy, model, hosts, ranks_per_host, sample_counts=False):
    return strategy.expected_traffic(model.trainable_variables, model.non_trainable_variables, hosts, ranks_per_host,
                                     sample_counts)


@pytest.mark.parametrize("make, counts, by_hand", [
    (SyncAverage, None, (M, 1.0)),
    (SyncAverage, [3, 1, 0, 2], (M + 4, 1.0)),                         # the count rides along
    (lambda: SyncAverage(compression="fp16"), None, (M / 2, 1.0)),       # 2 bytes an element
    (lambda: SyncAverage(compression="fp16"), [1, 2, 3, 4], ((M + 4) / 2, 1.0)),
    (lambda: EASGD(period=3), None, ((M + 4) / 3, 1 / 3)),  # differences + flag every tau
    (lambda: EASGD(period=3, overlap=True), None, ((M + 4) / 3, 1 / 3)),
    (lambda: PeriodicAverage(period=3), None, ((M + 4 * STATISTICS + 4) / 3, 1 / 3)),  # weights, statistics, flag
    (lambda: DiLoCo(period=4), None, ((M + 4) / 4, 1 / 4)),              # the pseudo-gradient + flag
    (lambda: GradientAccumulation(2), None, ((M + 4) / 2, 1 / 2)),       # sums + the window's count, every k
    (lambda: GradientAccumulation(2, strategy=EASGD(period=2)), None, ((M + 4) / 4, 1 / 4)),
])
def test_the_expected_traffic_is_what_the_ranks_account_for(make, counts, by_hand):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # EASGD's alpha notes at p = 4 are not the point here
        model, measured, _ = measured_per_step(SimulatedCluster(P), make, steps=two_periods(by_hand[1]),
                                               counts=counts)
        expected = expected_of(make(), model, 1, P, sample_counts=counts is not None)
    assert payload_bytes(model.trainable_variables) == M
    assert expected.within_group == Traffic() and expected.ranks_per_group == 1  # flat: every rank its own group
    assert (expected.total.bytes, expected.total.calls) == pytest.approx(by_hand, rel=1e-12)
    for rank in measured:
        assert (rank["bytes"], rank["calls"]) == pytest.approx((expected.total.bytes, expected.total.calls),
                                                               rel=1e-12)


# Groups of 2: each rank's shard of the 34 trainable elements is m = 17 of them (hierarchical.py's docstring).
SHARD = 4 * TRAINABLE // 2


@pytest.mark.parametrize("make_inter, intra_by_hand, inter_by_hand", [
    # the reduce-scatter of 2 rows of m + 1 (the non-finite flag), the update's allgather of m
    (SyncAverage, (2 * (SHARD + 4) + SHARD, 2.0), (SHARD, 1.0)),
    # and every 3rd step the weights' allgather; across, the shard and the flag every 3rd step
    (lambda: EASGD(period=3), (2 * (SHARD + 4) + SHARD + SHARD / 3, 2 + 1 / 3), ((SHARD + 4) / 3, 1 / 3)),
])
def test_hierarchical_expects_each_level_as_its_account_by_level_counts_it(make_inter, intra_by_hand,
                                                                           inter_by_hand):
    cluster = SimulatedCluster(P, ranks_per_host=2)  # 2 hosts of 2: the groups
    model, measured, levels = measured_per_step(cluster, lambda: Hierarchical(inter=make_inter()))
    expected = expected_of(Hierarchical(inter=make_inter()), model, 2, 2)
    assert (expected.within_group.bytes, expected.within_group.calls) == pytest.approx(intra_by_hand, rel=1e-12)
    assert (expected.across_groups.bytes, expected.across_groups.calls) == pytest.approx(inter_by_hand, rel=1e-12)
    assert expected.ranks_per_group == 2
    for rank, by_level in zip(measured, levels):
        assert by_level["intra"] == pytest.approx(
            {"bytes": expected.within_group.bytes, "calls": expected.within_group.calls}, rel=1e-12)
        assert by_level["inter"] == pytest.approx(
            {"bytes": expected.across_groups.bytes, "calls": expected.across_groups.calls}, rel=1e-12)
        assert rank == pytest.approx({"bytes": expected.total.bytes, "calls": expected.total.calls}, rel=1e-12)


def test_hierarchical_with_counts_and_degenerate_layouts():
    model = model_with_statistics()
    two_level = Hierarchical(intra=SyncAverage(), inter=SyncAverage())
    with_counts = expected_of(two_level, model, 2, 2, sample_counts=True)
    # the count rides in every shard's row (and in the shard's allreduce across the groups); wire bytes:
    # the reduce-scatter over n = 2 sends (n-1)/n of its payload, the allgather (n-1)x, a ring allreduce
    # over 2 ranks 2(2-1)/2 S = S, over 4 ranks 2(4-1)/4 S = 1.5 S
    assert (with_counts.within_group, with_counts.across_groups) == (
        Traffic(2 * (SHARD + 8) + SHARD, 2.0, (SHARD + 8) + SHARD), Traffic(SHARD + 4, 1.0, SHARD + 4))
    assert expected_of(two_level, model, 1, 4) == ExpectedTraffic(Traffic(M, 1.0, 1.5 * M), Traffic(), 4)  # one group
    assert expected_of(two_level, model, 4, 1) == ExpectedTraffic(Traffic(), Traffic(M, 1.0, 1.5 * M), 1)  # of one
    with pytest.raises(ValueError, match=r"`ranks_per_group` must divide the number of ranks p=4\. "
                                         r"Received: ranks_per_group=3"):
        expected_of(Hierarchical(ranks_per_group=3), model, 1, 4)


def test_one_rank_sends_nothing_and_a_strategy_that_declares_no_traffic_sends_nothing():
    model = model_with_statistics()
    for strategy in (SyncAverage(), EASGD(), PeriodicAverage(), DiLoCo(), GradientAccumulation(4), Hierarchical()):
        assert expected_of(strategy, model, 1, 1).total == Traffic(), strategy
    assert expected_of(_Silent(), model, 2, 2) == ExpectedTraffic()


class _Silent(SyncStrategy):
    name = "silent"
    description = "a strategy that overrides no hook"


# --- --scale-lr -------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy, size, by_hand", [
    (SyncAverage(), 2, 2.0), (SyncAverage(), 8, 4 * math.sqrt(2)),
    (GradientAccumulation(4, strategy=SyncAverage()), 2, 4 * math.sqrt(2)),  # m = 2·4
    (EASGD(), 8, 4.0), (GradientAccumulation(9, strategy=EASGD()), 2, 6.0),  # size·sqrt(k), 2·sqrt(size/2) past 2
    (PeriodicAverage(), 4, 4.0), (GradientAccumulation(4, strategy=PeriodicAverage()), 2, 4.0),
    # Hierarchical: the inter strategy's rule at G = size/n ranks and n·k micro-batches; sync's at G = 1
    (Hierarchical(inter=EASGD(), ranks_per_group=4), 8, 2 * math.sqrt(4)),            # G 2, n·k 4
    (Hierarchical(inter=SyncAverage(), ranks_per_group=2), 4, 4.0),                   # flat sync's m = 4
    (Hierarchical(inter=PeriodicAverage(), ranks_per_group=2), 8, 4 * math.sqrt(2)),  # G 4, n·k 2
    (GradientAccumulation(2, strategy=Hierarchical(inter=EASGD(), ranks_per_group=2)), 8,
     2 * math.sqrt(4 / 2) * math.sqrt(2 * 2)),                                        # G 4, n·k 4
    (Hierarchical(inter=EASGD(), ranks_per_group=4), 4, 4.0),                         # G 1: SyncAverage(4)
    (Hierarchical(inter=EASGD(), ranks_per_group=8), 8, 4 * math.sqrt(2)),            # G 1: SyncAverage(8)
])
def test_each_strategy_gives_its_own_factor(strategy, size, by_hand):
    assert strategy.lr_scale_factor(size) == pytest.approx(by_hand, rel=1e-12)


@pytest.mark.parametrize("strategy, reason", [
    (DiLoCo(), "--strategy diloco has no --scale-lr rule: the inner --lr sets the ranks' drift"),
    (Hierarchical(inter=DiLoCo(), ranks_per_group=2), "--strategy diloco has no --scale-lr rule"),  # at G = 1 too
    (GradientAccumulation(2, strategy=DiLoCo()), "--strategy diloco has no --scale-lr rule"),
    (_Silent(), "--strategy silent has no --scale-lr rule: it declares none (lr_scale_factor); tune --lr"),
])
def test_a_strategy_without_a_rule_refuses_with_its_reason(strategy, reason):
    with pytest.raises(NoScaleRule) as err:
        strategy.lr_scale_factor(2)
    assert str(err.value).startswith(reason)


def test_hierarchicals_rule_needs_a_layout_of_its_groups():
    with pytest.raises(ValueError, match=r"^`ranks_per_group` must divide the number of ranks p=6\. "
                                         r"Received: ranks_per_group=4$"):
        Hierarchical(ranks_per_group=4).lr_scale_factor(6)
    with pytest.raises(ValueError, match=r"^`ranks_per_group` must be known for --scale-lr's rule: .*"
                                         r"Received: ranks_per_group=None$"):
        Hierarchical().lr_scale_factor(4)  # one group per host: n is known once bound
    assert Hierarchical().lr_scale_factor(1) == 1.0  # train.py's check at one rank, before the ranks start
    bound = Hierarchical(inter=EASGD()).bind(SimulatedCluster(8, ranks_per_host=2).communicators[0])
    assert bound.lr_scale_factor(8) == pytest.approx(2 * math.sqrt(4 / 2) * math.sqrt(2), rel=1e-12)  # G 4, n 2
    assert Hierarchical(ranks_per_group=4).lr_scale_factor(1) == 1.0


# --- resuming at another number of ranks -----------------------------------------------------
def test_resize_verdicts_and_notices():
    assert SyncAverage().resize_refusal(2, 3) is None
    assert GradientAccumulation(4).resize_refusal(2, 3) is None
    assert EASGD().resize_refusal(2, 8) is None  # alpha = beta/q again
    # a fixed alpha: refused exactly where EASGD(moving_rate=alpha) is at q ranks (alpha > 2/(q+1))
    assert EASGD(moving_rate=0.4).resize_refusal(2, 4) is None        # 0.4 = 2/5: at the bound, warned only
    assert EASGD(moving_rate=0.4).resize_refusal(2, 5).startswith(
        "--moving-rate 0.4 was fixed for 2 ranks, and at 5 ranks alpha > 2/(q+1) = 0.333333: the elastic step "
        "diverges; resume at 4 ranks or fewer")
    assert Hierarchical().resize_refusal(2, 3) is None  # by host: the saved group size is in the shards
    for strategy in (PeriodicAverage(), DiLoCo(), GradientAccumulation(2, strategy=DiLoCo())):
        assert strategy.resize_refusal(2, 3) is None  # each declares its rule (test_resize.py)
    # a strategy that declares no rule of its own (the base's hook) still refuses
    assert _Silent().resize_refusal(2, 3) == ("--strategy silent keeps state per rank that has no rule for another "
                                              "number of ranks (resize_refusal)")
    easgd = EASGD(moving_rate=0.3).bind(SimulatedCluster(3).communicators[0])
    assert easgd.resize_notice(2, 3) == ("every rank's local weights restart from the center, optimizer slots are "
                                         "the mean of the 2 saved ranks', moving rate alpha = 0.3")
    assert GradientAccumulation(2, strategy=easgd).resize_notice(2, 3) == easgd.resize_notice(2, 3)
    assert SyncAverage().resize_notice(2, 3) is None and GradientAccumulation(2).resize_notice(2, 3) is None


# --- process groups, and who may sit across them -------------------------------------------------
def test_process_groups_are_the_hierarchical_strategys_and_composites_ask_their_children():
    cluster = SimulatedCluster(P, ranks_per_host=2)
    assert not SyncAverage().needs_process_groups() and not EASGD().needs_process_groups()
    wrapped = GradientAccumulation(2, strategy=Hierarchical())
    assert Hierarchical().needs_process_groups() and wrapped.needs_process_groups()
    assert wrapped.process_groups() is None  # not bound yet
    wrapped.bind(cluster.communicators[1])
    assert wrapped.process_groups() == [[0, 1], [2, 3]]
    assert SyncAverage().bind(cluster.communicators[1]).process_groups() is None


def test_the_inter_choices_are_the_registered_strategies_that_run_across_groups(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    inter = next(opt for opt in Hierarchical.cli_options if opt.flag == "--inter")
    assert registry.choices(inter) == ("diloco", "easgd", "periodic", "sync")
    assert [cls.across_groups for cls in (SyncAverage, EASGD, PeriodicAverage, DiLoCo, Hierarchical)] == [
        True, True, True, True, False]

    class CalmEASGD(EASGD):
        name = "calm_easgd"
        description = "EASGD under another name"

    registry.register(CalmEASGD)  # a subclass inherits the capability, so it may sit across groups
    assert registry.choices(inter) == ("calm_easgd", "diloco", "easgd", "periodic", "sync")


def test_traffic_is_split_by_the_collective_that_carries_it():
    # What a cost model charges by each kind's own formula (hvd_easgd/choosing/cost_model.py): int8 at p = 4 is the
    # quantised allreduce's alltoall (p messages) and allgather (one), each (p−1) messages on the wire.
    model = model_with_statistics()
    int8 = expected_of(SyncAverage(compression="int8"), model, 1, P).across_groups
    kinds = {kind: (b, c, w) for kind, b, c, w in int8.by_collective}
    assert set(kinds) == {"alltoall", "allgather"}
    message = kinds["allgather"][0]
    assert kinds == {"alltoall": (P * message, 1.0, (P - 1) * message), "allgather": (message, 1.0, (P - 1) * message)}
    assert (int8.bytes, int8.calls, int8.wire_bytes) == ((P + 1) * message, 2.0, 2 * (P - 1) * message)
    two_level = expected_of(Hierarchical(intra=SyncAverage(), inter=SyncAverage()), model, 2, 2)
    assert [kind for kind, *_ in two_level.within_group.by_collective] == ["allgather", "reducescatter"]
    assert [kind for kind, *_ in two_level.across_groups.by_collective] == ["allreduce"]
    # accumulation spreads every kind over its k micro-batches
    accumulated = expected_of(GradientAccumulation(2, SyncAverage()), model, 1, P).across_groups
    assert accumulated.by_collective == (("allreduce", accumulated.bytes, 0.5, accumulated.wire_bytes),)
