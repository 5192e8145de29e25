"""The τ-strategies' step (EASGD, PeriodicAverage, DiLoCo): their own warm-up of
SyncAverage steps, then local steps that their schedule synchronises.

One rule for the three, so that the counter τ counts, the switch and the hooks
that report a synchronisation cannot drift apart:

  t = step_counter − warmup_steps     the local steps since the switch (τ counts these)
  step_counter <= warmup_steps:       warmup_strategy.step(...)
  after:                              the strategy's ``_main_step(...)``

A strategy whose synchronisations are not one per τ steps (DiLoCo's fragments,
its overlapped merges) answers ``weights_synchronised`` and
``weight_synchronisations_per_step`` for itself.
"""
from .local_updates import synchronised_this_step
from .warmup import run_phases


class LocalPeriods:
    """A mixin for a τ-strategy: it has ``step_counter``, ``warmup_steps``,
    ``warmup_strategy``, ``period`` and ``schedule``, and implements
    ``_main_step(grad_sums, variables, apply_update, sample_count, mean)``, one
    step after the warm-up (which advances ``step_counter`` itself). Listed
    before ``SyncStrategy`` in the bases."""

    def local_steps(self):
        """t: optimizer steps since the warm-up ended (the τ counter)."""
        return self.step_counter - self.warmup_steps

    def weights_synchronised(self):
        return synchronised_this_step(self)

    def weight_synchronisations_per_step(self):
        return 1.0 / self.period

    def step(self, grad_sums, variables, apply_update, sample_count=None, mean=True):
        # The switch is on_warmup_end: every rank holds the same weights there, and the strategy takes its
        # start from them (EASGD's center, the synced copy of DiLoCo and PeriodicAverage).
        run_phases(self.step_counter, self.warmup_steps,
                   lambda: self.warmup_strategy.step(grad_sums, variables, apply_update, sample_count, mean),
                   lambda: self._main_step(grad_sums, variables, apply_update, sample_count, mean),
                   self.on_warmup_end, main_counts=True)

    def _main_step(self, grad_sums, variables, apply_update, sample_count, mean):
        raise NotImplementedError
