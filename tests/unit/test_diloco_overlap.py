"""DiLoCo with overlap δ (Streaming DiLoCo's overlapped merge) on p = 3 simulated ranks, against
tests/reference.py's DiLoCoOverlapReference: the default "progress" merge at δ = 1 and 2 at F = 1 and
at F = 3 with τ = 10 (F not dividing τ), int8 with F = 2 and its error feedback; the "mix" merge and
its mixing factor's effect; drain and a mid-overlap resume bit for bit, the account, the configs of
runs saved before the default changed, and the refusals (the strategy's and train.py's)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import DiLoCo, checkpoint
from hvd_easgd.app import cli, config_compare, errors
from hvd_easgd.comm import SimulatedCluster
from hvd_easgd.strategies.diloco import fragment_layout
from tests import reference as ref
from tests.unit.test_diloco_fragments import Pieces, train  # the same layer and training loop, BATCH 4

# slow: overlapped runs of several ranks and their resumes: `make test-fast` leaves it out.
pytestmark = [pytest.mark.unit, pytest.mark.slow]
P, BATCH = 3, 4
SIZES = (2, 2, 2)  # whole variables of 2 elements: int8 quantises each (a 1-element one travels exact)


def ranks(make_strategy, w0, shift=0.0):
    cluster = SimulatedCluster(P, timeout=30)
    models, opts = [], []
    for comm in cluster.communicators:
        model = keras.Sequential([keras.Input((ref.DIM,)), Pieces(SIZES)])
        for v, part in zip(model.trainable_variables, np.split(w0 + shift + 100.0 * comm.rank, np.cumsum(SIZES)[:-1])):
            v.assign(part)
        models.append(model)
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.05), make_strategy(), comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    for comm in cluster.communicators:
        comm.reset_account()
    return cluster, models, opts


def masks(fragments):
    bounds = np.cumsum([0] + list(SIZES))
    out = []
    for indices in fragment_layout([np.zeros(n, np.float32) for n in SIZES], fragments):
        mask = np.zeros(bounds[-1], bool)
        for i in indices:
            mask[bounds[i]:bounds[i + 1]] = True
        out.append(mask)
    return out


def weights(models):
    return [np.concatenate([v.numpy() for v in m.trainable_variables]) for m in models]


def assert_matches(models, opts, xs, theta):
    for got, expected in zip(weights(models), xs):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.concatenate([v.numpy() for v in opts[0].strategy.synced]), theta,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tau, fragments, delta, steps, name", [
    # δ = 1 at F = 1 is test_the_mixing_factor_...'s, δ = 2 at F = 3 test_drain_then_a_mid_overlap_...'s
    (4, 1, 2, 10, "none"),   # merges at 6 and 10
    (10, 3, 1, 12, "none"),  # offsets 0, 3, 6 (F does not divide τ): merges at 4, 7, 11
    (4, 2, 1, 9, "int8"),    # offsets 0, 2: merges at 3, 5, 7, 9, with each fragment's error feedback
])
def test_overlap_matches_the_numpy_reference(tau, fragments, delta, steps, name):
    shards, w0 = ref.least_squares_shards(P)
    cluster, models, opts = ranks(lambda: DiLoCo(tau, fragments=fragments, overlap=delta, compression=name), w0)
    train(cluster, models, opts, shards, steps)
    reference = ref.DiLoCoOverlapReference(shards, w0, masks(fragments), tau, delta, name=name)
    xs, theta = reference.run(steps)
    assert_matches(models, opts, xs, theta)
    if name != "none":  # every rank's residuals are its own payload's
        assert np.any(reference.residuals[0] != 0)
        bounds = np.cumsum([0] + list(SIZES))
        for opt, expected in zip(opts, reference.residuals):
            got = np.zeros_like(expected)
            for feedback, indices in zip(opt.strategy.error_feedbacks, opt.strategy.fragment_indices):
                for i, e in zip(indices, feedback.residuals):
                    got[bounds[i]:bounds[i + 1]] = e.numpy()
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    if name == "none":  # the account: each start sends its fragment's elements and the flag, in one call
        starts = [t for t in range(1, steps + 1) if t % tau in {f * tau // fragments for f in range(fragments)}]
        sizes = [SIZES[0] * len(ix) for ix in opts[0].strategy.fragment_indices]
        sent = sum(4 * (sizes[[f * tau // fragments for f in range(fragments)].index(t % tau)] + 1) for t in starts)
        for comm in cluster.communicators:
            assert comm.account() == {"bytes": sent, "calls": len(starts)}
        strategy = opts[0].strategy
        traffic = strategy.expected_traffic(models[0].trainable_variables, hosts=P)
        assert traffic.total.bytes == pytest.approx(4 * (ref.DIM + fragments) / tau)  # as without overlap
        assert traffic.overlapped == (1.0 if strategy.comm.reduces_in_background else 0.0)
    # Not the blocking run: the merges are δ steps late, each rank's own steps since the start kept.
    blocking, _ = ref.DiLoCoOverlapReference(shards, w0, masks(fragments), tau, 0, name=name).run(steps)
    assert not np.allclose(xs[0], blocking[0], rtol=1e-4)


@pytest.mark.parametrize("tau, fragments, delta, steps", [(4, 1, 2, 10), (10, 3, 1, 12)])
def test_the_mix_merge_mixes_the_local_with_the_new_synced_weights(tau, fragments, delta, steps):
    shards, w0 = ref.least_squares_shards(P)
    cluster, models, opts = ranks(lambda: DiLoCo(tau, fragments=fragments, overlap=delta, overlap_merge="mix"), w0)
    train(cluster, models, opts, shards, steps)
    reference = ref.DiLoCoOverlapReference(shards, w0, masks(fragments), tau, delta, merge="mix")
    assert_matches(models, opts, *reference.run(steps))
    progress, _ = ref.DiLoCoOverlapReference(shards, w0, masks(fragments), tau, delta).run(steps)
    assert not np.allclose(weights(models)[0], progress[0], rtol=1e-4)  # not the default merge
    assert opts[0].strategy.get_config()["overlap_merge"] == "mix"


def test_the_merge_is_progress_by_default_and_mix_where_a_mixing_factor_is_given():
    assert (DiLoCo(10, overlap=1).overlap_merge, DiLoCo(10, overlap=1, mixing=0.3).overlap_merge) == (
        "progress", "mix")
    assert DiLoCo(10, overlap=1).get_config() | {"outer_optimizer": None} == {
        "period": 10, "outer_learning_rate": 0.7, "outer_momentum": 0.7, "outer_optimizer": None,
        "warmup_steps": 0, "overlap": 1, "overlap_merge": "progress"}  # no mixing factor: it has none
    assert DiLoCo(10, overlap=1, mixing=0.3).get_config()["mixing"] == 0.3
    assert "overlap_merge" not in DiLoCo(10).get_config()
    # A config saved before "progress" was the default named the mixing factor beside every overlap
    # and no merge: it mixed, and comes back mixing; one saved with the progress merge kept 0.5 beside it.
    old = {"period": 10, "overlap": 2, "mixing": 0.5}
    assert (DiLoCo.from_config(old).overlap_merge, DiLoCo.from_config(old).mixing) == ("mix", 0.5)
    assert DiLoCo.from_config({**old, "overlap_merge": "progress"}).overlap_merge == "progress"
    for config in (DiLoCo(10, overlap=2).get_config(), DiLoCo(10, overlap=2, mixing=0.25).get_config()):
        assert DiLoCo.from_config(config).get_config() == config


def test_the_merge_is_refused_without_overlap_or_progress_beside_a_mixing_factor():
    for merge in ("progress", "mix"):
        with pytest.raises(ValueError, match="`overlap_merge` applies to an overlapped merge only"):
            DiLoCo(10, overlap_merge=merge)
    with pytest.raises(ValueError, match="`mixing` is the \"mix\" merge's"):
        DiLoCo(10, overlap=1, overlap_merge="progress", mixing=0.3)
    with pytest.raises(ValueError, match="`overlap_merge` must be one of"):
        DiLoCo(10, overlap=1, overlap_merge="average")


def test_the_mixing_factor_weighs_the_local_against_the_synced_weights():
    shards, w0 = ref.least_squares_shards(P)
    runs = {}
    for mixing in (0.0, 0.5, 1.0):  # F = 1, δ = 1; 0.5 is the default
        cluster, models, opts = ranks(lambda: DiLoCo(4, overlap=1, mixing=mixing), w0)
        train(cluster, models, opts, shards, 5)  # started at 4, merged at 5
        xs, theta = ref.DiLoCoOverlapReference(shards, w0, masks(1), 4, 1, mixing=mixing, merge="mix").run(5)
        assert_matches(models, opts, xs, theta)
        runs[mixing] = weights(models)
    theta = np.concatenate([v.numpy() for v in opts[0].strategy.synced])
    for got in runs[0.0]:  # α = 0: every rank restarts from θ
        np.testing.assert_allclose(got, theta, rtol=1e-6)
    assert not np.allclose(runs[1.0][0], runs[1.0][1])  # α = 1: the ranks keep their own weights
    for half, none, full in zip(runs[0.5], runs[0.0], runs[1.0]):  # one merge, the last step: linear in α
        np.testing.assert_allclose(half, (none + full) / 2, rtol=1e-5, atol=1e-6)
    assert DiLoCo(10, overlap=1, overlap_merge="mix").get_config()["mixing"] == 0.5  # the default α


def test_drain_then_a_mid_overlap_resume_continues_bit_for_bit(tmp_path):
    shards, w0 = ref.least_squares_shards(P)
    make = lambda: DiLoCo(10, fragments=3, overlap=2, compression="int8")  # noqa: E731
    cluster, models, opts = ranks(make, w0)
    train(cluster, models, opts, shards, 7)  # fragment 2 started at 6, its merge due at 8
    assert all(int(o.strategy.pending_handle.numpy()) > 0 for o in opts)
    assert int(opts[0].strategy.pending_fragment.numpy()) == 2
    cluster.run(lambda r: checkpoint.save(str(tmp_path), 1, models[r], opts[r], opts[r].comm, {},
                                          step_in_epoch=7, steps_per_epoch=100))
    assert all(int(o.strategy.pending_handle.numpy()) == 0 for o in opts)  # the save drained first
    reference = ref.DiLoCoOverlapReference(shards, w0, masks(3), 10, 2, name="int8")
    assert_matches(models, opts, *reference.run(7, drain_after=7))
    resumed_cluster, resumed, resumed_opts = ranks(make, w0, shift=50.0)  # the restore must set everything
    manifest, directory = checkpoint.latest(str(tmp_path))
    resumed_cluster.run(lambda r: checkpoint.restore(directory, manifest, resumed[r], resumed_opts[r],
                                                     resumed_opts[r].comm))
    train(cluster, models, opts, shards, 6, start=7)  # nothing merges at 8; 10 starts f0, 12 merges it
    train(resumed_cluster, resumed, resumed_opts, shards, 6, start=7)
    for a, b in zip(weights(models), weights(resumed)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(opts, resumed_opts):
        for x, y in zip(a.strategy.state_variables(), b.strategy.state_variables()):
            if x is a.strategy.pending_handle:  # a communicator's own count of its starts: in flight in both
                assert int(x.numpy()) > 0 and int(y.numpy()) > 0
                continue
            np.testing.assert_array_equal(x.numpy(), y.numpy())
    assert_matches(resumed, resumed_opts, *reference.run(6, start=7))


@pytest.mark.parametrize("kwargs, message", [
    ({"period": 10, "overlap": 10}, r"`overlap` must be an integer with 0 <= overlap <= 9"),
    ({"period": 10, "fragments": 3, "overlap": 3},
     r"^`overlap` must be below tau // fragments = 3 \(period=10, fragments=3\): a fragment's merge must land "
     r"before the next fragment starts\. Received: overlap=3$"),
    ({"period": "adaptive", "max_period": 20, "overlap": 1}, r"`overlap` > 0 needs a fixed period"),
    ({"period": 10, "overlap": 1, "mixing": 1.5}, r"`mixing` \(alpha\) must be"),
    ({"period": 10, "mixing": 0.2}, r"`mixing` applies to an overlapped merge only"),
])
def test_bad_overlap_is_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        DiLoCo(**kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("argv, message", [
    (["--strategy", "diloco", "--tau", "10", "--fragments", "4", "--overlap", "2"],
     r"^`overlap` must be below tau // fragments = 2 .*Received: overlap=2$"),
    (["--strategy", "diloco", "--mixing", "0.3"], r"^`mixing` applies to an overlapped merge only"),
])
def test_train_py_refuses_bad_overlap_in_one_line(argv, message):
    with pytest.raises(errors.UsageError, match=message) as info:
        cli.make_strategy(cli.parse_args(argv))
    assert "\n" not in str(info.value)


def test_train_py_builds_the_overlapped_diloco():
    strategy = cli.make_strategy(cli.parse_args(["--strategy", "diloco", "--tau", "10", "--fragments", "3",
                                                 "--overlap", "2", "--mixing", "0.25"]))
    assert (strategy.period, strategy.fragments, strategy.overlap, strategy.mixing, strategy.overlap_merge) == (
        10, 3, 2, 0.25, "mix")


@pytest.mark.parametrize("argv, recorded", [
    (["--overlap", "2"], "progress"),  # the default, named in config.yaml
    (["--overlap", "2", "--mixing", "0.25"], "mix"),  # a mixing factor chooses its merge
    (["--overlap", "2", "--overlap-merge", "mix"], "mix"),
])
def test_train_py_names_the_overlapped_merge_in_its_config(argv, recorded):
    config = cli.parse_args(["--strategy", "diloco", "--tau", "10", *argv])
    assert cli.effective_config(config)["overlap_merge"] == recorded
    assert cli.make_strategy(config).overlap_merge == recorded
    assert "overlap_merge" not in cli.effective_config(cli.parse_args(["--strategy", "diloco", "--tau", "10"]))


def test_a_run_saved_before_the_progress_merge_was_the_default_resumes_mixing(tmp_path):
    from tests.unit.test_cli import saved_run
    new = cli.effective_config(cli.parse_args(["--strategy", "diloco", "--tau", "10", "--overlap", "2"]))
    old = {k: v for k, v in new.items() if k != "overlap_merge"}  # what config.yaml held then
    for name, saved, merge in (("old", old, "mix"), ("new", new, "progress")):
        run_dir = saved_run(tmp_path / name, checkpoint.FORMAT_VERSION, dict(saved, run_dir=str(tmp_path / name)))
        resumed = cli.parse_args(["--resume", run_dir, "--epochs", "9"])
        assert (cli.make_strategy(resumed).overlap_merge, cli.effective_config(resumed)["overlap_merge"]) == (
            merge, merge)
        assert config_compare.config_differences(saved, cli.effective_config(resumed)) == []
    # Its checkpoint does not fit a run that asks for the new merge: one line says which option differs.
    assert config_compare.config_differences(old, new) == ["overlap_merge"]
