"""``python -m benchmarks traffic``: the committed traffic table the cost model reads.

The cost model (``hvd_easgd/choosing/cost_model.py``) imports no TensorFlow, so what
each configuration sends is asked of its strategy's own hook
(``SyncStrategy.expected_traffic``) here, once, and written to
``docs/results/traffic/traffic.json``. Per configuration and level the table
holds payload bytes per step as ``a + b·N`` (N trainable float32 parameters),
collective calls per step and wire bytes over payload bytes, each at a
reference layout, and the same split by the collective that carries it
(``collectives``: allreduce, allgather, alltoall, reducescatter, broadcast;
``Traffic.by_collective``), so the model charges each kind by its own
formula. Two model sizes fix ``a`` and ``b``. A strategy added
later projects once this file is regenerated; the model needs no edit.
``tests/unit/test_traffic_table.py`` regenerates it and compares.
"""
import json
import math
import pathlib

import keras

from ..suite import committed, configurations
from ..suite.names import TABLE

PATH = pathlib.Path(__file__).resolve().parents[2] / "docs" / "results" / "traffic" / "traffic.json"
# Two sizes fix a + b·N. The reference layout has both levels, and more than 2 ranks on every flat or
# across-hosts collective (4 hosts × 2 ranks), so a quantised allreduce runs in the form it takes at scale
# (alltoall + allgather; at 2 ranks it is one allgather: comm/quantised_allreduce.py).
SIZES = (4096, 65536)
HOSTS, RANKS_PER_HOST = 4, 2
LEVELS = ("within_group", "across_groups")


BRANCHES = 4  # kernels of n/4 weights each: enough whole variables for the fragmented configurations


def _model(n):
    inputs = keras.Input((n // (64 * BRANCHES),))
    outputs = keras.layers.Concatenate()([keras.layers.Dense(64, use_bias=False)(inputs) for _ in range(BRANCHES)])
    return keras.Model(inputs, outputs)


def _fit(small, large):
    """``a + b·N`` through the payload bytes at the two sizes, and the calls (the same at both)."""
    slope = (large[0] - small[0]) / (SIZES[1] - SIZES[0])
    return {"bytes_a": round(small[0] - slope * SIZES[0], 6), "bytes_b": round(slope, 9), "calls": round(large[1], 9)}


def _level(traffics, level):
    small, large = (getattr(t, level) for t in traffics)
    by_kind = [{kind: (b, c) for kind, b, c, _ in t.by_collective} for t in (small, large)]
    if not math.isclose(sum(b for b, _ in by_kind[1].values()), large.bytes, rel_tol=1e-9):
        raise ValueError(f"`expected_traffic` must split its bytes by collective (Traffic.of). "
                         f"Received: {level} bytes {large.bytes} of which by collective {by_kind[1]}")
    return {**_fit((small.bytes, small.calls), (large.bytes, large.calls)),
            "wire_over_bytes": round(large.wire_bytes / large.bytes, 9) if large.bytes else 0.0,
            "collectives": {kind: _fit(by_kind[0].get(kind, (0.0, 0.0)), by_kind[1][kind]) for kind in by_kind[1]}}


def table():
    """{configuration: {"ranks_per_group", level: {...}}} for every strategy row of ``names.TABLE``."""
    models = [_model(n) for n in SIZES]
    rows = {}
    for row in TABLE:
        if row.name.endswith("_fit") or row.traffic_strategy() is None and row.name != "no_comm":
            continue
        traffics = [configurations.expected_levels(row.name, m, HOSTS, RANKS_PER_HOST) for m in models]
        rows[row.name] = {"description": row.description, "ranks_per_group": traffics[1].ranks_per_group,
                          "overlapped": traffics[1].overlapped,
                          **{level: _level(traffics, level) for level in LEVELS}}
    return {"reference": {"hosts": HOSTS, "ranks_per_host": RANKS_PER_HOST, "dtype": "float32"},
            "configurations": rows}


def render():
    return json.dumps(table(), indent=1, sort_keys=True) + "\n"


def main(argv=None, prog="python -m benchmarks traffic"):
    args = committed.parser(prog, __doc__, "exit 1 if the committed table is stale").parse_args(argv)
    return committed.status(prog, committed.update({PATH: render()}, args.check), args.check, prog)
