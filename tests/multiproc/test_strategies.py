"""Strategy behaviour across real ranks: horovodrun -np 2, over Gloo and over MPI,
and through the direct MPI communicator (--collectives mpi-direct) under
horovodrun --mpi and under mpirun itself.

One launch per (launcher, collectives) runs every check (tests/multiproc/
scripts/core_checks.py, launched by tests/multiproc/helpers.py's core_results,
once per session: test_background.py reads the same launches); the assertions
below read what each rank recorded.
"""
import numpy as np
import pytest

from tests.helpers import CONTROLLERS
from tests.multiproc.helpers import CORE_SIZE as SIZE, core_results

pytestmark = pytest.mark.multiproc
# (launcher, collectives): Horovod under each controller; the direct path under both MPI launch styles.
LAUNCHES = [(controller, "horovod") for controller in CONTROLLERS] + [("mpi", "mpi-direct"), ("mpirun", "mpi-direct")]
# The Horovod launches are in the smoke subset (make smoke / make matrix): the core checks
# under --gloo and --mpi; the direct path's smoke is train.py's (test_mpi_direct.py).
PARAMS = [pytest.param(p, id="-".join(p), marks=[pytest.mark.smoke] if p[1] == "horovod" else []) for p in LAUNCHES]


@pytest.fixture(scope="module", params=PARAMS)
def ranks(request, tmp_path_factory):
    return core_results(*request.param, tmp_path_factory)


def test_rank_values_are_averaged_and_summed(ranks):
    for r in ranks:
        assert r["avg_of_rank"] == [np.mean(range(SIZE))] * 3
        assert r["sum_of_rank"] == [float(sum(range(SIZE)))] * 3


def test_sync_average_keeps_ranks_bit_identical(ranks):
    for r in ranks:
        assert r["sync_identical_maxdiff"] == 0.0
        assert r["custom_train_step_maxdiff"] == 0.0
        assert r["fp16_identical_maxdiff"] == 0.0


def test_sync_average_bytes_are_the_gradient_sizes_one_call_per_step(ranks):
    for r in ranks:
        assert r["sync_bytes_20_steps"] == 20 * 4 * r["sync_params"]
        assert r["sync_calls_20_steps"] == 20
        # fp16 on the wire: exactly half
        assert r["fp16_bytes_5_steps"] == 5 * 2 * r["sync_params"]


def test_sync_average_equals_one_process_on_the_concatenated_batch(ranks):
    for r in ranks:
        assert max(r["sync_vs_single_relerr"]) <= 1e-5, r["sync_vs_single_relerr"]


def test_custom_train_step_calling_optimizer_apply_is_reduced(ranks):
    for r in ranks:
        assert r["custom_train_step_iterations"] == 10  # 200 samples / batch 20, one epoch


def test_ranks_that_disagree_on_variables_get_an_error_not_a_hang(ranks):
    for r in ranks:
        assert r["disagree_error"] is not None
        assert "model_variables" in r["disagree_error"] and "ranks [0]; ranks [1]" in r["disagree_error"]


@pytest.mark.parametrize("case", ["easgd", "easgd_overlap", "easgd_warmup", "eamsgd", "easgd_rho"])
def test_easgd_matches_the_numpy_reference(ranks, case):
    for r in ranks:
        got = r[case]
        assert got["moving_rate"] == pytest.approx(0.9 / SIZE)
        assert got["local_relerr"] <= 1e-5, got
        assert got["center_relerr"] <= 1e-5, got
        # the center is bit-identical across ranks after every communication step
        assert got["center_maxdiff"] == 0.0


def test_easgd_bytes_are_one_tau_th_of_sync_and_zero_between(ranks):
    tau, dim = 3, 6
    for r in ranks:
        per_step = r["easgd"]["per_step_bytes"]
        for t, sent in enumerate(per_step, start=1):
            # the elastic differences (dim floats) + the 4-byte non-finite flag, every tau-th step only
            assert sent == (4 * dim + 4 if t % tau == 0 else 0), (t, sent)
        whole = len(per_step) // tau * tau
        assert sum(per_step[:whole]) / whole == pytest.approx((4 * dim + 4) / tau)


def test_accumulation_equals_one_process_on_2kb_with_k_times_fewer_calls(ranks):
    k, dim = 3, 6
    for r in ranks:
        assert r["accumulate_relerr"] <= 1e-6
        assert r["accumulate_calls"] == r["accumulate_micro_batches"] // k
        # per call: the gradient bytes plus the 4-byte sample count
        assert r["accumulate_bytes"] == r["accumulate_calls"] * (4 * dim + 4)


def test_uneven_shards_finish_with_the_exact_rule(ranks):
    for r in ranks:
        assert r["uneven_windows"] == 3
        assert r["uneven_updates"] == 3
        assert r["uneven_relerr"] <= 1e-6


def test_sample_count_weights_each_rank_by_its_samples(ranks):
    # rank 0 averages over 3 samples, rank 1 over 1: the update is the mean over the 4
    dim = 6
    for r in ranks:
        assert r["weighted_relerr"] <= 1e-6, r["weighted_relerr"]
        # per step one call: the gradient sums and the 4-byte sample count
        assert r["weighted_calls"] == 3
        assert r["weighted_bytes"] == 3 * (4 * dim + 4)


def test_nan_on_one_rank_keeps_ranks_in_step(ranks):
    for r in ranks:
        assert r["nan_sync"] == {"skipped": 1, "maxdiff": 0.0, "finite": True}
        easgd = r["nan_easgd"]
        assert easgd["center_finite"] and easgd["center_maxdiff"] == 0.0
        assert easgd["steps"] == 6  # the step counter advances on every rank
        assert easgd["elastic_skipped"] == 2  # the bad rank's NaN weights void both elastic steps everywhere
    assert ranks[0]["nan_easgd"]["local_skipped"] == 0
    assert ranks[1]["nan_easgd"]["local_skipped"] >= 1


def test_variable_size_images_do_not_retrace_per_shape(ranks):
    for r in ranks:
        assert r["image_traces"] <= 3
        assert r["image_updates"] == 3  # 9 images, k = 3
        assert r["image_identical_maxdiff"] == 0.0


DIRECT = [launch for launch in LAUNCHES if launch[1] == "mpi-direct"]


@pytest.mark.parametrize("launcher", [launcher for launcher, _ in DIRECT])
def test_direct_collectives_ran_in_one_order_on_every_rank(launcher, tmp_path_factory):
    ranks = core_results(launcher, "mpi-direct", tmp_path_factory)
    for r in ranks:
        assert r["communicator"] == "DirectMPICommunicator"
        count, digest = r["collective_order"]
        assert count > 100  # every check's collectives, not a handful
        # the same number of collectives, and the same kinds, dtypes and sizes in the same order
        assert r["collective_orders"] == [[count, digest]] * SIZE


@pytest.mark.parametrize("launcher", [launcher for launcher, _ in DIRECT])
def test_direct_account_equals_the_horovod_account_for_the_same_steps(launcher, tmp_path_factory):
    direct = core_results(launcher, "mpi-direct", tmp_path_factory)
    horovod = core_results("mpi", "horovod", tmp_path_factory)
    assert horovod[0]["communicator"] == "HorovodCommunicator"
    keys = ["sync_bytes_20_steps", "sync_calls_20_steps", "fp16_bytes_5_steps", "accumulate_bytes",
            "accumulate_calls", "weighted_bytes", "weighted_calls"]
    for d, h in zip(direct, horovod):
        assert {k: d[k] for k in keys} == {k: h[k] for k in keys}
        assert d["easgd"]["per_step_bytes"] == h["easgd"]["per_step_bytes"]
