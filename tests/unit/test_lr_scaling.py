"""--scale-lr's rule (each strategy's ``lr_scale_factor``) and the optimizer the trainer builds with it."""
import math

import keras
import pytest

from hvd_easgd.app import cli
from hvd_easgd.app.config import TrainConfig
from hvd_easgd.app.lr_scaling import auto_scales, lr_factor
from hvd_easgd.app.trainer import _inner_optimizer
from hvd_easgd.strategies import DiLoCo, EASGD, GradientAccumulation, Hierarchical, PeriodicAverage, SyncAverage, \
    registry
from hvd_easgd.strategies.base import NoScaleRule

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("size, accumulate, expected", [
    (1, 1, 1.0), (2, 1, 2.0), (4, 1, 4.0),   # linear in the ranks, as before accumulation counted
    (2, 2, 4.0),                             # m = 4: still linear
    (2, 4, 4 * math.sqrt(2)),                # m = 8: 4 * sqrt(8 / 4)
    (8, 1, 4 * math.sqrt(2)),                # the same m, the same update: the same factor
    (4, 4, 4 * math.sqrt(2)),                # m = 16: flat beyond m = 8
    (8, 4, 4 * math.sqrt(2)),                # m = 32: --accumulate 4 at 8 ranks
])
def test_sync_is_linear_in_batches_per_update_up_to_4_then_square_root_up_to_8_then_flat(size, accumulate, expected):
    assert SyncAverage.lr_scale_factor(size, accumulate) == pytest.approx(expected, rel=1e-12)
    # accumulation asks the strategy it wraps at k times the micro-batches
    assert GradientAccumulation(accumulate, strategy=SyncAverage()).lr_scale_factor(size) == pytest.approx(
        expected, rel=1e-12)


@pytest.mark.parametrize("size, accumulate, expected", [
    (1, 1, 1.0), (2, 1, 2.0), (8, 1, 4.0),   # k = 1: lr x ranks up to 2, then 2 sqrt(ranks/2)
    (2, 4, 4.0), (2, 9, 6.0), (6, 4, 2 * math.sqrt(3) * 2), (32, 1, 8.0),
])
def test_easgd_is_ranks_up_to_two_then_their_square_root_times_that_of_k(size, accumulate, expected):
    assert EASGD.lr_scale_factor(size, accumulate) == pytest.approx(expected, rel=1e-12)
    assert GradientAccumulation(accumulate, strategy=EASGD()).lr_scale_factor(size) == pytest.approx(
        expected, rel=1e-12)


@pytest.mark.parametrize("strategy, args, message", [
    ("sync", (0, 1), "`size` must be an integer >= 1. Received: size=0"),
    ("sync", (2, 1.5), "`accumulate` must be an integer >= 1. Received: accumulate=1.5"),
    ("sync", (2, True), "Received: accumulate=True"),
    ("easgd", (0, 1), "`size` must be an integer >= 1. Received: size=0"),
    ("diloco", (2, 0), "`accumulate` must be an integer >= 1. Received: accumulate=0"),
])
def test_bad_arguments_are_refused_in_keras_form(strategy, args, message):
    with pytest.raises(ValueError) as err:
        registry.get(strategy).lr_scale_factor(*args)
    assert message in str(err.value)


def test_a_name_nobody_registered_is_refused_by_the_registry():
    # the rule is asked of the class, so an unknown name fails where names are looked up
    with pytest.raises(ValueError, match=r"^`name` must be a registered strategy, one of \['diloco', 'easgd', "
                                         r"'hierarchical'.*\(unknown strategy 'ps'\)\. Received: name='ps'$"):
        registry.get("ps")


def namespace(**overrides):
    values = dict(lr=0.1, scale_lr=True, lr_warmup_epochs=0.0, optimizer="sgd", momentum=0.0, accumulate=1,
                  strategy="sync")
    return TrainConfig(**{**values, **overrides})


def test_scale_lr_with_warmup_ramps_linearly_to_the_scaled_rate():
    config = _inner_optimizer(namespace(lr_warmup_epochs=1.0), size=4, updates_per_epoch=10).get_config()
    # a built-in Keras schedule: model.keras stays loadable without hvd_easgd
    assert config["learning_rate"]["module"] == "keras.optimizers.schedules"
    schedule = keras.optimizers.schedules.deserialize(config["learning_rate"])
    values = [float(schedule(step)) for step in (0, 5, 10, 50)]
    assert values == pytest.approx([0.1, 0.25, 0.4, 0.4])


@pytest.mark.parametrize("overrides, size, expected", [
    ({}, 4, 0.4),
    ({"accumulate": 4}, 2, 0.1 * 4 * math.sqrt(2)),
    ({"accumulate": 4, "strategy": "easgd"}, 2, 0.4),
    ({"scale_lr": False, "accumulate": 4}, 2, 0.1),
])
def test_the_trainer_takes_its_rate_from_the_strategys_rule(overrides, size, expected):
    optimizer = _inner_optimizer(namespace(**overrides), size=size, updates_per_epoch=10)
    assert float(optimizer.learning_rate.numpy()) == pytest.approx(expected, rel=1e-6)


# --- Adam's rules (``adaptive``): a rule written for SGD does not carry over ----------------------
@pytest.mark.parametrize("size", [1, 2, 4, 8, 64])
def test_under_adam_sync_takes_root_m_and_the_local_rules_take_theirs_times_syncs_flat_beyond_2_ranks(size):
    sync = math.sqrt(min(size, 8))  # √m, flat beyond the largest m measured
    assert SyncAverage.lr_scale_factor(size, adaptive=True) == pytest.approx(sync, rel=1e-12)
    p = min(size, 2)  # the local rules as measured up to 2 ranks, flat beyond
    assert PeriodicAverage.lr_scale_factor(size, adaptive=True) == pytest.approx(math.sqrt(p) * math.sqrt(p),
                                                                                 rel=1e-12)
    assert EASGD.lr_scale_factor(size, adaptive=True) == pytest.approx(math.sqrt(p) * (p + 1) / p * math.sqrt(p),
                                                                       rel=1e-12)
    # k = 4: SyncAverage's m = 4p (flat beyond 8); the workers' own √p whatever k
    assert GradientAccumulation(4).lr_scale_factor(size, adaptive=True) == \
        pytest.approx(math.sqrt(min(4 * size, 8)), rel=1e-12)
    assert GradientAccumulation(4, strategy=PeriodicAverage()).lr_scale_factor(size, adaptive=True) == \
        pytest.approx(math.sqrt(p) * math.sqrt(min(4 * p, 8)), rel=1e-12)
    with pytest.raises(NoScaleRule, match="no --scale-lr rule"):  # DiLoCo: --scale-lr auto keeps --lr
        DiLoCo.lr_scale_factor(size, adaptive=True)


@pytest.mark.parametrize("size, periodic, easgd", [(1, 1.0, 2.0), (2, 2.0, 3.0), (4, 2.0, 3.0), (8, 2.0, 3.0),
                                                   (64, 2.0, 3.0)])
def test_under_adam_at_k_1_periodic_is_p_and_easgd_p_plus_1_up_to_2_ranks_and_flat_beyond(size, periodic, easgd):
    assert lr_factor(PeriodicAverage, size, optimizer="adam") == pytest.approx(periodic, rel=1e-12)
    assert lr_factor(EASGD, size, optimizer="adam") == pytest.approx(easgd, rel=1e-12)


def test_easgd_at_two_ranks_under_adam_is_3_and_hierarchical_asks_its_inter_strategy_at_g_groups():
    assert lr_factor(EASGD, 2, optimizer="adam") == pytest.approx(3.0, rel=1e-12)
    assert lr_factor(EASGD, 2, optimizer="momentum") == 2.0  # SGD's rule, unchanged
    # 8 ranks in groups of 4: EASGD across G = 2 groups of m = 4 batches (SyncAverage's √8, flat at 8)
    hierarchical = Hierarchical(inter=EASGD(), ranks_per_group=4)
    assert hierarchical.lr_scale_factor(8, adaptive=True) == pytest.approx(math.sqrt(2) * 1.5 * math.sqrt(8),
                                                                           rel=1e-12)
    # one group: SyncAverage's rule over its n ranks
    assert Hierarchical(inter=EASGD(), ranks_per_group=4).lr_scale_factor(4, adaptive=True) == \
        pytest.approx(2.0, rel=1e-12)


def test_train_py_scales_adam_for_sync_periodic_and_easgd_and_keeps_it_for_diloco():
    for strategy, scaled in (("periodic", True), ("easgd", True), ("sync", True), ("diloco", False)):
        config = cli.parse_args(["--data", "python_docs", "--strategy", strategy])
        assert (config.optimizer, config.lr, config.scale_lr) == ("adam", 0.001, scaled)
    assert not cli.parse_args(["--data", "python_docs", "--strategy", "easgd", "--lr", "0.001"]).scale_lr
    for strategy, factor in (("easgd", 3.0), ("periodic", 2.0), ("sync", math.sqrt(2))):
        optimizer = _inner_optimizer(namespace(optimizer="adam", lr=0.001, strategy=strategy), size=2,
                                     updates_per_epoch=10)
        assert float(optimizer.learning_rate.numpy()) == pytest.approx(0.001 * factor, rel=1e-6)


def test_a_plugin_that_states_no_adam_rule_is_refused_for_adam_and_kept_for_sgd():
    class OldPlugin(SyncAverage):
        name = "old_plugin"

        @classmethod
        def lr_scale_factor(cls, size, accumulate=1):  # written before `adaptive` existed
            return float(size)

    assert lr_factor(OldPlugin, 4, optimizer="sgd") == 4.0
    with pytest.raises(ValueError, match="old_plugin states no --scale-lr rule for Adam"):
        lr_factor(OldPlugin, 4, optimizer="adam")
    assert not auto_scales(OldPlugin, "adam", lr_given=False) and auto_scales(OldPlugin, "sgd", lr_given=False)
