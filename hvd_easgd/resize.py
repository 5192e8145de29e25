"""Per-rank state at another number of ranks: the rules, and the one mapping that applies them.

A run saved (or living) at p ranks continues at q. Every variable of its
state (model, optimizer, strategy) has a rule saying what rank r of q holds,
given the p values the saved ranks held. The strategies declare the rules of
their own state (``SyncStrategy.set_resize_rule``, one line per variable or
list of variables; composites collect their children's), and every variable
without one follows ``DEFAULT``:

- ``DEFAULT``: where all p ranks hold the same value (SyncAverage's whole
  state; EASGD's center and DiLoCo's synced weights and outer slots; every
  step counter, so every τ phase; BatchNorm statistics at an epoch end):
  that value, exactly. Else floating state (local weights, the inner
  optimizer's slots): its mean over the p ranks. Else (integer counters
  that differ per rank) rank 0's.
- ``MEAN``, ``FIRST`` (rank 0's): those rules alone.
- ``RESTART_AT_ZERO``: zeros on every rank (state that is only a correction
  of past per-rank work, such as an error-feedback residual, and may be
  dropped at a resize).
- ``SUM_ON_FIRST``: rank 0 holds the sum over the p ranks, the others zeros:
  a partial sum that must count exactly once at q (the sums and sample
  counts of an open accumulation window).

The mapping works on in-memory states (``resized_state``): a checkpoint's
shards (``checkpoint.restore``) or the survivors' states of a job that lost
ranks alike. Standard library and NumPy only.
"""
import numpy as np


class Rule:
    """What rank ``rank`` of ``ranks`` holds of one variable, from its ``saved`` p values.

    Subclasses implement ``__call__(saved, ranks, rank)``, returning one array
    of the saved values' shape and dtype; ``name`` says the rule in a word.
    """

    name = "rule"

    def __call__(self, saved, ranks, rank):
        raise NotImplementedError

    def __repr__(self):
        return f"resize.{self.name.upper()}"


def _all_equal(saved):
    return all(np.array_equal(saved[0], other) for other in saved[1:])


def _mean(saved):
    # Summed in float64, in rank order, then cast back: the same bits on every rank.
    total = np.asarray(saved[0], np.float64).copy()
    for other in saved[1:]:
        total += other
    return (total / len(saved)).astype(saved[0].dtype)


class _Default(Rule):
    name = "default"

    def __call__(self, saved, ranks, rank):
        if _all_equal(saved) or not np.issubdtype(saved[0].dtype, np.floating):
            return saved[0]
        return _mean(saved)


class _Mean(Rule):
    name = "mean"

    def __call__(self, saved, ranks, rank):
        return saved[0] if _all_equal(saved) else _mean(saved)


class _First(Rule):
    name = "first"

    def __call__(self, saved, ranks, rank):
        return saved[0]


class _RestartAtZero(Rule):
    name = "restart_at_zero"

    def __call__(self, saved, ranks, rank):
        return np.zeros_like(saved[0])


class _SumOnFirst(Rule):
    name = "sum_on_first"

    def __call__(self, saved, ranks, rank):
        if rank != 0:
            return np.zeros_like(saved[0])
        if np.issubdtype(saved[0].dtype, np.floating):
            total = np.asarray(saved[0], np.float64).copy()
        else:
            total = np.asarray(saved[0]).copy()
        for other in saved[1:]:
            total += other
        return total.astype(saved[0].dtype)


DEFAULT = _Default()
MEAN = _Mean()
FIRST = _First()
RESTART_AT_ZERO = _RestartAtZero()
SUM_ON_FIRST = _SumOnFirst()


def resized_state(states, rules, ranks, rank):
    """Rank ``rank``'s state at ``ranks`` ranks, from the p per-rank ``states``.

    Args:
      states: p mappings (one per saved rank, in rank order) of key -> array,
        all with the same keys: a checkpoint's shards, or live ranks' states.
      rules: key -> ``Rule``; a key without one follows ``DEFAULT``.
      ranks: q, the number of ranks the state continues at.
      rank: r, the rank (0 <= r < q) whose state is wanted.

    Returns:
      A dict key -> array, rank r's state at q ranks.
    """
    if not states:
        raise ValueError("`states` must hold the state of at least one rank. Received: states=[]")
    if not 0 <= rank < ranks:
        raise ValueError(f"`rank` must satisfy 0 <= rank < ranks={ranks}. Received: rank={rank}")
    return {key: rules.get(key, DEFAULT)([state[key] for state in states], ranks, rank) for key in states[0]}


def resized_states(states, rules, ranks):
    """Every rank's state at ``ranks`` ranks (``resized_state`` for r = 0 .. q-1)."""
    return [resized_state(states, rules, ranks, rank) for rank in range(ranks)]
