"""When a τ-strategy synchronises: every τ steps (fixed), or AdaComm's adaptive period.

AdaComm (Wang & Joshi 2019, "Adaptive Communication Strategies to Achieve the
Best Error-Runtime Trade-off in Local-Update SGD", arXiv:1810.08313). With
l = 0, 1, ... the synchronisations, F_l the training loss averaged over the
ranks and over the interval that sync l ended, η_l the learning rate in force
at it, and τ₀ the period given::

    τ_{l+1} = clamp(⌈ √(η₀·F_l / (η_l·F₀)) · τ₀ ⌉, 1, τ_max)

F₀ and η₀ are those of the first interval (τ₀ steps), so τ₁ = τ₀. Intervals
are counted in optimizer steps t (after any warm-up), never in wall time, so a
resume is exact: the next sync falls at ``next_sync``, a variable.

F_l is one number every rank holds alike: each rank sums its batches' loss
times their sample counts and the counts over the interval, and at the sync
one allreduce of those two float32 elements gives ΣΣ loss·n / ΣΣ n. A separate
call (8 bytes) rather than one more element of the strategy's own allreduce:
the strategies' payloads differ (weights, differences, pseudo-gradients, in
compressed formats that would round the loss), and the fixed path stays
untouched, bit for bit. Its cost: one more call per synchronisation.

Where the loss comes from: a strategy runs inside ``optimizer.apply``, after
Keras's ``train_step`` has added the step's loss to the model's loss tracker
(a ``Mean``: total Σ loss·n, count Σ n). The schedule reads both in the trace
and keeps the difference from its last reading, which is the step's exact
contribution. The ``AdaptivePeriodLoss`` callback (in ``callbacks.defaults()``)
hands it the tracker and the optimizer's learning rate, and zeroes its
reading where Keras resets the tracker (each epoch's start).

Paddle's ``AdaptiveLocalSGDOptimizer`` takes F₀ from the first step's loss and
F_l from the sync step's loss alone (each averaged over the ranks), puts τ₀
inside the square root and clamps to [1, 16]; this one follows AdaComm: F is
the interval's mean (a single batch estimates F(x_l) poorly), τ₀ multiplies
the root, and the bound is the user's.
"""
import math

import tensorflow as tf

from .. import validation
from ..resize import FIRST
from .local_updates import check_period

ADAPTIVE = "adaptive"
DEFAULT_START = 10


def parse_period(value, name="period"):
    """``--tau``'s value: an int >= 1, ``"adaptive"`` (τ₀ = 10) or ``"adaptive:T0"``.

    Returns:
      ``(start, adaptive)``: τ (or τ₀) as an int, and whether it adapts.
    """
    if not isinstance(value, str):
        return check_period(value, name), False
    head, _, start = value.partition(":")
    if head == ADAPTIVE and not start:
        return DEFAULT_START, True
    if head == ADAPTIVE and start.isdigit() and int(start) >= 1:
        return int(start), True
    raise validation.refusal(name, "an integer >= 1, 'adaptive' or 'adaptive:T0' (T0 >= 1, the starting tau)",
                             value, gloss="(tau)" if name != "period" else "")


def cli_period(text):
    """argparse's ``type`` for ``--tau``: an int, or the adaptive forms kept as text."""
    return int(text) if text.lstrip("-").isdigit() else text


class FixedPeriod:
    """Every τ steps: t ≡ 0 (mod τ). No state."""

    adaptive = False

    def __init__(self, period):
        self.period = period

    def build(self, strategy):
        return None

    def state(self):
        return []

    def due(self, t):
        return tf.equal(t % self.period, 0)

    def just_synced(self, t):
        return self.due(t)

    def observe(self):
        return None

    def after_sync(self, comm):
        return None

    def period_in_force(self):
        return self.period

    def config_period(self):
        return self.period

    def synchronisations(self, t):
        return max(int(t), 0) // self.period


class AdaptivePeriod:
    """AdaComm's period (module docstring), from τ₀ = ``start`` up to ``maximum``.

    State (identical on every rank but the loss accumulators): ``counts`` =
    [τ in force, the step of the next sync, syncs so far] (int64) and
    ``losses`` = [F₀, η₀, Σ loss·n, Σ n, the tracker's total and count at the
    last reading] (float32). Resize rule: ``FIRST`` for both: the counts are
    every rank's; of the partial interval's loss sums rank 0's stands for the
    interval (the interval's F is then one rank's mean, not the ranks').
    """

    adaptive = True

    def __init__(self, start, maximum):
        self.period = start
        self.maximum = maximum
        self.counts = self.losses = None
        self.loss_tracker = None
        self.learning_rate = None

    def build(self, strategy):
        self.counts = tf.Variable([self.period, self.period, 0], dtype=tf.int64, trainable=False,
                                  name="adaptive_period_counts")
        self.losses = tf.Variable(tf.zeros([6], tf.float32), trainable=False, name="adaptive_period_losses")
        strategy.set_resize_rule(FIRST, [self.counts, self.losses])

    def state(self):
        return [self.counts, self.losses]

    def bind_loss(self, loss_tracker, learning_rate):
        """The model's loss tracker (a ``Mean``) and a callable for the lr in force."""
        self.loss_tracker = loss_tracker
        self.learning_rate = learning_rate

    def restart_reading(self):
        """Keras reset the tracker (an epoch starts): the next reading counts from zero."""
        self.losses[4:].assign(tf.zeros([2], tf.float32))

    def due(self, t):
        return tf.equal(t, self.counts[1])

    def just_synced(self, t):
        return tf.equal(t, self.counts[1] - self.counts[0])

    def observe(self):
        """Adds the step's Σ loss·n and n (the tracker's growth since the last reading)."""
        if self.loss_tracker is None:
            return
        total = tf.cast(tf.convert_to_tensor(self.loss_tracker.total), tf.float32)
        count = tf.cast(tf.convert_to_tensor(self.loss_tracker.count), tf.float32)
        grown = tf.stack([total, count]) - self.losses[4:]
        self.losses[2:4].assign(self.losses[2:4] + grown)
        self.losses[4:].assign(tf.stack([total, count]))

    def after_sync(self, comm):
        """The interval's F over the ranks (one 2-element allreduce), then τ_{l+1}."""
        summed = comm.allreduce([self.losses[2:4]], op="sum")[0]
        loss = tf.math.divide_no_nan(summed[0], summed[1])
        lr = (tf.cast(tf.convert_to_tensor(self.learning_rate()), tf.float32) if self.learning_rate is not None
              else tf.constant(1.0, tf.float32))
        first = tf.equal(self.losses[0], 0.0)
        f0 = tf.where(first, loss, self.losses[0])
        lr0 = tf.where(first, lr, self.losses[1])
        ratio = tf.math.divide_no_nan(lr0 * loss, lr * f0)
        # No loss known (no tracker, or a zero loss): keep τ₀.
        ratio = tf.where(tf.logical_and(f0 > 0, lr > 0), ratio, 1.0)
        tau = tf.cast(tf.math.ceil(tf.sqrt(ratio) * float(self.period)), tf.int64)
        tau = tf.clip_by_value(tau, 1, self.maximum)
        self.counts.assign(tf.stack([tau, self.counts[1] + tau, self.counts[2] + 1]))
        self.losses.assign(tf.concat([tf.stack([f0, lr0]), tf.zeros([2], tf.float32), self.losses[4:]], 0))

    def period_in_force(self):
        return int(self.counts[0].numpy())

    def config_period(self):
        return f"{ADAPTIVE}:{self.period}"

    def synchronisations(self, t):
        return int(self.counts[2].numpy())


def make_schedule(period, max_period, name="period"):
    """The schedule for ``period`` (``parse_period``'s forms) and ``max_period``.

    Returns:
      ``(τ or τ₀, schedule)``.
    """
    start, adaptive = parse_period(period, name)
    if not adaptive:
        if max_period is not None:
            raise validation.refusal("max_period", "None unless the period is adaptive (--tau adaptive)",
                                     max_period, gloss="(--tau-max)")
        return start, FixedPeriod(start)
    if max_period is None:
        raise validation.refusal("max_period", f"given with an adaptive period: an integer >= {start}",
                                 max_period, gloss="(--tau-max)")
    maximum = validation.integer("max_period", max_period, minimum=start, gloss="(--tau-max)")
    return start, AdaptivePeriod(start, maximum)

