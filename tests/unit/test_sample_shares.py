"""Ranks of unequal speed (hvd_easgd/strategies/sample_shares.py): each rank's share of the global batch, the
positions of a batch each rank takes, and the strategies' averages weighted by the shares, on p
simulated ranks against NumPy references written from the module's equations."""
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import DiLoCo, EASGD, GradientAccumulation, Hierarchical, PeriodicAverage, SyncAverage, checkpoint
from hvd_easgd.strategies import sample_shares
from hvd_easgd.app import cli, data
from hvd_easgd.app.errors import UsageError
from hvd_easgd.comm import SimulatedCluster
from tests import reference as ref
from tests.least_squares import least_squares_ranks
from tests.unit.test_cli import saved_run

pytestmark = pytest.mark.unit


# --- the shares ---------------------------------------------------------------------------------
def test_equal_speeds_within_the_tolerance_keep_equal_shares():
    assert sample_shares.from_speeds([100.0, 104.0, 97.0, 99.0], 64) == (16, 16, 16, 16)


def test_a_rank_twice_as_slow_gets_half_the_samples_of_the_others():
    shares = sample_shares.from_speeds([2.0, 2.0, 2.0, 1.0], 64)
    assert sum(shares) == 64
    # 1 each, then 60 split 2:2:2:1 by largest remainder: 17.14 x 3 and 8.57 -> 17, 17, 17, 9
    assert shares == (18, 18, 18, 10)


def test_every_rank_keeps_the_minimum_share_however_slow():
    shares = sample_shares.from_speeds([1000.0, 1.0], 8)
    assert shares == (7, 1)
    assert sample_shares.from_speeds([1000.0, 1.0], 8, minimum=0) == (8, 0)


@pytest.mark.parametrize("speeds, batch", [([1.0, 0.0], 8), ([1.0, float("nan")], 8), ([], 8), ([1.0, 2.0], 1)])
def test_bad_speeds_or_batch_are_refused(speeds, batch):
    with pytest.raises(ValueError, match="speeds|global_batch"):
        sample_shares.from_speeds(speeds, batch)


@pytest.mark.parametrize("shares", [(1, 2), (1, 2, -1), (0, 0, 0), (1.5, 1, 1), (True, 1, 1)])
def test_bad_shares_are_refused(shares):
    with pytest.raises(ValueError, match="one integer >= 0 per rank"):
        sample_shares.check(shares, 3)


def test_equal_shares_take_the_positions_ranks_always_took():
    # position q of a global batch goes to rank q mod p: data.epoch_indices' order[rank::size]
    assert list(sample_shares.positions((4, 4, 4))) == [q % 3 for q in range(12)]


def test_unequal_shares_take_their_counts_and_every_prefix_stays_within_one_sample():
    shares = (18, 18, 18, 10)
    owner = sample_shares.positions(shares)
    assert np.bincount(owner, minlength=4).tolist() == list(shares)
    total = sum(shares)
    for q in range(1, total + 1):
        counts = np.bincount(owner[:q], minlength=4)
        assert np.all(np.abs(counts - np.array(shares) * q / total) < 1), q


# --- the data: each rank its share of every global batch, each sample once an epoch ---------------
def test_an_epoch_of_unequal_shares_visits_each_sample_once_and_equal_shares_change_nothing():
    num_train, seed, epoch = 1000, 3, 2
    shares = (5, 3, 1)
    steps = num_train // sum(shares)
    pieces = [data.epoch_indices(num_train, seed, epoch, r, 3, steps, shares[r], shares=shares)
              for r in range(3)]
    assert [len(p) for p in pieces] == [steps * b for b in shares]
    seen = np.concatenate(pieces)
    assert len(np.unique(seen)) == len(seen) == steps * sum(shares)
    # step s of every rank together is the epoch's order from s·B to (s+1)·B
    order = np.random.default_rng([seed, epoch]).permutation(num_train)
    for s in (0, 7, steps - 1):
        together = np.concatenate([p.reshape(steps, b)[s] for p, b in zip(pieces, shares)])
        assert sorted(together) == sorted(order[s * 9:(s + 1) * 9])
    for r in range(3):
        assert np.array_equal(data.epoch_indices(num_train, seed, epoch, r, 3, 40, 8, shares=(8, 8, 8)),
                              data.epoch_indices(num_train, seed, epoch, r, 3, 40, 8))


# --- the strategies' averages, weighted ---------------------------------------------------------
SHARES = (4, 2, 0)  # rank 2 takes no sample: it steps with nothing, its weight is 0
INNER_LR = 0.05


def weighted_reference(shards, w0, tau, steps, kind, shares=SHARES, outer=None):
    """Rank r steps plain SGD on its micro-batch of shares[r] samples (none: it keeps its weights);
    every tau-th step the weights (periodic) or θ − x (diloco) are averaged with w_r = b_r / Σb."""
    weights = np.array(shares, np.float64) / sum(shares)
    xs = [w0.copy() for _ in shares]
    theta = w0.copy()
    for t in range(steps):
        for r, b in enumerate(shares):
            if b:
                xs[r] = xs[r] - INNER_LR * ref.grad(xs[r], *ref.batch(shards[r], t, b))
        if (t + 1) % tau == 0:
            if kind == "periodic":
                xs = [sum(w * x for w, x in zip(weights, xs))] * len(shares)
            else:
                theta = outer.step(theta, sum(w * (theta - x) for w, x in zip(weights, xs)))
                xs = [theta.copy() for _ in shares]
    return xs


def train_on_shares(cluster, models, opts, shards, steps, shares, counts=True):
    """Rank r's micro-batch t holds shares[r] samples; ``counts``: passed as sample_count."""
    def step(r, t):
        b = shares[r]
        x, y = ref.batch(shards[r], t, max(b, 1))
        x, y = tf.constant(x[:b], tf.float32), tf.constant(y[:b], tf.float32)
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_mean(tf.square(tf.squeeze(models[r](x), -1) - y))
        grads = tape.gradient(loss, models[r].trainable_variables)
        opts[r].apply(grads, models[r].trainable_variables, sample_count=b if counts else None)

    for t in range(steps):
        cluster.run(lambda r: step(r, t))


def weights_of(models):
    return [m.layers[0].kernel.numpy().ravel() for m in models]


@pytest.mark.parametrize("kind", ["periodic", "diloco"])
def test_an_average_weighs_each_rank_by_its_share_of_the_samples_a_rank_of_none_included(kind):
    shards, w0 = ref.least_squares_shards(3)
    cluster = SimulatedCluster(3)
    make = (lambda: PeriodicAverage(3)) if kind == "periodic" else (lambda: DiLoCo(3))
    models, opts = least_squares_ranks(cluster, make, lambda: keras.optimizers.SGD(INNER_LR), w0)
    for opt in opts:
        opt.strategy.set_sample_shares(SHARES)
    train_on_shares(cluster, models, opts, shards, 6, SHARES)  # two averages; ends on one
    got = weights_of(models)
    assert all(np.array_equal(got[0], w) for w in got[1:])
    expected = weighted_reference(shards, w0, 3, 6, kind, outer=ref.SGDRef(0.7, 0.7, nesterov=True))[0]
    np.testing.assert_allclose(got[0], expected, rtol=1e-5)
    # the weights are not the plain mean's: rank 2 held w0 and counts for nothing
    plain = weighted_reference(shards, w0, 3, 6, kind, shares=(1, 1, 1), outer=ref.SGDRef(0.7, 0.7, nesterov=True))
    assert np.linalg.norm(got[0] - plain[0]) > 1e-3
    # weighing costs no byte: 2 averages of the 6 weights and the flag, as unweighted
    for comm in cluster.communicators:
        assert comm.account() == {"bytes": 2 * 4 * (ref.DIM + 1), "calls": 2}


def test_sync_average_without_counts_takes_the_per_sample_mean_of_the_global_batch():
    shares = (6, 2)
    shards, w0 = ref.least_squares_shards(2)
    cluster = SimulatedCluster(2)
    models, opts = least_squares_ranks(cluster, SyncAverage, lambda: keras.optimizers.SGD(INNER_LR), w0)
    for opt in opts:
        opt.strategy.set_sample_shares(shares)
    train_on_shares(cluster, models, opts, shards, 3, shares, counts=False)  # Keras's path: no count
    w = w0.copy()
    for t in range(3):
        g = sum(b * ref.grad(w, *ref.batch(shards[r], t, b)) for r, b in enumerate(shares)) / sum(shares)
        w = w - INNER_LR * g
    for got in weights_of(models):
        np.testing.assert_allclose(got, w, rtol=1e-5)


@pytest.mark.parametrize("make", [lambda: SyncAverage(), lambda: PeriodicAverage(3), lambda: DiLoCo(3)])
def test_equal_shares_give_the_unweighted_bits(make):
    shards, w0 = ref.least_squares_shards(2)
    runs = []
    for shares in (None, (4, 4)):
        cluster = SimulatedCluster(2)
        models, opts = least_squares_ranks(cluster, make, lambda: keras.optimizers.SGD(INNER_LR), w0)
        if shares:
            for opt in opts:
                opt.strategy.set_sample_shares(shares)
        train_on_shares(cluster, models, opts, shards, 5, (4, 4), counts=False)
        runs.append(weights_of(models))
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("make, why", [(lambda: EASGD(3, moving_rate=0.3), "moving rate"),
                                       (lambda: GradientAccumulation(2), "count of samples"),
                                       (lambda: Hierarchical(ranks_per_group=1), "group")])
def test_a_strategy_that_cannot_weigh_refuses_unequal_shares_and_takes_equal_ones(make, why):
    cluster = SimulatedCluster(2)
    strategy = make().bind(cluster.communicators[0])
    with pytest.raises(ValueError, match=why):
        strategy.set_sample_shares((3, 1))
    strategy.set_sample_shares((2, 2))


# --- the test hook, the measurement, train.py's options -------------------------------------------
def test_the_slow_rank_hook_is_read_per_rank_and_refuses_what_it_cannot_read():
    assert sample_shares.test_slowdown(1, {}) == 0.0
    setting = {sample_shares.TEST_SLOW_RANKS: "1:0.002,3:0.5"}
    assert [sample_shares.test_slowdown(r, setting) for r in range(4)] == [0.0, 0.002, 0.0, 0.5]
    for bad in ("1", "1:x", "a:1", "1:-1", "1:inf"):
        with pytest.raises(ValueError, match="RANK:SECONDS_PER_SAMPLE"):
            sample_shares.test_slowdown(0, {sample_shares.TEST_SLOW_RANKS: bad})


def test_every_rank_measures_the_same_speeds_and_the_slowed_rank_is_slower(monkeypatch):
    # 5 ms a sample on rank 1: 40 ms a step of 8, against a few ms of the Dense model's own step
    monkeypatch.setenv(sample_shares.TEST_SLOW_RANKS, "1:0.005")
    cluster = SimulatedCluster(2)
    x = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    batches = [(tf.constant(x), tf.constant(np.arange(8) % 3))]

    def measure(r):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        return sample_shares.measure_speeds(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                                            keras.optimizers.SGD(0.1), batches, cluster.communicators[r])

    speeds = cluster.run(measure)
    assert speeds[0] == speeds[1] and len(speeds[0]) == 2
    fast, slow = speeds[0]
    assert slow < 8 / 0.040 and fast > 2 * slow
    assert sample_shares.from_speeds(speeds[0], 16)[1] < 8


def test_a_rank_reads_its_share_of_each_global_batch_and_a_resume_reads_the_rest_alike():
    dataset = data.digits()
    shares, steps = (24, 8), len(dataset.y_train) // 32
    pipelines = [data.training_dataset(dataset, shares[r], 0, r, 2, 0, 1, steps, shares=shares)[0]
                 for r in range(2)]
    for r, pipeline in enumerate(pipelines):
        sizes = {int(x.shape[0]) for x, _ in pipeline}
        assert sizes == {shares[r]}
    # the rest of epoch 0 after 5 global batches: each rank its share of the same positions
    rest = steps - 5
    for r in range(2):
        got = [y.numpy() for _, y in data.rest_of_epoch_dataset(dataset, shares[r], 0, r, 2, 0, 5 * 32, rest,
                                                                shares)]
        expected = [y.numpy() for _, y in pipelines[r].skip(5)]
        assert len(got) == rest and all(np.array_equal(a, b) for a, b in zip(got, expected))


@pytest.mark.parametrize("argv, message", [
    (["--strategy", "easgd"], "--balance speed: EASGD takes equal shares of the global batch only"),
    (["--accumulate", "2"], "--balance speed: GradientAccumulation takes equal shares"),
    (["--strategy", "hierarchical"], "--balance speed: Hierarchical takes equal shares"),
    (["--elastic", "--run-dir", "x"], "--balance speed measures the ranks at start-up, and --elastic"),
    (["--strategy", "auto"], "--balance speed with --strategy auto: auto prices ranks of equal speed"),
])
def test_train_py_refuses_balance_where_it_cannot_weigh(argv, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        cli.parse_args(["--balance", "speed", *argv])


def test_a_resume_at_the_same_size_takes_the_saved_shares(tmp_path):
    config = dict(cli.effective_config(cli.parse_args(["--strategy", "diloco", "--balance", "speed"])),
                  sample_shares=[40, 24], run_dir=str(tmp_path / "run"))
    run_dir = saved_run(tmp_path / "run", checkpoint.FORMAT_VERSION, config)
    resumed = cli.parse_args(["--resume", run_dir])
    assert (resumed.balance, resumed.sample_shares) == ("speed", [40, 24])
    assert cli.parse_args(["--strategy", "diloco", "--balance", "speed"]).sample_shares is None


def test_the_epoch_metrics_of_ranks_of_unequal_shares_are_weighed_by_their_samples():
    from hvd_easgd.callbacks import MetricAverage
    shares = (48, 16)
    cluster = SimulatedCluster(2)
    logs = [{"loss": 1.0, "val_loss": 5.0}, {"loss": 3.0, "val_loss": 7.0}]

    def average(r):
        callback = MetricAverage(cluster.communicators[r], share_weight=sample_shares.weight(shares, r))
        callback.on_epoch_end(0, logs[r])

    cluster.run(average)
    # (48·1 + 16·3) / 64 = 1.5 on both ranks; the validation entries are GlobalEvaluationMetrics' already
    assert logs == [{"loss": 1.5, "val_loss": 5.0}, {"loss": 1.5, "val_loss": 7.0}]
    assert sample_shares.weight((32, 32), 1) == 1.0
