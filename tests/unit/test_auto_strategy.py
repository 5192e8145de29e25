"""hvd_easgd.choosing.auto_strategy: the rule that chooses a configuration, on hand-written measurements and traffic.

A model of 4 MB of fp32 gradients; each candidate's traffic is what its strategy sends (one allreduce
of the payload every τ steps, the quantised formats a quarter or an eighth of it), written here by
hand so that every predicted step is a figure one can check with a pencil."""
import pytest

from hvd_easgd.choosing import auto_strategy as auto

pytestmark = pytest.mark.unit
MODEL_BYTES = 4e6


class Level:
    def __init__(self, *collectives):
        self.by_collective = tuple(collectives)
        self.wire_bytes = sum(c[3] for c in collectives)


class Expected:
    """The figures of an ``ExpectedTraffic`` the rule reads."""

    def __init__(self, across, within=None, ranks_per_group=1, overlapped=0.0):
        self.across_groups, self.within_group = across, within or Level()
        self.ranks_per_group, self.overlapped = ranks_per_group, overlapped
        self.total = Level(*(self.across_groups.by_collective + self.within_group.by_collective))


# The rule over several periods (the evidence offers τ = 10 alone today: auto.PERIODS).
PERIODS = (10, 25, 50)
SHARE = {"none": 1.0, "fp16": 0.5, "bf16": 0.5, "int8": 0.25, "int4": 0.125, "topk": 0.03, "powersgd": 0.05}


def hand_traffic(candidate):
    sent = MODEL_BYTES * SHARE[candidate.compression] / candidate.period
    return Expected(Level(("allreduce", sent, 1 / candidate.period, sent)))


def measured(bits_per_second, compute=0.1):
    return auto.Measurements(compute, 2, 1, auto.Link(0.0, bits_per_second / 8))


def test_a_fast_link_keeps_sync_at_full_precision():
    # 10 Gbit/s: sync's allreduce of 4 MB at 2 hosts takes 2·(1/2)·4e6/1.25e9 = 3.2 ms; 0.1/0.1032 = 0.97
    # (fp16 would reach 0.98: not needed)
    choice = auto.choose_for(measured(10e9), hand_traffic)
    assert choice.prediction.candidate == auto.Candidate("sync")
    assert choice.prediction.utilisation == pytest.approx(0.1 / 0.1032)


def test_a_slow_link_takes_the_most_synchronous_period_that_reaches_the_target_and_of_it_the_most_precise():
    # 100 Mbit/s: sync 0.1/(0.1 + 0.32) = 0.24, fp16 0.38; at tau 10, fp32 0.1/0.132 = 0.76, int8 0.1/0.108 = 0.93
    # and int4 0.1/0.104 = 0.96: int8 is the most precise that reaches 0.9
    choice = auto.choose_for(measured(100e6), hand_traffic)
    assert choice.prediction.candidate == auto.Candidate("diloco", "int8", 10)
    # at a target of 0.95 int8 (0.926) no longer reaches and int4 (0.962) does: fewer bits where they are needed
    assert auto.choose_for(measured(100e6), hand_traffic, target=0.95).prediction.candidate == \
        auto.Candidate("diloco", "int4", 10)
    # without the quantised formats, fp32 at the period that reaches: tau 25 0.1/0.1128 = 0.89, tau 50 0.94
    families = (("sync", "none"), ("diloco", "none"))
    assert auto.choose_for(measured(100e6), hand_traffic, families=families, periods=PERIODS).prediction.candidate \
        == auto.Candidate("diloco", "none", 50)


def test_a_longer_period_is_taken_only_when_a_shorter_cannot_reach_the_target():
    # 10 Mbit/s, fp32 only: tau 10 0.1/(0.1 + 0.32) = 0.24, tau 25 0.44, tau 50 0.61: none reaches 0.9,
    # so the highest, tau 50, with the line saying it is below the target
    families = (("sync", "none"), ("diloco", "none"))
    choice = auto.choose_for(measured(10e6), hand_traffic, families=families, periods=PERIODS)
    assert choice.prediction.candidate == auto.Candidate("diloco", "none", 50)
    assert "below the target 0.9: the highest predicted" in choice.reason
    # a target of 0.6 is reached first at tau 50 too; at 0.4, tau 25 (0.44) is the most synchronous that reaches
    assert auto.choose_for(measured(10e6), hand_traffic, target=0.4, families=families,
                           periods=PERIODS).prediction.candidate.period == 25


def test_the_one_line_names_the_choice_sync_and_the_best_more_synchronous_candidate():
    choice = auto.choose_for(measured(100e6, compute=0.041), hand_traffic,
                             families=(("sync", "none"), ("diloco", "none"), ("diloco", "int8")), periods=PERIODS)
    # c = 41 ms: sync 0.041/0.361 = 0.11; tau 10 fp32 0.56, int8 0.84; tau 25 int8 0.93 is the choice
    assert choice.prediction.candidate == auto.Candidate("diloco", "int8", 25)
    assert choice.reason == ("auto: diloco τ=25 int8, predicted utilisation 0.93 (sync 0.11, diloco τ=10 int8 "
                             "0.84) on a 100 Mbit/s link, c = 41 ms")


def test_hierarchical_is_a_candidate_only_with_several_hosts_of_several_ranks_and_comes_first_at_equal_period():
    assert not any(c.hierarchical for c in auto.candidates(2, 1) + auto.candidates(1, 4))
    both = auto.candidates(2, 2)
    assert auto.Candidate("sync", hierarchical=True) in both and auto.Candidate("diloco", "int8", 10, True) in both
    assert auto.Candidate("sync", hierarchical=True).order() < auto.Candidate("sync").order() \
        < auto.Candidate("diloco", period=10, hierarchical=True).order()
    assert auto.Candidate("diloco", "int8", 10, True).flags() == ("--strategy", "hierarchical", "--inter", "diloco",
                                                                  "--tau", "10", "--compression", "int8")


def test_only_the_families_the_evidence_allows_are_candidates():
    names = {(c.strategy, c.compression) for c in auto.candidates(2, 2)}
    assert names == set(auto.CANDIDATE_FAMILIES)
    assert max(c.period for c in auto.candidates(2, 1)) == max(auto.PERIODS)


def test_a_withheld_family_is_predicted_and_never_chosen_and_the_second_line_says_why():
    # 10 Mbit/s: diloco tau 10 int4 0.1/(0.1 + 2·(1/2)·4e6·0.125/10/1.25e6) = 0.1/0.14 = 0.71 is the highest
    # candidate; top-k (0.03 of fp32's bytes) would give 0.1/0.1096 = 0.91 and PowerSGD (0.05 every step)
    # 0.1/0.26 = 0.38: top-k is named, with why, and int4 is still the choice
    choice = auto.choose_for(measured(10e6), hand_traffic)
    assert choice.prediction.candidate == auto.Candidate("diloco", "int4", 10)
    aside = {p.candidate: (p.utilisation, why) for p, why in choice.withheld}
    assert set(aside) == {auto.Candidate("diloco", "topk", 10), auto.Candidate("sync", "powersgd")}
    assert aside[auto.Candidate("diloco", "topk", 10)][0] == pytest.approx(0.1 / 0.1096)
    assert aside[auto.Candidate("sync", "powersgd")][0] == pytest.approx(0.1 / 0.26)
    assert auto.withheld_line(choice) == ("auto: withheld diloco τ=10 topk, predicted utilisation 0.91: "
                                          + auto.WITHHELD_FAMILIES[("diloco", "topk")])
    # a choice that reaches the target needs none: on a fast link sync (0.97) has no second line though top-k
    # predicts 1.00, nor has int4 at 10 Mbit/s against a target of 0.7
    assert auto.withheld_line(auto.choose_for(measured(10e9), hand_traffic)) is None
    assert auto.withheld_line(auto.choose_for(measured(10e6), hand_traffic, target=0.7), target=0.7) is None
    # a family allowed as a candidate is not also predicted aside; none withheld, none predicted aside
    allowed = auto.CANDIDATE_FAMILIES + (("diloco", "topk"),)
    assert auto.choose_for(measured(10e6), hand_traffic, families=allowed).prediction.candidate == \
        auto.Candidate("diloco", "topk", 10)
    assert [p.candidate for p, _ in auto.choose_for(measured(10e6), hand_traffic, families=allowed).withheld] == \
        [auto.Candidate("sync", "powersgd")]
    assert auto.choose_for(measured(10e6), hand_traffic, withheld={}).withheld == ()


def test_the_withheld_families_are_not_candidates_and_each_builds_and_says_why():
    assert not set(auto.WITHHELD_FAMILIES) & set(auto.CANDIDATE_FAMILIES)
    for (strategy, compression), why in auto.WITHHELD_FAMILIES.items():
        built = auto.Candidate(strategy, compression, 10 if strategy == "diloco" else 1).build()
        # PowerSGD is SyncAverage's own low-rank step, not a wire format
        assert built.powersgd is not None if compression == "powersgd" else built.compression.name == compression
        assert "docs/" in why and len(why) > 40


def test_the_rule_refuses_nothing_to_choose_from_and_a_target_outside_0_1():
    with pytest.raises(ValueError, match="at least one candidate"):
        auto.choose([], measured(1e9))
    with pytest.raises(ValueError, match="0 < target <= 1"):
        auto.choose_for(measured(1e9), hand_traffic, target=1.5)


def test_a_record_builds_its_strategy_and_every_candidate_builds():
    from hvd_easgd.strategies import DiLoCo, Hierarchical, SyncAverage

    for candidate in auto.candidates(2, 2):
        strategy = candidate.build()
        flat = strategy.inter if candidate.hierarchical else strategy
        assert isinstance(strategy, Hierarchical) == candidate.hierarchical
        assert isinstance(flat, SyncAverage if candidate.strategy == "sync" else DiLoCo)
        assert flat.compression.name == candidate.compression
    record = {"candidate": auto.Candidate("diloco", "int4", 25)._asdict()}
    assert auto.strategy_of(record).period == 25


def test_auto_at_one_rank_measures_a_copy_and_keeps_sync_on_one_host():
    import keras
    import numpy as np

    from hvd_easgd.comm import LocalCommunicator

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    before = [w.copy() for w in model.get_weights()]
    batches = [(np.ones((8, 4), np.float32), np.zeros(8, np.int64))] * 2
    strategy, record = auto.auto(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                 keras.optimizers.Adam(1e-3), batches, comm=LocalCommunicator())
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))  # a copy was stepped
    assert type(strategy).__name__ == "SyncAverage" and record["candidate"]["strategy"] == "sync"
    assert record["hosts"] == 1 and record["compute"] > 0 and record["utilisation"] == 1.0
    assert record["reason"].startswith("auto: sync, predicted utilisation 1.00") and " on one host, c = " in \
        record["reason"]
    assert len(record["predictions"]) == len(auto.candidates(1, 1))
    # the withheld families are predicted too, and on one host none beats sync's 1.00: no second line
    assert {w["candidate"] for w in record["withheld"]} == {"diloco τ=10 topk", "sync powersgd"}
    assert all(w["why"] == auto.WITHHELD_FAMILIES[tuple(w["candidate"].replace(" τ=10", "").split())]
               for w in record["withheld"]) and record["withheld_line"] is None
