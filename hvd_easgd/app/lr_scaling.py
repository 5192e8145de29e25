"""The learning-rate rule of ``--scale-lr``, in one function, and the defaults
``train.py`` resolves with it (``--scale-lr auto``, the default ``--epochs``).

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

The defaults. ``train.py`` with no ``--lr`` trains at ``DEFAULT_LR`` times
the strategy's rule (``--scale-lr auto``: ``auto_scales``), and with no
``--epochs`` for ``default_epochs(updates per epoch)`` epochs: the default
10, lengthened to at least ``MIN_UPDATES`` optimizer updates when many ranks
(or ``--accumulate``) leave few updates in an epoch. Measured on digits
(1,437 training samples, per-rank batch 32; the figures are in the README):
at 8 ranks an epoch holds 5 updates, and 10 epochs at the unscaled rate end
at 0.881; 20 epochs alone (×1) at 0.953; the rule alone (×5.66, 10 epochs)
at 0.972 and 0.967 (seeds 0, 1); both (×5.66, 20 epochs = 100 updates) at
0.983 and 0.969, the default. At 4 ranks (11 updates an epoch, 10 epochs)
the rule (×4) ends at 0.978 and 0.981. The rule keeps what it was measured
with: SGD with or without momentum (``RULE_OPTIMIZERS``).

Standard library only: the benchmarks import ``lr_scale`` for their
time-to-accuracy rows, so they use the rule ``train.py`` uses.

Example::

    lr_scale(2, 4, "sync")    # 5.657 (m = 8)
    lr_scale(2, 4, "easgd")   # 4.0
    lr_scale(2, 1, "sync")    # 2.0, as lr × ranks before accumulation counted
"""
import math
import numbers

# train.py's --lr and --epochs when not given (see "The defaults" above).
DEFAULT_LR = 0.02
DEFAULT_EPOCHS = 10
MIN_UPDATES = 100
# The optimizers the rule was measured with; Adam adapts its own step size and was not measured.
RULE_OPTIMIZERS = ("sgd", "momentum", "nesterov")

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
    """Whether ``--scale-lr`` has a rule for this strategy (``diloco`` and ``hierarchical`` have none,
    nor has a strategy registered from outside hvd_easgd)."""
    return strategy_name in _RULES


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


def auto_scales(strategy_name, optimizer, lr_given):
    """Whether ``--scale-lr auto`` (the default) applies the rule: when ``--lr`` was
    not given, the strategy has a rule and the optimizer is one it was measured with.
    A given ``--lr`` is kept as given; ``--scale-lr`` scales it on purpose."""
    return not lr_given and has_rule(strategy_name) and optimizer in RULE_OPTIMIZERS


def default_epochs(updates_per_epoch):
    """The epochs ``train.py`` trains when ``--epochs`` is not given: ``DEFAULT_EPOCHS``,
    or as many more as keep ``MIN_UPDATES`` optimizer updates in the run.

    Args:
      updates_per_epoch: optimizer updates in one epoch (micro-batches per rank / k).

    Example::

        default_epochs(44)  # 10: one rank on digits, 440 updates
        default_epochs(5)   # 20: 8 ranks on digits, 5 updates an epoch
    """
    _check_count("updates_per_epoch", updates_per_epoch)
    return max(DEFAULT_EPOCHS, -(-MIN_UPDATES // int(updates_per_epoch)))
