"""train.py's defaults around ``--scale-lr``: ``--scale-lr auto``
(``auto_scales``), the default ``--epochs`` (``default_epochs``) and the
default ``--lr`` (``DEFAULT_LR``).

``--lr`` is tuned for one process updating from one batch of
``--batch-size`` samples. With more ranks, or k micro-batches per update,
an update averages more samples and, over a fixed number of epochs, there
are fewer updates, so the rate should grow. By how much was measured, not
assumed, and it differs by strategy because the strategies average
different things: each strategy states its own rule and the measurements
behind it (``SyncStrategy.lr_scale_factor``: SyncAverage's m = size·k rule,
PeriodicAverage's size·sqrt(k), EASGD's the same up to 2 ranks and
2·sqrt(size/2)·sqrt(k) beyond; DiLoCo refuses,
saying why; Hierarchical, an instance's rule as it needs its options,
the inter strategy's rule at G = size/n groups of n·k batches).
``GradientAccumulation`` asks the strategy it wraps at k times
the micro-batches, so this module holds no table of strategies.

The defaults. ``train.py`` with no ``--lr`` trains at ``DEFAULT_LR`` times
the strategy's rule (``--scale-lr auto``: ``auto_scales``), and with no
``--epochs`` for ``default_epochs(updates per epoch)`` epochs: the default
10, lengthened to at least ``MIN_UPDATES`` optimizer updates when many ranks
(or ``--accumulate``) leave few updates in an epoch. Measured on digits
(1,437 training samples, per-rank batch 32; the figures are in docs/defaults-at-n-ranks.md):
at 8 ranks an epoch holds 5 updates, and 10 epochs at the unscaled rate end
at 0.881; 20 epochs alone (×1) at 0.953; the rule alone (×5.66, 10 epochs)
at 0.972 and 0.967 (seeds 0, 1); both (×5.66, 20 epochs = 100 updates) at
0.983 and 0.969, the default. At 4 ranks (11 updates an epoch, 10 epochs)
the rule (×4) ends at 0.978 and 0.981. The rule keeps what it was measured
with: SGD with or without momentum. Adam (the language model's optimizer)
adapts its own step size, so a strategy states its Adam rule apart
(``lr_scale_factor(..., adaptive=True)``, asked through ``lr_factor``):
SyncAverage's √m (m = size·k batches an update, flat beyond m = 8), and
PeriodicAverage's √p and EASGD's √p·(p+1)/p, which keep SyncAverage's pace
at the same rate, times SyncAverage's √m, so that they keep its pace at
its rate (at k = 1: p and p + 1), up to 2 ranks and flat beyond
(``local_updates.ADAPTIVE_RANKS_UP_TO``); a strategy that states none
(DiLoCo) refuses, and ``--scale-lr auto`` then keeps ``--lr``.

Standard library only (the benchmarks' TF-free parts may import it): the
strategy classes are handed in, never imported here.

Example::

    SyncAverage.lr_scale_factor(2, 4)        # 5.657 (m = 8)
    EASGD.lr_scale_factor(2, 4)              # 4.0
    auto_scales(DiLoCo, "momentum", False)   # False: DiLoCo has no rule
    lr_factor(SyncAverage, 2, optimizer="adam")  # 1.414: sqrt(2)
    lr_factor(EASGD, 2, optimizer="adam")    # 3.0: sqrt(2) * 3/2 * sqrt(2)
"""
import inspect

from .. import validation

# train.py's --lr and --epochs when not given (see "The defaults" above).
DEFAULT_LR = 0.02
# Adam's when --lr is not given: Keras's own default, and GPT-2-small's order of magnitude.
DEFAULT_ADAM_LR = 1e-3
DEFAULT_EPOCHS = 10
# Text's: an epoch reads every token of the corpus once, thousands of updates.
DEFAULT_TEXT_EPOCHS = 1
MIN_UPDATES = 100
# The optimizers a rule is stated for: SGD's family, and Adam, which adapts its own step size and so
# takes a rule of its own (``lr_scale_factor``'s ``adaptive``), where the strategy states one.
RULE_OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam")
ADAPTIVE_OPTIMIZERS = ("adam",)


def lr_factor(strategy, size, accumulate=1, optimizer="momentum"):
    """``strategy.lr_scale_factor`` for ``optimizer`` (train.py's ``--optimizer``): Adam's rule
    (``adaptive``) or SGD's. A strategy defined before ``adaptive`` existed (a plugin) answers
    for SGD only: asked for Adam, it refuses (a ``ValueError``, as ``NoScaleRule`` is)."""
    adaptive = optimizer in ADAPTIVE_OPTIMIZERS
    if not adaptive:
        return strategy.lr_scale_factor(size, accumulate)
    try:
        return strategy.lr_scale_factor(size, accumulate, adaptive=True)
    except TypeError as err:
        if "adaptive" not in str(err):
            raise
        raise ValueError(f"--strategy {strategy.name} states no --scale-lr rule for Adam (its lr_scale_factor "
                         "takes no `adaptive`); tune --lr") from None


def _has_rule(strategy, optimizer="momentum"):
    """Whether ``--scale-lr`` has a rule for ``strategy`` (a class or instance) under
    ``optimizer``: its ``lr_scale_factor`` answers instead of refusing."""
    if isinstance(strategy, type) and _rule_needs_options(strategy):
        raise TypeError(f"{strategy.__name__}'s --scale-lr rule needs its options: ask the strategy built "
                        "(cli.make_strategy), not its class")
    try:
        lr_factor(strategy, 1, 1, optimizer)
    except ValueError:
        return False
    return True


def _rule_needs_options(cls):
    """Whether ``cls``'s rule is an instance's (it needs the strategy's options,
    Hierarchical's): a plain method, not bound to the class as a classmethod is."""
    return not inspect.ismethod(cls.lr_scale_factor)


def rule_help(strategies):
    """``--scale-lr``'s help: each strategy's rule in one line, the first line of
    its ``lr_scale_factor`` docstring. ``strategies``: ``{name: class}``. A rule
    that needs the strategy's options cannot be asked of the class: its line is
    listed as the strategy states it."""
    parts = []
    for name, cls in sorted(strategies.items()):
        if _rule_needs_options(cls) or _has_rule(cls):
            summary = (inspect.getdoc(cls.lr_scale_factor) or "").strip().splitlines()
            parts.append(f"{name}: {summary[0].rstrip('.') if summary else 'a rule of its own'}")
        else:
            parts.append(f"{name}: none (tune --lr; see the error)")
    return "; ".join(parts)


def auto_scales(strategy, optimizer, lr_given):
    """Whether ``--scale-lr auto`` (the default) applies the rule: when ``--lr`` was
    not given, the strategy (an instance, or a class whose rule needs no options) has a rule and the optimizer is
    one it was measured with. A given ``--lr`` is kept as given; ``--scale-lr``
    scales it on purpose."""
    return not lr_given and optimizer in RULE_OPTIMIZERS and _has_rule(strategy, optimizer)


def default_epochs(updates_per_epoch, text=False):
    """The epochs ``train.py`` trains when ``--epochs`` is not given: ``DEFAULT_EPOCHS``
    (``DEFAULT_TEXT_EPOCHS`` for text), or as many more as keep ``MIN_UPDATES``
    optimizer updates in the run.

    Args:
      updates_per_epoch: optimizer updates in one epoch (micro-batches per rank / k).
      text: whether the data are text (a language model's).

    Example::

        default_epochs(44)  # 10: one rank on digits, 440 updates
        default_epochs(5)   # 20: 8 ranks on digits, 5 updates an epoch
    """
    updates_per_epoch = validation.integer("updates_per_epoch", updates_per_epoch, minimum=1)
    return max(DEFAULT_TEXT_EPOCHS if text else DEFAULT_EPOCHS, -(-MIN_UPDATES // updates_per_epoch))
