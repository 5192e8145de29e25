"""The adaptive communication period (AdaComm, ``--tau adaptive``) on p = 3 simulated
ranks: its τ sequence and sync steps against a NumPy reference for a given loss
sequence and lr schedule (clamped at 1 and at τ_max), for PeriodicAverage, DiLoCo
and EASGD; a resume mid-period; the options' validation; the fixed path's state."""
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import DiLoCo, EASGD, PeriodicAverage
from hvd_easgd.app import cli, errors
from hvd_easgd.comm import SimulatedCluster
from hvd_easgd.strategies.period_schedule import AdaptivePeriod, FixedPeriod

# slow: AdaComm's whole tau sequence on several ranks: `make test-fast` leaves it out.
pytestmark = [pytest.mark.unit, pytest.mark.slow]
P, TAU0, TAU_MAX, STEPS, BATCH = 3, 4, 9, 40, 8
# The ranks' losses are base·(1 + r)/2 for r = 0, 1, 2: their mean is base. The base
# goes from 2 (F₀, two intervals of τ₀) to 16 (√8·4 = 11.3 → τ_max) to 0.01 (√0.005·4 = 0.28 → 1)
# and to 3 with the lr halved from step 21 (√3·4 = 6.9 → 7).
BASE = [2.0] * 8 + [16.0] * 4 + [0.01] * 9 + [3.0] * 19


def lr_at(step):
    return 0.1 if step <= 20 else 0.05


def adacomm_reference(base, tau0, tau_max, lr):
    """[(step, τ after it)] for the syncs: τ = clamp(⌈√(η₀F/(ηF₀))·τ₀⌉, 1, τ_max), F the interval's mean."""
    syncs, next_sync, total, count, first = [], tau0, 0.0, 0, None
    for step, loss in enumerate(base, start=1):
        total, count = total + loss, count + 1
        if step == next_sync:
            mean = total / count
            first = first or (mean, lr(step))
            tau = min(max(math.ceil(math.sqrt(first[1] * mean / (lr(step) * first[0])) * tau0), 1), tau_max)
            syncs.append((step, tau))
            next_sync, total, count = step + tau, 0.0, 0
    return syncs


class Tracker:
    """What the schedule reads of Keras's loss tracker: Σ loss·n and Σ n."""

    def __init__(self):
        self.total = tf.Variable(0.0)
        self.count = tf.Variable(0.0)


def ranks(make_strategy, lr):
    cluster = SimulatedCluster(P)
    models, opts, trackers = [], [], []
    for comm in cluster.communicators:
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
        model.layers[0].kernel.assign([[1.0], [-1.0]])
        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(lr), make_strategy(), comm=comm)
        tracker = Tracker()
        opt.strategy.schedule.bind_loss(tracker, lambda opt=opt: opt.learning_rate)
        models.append(model), opts.append(opt), trackers.append(tracker)
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    return cluster, models, opts, trackers


def train(cluster, models, opts, trackers, steps, start=0):
    """Steps start+1 .. start+steps; returns the steps at which rank 0 made a collective call."""
    synced = []
    for step in range(start + 1, start + steps + 1):
        def one(r):
            opts[r].learning_rate.assign(lr_at(step))
            x = tf.constant([[1.0 + r, 2.0], [0.5, -1.0 * r]])
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(models[r](x)))
            trackers[r].total.assign_add(BASE[step - 1] * (1 + r) / 2 * BATCH)
            trackers[r].count.assign_add(BATCH)
            opts[r].apply(tape.gradient(loss, models[r].trainable_variables), models[r].trainable_variables)

        calls = opts[0].comm.account()["calls"]
        cluster.run(one)
        if opts[0].comm.account()["calls"] > calls:
            synced.append(step)
    return synced


STRATEGIES = {
    "periodic": lambda: PeriodicAverage("adaptive:4", max_period=TAU_MAX),
    "diloco": lambda: DiLoCo("adaptive:4", max_period=TAU_MAX),
    "easgd": lambda: EASGD("adaptive:4", max_period=TAU_MAX),
}


@pytest.fixture(scope="module")
def periodic_run():
    """PeriodicAverage's whole run of STEPS steps, uninterrupted, and a copy of its ranks' state
    at step 19 (inside the τ_max interval): what a checkpoint there holds. Shared by the τ
    sequence's test and the resume's, which compare against the same run."""
    make = STRATEGIES["periodic"]
    cluster, models, opts, trackers = ranks(make, 0.1)
    first = train(cluster, models, opts, trackers, 19)
    copy = ranks(make, 0.1)
    _, models_c, opts_c, trackers_c = copy
    for r in range(P):  # the checkpoint: weights, optimizer and strategy state, the tracker
        pairs = zip(models_c[r].weights + opts_c[r].variables + opts_c[r].strategy.state_variables(),
                    models[r].weights + opts[r].variables + opts[r].strategy.state_variables())
        for dst, src in pairs:
            dst.assign(src)
        trackers_c[r].total.assign(trackers[r].total), trackers_c[r].count.assign(trackers[r].count)
    whole = first + train(cluster, models, opts, trackers, STEPS - 19, start=19)
    return (cluster, models, opts, trackers), whole, first, copy


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_the_tau_sequence_and_the_sync_steps_follow_adacomm(name, request):
    expected = adacomm_reference(BASE, TAU0, TAU_MAX, lr_at)
    taus = [tau for _, tau in expected]
    assert TAU_MAX in taus and 1 in taus and taus[0] == TAU0  # the case exercises both clamps
    if name == "periodic":
        (cluster, models, opts, trackers), synced, _, _ = request.getfixturevalue("periodic_run")
    else:
        cluster, models, opts, trackers = ranks(STRATEGIES[name], 0.1)
        synced = train(cluster, models, opts, trackers, STEPS)
    assert synced == [step for step, _ in expected]
    schedules = [opt.strategy.schedule for opt in opts]
    for schedule in schedules:  # every rank holds the same schedule
        assert schedule.counts.numpy().tolist() == [taus[-1], expected[-1][0] + taus[-1], len(expected)]
        assert schedule.losses.numpy()[0] == pytest.approx(2.0) and schedule.losses.numpy()[1] == pytest.approx(0.1)


def test_a_resume_mid_period_continues_bit_for_bit(periodic_run):
    # The uninterrupted run (its state copied, not touched, at step 19) against a run resumed from that copy.
    (_, models, opts, _), whole, first, (cluster_c, models_c, opts_c, trackers_c) = periodic_run
    assert 19 not in first
    assert whole == [step for step, _ in adacomm_reference(BASE, TAU0, TAU_MAX, lr_at)]
    rest = train(cluster_c, models_c, opts_c, trackers_c, STEPS - 19, start=19)
    assert first + rest == whole
    for r in range(P):
        assert np.array_equal(models_c[r].weights[0].numpy(), models[r].weights[0].numpy())
        for a, b in zip(opts_c[r].strategy.state_variables(), opts[r].strategy.state_variables()):
            assert np.array_equal(a.numpy(), b.numpy())


def test_a_fixed_period_keeps_its_state_layout():
    fixed, adaptive = PeriodicAverage(4), PeriodicAverage("adaptive:4", max_period=9)
    assert isinstance(fixed.schedule, FixedPeriod) and isinstance(adaptive.schedule, AdaptivePeriod)
    for s in (fixed, adaptive):
        s.build([tf.Variable([1.0, 2.0])])
    assert len(adaptive.state_variables()) == len(fixed.state_variables()) + 2
    assert fixed.get_config()["period"] == 4 and "max_period" not in fixed.get_config()
    again = PeriodicAverage.from_config(adaptive.get_config())
    assert (again.period, again.schedule.maximum) == (4, 9) and again.schedule.adaptive


@pytest.mark.parametrize("kwargs, message", [
    ({"period": "adaptive"}, "`max_period` (--tau-max) must be given with an adaptive period: an integer >= 10. "
                             "Received: max_period=None"),
    ({"period": "adaptive:8", "max_period": 4}, "`max_period` (--tau-max) must be an integer >= 8. "
                                                 "Received: max_period=4"),
    ({"period": "adaptive:0", "max_period": 4}, "`period` must be an integer >= 1, 'adaptive' or 'adaptive:T0' "
                                                 "(T0 >= 1, the starting tau). Received: period='adaptive:0'"),
    ({"period": "often"}, "`period` must be an integer >= 1, 'adaptive' or 'adaptive:T0' (T0 >= 1, the starting "
                          "tau). Received: period='often'"),
    ({"period": 5, "max_period": 9}, "`max_period` (--tau-max) must be None unless the period is adaptive "
                                     "(--tau adaptive). Received: max_period=9"),
])
def test_the_options_are_refused_in_one_line(kwargs, message):
    for cls in (PeriodicAverage, DiLoCo, EASGD):
        with pytest.raises(ValueError) as err:
            cls(**kwargs)
        assert str(err.value) == message


def test_the_command_line_takes_tau_adaptive_and_tau_max():
    config = cli.parse_args(["--strategy", "periodic", "--tau", "adaptive", "--tau-max", "40"])
    strategy = cli.make_strategy(config)
    assert (strategy.period, strategy.schedule.maximum, strategy.schedule.adaptive) == (10, 40, True)
    strategy = cli.make_strategy(cli.parse_args(["--strategy", "diloco", "--tau", "adaptive:20", "--tau-max", "80"]))
    assert (strategy.period, strategy.schedule.maximum) == (20, 80)
    with pytest.raises(errors.UsageError, match="Received: max_period=None"):
        cli.make_strategy(cli.parse_args(["--strategy", "easgd", "--tau", "adaptive"]))
