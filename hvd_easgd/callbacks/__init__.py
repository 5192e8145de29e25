"""Keras callbacks, one per module.

Imports ``training``, ``checkpoint``, ``strategies``, ``comm`` and the top-level modules; only the
application imports it.
"""
from .adaptive_period import AdaptivePeriodLoss
from .average_statistics import AverageStatistics
from .broadcast import BroadcastInitialState
from .checkpointing import PeriodicCheckpoint
from .elastic_commit import ElasticCommit
from .global_metrics import GlobalEvaluationMetrics
from .merge_at_end import MergeAtEnd
from .metric_average import MetricAverage
from .nonfinite_abort import AbortOnNonFinite, NonFiniteTrainingError
from .run_recorder import RunRecorder
from .step_timeline import StepTimeline
from .swap_kept_weights import SwapKeptWeights

__all__ = ["AbortOnNonFinite", "AdaptivePeriodLoss", "AverageStatistics", "BroadcastInitialState", "ElasticCommit", "GlobalEvaluationMetrics",
           "MergeAtEnd", "MetricAverage", "NonFiniteTrainingError", "PeriodicCheckpoint", "RunRecorder", "StepTimeline", "SwapKeptWeights",
           "defaults"]


def defaults(swap_on_epoch=False, statistics_every_step=False, merge_at_end=True):
    """The callbacks every ``model.fit`` with DistributedOptimizers wants, in order:
    initial state, BatchNorm statistics averaged, the kept model swapped in for
    evaluation and prediction (and at epoch ends with ``swap_on_epoch=True``,
    for a ``ModelCheckpoint`` placed after them), metrics averaged, the
    training loss handed to an adaptive period (``--tau adaptive``), and, when
    ``fit`` ends, the ranks' last local steps merged into the kept model
    (``MergeAtEnd``, which leaves the training state as it was, so a second ``fit``
    continues as one longer ``fit``; ``merge_at_end=False`` saves its one
    collective where only the last ``fit``'s kept model matters)."""
    chosen = [BroadcastInitialState(), AverageStatistics(every_step=statistics_every_step),
              SwapKeptWeights(swap_on_epoch=swap_on_epoch), MetricAverage(), AdaptivePeriodLoss()]
    return chosen + [MergeAtEnd()] if merge_at_end else chosen
