"""WarmUp: one strategy for the first optimizer steps, then another.

Post-local SGD (Lin et al. 2020, arXiv:1808.07217) and PyTorch's
``PeriodicModelAverager(period, warmup_steps)`` start with synchronous steps
and switch to local ones once the weights have left their noisy start; EASGD
and DiLoCo profit in the same way. Per rank, at optimizer step t = 1, 2, ...:

  t ≤ W:   warmup.step(...)         (default SyncAverage: the ranks stay identical)
  t = W:   strategy.on_warmup_end()  every rank holds the same weights: the
                                    strategy takes its start from them (EASGD:
                                    x̃ ← x; DiLoCo: θ ← x)
  t > W:   strategy.step(...)       its own counters start here, so its τ
                                    counts from the switch

Bytes: the warm-up strategy's during the first W steps, the strategy's after
(``expected_traffic`` reports the latter: traffic is stated once any warm-up
is over). The strategy's state is built at the start and checkpointed
throughout, so a resume inside the warm-up or after it continues exactly.

The switch itself is ``run_phases``, which the τ-strategies' own
``warmup_steps`` arguments (``EASGD``, ``PeriodicAverage``, ``DiLoCo``) also
run: one rule for every warm-up. Those keep their warm-up SyncAverage as
their one child and count t in their own step counter (their state layout,
hence their checkpoints, is what it was); ``WarmUp`` is the composite for any
other strategy, a plugin's included.
"""
import keras
import tensorflow as tf

from .. import validation
from .accumulation import GradientAccumulation
from .base import SyncStrategy
from .sync_average import SyncAverage


def run_phases(counter, steps, warmup_step, main_step, hand_over, main_counts):
    """One optimizer step of a warm-up of ``steps`` steps, then of the main strategy.

    Args:
      counter: the int64 variable counting the optimizer steps so far.
      steps: W, the warm-up's length in optimizer steps (a Python int >= 0).
      warmup_step: runs one warm-up step (it must not advance ``counter``).
      main_step: runs one step of the main strategy.
      hand_over: runs once, at the end of the W-th step (the switch).
      main_counts: whether ``main_step`` advances ``counter`` itself (a
        strategy running its own warm-up counts t in its own step counter).
    """
    def main():
        main_step()
        if not main_counts:
            counter.assign_add(1)
        return tf.constant(0)

    if not steps:
        main()
        return

    def warm():
        warmup_step()
        counter.assign_add(1)
        tf.cond(tf.equal(counter, steps), _as_op(hand_over), tf.no_op)
        return tf.constant(0)

    tf.cond(counter < steps, warm, main)


def _as_op(action):
    def run():
        action()
        return tf.no_op()
    return run


@keras.saving.register_keras_serializable(package="hvd_easgd")
class WarmUp(SyncStrategy):
    """``warmup`` for the first ``steps`` optimizer steps, then ``strategy``.

    Args:
      strategy: the strategy to train with after the warm-up.
      steps: W, the warm-up's length in optimizer steps (an integer >= 0).
      warmup: the strategy of the warm-up (default ``SyncAverage()``).

    Both are children (``children()``: warm-up first), so callbacks walk them.
    What the composite knows about itself is the main strategy's (its
    ``--scale-lr`` rule, its resize rule, its traffic after the warm-up); its
    process groups are its children's. The kept model is the warm-up's during
    the warm-up (the weights, under SyncAverage) and the strategy's after.

    Wrap accumulation around it, not inside: ``GradientAccumulation(k,
    strategy=WarmUp(...))`` counts W in optimizer steps (windows).

    Example::

        strategy = hvd_easgd.WarmUp(hvd_easgd.DiLoCo(period=10), steps=500)
    """

    name = "warmup"
    description = "a warm-up strategy (SyncAverage) for the first steps, then another strategy"
    contained_config_keys = ("strategy", "warmup")

    def __init__(self, strategy, steps, warmup=None):
        super().__init__()
        warmup = SyncAverage() if warmup is None else warmup
        for name, value in (("strategy", strategy), ("warmup", warmup)):
            if not isinstance(value, SyncStrategy) or isinstance(value, GradientAccumulation):
                raise validation.refusal(name, "a SyncStrategy other than GradientAccumulation (wrap the WarmUp "
                                         "instead, so that its steps are optimizer steps)", value)
        self.strategy = strategy
        self.steps = validation.integer("steps", steps, minimum=0)
        self.warmup = warmup
        self.name = f"{strategy.name}+warmup"

    def children(self):
        return (self.warmup, self.strategy)

    def _build_state(self, trainable_variables, non_trainable_variables):
        self.warmup.build(trainable_variables, non_trainable_variables)
        self.strategy.build(trainable_variables, non_trainable_variables)

    def in_warmup(self):
        """Whether the next step is a warm-up step (eager)."""
        return int(self.step_counter.numpy()) < self.steps

    def kept_variables(self):
        return self.warmup.kept_variables() if self.in_warmup() else self.strategy.kept_variables()

    # --- one step ----------------------------------------------------------------
    def step(self, grad_sums, variables, apply_update, sample_count=None, mean=True):
        run_phases(self.step_counter, self.steps,
                   lambda: self.warmup.step(grad_sums, variables, apply_update, sample_count, mean),
                   lambda: self.strategy.step(grad_sums, variables, apply_update, sample_count, mean),
                   self.strategy.on_warmup_end, main_counts=False)

    # --- the hooks (base.py): the main strategy's answers ----------------------------
    def lr_scale_factor(self, size, accumulate=1, adaptive=False):
        """The strategy's rule: the warm-up only starts it."""
        return self.strategy.lr_scale_factor(size, accumulate, adaptive=adaptive)

    def resize_refusal(self, saved_ranks, ranks):
        return self.strategy.resize_refusal(saved_ranks, ranks)

    def resize_notice(self, saved_ranks, ranks):
        return self.strategy.resize_notice(saved_ranks, ranks)

    def resized_weights(self):
        """The warm-up's during the warm-up (the weights, identical: None), the strategy's after."""
        return self.warmup.resized_weights() if self.in_warmup() else self.strategy.resized_weights()

    def expected_traffic(self, trainable_variables, non_trainable_variables=(), hosts=1, ranks_per_host=1,
                         sample_counts=False):
        """The strategy's: traffic is stated once the warm-up is over (``Traffic``)."""
        return self.strategy.expected_traffic(trainable_variables, non_trainable_variables, hosts, ranks_per_host,
                                              sample_counts)

    # --- configuration (serialised through keras.saving) -----------------------
    def get_config(self):
        config = self.contained_config()
        return {"strategy": config["strategy"], "steps": self.steps, "warmup": config["warmup"]}

    def __repr__(self):
        return f"WarmUp(strategy={self.strategy!r}, steps={self.steps!r}, warmup={self.warmup!r})"
