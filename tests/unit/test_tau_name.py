"""τ has one public name, ``period``, for every τ-strategy; EASGD also takes TF1's ``communication_period``."""
import keras
import numpy as np
import pytest

from hvd_easgd import DiLoCo, EASGD, Hierarchical, PeriodicAverage

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("cls", [EASGD, PeriodicAverage, DiLoCo])
def test_every_tau_strategy_takes_period_and_reports_it(cls):
    strategy = cls(period=np.int64(4))
    assert strategy.period == 4 and type(strategy.period) is int
    assert strategy.get_config()["period"] == 4
    assert "communication_period" not in strategy.get_config()
    assert cls(7).period == 7  # the first positional argument, as before


def test_easgd_takes_tf1s_name_as_an_alias_of_period():
    strategy = EASGD(communication_period=6, moving_rate=0.25)
    assert (strategy.period, strategy.communication_period) == (6, 6)
    assert strategy.get_config() == EASGD(period=6, moving_rate=0.25).get_config()
    assert EASGD().period == 10


def test_easgd_refuses_both_names_for_tau():
    with pytest.raises(ValueError, match=r"^`period` and `communication_period` are one argument, tau .* give one "
                                         r"of them\. Received: period=3, communication_period=3$"):
        EASGD(period=3, communication_period=3)


def test_a_config_saved_before_the_rename_still_loads():
    # What EASGD.get_config wrote before `period` (model.keras files, checkpoints' config).
    old = {"communication_period": 4, "moving_rate": 0.2, "beta": 0.9, "rho": 0.0, "warmup_steps": 3,
           "overlap": True}
    strategy = EASGD.from_config(old)
    assert (strategy.period, strategy._moving_rate_arg, strategy.warmup_steps, strategy.overlap) == (4, 0.2, 3, True)
    serialised = keras.saving.serialize_keras_object(EASGD(period=4))
    serialised["config"] = dict(old)
    again = keras.saving.deserialize_keras_object(serialised)
    assert type(again) is EASGD and again.period == 4
    nested = keras.saving.serialize_keras_object(Hierarchical(inter=EASGD(period=5), ranks_per_group=2))
    nested["config"]["inter"]["config"] = {"communication_period": 5, "moving_rate": None, "beta": 0.9,
                                           "rho": 0.0, "warmup_steps": 0, "overlap": False}
    assert keras.saving.deserialize_keras_object(nested).inter.period == 5
