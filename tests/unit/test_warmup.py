"""WarmUp: one rule for every warm-up (SyncAverage first, then the strategy), on
SimulatedCluster at p = 2 against hand-derived numbers."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import DiLoCo, EASGD, GradientAccumulation, Hierarchical, LocalCommunicator, PeriodicAverage, SyncAverage, \
    WarmUp
from hvd_easgd.comm import SimulatedCluster
from hvd_easgd.strategies import walk

pytestmark = pytest.mark.unit


def two_ranks(make_strategy, grads, steps):
    """Two ranks, each with w = [0.0] and SGD(1); rank r applies the constant
    gradient ``grads[r]`` for ``steps`` steps. Returns, per rank, the list of
    (w, kept model or None) after every step, its strategy and its account."""
    cluster = SimulatedCluster(2)
    ws = [tf.Variable([0.0]) for _ in range(2)]
    opts = [hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(1.0), make_strategy(), comm=c)
            for c in cluster.communicators]
    history = [[], []]

    def rank_main(rank):
        opts[rank].sync_initial_state(trainable_variables=[ws[rank]])
        opts[rank].comm.reset_account()
        for _ in range(steps):
            opts[rank].apply([tf.constant([grads[rank]])], [ws[rank]])
            kept = opts[rank].strategy.kept_variables()
            history[rank].append((float(ws[rank].numpy()[0]), None if kept is None else float(kept[0].numpy()[0])))

    cluster.run(rank_main)
    return history, [o.strategy for o in opts], [o.comm.account() for o in opts]


def diloco(**kwargs):
    # Outer SGD(0.5) without momentum: θ ← θ − 0.5·mean_i(θ − x_i), easy to follow by hand.
    return DiLoCo(period=2, outer_optimizer=keras.optimizers.SGD(0.5), **kwargs)


@pytest.mark.parametrize("make", [lambda: diloco(warmup_steps=2), lambda: WarmUp(diloco(), steps=2)],
                         ids=["DiLoCo(warmup_steps=2)", "WarmUp(DiLoCo, 2)"])
def test_diloco_warm_up_then_outer_steps_from_the_warmed_weights(make):
    # Gradients 1 (rank 0) and 3 (rank 1), lr 1, w0 = 0.
    # Warm-up, SyncAverage of the mean gradient 2: w = -2, -4 on both ranks; at the switch θ ← x = -4.
    # t = 1: local steps, w = -5 and -7.
    # t = 2: local steps, w = -6 and -10; Δ = θ − x = 2 and 6, mean 4; θ = -4 − 0.5·4 = -6; x ← θ.
    # t = 3, 4: -7 and -9, then -8 and -12; Δ = 2 and 6 again: θ = -6 − 2 = -8.
    # (Without θ ← x at the switch, Δ = 6 and 10 at t = 2 and θ would be -4, not -6.)
    history, strategies, accounts = two_ranks(make, grads=(1.0, 3.0), steps=6)
    assert [w for w, _ in history[0]] == [-2.0, -4.0, -5.0, -6.0, -7.0, -8.0]
    assert [w for w, _ in history[1]] == [-2.0, -4.0, -7.0, -6.0, -9.0, -8.0]
    # The kept model: the weights during the warm-up (None), θ after it.
    assert [kept for _, kept in history[0]] == [None, -4.0, -4.0, -6.0, -6.0, -8.0]
    # 2 warm-up allreduces of one float (4 bytes), then 2 outer steps of Δ and the flag (8 bytes).
    assert accounts == [{"bytes": 2 * 4 + 2 * 8, "calls": 4}] * 2
    for strategy in strategies:
        warm_up = next(s for s in walk(strategy) if type(s) is SyncAverage)
        assert int(warm_up.step_counter.numpy()) == 2


@pytest.mark.parametrize("make_builtin, make_main", [
    (lambda: EASGD(period=3, moving_rate=0.25, warmup_steps=4), lambda: EASGD(period=3, moving_rate=0.25)),
    (lambda: PeriodicAverage(3, warmup_steps=4), lambda: PeriodicAverage(3)),
], ids=["EASGD", "PeriodicAverage"])
def test_the_composite_computes_what_the_strategies_own_warm_up_does(make_builtin, make_main):
    builtin = two_ranks(make_builtin, grads=(1.0, -2.0), steps=11)
    composite = two_ranks(lambda: WarmUp(make_main(), steps=4), grads=(1.0, -2.0), steps=11)
    assert composite[0] == builtin[0]  # weights and kept model after every step, bit for bit
    assert composite[2] == builtin[2]
    # The main strategy counts only its own steps: t starts at the switch.
    assert [int(s.strategy.step_counter.numpy()) for s in composite[1]] == [7, 7]
    assert [int(s.step_counter.numpy()) for s in builtin[1]] == [11, 11]


@pytest.mark.parametrize("make_builtin, make_main", [
    (lambda: EASGD(period=3, moving_rate=0.5, warmup_steps=4), lambda: EASGD(period=3, moving_rate=0.5)),
    (lambda: DiLoCo(3, warmup_steps=4), lambda: DiLoCo(3)),
], ids=["EASGD", "DiLoCo"])
def test_inside_a_traced_step_the_composite_and_the_own_warm_up_agree(make_builtin, make_main):
    # One rank (SimulatedCluster's ranks exchange eager tensors): the tf.cond switch, traced.
    def run(strategy):
        w = tf.Variable([0.0])
        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.5, momentum=0.5), strategy,
                                             comm=LocalCommunicator())
        opt.sync_initial_state(trainable_variables=[w])
        step = tf.function(lambda g: opt.apply([g], [w]))
        seen = []
        for t in range(10):
            step(tf.constant([float(t % 3) - 0.5]))
            kept = strategy.kept_variables()
            seen.append((float(w.numpy()[0]), None if kept is None else float(kept[0].numpy()[0])))
        return seen

    builtin, composite = run(make_builtin()), run(WarmUp(make_main(), steps=4))
    assert composite == builtin
    assert [kept is None for _, kept in builtin] == [True] * 3 + [False] * 7


def test_easgd_hand_over_resets_the_center_at_the_switch():
    # Warm-up of 2 (mean gradient 0.5 with grads 1 and 0): w = -0.5, -1; x̃ ← -1 at the switch.
    # t = 1: local, w = -2 and -1; t = 2 (tau 2): local w = -3 and -1, d = 0.5·(x − x̃) = -1 and 0,
    # x = -2 and -1, x̃ = -1 + (-1 + 0) = -2.
    history, _, _ = two_ranks(lambda: WarmUp(EASGD(period=2, moving_rate=0.5), steps=2), grads=(1.0, 0.0), steps=4)
    assert [w for w, _ in history[0]] == [-0.5, -1.0, -2.0, -2.0]
    assert [w for w, _ in history[1]] == [-0.5, -1.0, -1.0, -1.0]
    assert [kept for _, kept in history[0]] == [None, -1.0, -1.0, -2.0]


def test_the_tree_the_state_and_the_configuration():
    composite = WarmUp(DiLoCo(5), steps=3)
    assert [type(s) for s in walk(composite)] == [WarmUp, SyncAverage, DiLoCo]
    assert [type(s) for s in walk(DiLoCo(5, warmup_steps=3))] == [DiLoCo, SyncAverage]
    assert [type(s) for s in walk(DiLoCo(5))] == [DiLoCo]  # no warm-up, no child: older checkpoints fit
    for strategy in [composite, WarmUp(EASGD(period=4), 7, warmup=SyncAverage(clip_norm=1.0)),
                     DiLoCo(5, warmup_steps=3), GradientAccumulation(2, strategy=WarmUp(PeriodicAverage(3), 2))]:
        again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(strategy))
        assert type(again) is type(strategy) and again.get_config() == strategy.get_config()
        assert repr(again) == repr(strategy)
    # A DiLoCo config written before warm-up existed loads, without one.
    old = {"period": 5, "outer_learning_rate": 0.7, "outer_momentum": 0.7, "outer_optimizer": None}
    assert DiLoCo.from_config(old).warmup_steps == 0


def test_the_easgd_and_periodic_warm_up_state_layout_is_unchanged():
    # What checkpoints written before the composite hold, in this order.
    w = tf.Variable([0.0], name="w")
    for strategy, own in [(EASGD(period=2, warmup_steps=3), ["EASGD_step", "EASGD_skips", "center", "easgd_skipped"]),
                          (PeriodicAverage(2, warmup_steps=3),
                           ["PeriodicAverage_step", "PeriodicAverage_skips", "periodic_skipped"])]:
        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(1.0), strategy, comm=LocalCommunicator())
        opt.build([w])
        names = [v.name for v in strategy.state_variables()]
        expected = own + ["SyncAverage_step", "SyncAverage_skips"]
        assert len(names) == len(expected) and all(n.startswith(e) for n, e in zip(names, expected)), names


def test_the_composite_answers_with_its_main_strategy_and_asks_its_children_for_groups():
    easgd = EASGD(period=4)
    composite = WarmUp(easgd, steps=10)
    assert composite.lr_scale_factor(4, 2) == EASGD.lr_scale_factor(4, 2)
    assert composite.resize_refusal(2, 3) == easgd.resize_refusal(2, 3)
    variables = [tf.Variable(np.zeros((3, 2), np.float32))]
    assert composite.expected_traffic(variables, (), 1, 2) == easgd.expected_traffic(variables, (), 1, 2)
    assert not composite.needs_process_groups()
    assert WarmUp(Hierarchical(ranks_per_group=1), 3).needs_process_groups()


@pytest.mark.parametrize("kwargs, message", [
    (dict(strategy=GradientAccumulation(2), steps=3),
     r"^`strategy` must be a SyncStrategy other than GradientAccumulation \(wrap the WarmUp instead.*Received: "),
    (dict(strategy=EASGD(), steps=3, warmup="sync"), r"^`warmup` must be a SyncStrategy other than .* "
                                                     r"Received: warmup='sync'$"),
    (dict(strategy=EASGD(), steps=-1), r"^`steps` must be an integer >= 0\. Received: steps=-1$"),
    (dict(strategy=EASGD(), steps=2.0), r"^`steps` must be an integer >= 0\. Received: steps=2\.0$"),
])
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WarmUp(**kwargs)


def test_train_py_gives_diloco_a_warm_up():
    from hvd_easgd.app import cli
    strategy = cli.make_strategy(cli.parse_args(["--strategy", "diloco", "--tau", "4", "--warmup-steps", "6"]))
    assert isinstance(strategy, DiLoCo) and (strategy.period, strategy.warmup_steps) == (4, 6)


@pytest.mark.parametrize("options, lr_warmup, expected", [
    ({"tau": 50}, 160, 160),  # 3.2 periods in the learning rate's warm-up: synchronous through it
    ({"tau": 10}, 160, 0),  # 16 periods: none
    ({}, 99, 99), ({}, 100, 0),  # the library's tau (10): under 10 periods, and at 10
    ({"tau": "adaptive:20"}, 160, 160), ({"tau": "adaptive"}, 160, 0),  # an adaptive tau by its start
    ({"tau": 50}, 0, 0),  # no warm-up to follow
])
def test_diloco_s_default_warm_up_follows_the_learning_rate_s_where_it_holds_few_periods(options, lr_warmup,
                                                                                       expected):
    assert DiLoCo.default_warmup_steps(options, lr_warmup) == expected
    # The others keep their constructors' 0: no rule.
    assert {cls.default_warmup_steps(options, lr_warmup) for cls in (EASGD, PeriodicAverage, SyncAverage)} == {None}


def test_train_py_resolves_diloco_s_warm_up_from_the_run_s_updates_and_a_resume_keeps_its_own():
    from hvd_easgd.app import cli, trainer
    comm = LocalCommunicator()

    def resolved(argv, steps=640):  # 640 steps an epoch, 5 epochs: 3,200 updates, a warm-up of 160
        config = trainer._resolve_warmup(cli.parse_args(["--data", "text:/etc/hostname", "--epochs", "5"] + argv),
                                         steps)
        return trainer._resolve_strategy_warmup(config, cli.make_strategy(config), comm)

    config, strategy = resolved(["--strategy", "diloco", "--tau", "50"])
    assert config.strategy_options["warmup_steps"] == strategy.warmup_steps == 160  # config.yaml names it
    assert isinstance(strategy.warmup_strategy, SyncAverage) and strategy.comm is comm  # remade, and bound
    assert strategy.period == 50
    config, strategy = resolved(["--strategy", "diloco", "--tau", "10"])  # 16 periods: named, none
    assert config.strategy_options["warmup_steps"] == strategy.warmup_steps == 0
    config, strategy = resolved(["--strategy", "diloco", "--tau", "50", "--accumulate", "2"], steps=1280)
    assert config.strategy_options["warmup_steps"] == strategy.strategy.warmup_steps == 160  # updates, not steps
    config, strategy = resolved(["--strategy", "diloco", "--tau", "50", "--warmup-steps", "7"])  # given: kept
    assert strategy.warmup_steps == 7
    for argv in (["--strategy", "easgd", "--tau", "50"], ["--strategy", "diloco", "--tau", "50", "--lr-schedule",
                                                           "constant"]):
        config, strategy = resolved(argv)  # no rule, or no warm-up of the rate to follow: nothing named
        assert "warmup_steps" not in config.strategy_options and strategy.warmup_steps == 0
    # A DiLoCo run saved before the rule (its config.yaml names no warm-up) resumes as it ran: with none.
    config, _ = resolved(["--strategy", "diloco", "--tau", "50"])
    saved = {k: v for k, v in config.as_dict().items() if k != "warmup_steps"}
    assert cli._implied_options("diloco", {"tau": 50}, saved) == {"warmup_steps": 0}
    assert cli._implied_options("diloco", {"tau": 50}, config.as_dict()) == {}
    assert cli._implied_options("easgd", {"tau": 50}, saved) == {}
