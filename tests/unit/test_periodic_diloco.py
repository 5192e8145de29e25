"""PeriodicAverage (local SGD) and DiLoCo on p simulated ranks (SimulatedCluster):
NumPy references written from the update equations, the exact byte account,
the NaN rules, accumulation, serialisation and validation."""
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import DiLoCo, GradientAccumulation, LocalCommunicator, PeriodicAverage, SyncAverage
from hvd_easgd.app import cli, errors
from hvd_easgd.comm import SimulatedCluster
from hvd_easgd.app.lr_scaling import auto_scales
from hvd_easgd.strategies import registry, walk
from tests import least_squares, reference as ref
from tests.least_squares import least_squares_ranks

pytestmark = [pytest.mark.unit, pytest.mark.slow]  # many simulated ranks, seconds together
BATCH = 4


# --- NumPy references, from the equations in the modules' docstrings ---------------------------
class AdamRef:
    """Keras 3 Adam: m += (g − m)(1 − β1); v += (g² − v)(1 − β2);
    w −= η·√(1 − β2ᵗ)/(1 − β1ᵗ) · m / (√v + ε)."""

    def __init__(self, lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
        self.lr, self.beta_1, self.beta_2, self.epsilon = lr, beta_1, beta_2, epsilon
        self.m = self.v = None
        self.t = 0

    def step(self, w, g):
        if self.m is None:
            self.m, self.v = np.zeros_like(w), np.zeros_like(w)
        self.t += 1
        self.m = self.m + (g - self.m) * (1 - self.beta_1)
        self.v = self.v + (g * g - self.v) * (1 - self.beta_2)
        alpha = self.lr * np.sqrt(1 - self.beta_2 ** self.t) / (1 - self.beta_1 ** self.t)
        return w - alpha * self.m / (np.sqrt(self.v) + self.epsilon)


def window_grad(shard, w, update, k):
    """The gradient an update applies: the mean over its k equal micro-batches."""
    return np.mean([ref.grad(w, *ref.batch(shard, update * k + j, BATCH)) for j in range(k)], axis=0)


def periodic_reference(shards, w0, make_inner, tau, updates, warmup_steps=0, k=1):
    """Local steps; every tau-th step after the warm-up, x_i ← mean_j x_j. Warm-up: SyncAverage."""
    p = len(shards)
    xs, inner = [w0.copy() for _ in range(p)], [make_inner() for _ in range(p)]
    for step in range(updates):
        if step < warmup_steps:
            g = np.mean([window_grad(s, xs[0], step, k) for s in shards], axis=0)
            xs = [inner[i].step(xs[i], g) for i in range(p)]
            continue
        xs = [inner[i].step(xs[i], window_grad(shards[i], xs[i], step, k)) for i in range(p)]
        if (step + 1 - warmup_steps) % tau == 0:
            xs = [np.mean(xs, axis=0)] * p
    return xs


def diloco_reference(shards, w0, make_inner, tau, updates, outer_lr=0.7, outer_momentum=0.7, k=1):
    """Local steps; every tau-th step Δ = mean_i(θ − x_i), θ ← NesterovSGD(θ, Δ), x_i ← θ."""
    p = len(shards)
    xs, inner = [w0.copy() for _ in range(p)], [make_inner() for _ in range(p)]
    theta, outer = w0.copy(), ref.SGDRef(outer_lr, outer_momentum, nesterov=True)
    for step in range(updates):
        xs = [inner[i].step(xs[i], window_grad(shards[i], xs[i], step, k)) for i in range(p)]
        if (step + 1) % tau == 0:
            theta = outer.step(theta, np.mean([theta - x for x in xs], axis=0))
            xs = [theta.copy() for _ in range(p)]
    return xs, theta


# --- p ranks of a least-squares model, each its own optimizer and strategy ----------------------


def train(cluster, models, opts, shards, steps, start=0):
    least_squares.train(cluster, models, opts, shards, steps, BATCH, start)


def weights(models):
    return [m.layers[0].kernel.numpy().ravel() for m in models]


def assert_close(got, expected):
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) <= 1e-5, (got, expected)


def momentum_sgd():
    return keras.optimizers.SGD(0.05, momentum=0.9)


def momentum_sgd_ref():
    return ref.SGDRef(0.05, momentum=0.9)


# --- PeriodicAverage ----------------------------------------------------------------------------
@pytest.mark.parametrize("p, warmup_steps", [(2, 0), (3, 0), (2, 4)])
def test_periodic_average_matches_the_numpy_reference(p, warmup_steps):
    # tau = 3, 11 steps: ends two steps after an average, so the ranks differ again
    shards, w0 = ref.least_squares_shards(p)
    cluster = SimulatedCluster(p)
    models, opts = least_squares_ranks(cluster, lambda: PeriodicAverage(3, warmup_steps=warmup_steps),
                                       momentum_sgd, w0)
    train(cluster, models, opts, shards, 9 + warmup_steps)  # ends on an average: every rank the same bits
    got = weights(models)
    assert all(np.array_equal(got[0], w) for w in got[1:])
    assert_close(got[0], periodic_reference(shards, w0, momentum_sgd_ref, 3, 9 + warmup_steps, warmup_steps)[0])
    train(cluster, models, opts, shards, 2, start=9 + warmup_steps)
    expected = periodic_reference(shards, w0, momentum_sgd_ref, 3, 11 + warmup_steps, warmup_steps)
    for got_w, expected_w in zip(weights(models), expected):
        assert_close(got_w, expected_w)
    assert len({tuple(w) for w in weights(models)}) == p
    # the account: 3 averages of 6 weights and the flag; a warm-up step sends SyncAverage's 6 gradients
    for comm in cluster.communicators:
        assert comm.account() == {"bytes": 3 * 4 * (ref.DIM + 1) + warmup_steps * 4 * ref.DIM,
                                  "calls": 3 + warmup_steps}


def test_periodic_warmup_is_a_sync_average_child():
    strategy = PeriodicAverage(4, warmup_steps=2)
    assert [type(s) for s in walk(strategy)] == [PeriodicAverage, SyncAverage]
    assert strategy.kept_variables() is None


def dense_batchnorm_setup(strategy, comm):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.BatchNormalization()])
    opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), strategy, comm=comm)
    hvd_easgd.broadcast_initial_state(model, opt)
    comm.reset_account()
    return model, opt


def forward_and_apply(model, opt, x, zero_grads=False):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(x, training=True) ** 2)  # updates BatchNorm's moving statistics
    grads = tape.gradient(loss, model.trainable_variables)
    if zero_grads:
        grads = [tf.zeros_like(g) for g in grads]
    opt.apply(grads, model.trainable_variables)


@pytest.mark.parametrize("make, floating_state_travels", [(lambda: PeriodicAverage(3), True),
                                                           (lambda: DiLoCo(3), False)])
def test_bytes_per_step_are_exact(make, floating_state_travels):
    # per sync step: every trainable element (+ the floating non-trainable ones for PeriodicAverage)
    # and the 4-byte flag, one call; nothing on the other steps
    # two ranks: a one-rank communicator sends nothing at all (0 bytes, 0 calls)
    cluster = SimulatedCluster(2)
    pairs = cluster.run(lambda r: dense_batchnorm_setup(make(), cluster.communicators[r]))
    model = pairs[0][0]
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    moving = sum(int(np.prod(v.shape)) for v in model.non_trainable_variables)
    assert (trainable, moving) == (4 * 3 + 3 + 3 + 3, 6)
    per_sync = 4 * (trainable + (moving if floating_state_travels else 0) + 1)
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    for step in range(1, 7):
        before = [opt.comm.account() for _, opt in pairs]
        cluster.run(lambda r: forward_and_apply(*pairs[r], x))
        for (_, opt), was in zip(pairs, before):
            now = opt.comm.account()
            sent = {"bytes": now["bytes"] - was["bytes"], "calls": now["calls"] - was["calls"]}
            assert sent == ({"bytes": per_sync, "calls": 1} if step % 3 == 0 else {"bytes": 0, "calls": 0}), step


def test_periodic_average_replaces_batchnorm_statistics_by_their_mean():
    cluster = SimulatedCluster(2)
    pairs = cluster.run(lambda r: dense_batchnorm_setup(PeriodicAverage(2), cluster.communicators[r]))
    data = [np.random.default_rng(r).standard_normal((8, 4)).astype(np.float32) + 3 * r for r in range(2)]
    cluster.run(lambda r: forward_and_apply(*pairs[r], data[r]))
    moving = [[v.numpy() for v in model.non_trainable_variables] for model, _ in pairs]
    assert not np.allclose(moving[0][0], moving[1][0])  # each rank's statistics follow its own data
    # step 2: the forward pass moves the statistics again, zero gradients leave the weights; then the average
    seen = [None, None]

    def second_step(r):
        model, opt = pairs[r]
        model(data[r], training=True)
        seen[r] = [v.numpy() for v in model.variables]
        opt.apply([tf.zeros_like(v) for v in model.trainable_variables], model.trainable_variables)

    cluster.run(second_step)
    for i, v in enumerate(pairs[0][0].variables):
        expected = (seen[0][i].astype(np.float64) + seen[1][i]) / 2
        for model, _ in pairs:
            assert_close(model.variables[i].numpy(), expected)
        if "moving" in v.path:
            assert not np.allclose(seen[0][i], seen[1][i])


# --- DiLoCo -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("inner, inner_ref", [(momentum_sgd, momentum_sgd_ref),
                                              (lambda: keras.optimizers.Adam(0.05), lambda: AdamRef(0.05))],
                         ids=["sgd", "adam"])
def test_diloco_matches_the_numpy_reference_at_p2(inner, inner_ref):
    p, tau = 2, 3
    shards, w0 = ref.least_squares_shards(p)
    cluster = SimulatedCluster(p)
    models, opts = least_squares_ranks(cluster, lambda: DiLoCo(tau), inner, w0)
    train(cluster, models, opts, shards, 11)  # three outer steps, then two local steps
    xs, theta = diloco_reference(shards, w0, inner_ref, tau, 11)
    for got, expected in zip(weights(models), xs):
        assert_close(got, expected)
    assert len({tuple(w) for w in weights(models)}) == p
    for opt in opts:  # θ: the kept model, the same bits on every rank
        assert_close(opt.strategy.kept_variables()[0].numpy().ravel(), theta)
        np.testing.assert_array_equal(opt.strategy.synced[0].numpy(), opts[0].strategy.synced[0].numpy())
        assert int(opt.strategy.outer_optimizer.iterations.numpy()) == 3
        # inner state is local: Adam's step count (or SGD's) counts every local step
        assert int(opt.iterations.numpy()) == 11
    for comm in cluster.communicators:
        assert comm.account() == {"bytes": 3 * 4 * (ref.DIM + 1), "calls": 3}


def test_diloco_with_outer_sgd_one_is_periodic_average():
    # θ ← θ − Δ = mean_i(x_i): the two strategies take the same steps
    p = 2
    shards, w0 = ref.least_squares_shards(p)
    runs = []
    for make in (lambda: DiLoCo(3, outer_optimizer=keras.optimizers.SGD(1.0)), lambda: PeriodicAverage(3)):
        cluster = SimulatedCluster(p)
        models, opts = least_squares_ranks(cluster, make, momentum_sgd, w0)
        train(cluster, models, opts, shards, 6)
        runs.append(weights(models))
    for diloco, periodic in zip(*runs):
        assert_close(diloco, periodic)


def test_diloco_outer_slots_are_strategy_state():
    model, opt = dense_batchnorm_setup(DiLoCo(2), LocalCommunicator())
    strategy = opt.strategy
    state = strategy.state_variables()
    momenta = [v for v in strategy.outer_optimizer.variables if "momentum" in v.name]
    assert len(momenta) == len(model.trainable_variables) == len(strategy.synced)
    assert all(any(v is s for s in state) for v in [*strategy.synced, *strategy.outer_optimizer.variables])
    assert [c.name.split(":")[0] for c in strategy.synced] == ["synced/" + v.path for v in model.trainable_variables]


# --- NaN/Inf: nothing non-finite on the wire, the same decision on every rank --------------------
def spy_on_allreduce(comm):
    sent = []
    original = comm._grouped_allreduce

    def spy(tensors, op):
        sent.append([t.numpy() for t in tensors])
        return original(tensors, op)

    comm._grouped_allreduce = spy
    return sent


@pytest.mark.parametrize("make", [lambda: PeriodicAverage(2), lambda: DiLoCo(2)], ids=["periodic", "diloco"])
def test_a_non_finite_rank_is_flagged_and_every_rank_skips_the_sync(make):
    p = 2
    shards, w0 = ref.least_squares_shards(p)
    cluster = SimulatedCluster(p)
    models, opts = least_squares_ranks(cluster, make, lambda: keras.optimizers.SGD(0.05), w0)
    sent = spy_on_allreduce(cluster.communicators[1])
    # step 1: rank 1's gradient is NaN: it drops its own update, rank 0 steps
    def nan_on_rank_1(r):
        x, y = (tf.constant(a, tf.float32) for a in ref.batch(shards[r], 0, BATCH))
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_mean(tf.square(tf.squeeze(models[r](x), -1) - y))
        grads = tape.gradient(loss, models[r].trainable_variables)
        if r == 1:
            grads = [g * np.nan for g in grads]
        opts[r].apply(grads, models[r].trainable_variables)

    cluster.run(nan_on_rank_1)
    assert [int(o.strategy.skipped_steps.numpy()) for o in opts] == [0, 1]
    # rank 1's weights overflow (as a diverging run's would); step 2 is a sync step
    models[1].layers[0].kernel.assign(tf.fill([ref.DIM, 1], np.inf))
    local = [None, None]

    def zero_step(r):
        local[r] = weights(models)[r].copy()
        opts[r].apply([tf.zeros([ref.DIM, 1])], models[r].trainable_variables)

    cluster.run(zero_step)
    wire = sent[-1]
    assert all(np.isfinite(t).all() for t in wire) and wire[-1].tolist() == [1.0]  # zeros and the flag
    assert not np.any(wire[0])
    if isinstance(opts[0].strategy, PeriodicAverage):
        assert [int(o.strategy.skipped_averages.numpy()) for o in opts] == [1, 1]
        np.testing.assert_array_equal(weights(models)[0], local[0])  # rank 0 keeps its own weights
    else:
        assert [int(o.strategy.skipped_outer_steps.numpy()) for o in opts] == [1, 1]
        assert [int(o.strategy.outer_optimizer.iterations.numpy()) for o in opts] == [0, 0]
        for w in weights(models):  # every rank restarts from the unchanged θ = w0: rank 1 is healed
            assert_close(w, w0)


# --- composition with GradientAccumulation ---------------------------------------------------------
@pytest.mark.parametrize("name", ["periodic", "diloco"])
def test_accumulation_feeds_one_local_step_per_window_and_tau_counts_windows(name):
    p, k, tau, windows = 2, 2, 2, 5
    shards, w0 = ref.least_squares_shards(p)
    cluster = SimulatedCluster(p)
    inner = {"periodic": PeriodicAverage, "diloco": DiLoCo}[name]
    models, opts = least_squares_ranks(cluster, lambda: GradientAccumulation(k, strategy=inner(tau)), momentum_sgd, w0)
    train(cluster, models, opts, shards, k * windows)
    if name == "periodic":
        expected = periodic_reference(shards, w0, momentum_sgd_ref, tau, windows, k=k)
    else:
        expected, _ = diloco_reference(shards, w0, momentum_sgd_ref, tau, windows, k=k)
    for got, want in zip(weights(models), expected):
        assert_close(got, want)
    for comm in cluster.communicators:  # syncs after windows 2 and 4
        assert comm.account() == {"bytes": 2 * 4 * (ref.DIM + 1), "calls": 2}


# --- serialisation, validation, command line ------------------------------------------------------
def test_configs_round_trip_through_keras_serialisation():
    strategies = [PeriodicAverage(4, warmup_steps=3), DiLoCo(5, outer_learning_rate=0.5, outer_momentum=0.8),
                  DiLoCo(2, outer_optimizer=keras.optimizers.Adam(0.01, beta_1=0.8)),
                  GradientAccumulation(3, strategy=DiLoCo(7))]
    for strategy in strategies:
        again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(strategy))
        assert type(again) is type(strategy) and again.get_config() == strategy.get_config()
        assert repr(again) == repr(strategy)
    outer = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(strategies[2])).outer_optimizer
    assert isinstance(outer, keras.optimizers.Adam) and outer is not strategies[2].outer_optimizer
    assert (float(outer.learning_rate.numpy()), outer.beta_1) == (pytest.approx(0.01), 0.8)
    defaults = [DiLoCo(), DiLoCo()]
    for strategy in defaults:
        assert strategy.outer_optimizer is None  # made in build, as the strategy's first variables
        strategy.build([tf.Variable([0.0])])
    default = defaults[0].outer_optimizer
    assert isinstance(default, keras.optimizers.SGD) and default.nesterov and default.momentum == 0.7
    assert float(default.learning_rate.numpy()) == pytest.approx(0.7)
    assert defaults[0].outer_optimizer is not defaults[1].outer_optimizer  # a fresh one per instance


@pytest.mark.parametrize("make, message", [
    (lambda: PeriodicAverage(0), r"`period` must be an integer >= 1\. Received: period=0"),
    (lambda: PeriodicAverage(2.5), r"Received: period=2\.5"),
    (lambda: PeriodicAverage(True), r"Received: period=True"),
    (lambda: PeriodicAverage(warmup_steps=-1), r"`warmup_steps` must be an integer >= 0\. Received: warmup_steps=-1"),
    (lambda: DiLoCo(0), r"`period` must be an integer >= 1\. Received: period=0"),
    (lambda: DiLoCo(outer_learning_rate=0), r"`outer_learning_rate` must be a number > 0\. "
                                             r"Received: outer_learning_rate=0"),
    (lambda: DiLoCo(outer_momentum=1.0), r"`outer_momentum` must be a number with 0 <= outer_momentum < 1\. "
                                         r"Received: outer_momentum=1\.0"),
    (lambda: DiLoCo(outer_optimizer="sgd"), r"`outer_optimizer` must be a Keras optimizer or None\. "
                                            r"Received: outer_optimizer='sgd'"),
    (lambda: DiLoCo(outer_learning_rate=0.5, outer_optimizer=keras.optimizers.SGD(0.5)),
     r"set them on `outer_optimizer` instead\. Received: outer_learning_rate=0\.5"),
])
def test_bad_hyperparameters_are_refused_in_keras_form(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_period_one_warns():
    with pytest.warns(UserWarning, match="period=1 averages the weights every step"):
        PeriodicAverage(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PeriodicAverage(2)


def test_command_line_builds_them_and_shares_tau_with_easgd():
    assert {"periodic", "diloco"} <= set(registry.available())
    periodic = cli.make_strategy(cli.parse_args(["--strategy", "periodic", "--tau", "4", "--warmup-steps", "8"]))
    assert isinstance(periodic, PeriodicAverage) and (periodic.period, periodic.warmup_steps) == (4, 8)
    args = cli.parse_args(["--strategy", "diloco", "--tau", "5", "--outer-lr", "0.5", "--outer-momentum", "0.8"])
    diloco = cli.make_strategy(args)
    assert (diloco.period, diloco.outer_learning_rate, diloco.outer_momentum) == (5, 0.5, 0.8)
    assert cli.effective_config(args)["outer_lr"] == 0.5
    assert cli.make_strategy(cli.parse_args(["--strategy", "easgd", "--tau", "6"])).period == 6
    with pytest.raises(errors.UsageError, match=r"^--outer-lr is an option of --strategy diloco, not --strategy "
                                                r"periodic$"):
        cli.parse_args(["--strategy", "periodic", "--outer-lr", "0.5"])
    with pytest.raises(errors.UsageError, match=r"^`period` must be an integer >= 1\. Received: period=0$"):
        cli.make_strategy(cli.parse_args(["--strategy", "diloco", "--tau", "0"]))


def test_scale_lr_rule():
    # periodic: a local step averages one rank's K micro-batches, as under EASGD
    assert PeriodicAverage.lr_scale_factor(2, 1) == 2.0 and PeriodicAverage.lr_scale_factor(2, 4) == 4.0
    with pytest.raises(ValueError, match=r"--strategy diloco has no --scale-lr rule: .*--outer-lr"):
        DiLoCo.lr_scale_factor(2, 1)
    with pytest.raises(errors.UsageError, match=r"^--scale-lr: --strategy diloco has no --scale-lr rule"):
        cli.parse_args(["--strategy", "diloco", "--scale-lr"])
    assert [auto_scales(registry.get(name), "momentum", lr_given=False)
            for name in ("sync", "easgd", "periodic", "diloco")] == [True, True, True, False]
    # Hierarchical's rule needs its options (the inter strategy's): asked of the strategy built, not the class
    hierarchical = ["--strategy", "hierarchical", "--ranks-per-group", "2"]
    assert [auto_scales(cli.make_strategy(cli.parse_args(hierarchical + ["--inter", inter])), "momentum", False)
            for inter in ("easgd", "sync", "diloco")] == [True, True, False]
    assert [cli.parse_args(hierarchical + ["--inter", inter]).scale_lr for inter in ("easgd", "diloco")] == [
        True, False]
    with pytest.raises(TypeError, match=r"^Hierarchical's --scale-lr rule needs its options"):
        auto_scales(registry.get("hierarchical"), "momentum", lr_given=False)
    # --inter diloco: named, with the inter strategy's reason
    with pytest.raises(errors.UsageError, match=r"^--scale-lr: --strategy diloco has no --scale-lr rule: "
                                                r".* Tune --lr and --outer-lr instead$"):
        cli.parse_args(hierarchical + ["--inter", "diloco", "--scale-lr"])


def test_building_them_from_the_command_line_creates_no_tensorflow_variable():
    # train.py builds the strategy before hvd_easgd.init() sets TF's thread counts (and pins GPUs),
    # which TensorFlow refuses once it holds a variable: a strategy must create none until build.
    created = []

    def record(next_creator, **kwargs):
        created.append(kwargs.get("name"))
        return next_creator(**kwargs)

    with tf.variable_creator_scope(record):
        for name in ("periodic", "diloco"):
            cli.make_strategy(cli.parse_args(["--strategy", name]))
        keras.optimizers.SGD(0.1)  # the scope sees what a Keras optimizer creates
    assert created == ["iteration", "learning_rate"]
