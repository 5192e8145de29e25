"""--scale-lr's rule (each strategy's ``lr_scale_factor``) and the optimizer the trainer builds with it."""
import math

import keras
import pytest

from hvd_easgd.app.config import TrainConfig
from hvd_easgd.app.trainer import _inner_optimizer
from hvd_easgd.strategies import EASGD, GradientAccumulation, SyncAverage, registry

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
