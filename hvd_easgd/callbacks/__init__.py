"""Keras callbacks, one per module."""
from .adaptive_period import AdaptivePeriodLoss
from .average_statistics import AverageStatistics
from .broadcast import BroadcastInitialState
from .checkpointing import PeriodicCheckpoint
from .elastic_commit import ElasticCommit
from .global_metrics import GlobalEvaluationMetrics
from .metric_average import MetricAverage
from .nonfinite_abort import AbortOnNonFinite, NonFiniteTrainingError
from .run_recorder import RunRecorder
from .step_timeline import StepTimeline
from .swap_kept_weights import SwapKeptWeights

__all__ = ["AbortOnNonFinite", "AdaptivePeriodLoss", "AverageStatistics", "BroadcastInitialState", "ElasticCommit", "GlobalEvaluationMetrics",
           "MetricAverage", "NonFiniteTrainingError", "PeriodicCheckpoint", "RunRecorder", "StepTimeline", "SwapKeptWeights",
           "defaults"]


def defaults(swap_on_epoch=False, statistics_every_step=False):
    """The callbacks every ``model.fit`` with DistributedOptimizers wants, in order:
    initial state, BatchNorm statistics averaged, the kept model swapped in for
    evaluation and prediction (and at epoch ends with ``swap_on_epoch=True``,
    for a ``ModelCheckpoint`` placed after them), metrics averaged, and the
    training loss handed to an adaptive period (``--tau adaptive``)."""
    return [BroadcastInitialState(), AverageStatistics(every_step=statistics_every_step),
            SwapKeptWeights(swap_on_epoch=swap_on_epoch), MetricAverage(), AdaptivePeriodLoss()]
