"""What train.py's defaults resolve to: --scale-lr auto and the default --epochs, at 1, 2, 4 and 8
ranks on digits; and that a given --lr or --epochs is kept as given."""
import json
import math
import types

import pytest

from hvd_easgd import checkpoint
from hvd_easgd.app import cli, data, trainer
from hvd_easgd.app.lr_scaling import DEFAULT_EPOCHS, DEFAULT_LR, MIN_UPDATES, default_epochs

pytestmark = pytest.mark.unit
SQRT2 = math.sqrt(2)


@pytest.fixture(scope="module")
def digits():
    return data.digits()


def resolved(argv, size, digits):
    """``(rate trained at, epochs, updates per epoch, config)`` as train.py resolves ``argv`` at ``size`` ranks."""
    args = cli.parse_args(argv)
    steps = trainer._steps_per_epoch(args, digits, types.SimpleNamespace(size=size))
    args = trainer._resolve_epochs(args, steps)  # a new config: a TrainConfig is frozen
    rate, _, _ = trainer._learning_rate(args, size, steps // args.accumulate, cli.make_strategy(args))
    return rate, args.epochs, steps // args.accumulate, args


@pytest.mark.parametrize("size, updates, epochs, factor", [
    (1, 44, 10, 1.0),          # 440 updates in 10 epochs: the default length
    (2, 22, 10, 2.0),
    (4, 11, 10, 4.0),          # 110 >= MIN_UPDATES: still 10 epochs
    (8, 5, 20, 4 * SQRT2),     # 5 updates an epoch: 20 epochs make 100; m = 8: 4 * sqrt(2)
])
def test_the_defaults_scale_the_rate_and_keep_100_updates(size, updates, epochs, factor, digits):
    rate, got_epochs, got_updates, args = resolved([], size, digits)
    assert (got_updates, got_epochs, args.scale_lr) == (updates, epochs, True)
    assert rate == pytest.approx(DEFAULT_LR * factor, rel=1e-12)
    assert got_epochs * got_updates >= MIN_UPDATES


@pytest.mark.parametrize("argv, size, rate, epochs", [
    (["--strategy", "easgd"], 8, 0.02 * 4, 20),                      # 2 * sqrt(ranks / 2) past 2 ranks
    (["--accumulate", "4"], 8, 0.02 * 4 * SQRT2, 100),               # m = 32: flat beyond m = 8
    (["--strategy", "periodic"], 4, 0.02 * 4, 10),
    (["--accumulate", "4"], 2, 0.02 * 4 * SQRT2, 20),                # 20 micro-batches = 5 updates an epoch
    (["--strategy", "easgd", "--accumulate", "4"], 2, 0.02 * 4, 20),
    (["--strategy", "diloco"], 8, 0.02, 20),                         # no rule: --lr as it is
    (["--strategy", "hierarchical", "--ranks-per-group", "2"], 4, 0.02 * 2 * SQRT2, 10),  # EASGD's at G=2, n·k=2
    (["--strategy", "hierarchical", "--ranks-per-group", "2", "--inter", "diloco"], 4, 0.02, 10),  # no rule
    (["--optimizer", "adam"], 8, 0.001 * 2 * SQRT2, 20),             # Adam's own default at Adam's rule: sqrt(m = 8)
    (["--optimizer", "adam", "--strategy", "diloco"], 8, 0.001, 20),  # DiLoCo states none under Adam either
    (["--no-scale-lr"], 8, 0.02, 20),
])
def test_auto_follows_the_strategy_and_optimizer(argv, size, rate, epochs, digits):
    got_rate, got_epochs, _, _ = resolved(argv, size, digits)
    assert (got_rate, got_epochs) == (pytest.approx(rate, rel=1e-12), epochs)


@pytest.mark.parametrize("size", [1, 2, 4, 8])
def test_a_given_lr_or_epochs_is_kept(size, digits):
    rate, epochs, _, args = resolved(["--lr", "0.05", "--epochs", "3"], size, digits)
    assert (rate, epochs, args.scale_lr) == (0.05, 3, False)
    rate, _, _, _ = resolved(["--lr", "0.05", "--scale-lr"], size, digits)  # scaled only when asked
    assert rate == pytest.approx(0.05 * {1: 1, 2: 2, 4: 4, 8: 4 * SQRT2}[size], rel=1e-12)
    _, epochs, _, _ = resolved(["--epochs", "3"], size, digits)
    assert epochs == 3


def test_a_config_file_lr_counts_as_given(tmp_path, digits):
    path = tmp_path / "c.yaml"
    path.write_text("lr: 0.05\n")
    assert resolved(["--config", str(path)], 8, digits)[0] == 0.05
    path.write_text("scale_lr: maybe\n")
    with pytest.raises(cli.UsageError, match=r"^--scale-lr must be auto, true or false\. Received: scale_lr='maybe'$"):
        cli.parse_args(["--config", str(path)])


def test_default_epochs_arithmetic():
    assert [default_epochs(n) for n in (44, 22, 11, 10, 8, 5, 2, 1)] == [10, 10, 10, 10, 13, 20, 50, 100]
    assert DEFAULT_EPOCHS == 10
    with pytest.raises(ValueError, match=r"Received: updates_per_epoch=0$"):
        default_epochs(0)


def test_a_resume_continues_at_the_resolved_rate_and_epochs(tmp_path, digits):
    # The config a default run at 8 ranks saves holds the resolved values, which the resume takes as its own.
    _, _, _, args = resolved([], 8, digits)
    config = dict(cli.effective_config(args), run_dir=str(tmp_path))
    assert (config["lr"], config["scale_lr"], config["epochs"]) == (DEFAULT_LR, True, 20)
    directory = tmp_path / "checkpoints" / "epoch-000002"
    directory.mkdir(parents=True)
    (directory / "rank-00000.npz").write_bytes(b"")
    (directory / "manifest.json").write_text(json.dumps({
        "format": checkpoint.FORMAT_VERSION, "epoch": 2, "num_ranks": 8, "shards": ["rank-00000.npz"],
        "config": config}))
    rate, epochs, _, resumed = resolved(["--resume", str(tmp_path)], 8, digits)
    assert (rate, epochs, resumed.scale_lr) == (pytest.approx(DEFAULT_LR * 4 * SQRT2), 20, True)
    assert cli.effective_config(resumed) == {**config, "resume": str(tmp_path)}
    # at another size the constant rate is the checkpoint's (an optimizer variable): config.yaml says so
    record = trainer._learning_rate_record(resumed, 2, 22, ({"num_ranks": 8}, None))
    assert record == {"rate": pytest.approx(DEFAULT_LR * 4 * SQRT2), "factor": pytest.approx(4 * SQRT2),
                      "warmup_updates": 0}
