"""PowerSGD under SyncAverage on p = 3 simulated ranks, against the NumPy
reference of its step (tests/reference.py: powersgd_step).

The reference runs in float64 and the strategy in float32, and Gram–Schmidt
and the sums round differently, so the compressed values agree to float32
rounding: rtol = atol = 1e-5 on values of order 1. Whatever must be the same
bits on every rank is checked with assert_array_equal.
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import SyncAverage
from hvd_easgd.comm import LocalCommunicator, SimulatedCluster
from hvd_easgd.comm.powersgd import PowerSGD, matrix_shape
from tests import reference as ref

pytestmark = [pytest.mark.unit, pytest.mark.slow]  # many simulated ranks, seconds together
P = 3
LR = 0.5
RANK = 2
WARMUP = 2
RTOL = 1e-5
# Dense(12 -> 8): its kernel (12, 8) is compressed at R = 2 (rate 96 / 40 = 2.4); Dense(8 -> 3)'s
# kernel (rate 24 / 22 < 2) and both biases are sent whole.
SHAPES = [(12, 8), (8,), (8, 3), (3,)]
COMPRESSED = 0


def make_strategy(**kwargs):
    kwargs = {"compression": "powersgd", "powersgd_rank": RANK, "powersgd_warmup_steps": WARMUP, **kwargs}
    return SyncAverage(**kwargs)


def ranks(cluster, **kwargs):
    """One two-layer model per rank (rank 0's weights broadcast) and its optimizer."""
    keras.utils.set_random_seed(3)
    template = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8), keras.layers.Dense(3)])
    models, opts = [], []
    for comm in cluster.communicators:
        model = keras.models.clone_model(template)
        model.set_weights([w + comm.rank for w in template.get_weights()])
        models.append(model)
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), make_strategy(**kwargs), comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    for comm in cluster.communicators:
        comm.reset_account()
    return models, opts, [w.astype(np.float64) for w in template.get_weights()]


def gradients(steps, seed=11):
    """grads[t][r][v]: step t, rank r, variable v; quarter-integers, exact in float32."""
    rng = np.random.default_rng(seed)
    return [[[rng.integers(-8, 9, size=s) / 4.0 for s in SHAPES] for _ in range(P)] for _ in range(steps)]


def step_all(cluster, models, opts, grads_t, counts=None):
    def step(r):
        count = None if counts is None else counts[r]
        opts[r].apply([tf.constant(g, tf.float32) for g in grads_t[r]], models[r].trainable_variables,
                      sample_count=count)

    cluster.run(step)


def reference_run(weights, q0, grads, counts=None, skip=(), clip_norm=None):
    """SGD(LR) on SyncAverage's division of the PowerSGD sums; steps in ``skip`` are dropped."""
    weights = [w.copy() for w in weights]
    residuals = [np.zeros(SHAPES[COMPRESSED]) for _ in range(P)]
    q = q0.astype(np.float64)
    for t, grads_t in enumerate(grads):
        if t in skip:
            continue
        n = [1] * P if counts is None else counts
        sums = [[n[r] * grads_t[r][v] for r in range(P)] for v in range(len(SHAPES))]
        total = [np.sum(s, axis=0) for s in sums]
        if t >= WARMUP:
            total[COMPRESSED], residuals, q = ref.powersgd_step(sums[COMPRESSED], residuals, q)
        applied = [s / (P if counts is None else sum(counts)) for s in total]
        if clip_norm is not None:
            norm = np.sqrt(sum(np.sum(a * a) for a in applied))
            applied = [a * clip_norm / max(norm, clip_norm) for a in applied]
        weights = [w - LR * a for w, a in zip(weights, applied)]
    return weights, residuals, q


def check_identical_ranks(models):
    for model in models[1:]:
        for a, b in zip(models[0].get_weights(), model.get_weights()):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("counts, clip_norm", [(None, None), ([3, 1, 2], None), (None, 0.5)],
                         ids=["average", "sample-counts", "clipped"])
def test_powersgd_matches_the_reference_through_warmup_error_feedback_and_warm_start(counts, clip_norm):
    cluster = SimulatedCluster(P)
    models, opts, weights = ranks(cluster, clip_norm=clip_norm)
    q0 = opts[0].strategy.powersgd.factors[COMPRESSED].numpy()
    for opt in opts[1:]:  # the seeded Q needs no broadcast
        np.testing.assert_array_equal(opt.strategy.powersgd.factors[COMPRESSED].numpy(), q0)
    grads = gradients(6)
    for t in range(6):
        step_all(cluster, models, opts, grads[t], counts)
        expected, residuals, q = reference_run(weights, q0, grads[: t + 1], counts, clip_norm=clip_norm)
        check_identical_ranks(models)
        for got, want in zip(models[0].get_weights(), expected):
            np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL)
        for r, opt in enumerate(opts):
            state = opt.strategy.powersgd
            np.testing.assert_allclose(state.residuals[COMPRESSED].numpy(), residuals[r], rtol=RTOL, atol=RTOL)
            np.testing.assert_allclose(state.factors[COMPRESSED].numpy(), q, rtol=RTOL, atol=RTOL)
    if counts is None and clip_norm is None:
        # error feedback loses nothing: p · (what was applied) + Σ_r e_r = Σ_t Σ_r G_t,r, in TF's own numbers
        applied = P * (weights[COMPRESSED] - models[0].get_weights()[COMPRESSED]) / LR
        kept = sum(o.strategy.powersgd.residuals[COMPRESSED].numpy() for o in opts)
        fed = sum(grads[t][r][COMPRESSED] for t in range(6) for r in range(P))
        np.testing.assert_allclose(applied + kept, fed, rtol=RTOL, atol=RTOL * 10)

def test_powersgd_account_over_a_run_is_warmup_steps_plus_factor_bytes():
    cluster = SimulatedCluster(P)
    models, opts, _ = ranks(cluster)
    grads = gradients(5)
    for t in range(5):
        step_all(cluster, models, opts, grads[t])
    full = 4 * sum(int(np.prod(s)) for s in SHAPES)  # 4 * 131
    compressed = 4 * ((12 + 8) * RANK + 8 + 8 * 3 + 3)  # the factors P (12x2) and Q (8x2), the rest whole
    assert opts[0].strategy.powersgd.payload_bytes(models[0].trainable_variables) == compressed
    payload = WARMUP * full + (5 - WARMUP) * compressed
    for comm in cluster.communicators:
        assert comm.account() == {"bytes": payload, "calls": WARMUP + 2 * (5 - WARMUP)}
    # both calls are allreduces, so a rank's wire bytes are 2(p-1)/p of its payload: 4/3 · 300 = 400
    # bytes a compressed step against 4/3 · 524 before (the formats helper's Traffic.wire_bytes reads the same)
    assert 2 * (P - 1) / P * compressed == 400.0
    traffic = opts[0].strategy.expected_traffic(models[0].trainable_variables, hosts=1, ranks_per_host=P)
    assert (traffic.total.bytes, traffic.total.calls) == (float(compressed), 2.0)
    with_count = opts[0].strategy.expected_traffic(models[0].trainable_variables, ranks_per_host=P,
                                                   sample_counts=True)
    assert with_count.total.bytes == compressed + 4


def test_a_non_finite_gradient_skips_the_step_everywhere_and_keeps_residuals_and_q():
    cluster = SimulatedCluster(P)
    models, opts, weights = ranks(cluster)
    q0 = opts[0].strategy.powersgd.factors[COMPRESSED].numpy()
    grads = gradients(6)
    grads[3][1][COMPRESSED][2, 5] = np.inf  # rank 1, a compressed step: caught before its factor travels
    grads[4][2][1][0] = np.nan  # rank 2, a bias sent whole
    state_before = None
    for t in range(6):
        if t == 3:
            state_before = [[v.numpy() for v in o.strategy.powersgd.state_variables()] for o in opts]
            weights_before = models[0].get_weights()
        step_all(cluster, models, opts, grads[t])
        if t == 3:
            for opt, before in zip(opts, state_before):
                for v, b in zip(opt.strategy.powersgd.state_variables(), before):
                    np.testing.assert_array_equal(v.numpy(), b)
            for a, b in zip(models[0].get_weights(), weights_before):
                np.testing.assert_array_equal(a, b)
        check_identical_ranks(models)
    assert [int(o.strategy.skipped_steps.numpy()) for o in opts] == [2] * P
    expected, residuals, q = reference_run(weights, q0, grads, skip=(3, 4))
    for got, want in zip(models[0].get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL)
    for r, opt in enumerate(opts):
        np.testing.assert_allclose(opt.strategy.powersgd.residuals[COMPRESSED].numpy(), residuals[r],
                                   rtol=RTOL, atol=RTOL)


def test_which_tensors_are_compressed_and_at_which_rank():
    psgd = PowerSGD(rank=4)
    assert matrix_shape((3, 3, 16, 32)) == (144, 32)  # a Conv2D kernel: rows are one output's inputs
    assert matrix_shape((10,)) is None and matrix_shape(()) is None
    assert psgd.factor_rank((3, 3, 16, 32)) == 4  # 4608 / (176 * 4) = 6.5
    assert psgd.factor_rank((3, 3, 1, 16)) is None  # 144 / (25 * 4) = 1.44 < 2
    assert psgd.factor_rank((64, 10)) == 4  # 640 / 296 = 2.16
    assert psgd.factor_rank((3, 2)) is None
    loose = PowerSGD(rank=8, min_compression_rate=1)
    assert loose.factor_rank((10, 100)) == 8  # 1000 / 880 = 1.14
    assert loose.factor_rank((3, 100)) is None  # R' = min(R, n, m) = 3 factors cost more than the matrix
    assert (psgd.warmup_steps, psgd.min_compression_rate) == (10, 2.0)


def test_one_rank_sends_nothing_and_applies_the_exact_gradient():
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(8, use_bias=False)])
    opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(1.0), make_strategy(powersgd_warmup_steps=0),
                                         comm=LocalCommunicator())
    before = model.get_weights()[0]
    grad = np.arange(96, dtype=np.float32).reshape(12, 8)
    opt.apply([tf.constant(grad)], model.trainable_variables)
    np.testing.assert_array_equal(model.get_weights()[0], before - grad)


def test_powersgd_options_are_refused_in_keras_form_and_round_trip():
    with pytest.raises(ValueError, match=r"`powersgd_warmup_steps` .*must be None unless compression='powersgd'. "
                                         r"Received: powersgd_warmup_steps=4"):
        SyncAverage(powersgd_warmup_steps=4)
    with pytest.raises(ValueError, match=r"`powersgd_rank` must be an integer >= 1. Received: powersgd_rank=0"):
        SyncAverage(compression="powersgd", powersgd_rank=0)
    with pytest.raises(ValueError, match=r"`compression` must be one of"):
        SyncAverage(compression="int3")
    strategy = make_strategy()
    again = SyncAverage.from_config(strategy.get_config())
    assert (again.powersgd.rank, again.powersgd.warmup_steps) == (RANK, WARMUP)
    assert SyncAverage().get_config() == {"reduce_op": "average", "clip_norm": None, "compression": "none"}
    assert "residuals resume as the mean of the 4 saved ranks'" in strategy.resize_notice(4, 2)
    assert SyncAverage().resize_notice(4, 2) is None


def test_a_resume_from_the_state_variables_continues_bit_for_bit():
    # state_variables() holds all PowerSGD needs (step counter, residuals, Q): new ranks given the
    # weights and those values after 3 steps take the same next 2 steps, bits and all
    grads = gradients(5)
    cluster = SimulatedCluster(P)
    models, opts, _ = ranks(cluster)
    for t in range(3):
        step_all(cluster, models, opts, grads[t])
    saved = [([v.numpy() for v in o.strategy.state_variables()], m.get_weights()) for m, o in zip(models, opts)]
    assert len(saved[0][0]) == 2 + 2  # the counters, one residual and one Q
    resumed_cluster = SimulatedCluster(P)
    resumed, resumed_opts, _ = ranks(resumed_cluster)
    for model, opt, (state, weights) in zip(resumed, resumed_opts, saved):
        model.set_weights(weights)
        for variable, value in zip(opt.strategy.state_variables(), state):
            variable.assign(value)
    for t in range(3, 5):
        step_all(cluster, models, opts, grads[t])
        step_all(resumed_cluster, resumed, resumed_opts, grads[t])
    for a, b in zip(models, resumed):
        for x, y in zip(a.get_weights(), b.get_weights()):
            np.testing.assert_array_equal(x, y)


def test_train_py_builds_powersgd_from_its_flags_and_refuses_its_warmup_without_it(capsys):
    from hvd_easgd.app import cli

    strategy = cli.make_strategy(cli.parse_args(["--compression", "powersgd", "--powersgd-rank", "2",
                                                 "--powersgd-warmup-steps", "5"]))
    assert (strategy.compression_name, strategy.powersgd.rank, strategy.powersgd.warmup_steps) == ("powersgd", 2, 5)
    assert cli.make_strategy(cli.parse_args(["--compression", "powersgd"])).powersgd.rank == 4
    # The transformer's default rank is 16 (config.TEXT_POWERSGD_RANK); a rank given is kept.
    text = ["--data", "python_docs", "--compression", "powersgd"]
    assert cli.make_strategy(cli.parse_args(text)).powersgd.rank == 16
    assert cli.make_strategy(cli.parse_args(text + ["--powersgd-rank", "4"])).powersgd.rank == 4
    with pytest.raises(SystemExit) as exc:
        cli.main(["--powersgd-warmup-steps", "5"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exc.value.code == 2 and len(lines) == 1, lines
    assert "`powersgd_warmup_steps` (compression='none') must be None unless compression='powersgd'" in lines[0]


def test_a_model_with_nothing_to_compress_sends_everything_whole_in_one_call():
    cluster = SimulatedCluster(P)
    models, opts = [], []
    for comm in cluster.communicators:
        models.append(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))  # (4, 2): rate 8/12
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(1.0), make_strategy(powersgd_warmup_steps=0),
                                                   comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    before = models[0].get_weights()
    grads = [[np.full((4, 2), r + 1.0), np.full((2,), 2.0 * r)] for r in range(P)]

    def step(r):
        opts[r].apply([tf.constant(g, tf.float32) for g in grads[r]], models[r].trainable_variables)

    for comm in cluster.communicators:
        comm.reset_account()
    cluster.run(step)
    np.testing.assert_array_equal(models[0].get_weights()[0], before[0] - 2.0)  # mean of 1, 2, 3
    np.testing.assert_array_equal(models[0].get_weights()[1], before[1] - 2.0)  # mean of 0, 2, 4
    assert cluster.communicators[0].account() == {"bytes": 4 * 10, "calls": 1}
    traffic = opts[0].strategy.expected_traffic(models[0].trainable_variables, ranks_per_host=P)
    assert (traffic.total.bytes, traffic.total.calls) == (40.0, 1.0)


@pytest.mark.parametrize("q", [2, 4])
def test_a_resize_gives_every_rank_the_mean_residual_and_keeps_q_and_the_warmup_count(tmp_path, q):
    from hvd_easgd import checkpoint

    grads = gradients(4)
    cluster = SimulatedCluster(P)
    models, opts, _ = ranks(cluster)
    for t in range(3):
        step_all(cluster, models, opts, grads[t])
    cluster.run(lambda r: checkpoint.save(str(tmp_path), 1, models[r], opts[r], opts[r].comm, {},
                                          step_in_epoch=3, steps_per_epoch=100))
    residuals = [o.strategy.powersgd.residuals[COMPRESSED].numpy() for o in opts]
    saved_q = opts[0].strategy.powersgd.factors[COMPRESSED].numpy()
    weights = models[0].get_weights()
    manifest, directory = checkpoint.latest(str(tmp_path))
    resized = SimulatedCluster(q)
    new_models, new_opts = [], []
    for comm in resized.communicators:
        new_models.append(keras.Sequential([keras.Input((12,)), keras.layers.Dense(8), keras.layers.Dense(3)]))
        new_opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(LR), make_strategy(), comm=comm))
    resized.run(lambda r: hvd_easgd.broadcast_initial_state(new_models[r], new_opts[r]))
    resized.run(lambda r: checkpoint.restore(directory, manifest, new_models[r], new_opts[r], new_opts[r].comm))
    mean = (np.sum(np.stack(residuals).astype(np.float64), axis=0) / P).astype(np.float32)
    for opt in new_opts:
        np.testing.assert_array_equal(opt.strategy.powersgd.residuals[COMPRESSED].numpy(), mean)
        np.testing.assert_array_equal(opt.strategy.powersgd.factors[COMPRESSED].numpy(), saved_q)
        assert int(opt.strategy.step_counter.numpy()) == 3  # past the warm-up: the next step is compressed
    # the averaged step at q feeds back the saved ranks' mean error, q times over: q·mean / q = mean
    step_grads = [grads[3][r % P] for r in range(q)]

    def step(r):
        new_opts[r].apply([tf.constant(g, tf.float32) for g in step_grads[r]], new_models[r].trainable_variables)

    resized.run(step)
    total, _, _ = ref.powersgd_step([g[COMPRESSED] for g in step_grads], [mean.astype(np.float64)] * q,
                                    saved_q.astype(np.float64))
    np.testing.assert_allclose(new_models[0].get_weights()[COMPRESSED], weights[COMPRESSED] - LR * total / q,
                               rtol=RTOL, atol=RTOL)
