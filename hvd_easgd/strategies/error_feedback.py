"""Error feedback: each rank keeps what quantisation cut from its payload and sends it next time.

With a quantiser Q, a rank that sends Q(u) instead of u loses e = u − Q(u).
Error feedback (Seide et al. 2014; Karimireddy et al. 2019,
arXiv:1901.09847) keeps e and adds it into the next payload::

    u_t = payload_t + e_{t−1}          sent: Q(u_t)          e_t = u_t − Q(u_t)

so nothing is lost, only delayed: Σ_t Q(u_t) = Σ_t payload_t − e_T. The
residual e is per-rank state (checkpointed with the strategy). It changes
only when the step that sent it takes effect: a step skipped on every rank
(NaN/Inf on some rank, no samples anywhere) applied nothing, so the residual
it computed is dropped and the old one kept.

Used by the formats that quantise (bf16, int8, int4: ``not summable``);
fp16 keeps the behaviour ``--fp16-allreduce`` always had (its relative
rounding, 2^-11, is left alone).
"""
import tensorflow as tf

from .. import resize
from .base import state_variable_name


def error_feedback_wanted(compression):
    """Whether ``compression`` gets error feedback (the quantising formats)."""
    return not compression.summable


class ErrorFeedback:
    """The residuals of one payload, one variable per tensor of it.

    Args:
      strategy: the strategy that owns them; they are declared to it with
        their resize rule.
      prefix: names the variables (``prefix/<variable path>``).
      like: the variables the payload's tensors are shaped like.

    At another number of ranks the residuals restart at zero
    (``resize.RESTART_AT_ZERO``): a rank's residual is what *its* payload still
    owes, which no rank of the new layout owes; dropping it loses at most one
    step's quantisation error per saved rank, never a whole payload.
    """

    def __init__(self, strategy, prefix, like):
        self.residuals = [tf.Variable(tf.zeros_like(v), trainable=False, name=state_variable_name(prefix, v))
                          for v in like]
        strategy.set_resize_rule(resize.RESTART_AT_ZERO, self.residuals)

    def add(self, payload):
        """``payload + e``: what to send this step."""
        return [p + e for p, e in zip(payload, self.residuals)]

    def keep(self, errors, took_effect):
        """``e ← errors`` where the scalar ``took_effect`` holds, else unchanged."""
        def assign():
            for e, err in zip(self.residuals, errors):
                e.assign(err)
            return tf.no_op()

        tf.cond(took_effect, assign, tf.no_op)
