"""SyncAverage with PowerSGD on real ranks: horovodrun -np 2 over Gloo and over MPI.

One launch per controller runs every check (tests/multiproc/scripts/
powersgd_checks.py, in traced steps); the assertions read what each rank recorded.
"""
import math

import pytest

from tests.helpers import CONTROLLERS, launch, read_rank_results, script

pytestmark = pytest.mark.multiproc
SIZE = 2
WARMUP, STEPS, RANK = 3, 8, 4


@pytest.fixture(scope="module", params=CONTROLLERS)
def ranks(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"powersgd-{request.param}")
    proc = launch([script("powersgd_checks.py"), str(out)], request.param, np=SIZE, timeout=180)
    assert proc.returncode == 0, f"powersgd_checks failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return read_rank_results(out, SIZE)


def factor_bytes(shape, rank=RANK, rate=2.0):
    """A tensor's bytes on a compressed step, worked out here from the rule in the docs."""
    elements = math.prod(shape)
    if len(shape) < 2:
        return 4 * elements
    n, m = math.prod(shape[:-1]), shape[-1]
    r = min(rank, n, m)
    return 4 * (n + m) * r if n * m >= rate * (n + m) * r else 4 * elements


def test_powersgd_matches_the_numpy_reference_in_traced_steps(ranks):
    for r in ranks:
        # float32 against float64 over 5 compressed steps of standard-normal gradients
        assert r["reference_relerr"] <= 1e-5, r["reference_relerr"]
        assert r["reference_residual_relerr"] <= 1e-4, r["reference_residual_relerr"]


def test_powersgd_keeps_ranks_bit_identical_and_sends_its_formula(ranks):
    shapes = ranks[0]["cnn_shapes"]
    full = sum(4 * math.prod(s) for s in shapes)
    compressed = sum(factor_bytes(s) for s in shapes)
    for r in ranks:
        assert r["cnn_weights_maxdiff"] == 0.0 and r["cnn_q_maxdiff"] == 0.0
        assert r["cnn_residuals_maxdiff"] > 0.0  # each rank's own compression error
        assert r["cnn_skipped"] == 0
        assert r["cnn_bytes"] == WARMUP * full + (STEPS - WARMUP) * compressed
        assert r["cnn_calls"] == WARMUP + 2 * (STEPS - WARMUP)
    # the CNN on digits after the warm-up: its factors are under a fifth of the fp32 gradients
    assert compressed < 0.2 * full, (compressed, full)
