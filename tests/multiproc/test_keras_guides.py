"""Keras code as people write it, under horovodrun -np 2 (issue 13).

Each script (tests/multiproc/scripts/guide_*.py) follows one Keras guide's
pattern, changed only as docs/keras.md says (init, wrap the optimizers, add the
callbacks, shard the data), under --gloo or --mpi. The assertions read what
each rank recorded.

The guides under one launcher share ONE launch (scripts/guides.py runs one,
then the other, on every rank, Keras cleared between them): two launches of 2
ranks importing TensorFlow, not four. A guide that fails ends its launch with
a line naming it, and fails the tests of every guide in that launch.
"""
import os

import numpy as np
import pytest

from tests.helpers import horovodrun, read_rank_results, script

SIZE = 2
GUIDE_SECONDS = 240  # each guide's bound, as each had its own launch's
# The guides of each launcher, in the order they run.
GUIDES = {"gloo": ["guide_gan", "guide_custom_model"], "mpi": ["guide_embedding", "guide_mixed_precision"]}
# A test that sets up a launch: that launch's bound, and a margin.
pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(GUIDE_SECONDS * max(map(len, GUIDES.values())) + 60)]


def launch(controller, tmp_path_factory):
    """Every rank's results of each guide of ``controller``, by guide: its guides in one launch."""
    out = tmp_path_factory.mktemp(f"guides-{controller}")
    names = GUIDES[controller]
    proc = horovodrun([script("guides.py"), str(out), *names], np=SIZE, controller=controller,
                      timeout=GUIDE_SECONDS * len(names))
    assert proc.returncode == 0, (f"the launch of {names} failed under --{controller} (the guide that failed: "
                                  f"'guides.py: rank R: NAME failed'):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return {name: read_rank_results(os.path.join(out, name), SIZE) for name in names}


@pytest.fixture(scope="module")
def gloo_guides(tmp_path_factory):
    return launch("gloo", tmp_path_factory)


@pytest.fixture(scope="module")
def mpi_guides(tmp_path_factory):
    return launch("mpi", tmp_path_factory)


@pytest.fixture(scope="module")
def gan(gloo_guides):
    return gloo_guides["guide_gan"]


@pytest.fixture(scope="module")
def custom(gloo_guides):
    return gloo_guides["guide_custom_model"]


@pytest.fixture(scope="module")
def mixed(mpi_guides):
    return mpi_guides["guide_mixed_precision"]


@pytest.fixture(scope="module")
def embedding(mpi_guides):
    return mpi_guides["guide_embedding"]


def max_rel_err(a, b):
    a, b = np.concatenate([np.ravel(x) for x in a]), np.concatenate([np.ravel(x) for x in b])
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# --- 1. several optimizers (the GAN) -------------------------------------------------------------------
@pytest.mark.smoke  # the GAN guide: two wrapped optimizers, one launch
def test_gan_with_two_wrapped_optimizers_fits(gan):
    for r in gan:
        assert r["fit_error"] is None  # was: AttributeError: 'RMSprop' object has no attribute 'comm'
        # Both optimizers were built inside the trace and broadcast their state there.
        assert r["both_synced_at_build"]


@pytest.mark.smoke
def test_gan_ranks_agree_and_the_generator_learns(gan):
    for r in gan:
        assert r["discriminator_maxdiff"] == 0.0 and r["d_optimizer_maxdiff"] == 0.0  # SyncAverage
        assert r["generator_center_maxdiff"] == 0.0  # EASGD: one center on every rank...
        assert r["center_moved"] > 0.05  # ...that moved from the broadcast start
        assert r["local_minus_center"] > 0.0  # and is not the local weights
        assert r["g_steps"] == 8 * 1280 // SIZE // 32
        # The kept generator's samples moved toward the data's mean.
        assert r["distance_after"] < 0.5 * r["distance_before"], (r["distance_before"], r["distance_after"])


# --- 2. mixed precision, both layouts ---------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["inside", "outside"])
def test_mixed_precision_trains_like_fp32(mixed, layout):
    for r in mixed:
        got, fp32 = r[layout], r["fp32"]
        # outside was: AttributeError: 'LossScaleOptimizer' object has no attribute 'comm'
        assert got["error"] is None, got["error"]
        assert len(got["losses"]) == 50 and got["iterations"] == 50
        # inside was: the loss stayed where it started (scale_loss was not passed on)
        worst = max(abs(a - b) / b for a, b in zip(got["losses"], fp32["losses"]))
        assert worst <= 0.02, worst
        assert got["losses"][-1] < 0.9 * got["losses"][0]
        assert max_rel_err(got["weights"], fp32["weights"]) <= 1e-2
        assert got["weights_maxdiff"] == 0.0


# --- 3. an fp16 overflow on one rank ---------------------------------------------------------------------
def test_one_rank_overflow_under_sync_average_lowers_the_scale_everywhere(mixed):
    for r in mixed:
        got = r["overflow_sync"]
        assert got["error"] is None, got["error"]  # was a crash, then a 60 s stall
        assert got["loss_scale"] == 2.0**15 / 2  # halved once, on every rank (the trap: it stayed at 2**15)
        assert got["skipped_steps"] == 1 and got["iterations"] == 49 and got["strategy_steps"] == 50
        assert got["consecutive_skips"] == 0  # an overflow the scale cures is not a bad step
        assert got["weights_maxdiff"] == 0.0  # ranks bit-identical


def test_one_rank_overflow_under_easgd_keeps_tau_aligned_and_the_center_moving(mixed):
    for r in mixed:
        got = r["overflow_easgd"]
        assert got["error"] is None, got["error"]
        assert got["steps_per_rank"] == [50, 50]  # τ counter aligned
        assert got["loss_scale_per_rank"] == [2.0**15, 2.0**15 / 2]  # only rank 1 overflowed
        assert got["center_maxdiff"] == 0.0 and got["center_moved"] > 0.01


# --- 4. BatchNorm statistics ------------------------------------------------------------------------------
def test_batchnorm_statistics_are_the_same_on_every_rank_and_saved(mixed):
    for r in mixed:
        for run in ("fp32", "inside", "outside", "overflow_sync", "overflow_easgd"):
            assert r[run]["statistics_maxdiff"] == 0.0, run
        assert r["saved_statistics_diff"] == 0.0


# --- 5. repeated fit, the model you keep, the safeguard -----------------------------------------------------
def test_fit_twice_equals_fit_once_bit_for_bit(custom):
    for r in custom:
        assert r["repeat_fit_maxdiff"] == {"weights": 0.0, "center": 0.0, "optimizer": 0.0}
        assert r["center_maxdiff"] == 0.0 and r["local_maxdiff"] > 0.0
        assert r["losses"][-1] < 0.2 * r["losses"][0]


def test_the_saved_kept_model_predicts_as_the_merged_center(custom):
    for r in custom:
        assert r["kept_error"] is None, r["kept_error"]
        assert r["saved_vs_center"] <= 1e-5
        assert r["saved_vs_local"] > 1e-3  # it is not the rank's local weights
        assert r["swapped_predict_vs_center"] <= 1e-5  # predict(callbacks=[SwapKeptWeights()])
        assert r["local_back_after_predict"] == 0.0


def test_a_custom_loop_without_broadcast_is_refused_at_build(custom):
    for r in custom:
        assert "different initial weights" in r["no_broadcast_error"]
        assert "broadcast_initial_state" in r["no_broadcast_error"]
        assert r["check_off_error"] is None


# --- 6. the user's own pipeline ---------------------------------------------------------------------------
def test_shard_dataset_gives_every_rank_the_same_steps(embedding):
    for r in embedding:
        assert r["plain_shard_batches"] == [51, 50]  # what stalls a job without the helper
        assert r["shard_dataset_batches"] == [50, 50]
        assert r["iterations"] == 4 * 50


def test_embedding_model_trains_identically_on_every_rank(embedding):
    for r in embedding:
        assert r["weights_maxdiff"] == 0.0 and r["optimizer_maxdiff"] == 0.0
        assert r["losses"][-1] < 0.5 * r["losses"][0] and r["accuracy"][-1] >= 0.9
