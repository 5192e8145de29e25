"""Keras callbacks, one per module."""
from .broadcast import BroadcastInitialState
from .center_swap import CenterSwap, SwappedWeights, center_strategy
from .metric_average import MetricAverage

__all__ = ["BroadcastInitialState", "CenterSwap", "MetricAverage", "SwappedWeights", "center_strategy", "defaults"]


def defaults():
    """The callbacks every ``model.fit`` with a ``DistributedOptimizer`` wants, in order."""
    return [BroadcastInitialState(), CenterSwap(), MetricAverage()]
