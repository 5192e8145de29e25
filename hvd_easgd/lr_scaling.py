"""The learning-rate rule of ``--scale-lr``, in one function.

``--lr`` is tuned for one process updating from one batch of
``--batch-size`` samples. With more ranks, or k micro-batches per update,
an update averages more samples and, over a fixed number of epochs, there
are fewer updates, so the rate should grow. By how much was measured, not
assumed (digits, ``horovodrun -np 2 train.py``, lr 0.02, momentum 0.9, the
default 10 epochs; the sweep is in the README), and it differs by strategy
because the strategies average different things:

- ``sync`` (SyncAverage): an update averages the gradients of m = size · k
  batches. The rate scales linearly with m up to m = 4 (Goyal et al. 2017,
  arXiv:1706.02677) and by the square root beyond it (Krizhevsky 2014,
  arXiv:1404.5997; Hoffer et al. 2017, arXiv:1705.08741), continuous at the
  bend::

      factor = m                   for m <= 4
             = 4 * sqrt(m / 4)     for m > 4

  Measured at m = 8 (size 2, k 4), three seeds: ×8 diverges (with or
  without warm-up), ×4 ends at 0.88-0.95, ×5.66 at 0.956-0.972.
- ``easgd``: a rank's local update averages its own k micro-batches only;
  gradients are never averaged across ranks, which meet through the elastic
  pull on the center instead. The rule is linear in the number of ranks
  (the center averages size workers: the rule before accumulation counted,
  unchanged at k = 1) and the square root of k::

      factor = size * sqrt(k)

  Measured at size 2, three seeds: at k = 1, ×2 ends as high as ×1
  (0.978-0.986) and reaches 0.95 about an epoch sooner; at k = 4, ×4 ends
  at 0.964-0.978, while ×5.66 and ×8 end at 0.90 and 0.81.

- ``periodic`` (PeriodicAverage, local SGD): as ``easgd``, and for the same
  reason: a local step averages one rank's k micro-batches, and the ranks
  meet by averaging weights, every τ steps. Between averages the mean of the
  ranks' weights moves as one SyncAverage step over size batches would, so
  over a fixed number of epochs it needs the size-fold rate SyncAverage gets
  at k = 1. Measured at size 2, k = 1, τ = 10, seeds 0 and 1: ×1 ends at
  0.986 and 0.981 (first epoch >= 0.95: 5, 5), ×2 at 0.986 and 0.983 (4, 5).
  k > 1 was not measured: the √k is EASGD's, by the same argument.
- ``hierarchical``: refused. Its two levels average different things (the
  gradients of a group's ranks; the groups by ``--inter``'s rule), and no
  factor for the pair was measured.
- ``diloco``: refused. Its inner rate sets how far the ranks drift in τ
  steps and ``--outer-lr`` how far the synced weights follow their mean
  drift; no single factor on ``--lr`` stands for both, and none was
  measured. Tune ``--lr`` and ``--outer-lr``.

Standard library only: the benchmarks import ``lr_scale`` for their
time-to-accuracy rows, so they use the rule ``train.py`` uses.

Example::

    lr_scale(2, 4, "sync")    # 5.657 (m = 8)
    lr_scale(2, 4, "easgd")   # 4.0
    lr_scale(2, 1, "sync")    # 2.0, as lr × ranks before accumulation counted
"""
import math
import numbers

# The batches per update up to which the linear rule holds under sync (measured; see above).
LINEAR_UP_TO = 4

RULE_HELP = ("sync: m = ranks*K batches per update, factor m up to 4, then 4*sqrt(m/4); "
             "easgd and periodic: factor ranks*sqrt(K) (a local update averages K micro-batches of one rank); "
             "diloco and hierarchical: none (tune --lr; see the error)")


def _sync_factor(size, accumulate):
    batches = size * accumulate
    if batches <= LINEAR_UP_TO:
        return float(batches)
    return LINEAR_UP_TO * math.sqrt(batches / LINEAR_UP_TO)


def _easgd_factor(size, accumulate):
    return size * math.sqrt(accumulate)


_RULES = {"sync": _sync_factor, "easgd": _easgd_factor, "periodic": _easgd_factor}
# Strategies with no rule, and why (the message --scale-lr gives).
_NO_RULE = {"diloco": "the inner --lr sets the ranks' drift over tau steps and --outer-lr how far the synced "
                      "weights follow it; no one factor on --lr scales both. Tune --lr and --outer-lr instead",
            "hierarchical": "its intra level averages the gradients of the ranks in a group (SyncAverage's rule "
                            "would count those) while its inter level meets the groups by its own rule (--inter), "
                            "and no factor for the pair was measured. Tune --lr, e.g. starting from "
                            "--strategy sync's factor for the ranks in one group"}


def has_rule(strategy_name):
    """Whether ``--scale-lr`` has a rule for this strategy (``diloco`` and ``hierarchical`` have none)."""
    return strategy_name not in _NO_RULE


def _check_count(name, value):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1. Received: {name}={value!r}")


def lr_scale(size, accumulate, strategy_name):
    """The factor ``--scale-lr`` multiplies ``--lr`` by.

    Args:
      size: the number of ranks.
      accumulate: k, micro-batches per update (``--accumulate``; 1 without accumulation).
      strategy_name: ``"sync"``, ``"easgd"`` or ``"periodic"``: the strategy under any accumulation.

    Returns:
      The factor, a float >= 1 (see the module docstring for the rule and
      the measurements behind it).
    """
    _check_count("size", size)
    _check_count("accumulate", accumulate)
    if strategy_name in _NO_RULE:
        raise ValueError(f"--strategy {strategy_name} has no --scale-lr rule: {_NO_RULE[strategy_name]}")
    if strategy_name not in _RULES:
        raise ValueError(f"`strategy_name` must be one of {sorted(_RULES)}. "
                         f"Received: strategy_name={strategy_name!r}")
    return float(_RULES[strategy_name](int(size), int(accumulate)))
