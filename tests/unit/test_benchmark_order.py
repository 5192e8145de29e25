"""The benchmark's run order: rows of a Williams design, whole designs by default.

For n items one design is n rounds (even n) or 2n (odd n); r = rounds / n.
Expected counts below are derived from that definition, not read from the code.
"""
import collections
import itertools

import pytest

from benchmarks.suite import compare, names, order, worker

pytestmark = pytest.mark.unit


class Named:
    def __init__(self, name):
        self.name = name


def neighbour_pairs(rounds):
    return collections.Counter(pair for row in rounds for pair in zip(row, row[1:]))


def positions(rounds):
    return collections.Counter((item, i) for row in rounds for i, item in enumerate(row))


def rounds_per_design(n):
    return n if n % 2 == 0 else 2 * n


def test_design_length_and_default_repeats():
    assert [order.design_length(n) for n in range(2, 9)] == [2, 6, 4, 10, 6, 14, 8]
    assert order.default_repeats(7) == 14  # the 7 custom-loop configurations: one design
    assert order.default_repeats(2) == 6  # model.fit's 2: three designs of 2 rounds, not a median of 2
    assert order.default_repeats(5) == 10
    with pytest.raises(ValueError, match=r"`n` must be an integer >= 1. Received: n=0"):
        order.design_length(0)


@pytest.mark.parametrize("n", range(2, 10))
def test_balanced_order_is_a_williams_design(n):
    length = rounds_per_design(n)
    rounds = [order.balanced_order(list(range(n)), r) for r in range(length)]
    assert all(sorted(row) == list(range(n)) for row in rounds)
    each = length // n  # 1 for even n, 2 for odd n
    assert positions(rounds) == {(item, i): each for item in range(n) for i in range(n)}
    assert neighbour_pairs(rounds) == {pair: each for pair in itertools.permutations(range(n), 2)}
    # Round indices wrap: the next design repeats this one.
    assert [order.balanced_order(list(range(n)), length + r) for r in range(length)] == rounds


@pytest.mark.parametrize("n", range(3, 10))
def test_no_configuration_runs_twice_in_a_row_across_rounds(n):
    length = rounds_per_design(n)
    rounds = [order.balanced_order(list(range(n)), r) for r in range(2 * length)]  # two designs back to back
    stream = [item for row in rounds for item in row]
    repeated = [(i, a) for i, (a, b) in enumerate(zip(stream, stream[1:])) if a == b]
    assert not repeated, f"runs twice in a row at (stream position, item) {repeated}"


@pytest.mark.parametrize("n", range(2, 10))
def test_round_boundaries_spread_predecessors_as_evenly_as_possible(n):
    """Counting each round's last item before the next round's first (cyclically),
    every ordered pair occurs r or r + 1 times over one design."""
    length = rounds_per_design(n)
    each = length // n
    rounds = [order.balanced_order(list(range(n)), r) for r in range(length)]
    boundaries = collections.Counter((rounds[r][-1], rounds[(r + 1) % length][0]) for r in range(length))
    assert max(boundaries.values()) == 1  # all different
    assert collections.Counter(last for last, _ in boundaries) == {item: each for item in range(n)}
    stream = neighbour_pairs(rounds) + boundaries
    pairs = itertools.product(range(n), repeat=2) if n == 2 else itertools.permutations(range(n), 2)
    assert {stream[pair] for pair in pairs} <= {each, each + 1}


def scheduled_rounds(group, repeats):
    rounds = [[]]
    order.interleaved_repeats([Named(name) for name in group], repeats,
                              lambda config: rounds[-1].append(config.name),
                              lambda r, results: rounds.append([]))
    return rounds[:-1]


@pytest.mark.parametrize("group", [names.CUSTOM_LOOP, names.FIT], ids=["custom_loop", "fit"])
def test_the_full_run_orders_each_group_in_whole_williams_designs(group):
    args = compare.parse_args(["--np", "2"])
    command, _, _ = compare.worker_command(args, 2, "mpi", "out.json", tta=False)
    worker_args = worker.parse_args(command[command.index("benchmarks.suite.worker") + 1:])
    rounds = scheduled_rounds(group, worker.repeats_of(worker_args, group))
    n = len(group)
    assert len(rounds) % rounds_per_design(n) == 0 and len(rounds) >= order.MIN_REPEATS
    pairs = neighbour_pairs(rounds)
    missing = sorted(set(itertools.permutations(group, 2)) - set(pairs))
    assert not missing, f"{len(missing)} of {n * (n - 1)} ordered pairs never occur in {len(rounds)} rounds"
    assert len(set(pairs.values())) == 1, pairs
    assert len(set(positions(rounds).values())) == 1


def test_quick_and_explicit_repeats_are_passed_through():
    quick = compare.parse_args(["--quick"])
    command, _, _ = compare.worker_command(quick, 2, "mpi", "out.json", tta=False)
    assert command[command.index("--repeats") + 1] == "3"
    assert "not a whole design" in compare.order_note(quick)
    with pytest.raises(SystemExit):
        compare.parse_args(["--np", "2", "--repeats", "0"])
