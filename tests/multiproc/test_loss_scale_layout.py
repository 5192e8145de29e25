"""An fp16 overflow on one rank, in the user's own flow (issue 23, section 3).

``broadcast_initial_state(model, opt)`` then ``fit`` without
``callbacks.defaults()``, under ``mixed_float16``: before the fix the
LossScaleOptimizer Keras's ``compile`` puts outside the DistributedOptimizer
decided on overflow per rank, so the overflowing rank skipped its allreduce
and the other waited in it until the stall shutdown. Now every rank takes the
decision on the reduced gradients: all skip the step and halve the scale.
"""
import pytest

from tests.helpers import horovodrun, quiet_env, read_rank_results, script

pytestmark = pytest.mark.multiproc
SIZE = 2
STEPS = 6
# A stall becomes a failure in about 20 s, well inside the launch's bound.
STALL_ENV = {"HOROVOD_STALL_CHECK_TIME_SECONDS": "5", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "20"}


@pytest.mark.parametrize("controller, collectives, expected_path", [
    ("gloo", "auto", "horovod"),  # Horovod's collectives over Gloo
    ("mpi", "auto", "mpi-direct"),  # an MPI launch's default: the direct path
])
def test_one_rank_overflow_after_broadcast_initial_state_skips_the_step_on_every_rank(
        controller, collectives, expected_path, tmp_path):
    proc = horovodrun([script("loss_scale_layout.py"), str(tmp_path), collectives], np=SIZE,
                      controller=controller, timeout=90, env=quiet_env(**STALL_ENV))
    assert proc.returncode == 0, f"--{controller} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    ranks = read_rank_results(tmp_path, SIZE)
    for r in ranks:
        assert r["collectives"] == expected_path
        # The safe layout, made by broadcast_initial_state.
        assert r["layout"] == ["DistributedOptimizer", "LossScaleOptimizer", "SGD"]
        assert r["loss_scale"] == 2.0**15 / 2  # halved once, on both ranks (only rank 1 overflowed)
        assert r["skipped_steps"] == 1 and r["strategy_steps"] == STEPS
        assert r["iterations"] == STEPS - 1  # the overflow step applied nothing
    assert ranks[0]["weights"] == ranks[1]["weights"]  # bit-identical
