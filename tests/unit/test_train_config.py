"""The frozen TrainConfig that train.py's cli builds and its trainer takes: frozen, the same
effective config as before it existed, and one default per option."""
import ast
import dataclasses
import inspect

import pytest

from hvd_easgd.checkpoint import preemption
from hvd_easgd.startup import runtime
from hvd_easgd.app import cli, data, trainer
from hvd_easgd.app.config import TrainConfig
from hvd_easgd.callbacks import AbortOnNonFinite, PeriodicCheckpoint

pytestmark = pytest.mark.unit

# The effective config of `train.py` with no flags, written out by hand: config.yaml's and the
# manifests' keys and values as they were when the trainer still took an argparse.Namespace.
# "plugin" joined with --plugin (issue 23): the modules imported, [] without any.
DEFAULTS_EFFECTIVE = {
    "config": None, "plugin": [], "strategy": "sync", "accumulate": 1, "accumulate_reduction": "mean",
    "compression": "none", "powersgd_rank": 4, "density": 1 / 64, "bits": 2,  # --compression topk's (issue 62)
    "model": "cnn",
    "data": "digits", "train_fraction": 1.0, "image_shape": "32,32,3", "num_classes": 10,
    "context": 128, "layers": 2, "width": 64, "heads": 4,  # the transformer's (wave 4: real workloads)
    "optimizer": "momentum", "momentum": 0.9,
    "lr": 0.02, "lr_schedule": "constant", "lr_warmup_updates": None, "lr_floor": 0.1, "batch_size": 32, "epochs": None, "seed": 0, "scale_lr": True, "lr_warmup_epochs": 0.0,
    "threads_per_rank": None, "collectives": "auto", "max_bad_steps": 25, "run_dir": None, "resume": None,
    "checkpoint_every": 1, "checkpoint_every_steps": 0, "checkpoint_every_minutes": 0.0,
    "checkpoint_on_signal": "none", "agree_every": 10, "stop_grace_seconds": 120.0, "auto_resume": False,
    "keep_checkpoints": 3, "elastic": False, "elastic_commit_every": None,  # --elastic (issue 27)
    "eval_every": 1, "tensorboard": True, "verbose": None,
    "step_timeline": False,  # --step-timeline (issue 25: timeline.json)
    "auto_utilisation": 0.9, "auto_choice": None,  # --strategy auto's target and its choice
    "balance": "off", "sample_shares": None,  # --balance and the shares it measured
}


def test_a_config_is_frozen_and_so_are_its_strategy_options():
    config = cli.parse_args(["--strategy", "easgd", "--tau", "4"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.epochs = 3
    with pytest.raises(TypeError):
        config.strategy_options["tau"] = 5
    options = {"tau": 4}
    kept = TrainConfig(strategy="easgd", strategy_options=options)
    options["tau"] = 5  # the caller's dict is copied, not shared
    assert kept.strategy_options == {"tau": 4}


def test_a_resolved_value_comes_back_as_a_new_config():
    config = cli.parse_args(["--accumulate", "2"])
    resolved = trainer._resolve_epochs(config, steps=20)  # 10 updates an epoch: default_epochs(10) = 10
    assert (config.epochs, resolved.epochs) == (None, 10)
    assert dataclasses.replace(resolved, epochs=None) == config
    given = cli.parse_args(["--epochs", "3"])
    assert trainer._resolve_epochs(given, steps=20) is given


@pytest.mark.parametrize("argv, changed", [
    ([], {}),
    (["--strategy", "easgd", "--tau", "4", "--overlap", "1", "--epochs", "3"],
     {"strategy": "easgd", "epochs": 3, "tau": 4, "overlap": 1}),
    (["--strategy", "hierarchical", "--ranks-per-group", "2", "--inter", "easgd", "--tau", "5",
      "--moving-rate", "0.1"],  # the inter strategy's --scale-lr rule: auto scales, as for sync
     {"strategy": "hierarchical", "tau": 5, "moving_rate": 0.1, "inter": "easgd",
      "ranks_per_group": 2}),
    (["--strategy", "diloco", "--tau", "5", "--outer-lr", "0.5", "--lr", "0.1"],
     {"strategy": "diloco", "lr": 0.1, "scale_lr": False, "tau": 5, "outer_lr": 0.5}),
    (["--accumulate", "4", "--accumulate-reduction", "sum", "--checkpoint-on-signal", "sigterm",
      "--no-tensorboard", "--data", "synthetic", "--image-shape", "8, 8,3", "--fp16-allreduce"],
     {"accumulate": 4, "accumulate_reduction": "sum", "checkpoint_on_signal": "TERM", "tensorboard": False,
      "data": "synthetic", "image_shape": "8,8,3", "fp16_allreduce": "fp16"}),
    (["--optimizer", "adam", "--collectives", "horovod", "--run-dir", "/tmp/x", "--verbose", "2"],
     {"optimizer": "adam", "lr": 0.001, "scale_lr": True, "collectives": "horovod", "run_dir": "/tmp/x",
      "verbose": 2}),
    (["--data", "text:/etc/hostname", "--width", "64", "--heads", "2"],  # the transformer's defaults
     {"data": "text:/etc/hostname", "model": "transformer", "width": 64, "heads": 2, "optimizer": "adam",
      "lr": 0.001, "scale_lr": True, "lr_schedule": "cosine", "powersgd_rank": 16}),
    (["--data", "fashion_mnist"], {"data": "fashion_mnist", "lr_schedule": "cosine"}),  # COSINE_IMAGE_SETS
    (["--data", "fashion_mnist:/srv/fm"], {"data": "fashion_mnist:/srv/fm", "lr_schedule": "cosine"}),
    (["--data", "fashion_mnist", "--lr-schedule", "constant"], {"data": "fashion_mnist"}),
])
def test_the_effective_config_is_the_one_saved_before_the_config_object(argv, changed):
    effective = cli.parse_args(argv).as_dict()
    assert effective == {**DEFAULTS_EFFECTIVE, **changed}
    assert list(effective)[:len(DEFAULTS_EFFECTIVE)] == list(DEFAULTS_EFFECTIVE)  # and in the same order
    assert cli.effective_config(cli.parse_args(argv)) == effective


def test_every_option_has_one_default_and_argparse_takes_it_from_the_config():
    parser = cli.build_parser()
    plain = {a.dest for a in parser._actions if a.dest != "help" and "__" not in a.dest}
    defaults = TrainConfig.option_defaults()
    assert plain == set(defaults)  # one field per option, one option per field
    for name, default in defaults.items():
        assert parser.get_default(name) == default, name
    # Not a second copy that happens to agree: no add_argument in cli.py writes a default.
    tree = ast.parse(inspect.getsource(cli))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "attr", None) == "add_argument"]
    assert calls and not [c.lineno for c in calls if any(k.arg == "default" for k in c.keywords)]


def test_the_options_of_library_classes_take_the_library_default():
    # the config repeats no value a library class already defaults to
    def default_of(function, name):
        return inspect.signature(function).parameters[name].default

    config = TrainConfig()
    assert (config.max_bad_steps, config.checkpoint_every, config.keep_checkpoints, config.checkpoint_every_steps,
            config.checkpoint_every_minutes, config.agree_every, config.stop_grace_seconds) == (
        25, 1, 3, 0, 0.0, 10, 120.0)
    assert config.max_bad_steps == default_of(AbortOnNonFinite, "max_consecutive")
    assert config.keep_checkpoints == default_of(PeriodicCheckpoint, "keep")
    assert config.stop_grace_seconds == default_of(preemption.StopRequests, "grace_seconds")
    assert config.collectives == runtime.DEFAULT_COLLECTIVES == default_of(runtime.init, "collectives")
    assert (config.image_shape, config.num_classes) == ("32,32,3", 10)
    assert (default_of(data.load, "image_shape"), default_of(data.load, "num_classes")) == ((32, 32, 3), 10)


def test_strategy_kwargs_and_make_strategy_read_the_config():
    config = TrainConfig(strategy="easgd", strategy_options={"tau": 3, "moving_rate": 0.25}, accumulate=2)
    assert cli.strategy_kwargs(config) == {"period": 3, "moving_rate": 0.25}
    strategy = cli.make_strategy(config)
    assert (strategy.k, strategy.strategy.communication_period, strategy.strategy.moving_rate) == (2, 3, 0.25)
