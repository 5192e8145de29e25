"""The learning-rate rule of ``--scale-lr``, in one function.

Standard library only: the benchmarks import it for their time-to-accuracy rows.
"""

RULE_HELP = "lr * number of ranks"


def lr_scale(size, accumulate, strategy_name):
    """The factor ``--scale-lr`` multiplies ``--lr`` by."""
    return float(size)
