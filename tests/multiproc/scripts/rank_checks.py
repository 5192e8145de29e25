"""What the Keras-guide scripts check on every rank, and how they hand it to pytest."""
import json
import os

import numpy as np
import tensorflow as tf


def gathered_max_diff(comm, variables):
    """The largest |value − rank 0's value| over ``variables``, across ranks (0.0: bit-identical)."""
    worst = 0.0
    for v in variables:
        # float64 on the wire: fp16 state under mixed precision compares exactly too.
        values = comm.allgather(tf.reshape(tf.cast(tf.convert_to_tensor(v), tf.float64), [1, -1])).numpy()
        worst = max(worst, float(np.max(np.abs(values - values[0]))))
    return worst


def write_rank_results(out_dir, rank, results):
    """OUT/rank<r>.json, which the pytest side reads with tests.helpers.read_rank_results."""
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
