"""A strategy defined outside hvd_easgd works wherever a built-in does: imported by
``--plugin`` (or an entry point of an installed distribution), parsed with the
options it inherits, trained on simulated ranks, resumed from its saved config,
and run by the benchmark suite. In-process; the launched run is
tests/multiproc/test_plugin.py."""
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvd_easgd
from hvd_easgd import LocalCommunicator, PeriodicAverage, checkpoint
from hvd_easgd.app import cli
from hvd_easgd.comm import SimulatedCluster
from hvd_easgd.strategies import registry
from tests.helpers import ROOT

pytestmark = pytest.mark.unit

PLUGINS = os.path.join(ROOT, "tests", "plugins")


def forget_plugins(monkeypatch, *modules):
    """As in a fresh process: the plugin modules not imported, the registry without them."""
    for module in modules:
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.setattr(registry, "_REGISTRY", {k: v for k, v in registry._REGISTRY.items()
                                                if v["cls"].__module__ not in modules})


@pytest.fixture
def plugin_path(monkeypatch):
    """tests/plugins importable; the registry and the module cache restored afterwards."""
    monkeypatch.syspath_prepend(PLUGINS)
    forget_plugins(monkeypatch, "fast_periodic")
    yield
    sys.modules.pop("fast_periodic", None)


def test_a_plugin_strategy_parses_with_its_parents_options_and_rules(plugin_path):
    args = cli.parse_args(["--plugin", "fast_periodic", "--strategy", "fast_periodic", "--tau", "3"])
    assert args.plugin == ("fast_periodic",) and "fast_periodic" in registry.available()
    config = cli.effective_config(args)
    assert (config["plugin"], config["strategy"], config["tau"]) == (["fast_periodic"], "fast_periodic", 3)
    strategy = cli.make_strategy(args)
    assert type(strategy).__name__ == "FastPeriodic" and isinstance(strategy, PeriodicAverage)
    assert strategy.period == 3
    # --scale-lr auto applies the parent's rule (size·sqrt(k)), and it resizes by the parent's rule
    assert args.scale_lr is True
    assert strategy.lr_scale_factor(2) == PeriodicAverage.lr_scale_factor(2) == 2.0
    assert cli.make_strategy(cli.parse_args(["--plugin", "fast_periodic", "--strategy", "fast_periodic",
                                             "--accumulate", "4"])).lr_scale_factor(2) == 4.0
    assert strategy.resize_refusal(2, 3) is None
    assert strategy.resize_notice(2, 3) == PeriodicAverage().resize_notice(2, 3)
    # the Keras round trip keeps the plugin's class
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(strategy))
    assert type(again) is type(strategy) and again.period == 3
    # comma-separated and repeated values are one list, first seen first
    assert cli.parse_args(["--plugin", "fast_periodic,fast_periodic", "--plugin", "fast_periodic"]).plugin == (
        "fast_periodic",)


def test_a_plugin_strategy_trains_on_simulated_ranks_as_its_parent_would(plugin_path):
    # p = 2, tau = 2, SGD(1): step 1 is local (w0 - g_r), step 2 ends on the mean of the ranks' weights.
    cluster = SimulatedCluster(2)
    args = cli.parse_args(["--plugin", "fast_periodic", "--strategy", "fast_periodic", "--tau", "2"])
    w0 = np.array([[1.0, -2.0, 0.5]], np.float32)
    grads = np.array([[[0.5, 1.0, -1.0], [1.5, -1.0, 3.0]],   # step 1: rank 0, rank 1
                      [[1.0, 0.0, 2.0], [-1.0, 2.0, 0.0]]], np.float32)  # step 2
    models, opts = [], []
    for comm in cluster.communicators:
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(3, use_bias=False)])
        model.layers[0].kernel.assign(w0 + 10.0 * comm.rank)  # rank 0's reach every rank
        models.append(model)
        opts.append(hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(1.0), cli.make_strategy(args), comm=comm))
    cluster.run(lambda r: hvd_easgd.broadcast_initial_state(models[r], opts[r]))
    for comm in cluster.communicators:
        comm.reset_account()
    seen = []

    def step(t):
        def one(r):
            opts[r].apply([tf.constant(grads[t][r][None, :])], models[r].trainable_variables)
        cluster.run(one)
        seen.append(np.stack([m.layers[0].kernel.numpy().ravel() for m in models]))

    step(0)
    np.testing.assert_allclose(seen[0], w0 - grads[0], rtol=1e-6)  # each rank its own
    step(1)
    mean = (w0 - grads[0] - grads[1]).mean(axis=0)
    np.testing.assert_allclose(seen[1], np.stack([mean, mean]), rtol=1e-6)
    # one average in two steps: 3 weights and the flag, as the hook expects
    expected = opts[0].strategy.expected_traffic(models[0].trainable_variables, (), 1, 2).total
    assert (expected.bytes, expected.calls) == (16 / 2, 0.5)
    for comm in cluster.communicators:
        assert comm.account() == {"bytes": 16, "calls": 1}


def test_an_unimportable_plugin_is_one_line_and_exit_status_2(plugin_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--plugin", "no_such_plugin_module", "--strategy", "fast_periodic"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plugin: `plugin` must name an importable module. Received: " \
                              "plugin='no_such_plugin_module' (ModuleNotFoundError" in err[0], err


def test_resume_imports_the_saved_plugin_before_the_saved_strategy_is_checked(plugin_path, monkeypatch, tmp_path):
    args = cli.parse_args(["--plugin", "fast_periodic", "--strategy", "fast_periodic", "--tau", "4"])
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    opt = hvd_easgd.DistributedOptimizer(keras.optimizers.SGD(0.1), cli.make_strategy(args),
                                         comm=LocalCommunicator())
    hvd_easgd.broadcast_initial_state(model, opt)
    opt.apply([tf.ones_like(v) for v in model.trainable_variables], model.trainable_variables)
    run_dir = str(tmp_path / "run")
    checkpoint.save(run_dir, 1, model, opt, opt.comm, cli.effective_config(args))
    forget_plugins(monkeypatch, "fast_periodic")  # a new process: nothing imported yet

    resumed = cli.parse_args(["--resume", run_dir])
    assert "fast_periodic" in sys.modules  # imported from the saved config, before the parser was built
    assert (resumed.strategy, resumed.plugin, cli.make_strategy(resumed).period) == ("fast_periodic",
                                                                                    ("fast_periodic",), 4)
    # a --config file names plugins too
    forget_plugins(monkeypatch, "fast_periodic")
    path = tmp_path / "run.yaml"
    path.write_text("plugin: fast_periodic\nstrategy: fast_periodic\ntau: 5\n")
    assert cli.make_strategy(cli.parse_args(["--config", str(path)])).period == 5


def test_an_installed_distribution_registers_through_its_entry_points(plugin_path, monkeypatch, tmp_path):
    # A fake installed distribution on sys.path: one entry names a class, the other a module that
    # registers its strategies when imported.
    (tmp_path / "entry_periodic_plugin.py").write_text(
        "import hvd_easgd\n\n\n"
        "class EntryPeriodic(hvd_easgd.PeriodicAverage):\n"
        "    name = 'entry_periodic'\n"
        "    description = 'PeriodicAverage from an entry point'\n")
    info = tmp_path / "fake_hvd_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-hvd-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hvd_easgd.strategies]\n"
                                           "entry_periodic = entry_periodic_plugin:EntryPeriodic\n"
                                           "fast = fast_periodic\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    forget_plugins(monkeypatch, "fast_periodic", "entry_periodic_plugin")

    names = registry.available()  # the first listing loads the entry points
    assert {"entry_periodic", "fast_periodic"} <= set(names)
    assert names["entry_periodic"] == "PeriodicAverage from an entry point"
    assert registry.available() == names  # once: no second registration
    strategy = cli.make_strategy(cli.parse_args(["--strategy", "entry_periodic", "--tau", "6"]))
    assert type(strategy).__name__ == "EntryPeriodic" and strategy.period == 6
    sys.modules.pop("entry_periodic_plugin", None)


def test_the_benchmark_suite_runs_a_plugin_configuration(plugin_path):
    from benchmarks.suite import configurations, worker

    args = worker.parse_args(["--out", "unused.json", "--controller", "gloo", "--plugin", "fast_periodic",
                              "--configs", "sync,fast_periodic", "--tta-configs", "fast_periodic"])
    assert args.config_list == ["sync", "fast_periodic"] and args.plugin == ["fast_periodic"]
    row = configurations.lookup("fast_periodic", args.plugin)
    assert row.train_py == ("--plugin", "fast_periodic", "--strategy", "fast_periodic")
    assert row.description == "PeriodicAverage registered by a plugin (tests/plugins/fast_periodic.py)"
    assert not configurations.needs_process_sets(args.config_list, args.plugin)
    # time to accuracy: the rate train.py --plugin ... --strategy fast_periodic --scale-lr trains at
    assert worker.scaled_learning_rate(0.02, 2, "fast_periodic", args.plugin) == pytest.approx(0.04)

    # The configuration itself, on two simulated ranks: its analytic traffic is its strategy's, and the
    # account of 20 steps (two averages of tau = 10, the plugin's default) equals it.
    cluster = SimulatedCluster(2)
    built = [None, None]
    batch = 4

    def make(r):
        built[r] = configurations.Configuration("fast_periodic", "cnn", (8, 8, 1), 10, batch,
                                                cluster.communicators[r], plugins=args.plugin)
    cluster.run(make)
    model = built[0].model
    weights = 4 * configurations.trainable_count(model)
    assert built[0].expected == {"bytes_per_step": (weights + 4) / 10, "calls_per_step": 0.1}
    assert built[0].expected == configurations.expected_traffic("periodic_tau10", model, 1, 2)
    # The configuration's own optimizer, stepped eagerly (SimulatedCluster's collectives cannot sit in the
    # tf.range loop of Configuration.run, which the launched suite runs under Horovod).
    rng = np.random.default_rng(0)
    grads = [[rng.normal(scale=0.01, size=v.shape).astype(np.float32) for v in model.trainable_variables]
             for _ in range(2)]

    def train(r):
        built[r].reset_account()
        for _ in range(20):
            built[r].optimizer.apply([tf.constant(g) for g in grads[r]], built[r].model.trainable_variables)
        return built[r].account()

    for account in cluster.run(train):
        assert (account["bytes"], account["calls"]) == (2 * (weights + 4), 2)


def test_the_suite_driver_hands_its_plugins_to_every_worker(plugin_path):
    # python -m benchmarks compare --plugin M: each worker imports M, so its strategies join the default
    # configurations (the worker test above shows what a worker does with them).
    from benchmarks.suite import compare, worker

    args = compare.parse_args(["--quick", "--plugin", "fast_periodic"])
    command, _, _ = compare.worker_command(args, 2, "mpi", "out.json", tta=False)
    worker_args = worker.parse_args(command[command.index("benchmarks.suite.worker") + 1:])
    assert worker_args.plugin == ["fast_periodic"]
    assert worker_args.config_list[-1] == "fast_periodic" and worker_args.tta_config_list[-1] == "fast_periodic"
