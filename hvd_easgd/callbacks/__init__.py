"""Keras callbacks, one per module."""
from .broadcast import BroadcastInitialState
from .center_swap import CenterSwap, SwappedWeights, center_strategy
from .checkpointing import PeriodicCheckpoint
from .global_metrics import GlobalEvaluationMetrics
from .metric_average import MetricAverage
from .nonfinite_abort import AbortOnNonFinite, NonFiniteTrainingError
from .run_recorder import RunRecorder

__all__ = ["AbortOnNonFinite", "BroadcastInitialState", "CenterSwap", "GlobalEvaluationMetrics", "MetricAverage",
           "NonFiniteTrainingError", "PeriodicCheckpoint", "RunRecorder", "SwappedWeights", "center_strategy",
           "defaults"]


def defaults():
    """The callbacks every ``model.fit`` with a ``DistributedOptimizer`` wants, in order."""
    return [BroadcastInitialState(), CenterSwap(), MetricAverage()]
