"""The order in which a launch times its configurations: rows of a Williams design.

A launch times every configuration many times, round after round, back to
back. On a shared CPU both the position in a round and the configuration
that ran just before matter: the predecessor leaves caches, allocator pools
and Horovod's background thread in its own state, and noise from elsewhere
comes in bursts. A Williams design (E. J. Williams, "Experimental designs
balanced for the estimation of residual effects of treatments", 1949)
balances both.

For n configurations one design is ``design_length(n)`` rounds: n for even
n, 2n for odd n (the n rows of the square and their mirror images). Let
r = design_length(n) / n, that is 1 for even n and 2 for odd n. Over one
design:

* every round runs each configuration once;
* each configuration runs in each position of a round exactly r times;
* within rounds, each ordered pair (a, b) of different configurations
  occurs as neighbours (b directly after a) exactly r times;
* rounds follow each other too, so a round's last configuration precedes
  the next round's first (the design's last round precedes its first
  round again when designs repeat). These design_length(n) boundary pairs
  are all different; each configuration ends r rounds and starts r, and
  for n >= 3 none follows itself. Counted over the whole stream, each
  ordered pair therefore occurs r or r + 1 times, as evenly as
  n * design_length(n) neighbour pairs allow (n = 3: exactly 3 times each).

For n = 2 the design is AB, BA: A runs after A once per design, and B
after B; positions cannot be balanced otherwise. A number of rounds that is
not a whole number of designs leaves some ordered pairs out: 6 rounds of 7
configurations meet only 21 of the 42.
"""

# Fewer repeats make a median hostage to one burst of noise on a shared machine.
MIN_REPEATS = 6


def design_length(n):
    """Rounds in one Williams design of ``n`` items: ``n`` if even, ``2n`` if odd."""
    if n < 1:
        raise ValueError(f"`n` must be an integer >= 1. Received: n={n!r}")
    return n if n % 2 == 0 else 2 * n


def default_repeats(n):
    """The fewest whole designs of ``n`` configurations that give at least ``MIN_REPEATS`` rounds."""
    length = design_length(n)
    return length * -(-MIN_REPEATS // length)


def is_whole_design(n, repeats):
    return repeats % design_length(n) == 0


def _first_row(n):
    """0, 1, n-1, 2, n-2, ...: consecutive differences 1, -2, 3, -4, ... are
    all different mod n (for even n), which is what balances neighbours."""
    row, low, high = [0], 1, n - 1
    while len(row) < n:
        row.append(low)
        low += 1
        if len(row) < n:
            row.append(high)
            high -= 1
    return row


def balanced_order(items, round_index):
    """``items`` in the order of round ``round_index`` of a Williams design.

    Rounds 0..n-1 shift the first row by the round index. For odd n, rounds
    n..2n-1 are mirror images of the shifted rows, taken with decreasing
    shifts: mirrored row c ends with item c, and the next one, shifted by
    c - 1, then starts with a different item, so a configuration never runs
    twice in a row across the boundary (increasing shifts would repeat one
    at n = 3).
    """
    n = len(items)
    index = round_index % design_length(n)
    if index < n:
        return [items[(i + index) % n] for i in _first_row(n)]
    shift = -(index - n)
    return [items[(i + shift) % n] for i in reversed(_first_row(n))]


def interleaved_repeats(configs, repeats, timed, after_repeat=None):
    """``timed(config)`` for every configuration, ``repeats`` rounds in
    balanced order; returns ``{name: [what timed returned, per round]}``."""
    results = {c.name: [] for c in configs}
    for r in range(repeats):
        for config in balanced_order(configs, r):
            results[config.name].append(timed(config))
        if after_repeat is not None:
            after_repeat(r, results)
    return results
