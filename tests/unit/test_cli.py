"""train.py's command line: options, config files, and one-line errors with exit 2."""
import json

import numpy as np
import pytest
import yaml

from hvd_easgd import checkpoint
from hvd_easgd.app import cli, errors
from hvd_easgd.strategies import EASGD, registry
from hvd_easgd.strategies.base import CliOption, SyncStrategy
from hvd_easgd.strategies.period_schedule import cli_period

pytestmark = pytest.mark.unit


def exit_and_stderr(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err
    return exc.value.code, err


@pytest.mark.parametrize("argv, message", [
    (["--strategy", "ps"], "invalid choice: 'ps'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--batch-size", "0"], "--batch-size must be > 0. Received: --batch-size=0"),
    (["--batch-size", "-4"], "--batch-size must be > 0"),
    (["--lr", "0"], "--lr must be > 0. Received: --lr=0.0"),
    (["--lr", "-0.1"], "--lr must be > 0"),
    (["--tau", "5"], "--tau is an option of --strategy diloco or easgd or periodic, not --strategy sync"),
    (["--strategy", "easgd", "--clip-norm", "1"], "--clip-norm is an option of --strategy sync"),
    (["--strategy", "easgd", "--tau", "0"], "`period` must be an integer >= 1. Received: period=0"),
    (["--strategy", "easgd", "--tau", "-3"], "Received: period=-3"),
    (["--accumulate", "0"], "--accumulate must be > 0"),
    (["--data", "npz:/nonexistent/data.npz"], "--data npz:/nonexistent/data.npz: no such file"),
    (["--data", "images:/nonexistent"], "no such directory"),
    (["--data", "mnist"], "--data must be digits, fashion_mnist[:DIR], python_docs, synthetic, teacher, npz:PATH, images:DIR, text:PATH"),
    (["--image-shape", "32,32"], "--image-shape must be H,W,C"),
    (["--data", "images:/tmp", "--batch-size", "8"], "images of different sizes cannot be stacked"),
    (["--model", "vgg"], "--model must be one of"),
    (["--lr", "0.05", "--lr-warmup-epochs", "2"], "--lr-warmup-epochs goes with a scaled rate (--scale-lr, or "
     "--scale-lr auto without --lr), and this run keeps --lr 0.05. Received: --lr-warmup-epochs=2.0"),
    (["--strategy", "diloco", "--lr-warmup-epochs", "2"], "--lr-warmup-epochs goes with a scaled rate"),
    (["--lr-warmup-epochs", "-1"], "--lr-warmup-epochs must be >= 0. Received: --lr-warmup-epochs=-1.0"),
    (["--epochs", "0"], "--epochs must be > 0. Received: --epochs=0"),
    (["--config", "/nonexistent.yaml"], "--config /nonexistent.yaml: no such file"),
    # text and the language model
    (["--data", "text:/nonexistent.txt"], "--data text:/nonexistent.txt: no such file"),
    (["--data", "text:/tmp"], "--data text:/tmp: no such file"),
    (["--data", "fashion_mnist:/nonexistent"], "--data fashion_mnist:/nonexistent: no such directory /nonexistent"),
    (["--model", "cnn", "--data", "text:/etc/hostname"], "--model cnn cannot read --data text:/etc/hostname: text "
     "takes --model transformer"),
    (["--model", "transformer"], "--model transformer cannot read --data digits"),
    (["--data", "text:/etc/hostname", "--width", "100", "--heads", "3"],
     "--width must be a multiple of --heads. Received: --width 100 --heads 3"),
    (["--data", "text:/etc/hostname", "--context", "0"], "--context must be > 0. Received: --context=0"),
    (["--data", "text:/etc/hostname", "--layers", "-1"], "--layers must be > 0"),
    (["--data", "text:/etc/hostname", "--lr-floor", "2"], "--lr-floor must satisfy 0 <= floor <= 1"),
    (["--data", "text:/etc/hostname", "--lr-warmup-updates", "-1"], "--lr-warmup-updates must be >= 0"),
    (["--lr-warmup-updates", "5"], "--lr-warmup-updates goes with --lr-schedule cosine"),
    (["--data", "text:/etc/hostname", "--lr-warmup-epochs", "1"], "--lr-schedule cosine warms up over "
     "--lr-warmup-updates"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    code, err = exit_and_stderr(argv, capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("train.py: error: ") and message in lines[0], lines[0]
    assert "Traceback" not in err


def test_other_ranks_leave_rank_0_time_to_speak_then_speak_themselves(monkeypatch, capsys):
    # a launcher stops all ranks when the first one fails: a non-zero rank must not exit
    # before rank 0 has printed; if nobody stops it, rank 0 did not see the error and it speaks
    sleeps = []
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setattr(errors.time, "sleep", sleeps.append)
    code, err = exit_and_stderr(["--tau", "5"], capsys)
    assert code == 2 and sleeps == [errors.USAGE_ERROR_GRACE_SECONDS]
    assert err == ("train.py: error (rank 1): --tau is an option of --strategy diloco or easgd or periodic, "
                   "not --strategy sync\n")
    monkeypatch.setenv("HOROVOD_RANK", "0")
    code, err = exit_and_stderr(["--tau", "5"], capsys)
    assert code == 2 and len(sleeps) == 1 and err.startswith("train.py: error: --tau")


def test_npz_without_x_and_y(tmp_path, capsys):
    path = tmp_path / "d.npz"
    np.savez(path, images=np.zeros((4, 3, 3)))
    code, err = exit_and_stderr(["--data", f"npz:{path}"], capsys)
    assert code == 2 and "missing array(s) ['x', 'y']" in err


def test_config_file_sets_options_and_flags_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"strategy": "easgd", "tau": 4, "lr": 0.1, "batch-size": 16}))
    args = cli.parse_args(["--config", str(path), "--lr", "0.3"])
    config = cli.effective_config(args)
    assert (config["strategy"], config["tau"], config["lr"], config["batch_size"]) == ("easgd", 4, 0.3, 16)
    assert cli.strategy_kwargs(args) == {"period": 4}


def test_config_file_with_unknown_key(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("learning_rate: 0.1\n")
    code, err = exit_and_stderr(["--config", str(path)], capsys)
    assert code == 2 and "unknown option 'learning_rate'" in err


def test_help_lists_strategies_from_the_registry(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0
    for text in ("--strategy {diloco,easgd,hierarchical,periodic,sync,auto}", "--auto-utilisation", "--outer-lr", "--outer-momentum", "--tau", "--moving-rate", "--overlap", "--clip-norm",
                 "--fp16-allreduce", "--reduce-op", "--accumulate", "--resume", "--checkpoint-every",
                 "factor m up to 4, then 4*sqrt(m/4)", "factor ranks*sqrt(K)"):  # --scale-lr's rule
        assert text in " ".join(out.split())


def test_accumulation_composes_with_any_strategy():
    args = cli.parse_args(["--strategy", "easgd", "--tau", "3", "--accumulate", "4",
                           "--accumulate-reduction", "sum"])
    strategy = cli.make_strategy(args)
    assert (strategy.k, strategy.average, strategy.strategy.period) == (4, False, 3)


def saved_run(run_dir, manifest_format, config):
    """A run directory holding one complete checkpoint, its manifest written by hand."""
    directory = run_dir / "checkpoints" / "epoch-000002"
    directory.mkdir(parents=True)
    (directory / "rank-00000.npz").write_bytes(b"")
    manifest = {"epoch": 2, "num_ranks": 1, "shards": ["rank-00000.npz"], "config": config}
    if manifest_format is not None:
        manifest["format"] = manifest_format
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return str(run_dir)


@pytest.mark.parametrize("manifest_format, named", [(1, "checkpoint format 1"), (None, "checkpoint format unknown")])
def test_resume_refuses_a_checkpoint_of_another_format(manifest_format, named, tmp_path, capsys):
    # format 1 meant other things by sample_count and --scale-lr: resuming it under
    # format 2's rules would silently train another model
    config = cli.effective_config(cli.parse_args(["--strategy", "easgd", "--tau", "4", "--epochs", "3"]))
    run_dir = saved_run(tmp_path / "old", manifest_format, dict(config, run_dir=str(tmp_path / "old")))
    code, err = exit_and_stderr(["--resume", run_dir, "--epochs", "4"], capsys)
    assert code == 2 and err == (f"train.py: error: --resume {run_dir}: {named}, this hvd_easgd reads format "
                                 f"{checkpoint.FORMAT_VERSION} (the meaning of saved state changed); resume it "
                                 "with the hvd_easgd release that wrote it, or start a new run\n")
    assert checkpoint.FORMAT_VERSION == 2


def test_resume_takes_the_saved_options_and_lets_resumable_ones_change(tmp_path):
    # the saved config holds strategy options under their flag names (effective_config)
    config = cli.effective_config(cli.parse_args(["--strategy", "easgd", "--tau", "4", "--lr", "0.05",
                                                  "--accumulate", "2", "--epochs", "3"]))
    assert config["tau"] == 4 and not any("__" in key for key in config)
    run_dir = saved_run(tmp_path / "run", checkpoint.FORMAT_VERSION, dict(config, run_dir=str(tmp_path / "run")))
    args = cli.parse_args(["--resume", run_dir, "--epochs", "5"])
    resumed = cli.effective_config(args)
    assert (resumed["strategy"], resumed["tau"], resumed["lr"], resumed["accumulate"], resumed["epochs"]) == (
        "easgd", 4, 0.05, 2, 5)
    assert args.run_dir == run_dir


def test_a_resume_keeps_the_measured_shares_unless_it_turns_balancing_off(tmp_path):
    config = cli.effective_config(cli.parse_args(["--strategy", "diloco", "--balance", "speed"]))
    run_dir = saved_run(tmp_path / "run", checkpoint.FORMAT_VERSION,
                        dict(config, run_dir=str(tmp_path / "run"), sample_shares=[42, 22]))
    kept = cli.parse_args(["--resume", run_dir])
    assert (kept.balance, kept.sample_shares) == ("speed", [42, 22])
    dropped = cli.parse_args(["--resume", run_dir, "--balance", "off"])
    assert (dropped.balance, dropped.sample_shares) == ("off", None)


def test_resume_of_a_directory_without_checkpoints(tmp_path, capsys):
    code, err = exit_and_stderr(["--resume", str(tmp_path)], capsys)
    assert code == 2 and err == (f"train.py: error: --resume {tmp_path}: no complete checkpoint under "
                                 f"{tmp_path}/checkpoints\n")


def test_auto_resume_resumes_a_directory_with_a_checkpoint_and_starts_fresh_otherwise(tmp_path, capsys):
    config = cli.effective_config(cli.parse_args(["--strategy", "easgd", "--tau", "4", "--epochs", "3"]))
    run_dir = saved_run(tmp_path / "run", checkpoint.FORMAT_VERSION, dict(config, run_dir=str(tmp_path / "run")))
    args = cli.parse_args(["--auto-resume", "--run-dir", run_dir])
    assert args.resume == run_dir and cli.effective_config(args)["tau"] == 4  # the saved options
    fresh = cli.parse_args(["--auto-resume", "--run-dir", str(tmp_path / "empty")])
    assert fresh.resume is None and fresh.strategy == "sync"
    code, err = exit_and_stderr(["--auto-resume"], capsys)
    assert code == 2 and "--auto-resume needs --run-dir" in err


def test_checkpoint_on_signal_names(capsys):
    assert cli.parse_args(["--checkpoint-on-signal", "sigterm,USR1"]).checkpoint_on_signal == "TERM,USR1"
    code, err = exit_and_stderr(["--checkpoint-on-signal", "KILL"], capsys)
    assert code == 2 and "--checkpoint-on-signal must be none or names among" in err


# --- one flag shared by several strategies, and a strategy that contains another ------------
class _Periodic(SyncStrategy):
    name = "fake-periodic"
    description = "a fake strategy with --tau"
    cli_options = (CliOption("--tau", "period", "steps between averages", type=cli_period),)  # --tau takes an int or the adaptive forms

    def __init__(self, period=10):
        super().__init__()
        self.period = period


class _TwoLevel(SyncStrategy):
    name = "fake-two-level"
    description = "a fake strategy containing another"
    cli_options = (CliOption("--inter", "inter", "the strategy across groups", choices=("easgd", "fake-periodic")),
                   CliOption("--ranks-per-group", "ranks_per_group", "ranks per group", type=int))
    cli_delegate = ("inter", "easgd")

    def __init__(self, inter=None, ranks_per_group=None):
        super().__init__()
        self.inter, self.ranks_per_group = inter, ranks_per_group


@pytest.fixture
def fake_strategies(monkeypatch):
    # Without the real hierarchical: its --inter takes other choices than the fake's.
    monkeypatch.setattr(registry, "_REGISTRY", {k: v for k, v in registry._REGISTRY.items() if k != "hierarchical"})
    registry.register(_Periodic)
    registry.register(_TwoLevel)


def test_a_flag_that_two_strategies_declare_is_one_flag_and_goes_to_the_chosen_one(fake_strategies):
    args = cli.parse_args(["--strategy", "fake-periodic", "--tau", "3"])
    assert cli.strategy_kwargs(args) == {"period": 3}
    assert cli.make_strategy(args).period == 3
    assert cli.effective_config(args)["tau"] == 3
    easgd = cli.make_strategy(cli.parse_args(["--strategy", "easgd", "--tau", "4"]))
    assert easgd.period == 4
    with pytest.raises(errors.UsageError, match=r"^--tau is an option of --strategy diloco or easgd or fake-periodic "
                                                r"or periodic, not --strategy sync$"):
        cli.parse_args(["--tau", "5"])


def test_a_contained_strategy_takes_its_own_flags(fake_strategies):
    args = cli.parse_args(["--strategy", "fake-two-level", "--tau", "4", "--ranks-per-group", "2"])
    strategy = cli.make_strategy(args)  # --inter defaults to easgd
    assert isinstance(strategy.inter, EASGD) and strategy.inter.period == 4
    assert strategy.ranks_per_group == 2
    assert cli.effective_config(args)["tau"] == 4 and cli.effective_config(args)["ranks_per_group"] == 2
    strategy = cli.make_strategy(cli.parse_args(["--strategy", "fake-two-level", "--inter", "fake-periodic",
                                                 "--tau", "7"]))
    assert isinstance(strategy.inter, _Periodic) and strategy.inter.period == 7
    with pytest.raises(errors.UsageError, match=r"^--moving-rate is an option of --strategy easgd, not "
                                                r"--strategy fake-two-level --inter fake-periodic$"):
        cli.parse_args(["--strategy", "fake-two-level", "--inter", "fake-periodic", "--moving-rate", "0.1"])
    with pytest.raises(errors.UsageError, match="--clip-norm is an option of --strategy sync"):
        cli.parse_args(["--strategy", "fake-two-level", "--clip-norm", "1"])


# --- --strategy auto --------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--tau", "10"], "--strategy auto chooses the strategy's options and format itself; give a strategy instead "
                      "to set them. Received: --tau"),
    (["--compression", "int8"], "Received: --compression int8"),
    (["--accumulate", "2"], "--strategy auto does not choose under --accumulate or --elastic"),
    (["--auto-utilisation", "1.5"], "--auto-utilisation must satisfy 0 < U <= 1. Received: --auto-utilisation=1.5"),
    (["--scale-lr"], "--scale-lr with --strategy auto: the rule is the chosen strategy's"),
])
def test_auto_refuses_what_it_chooses_itself(argv, message, capsys):
    code, err = exit_and_stderr(["--strategy", "auto", *argv], capsys)
    assert code == 2 and message in err and err.count("\n") == 1


def test_auto_utilisation_belongs_to_auto(capsys):
    code, err = exit_and_stderr(["--strategy", "easgd", "--auto-utilisation", "0.8"], capsys)
    assert code == 2 and "--auto-utilisation is an option of --strategy auto, not --strategy easgd" in err


def test_auto_leaves_the_strategy_and_its_rate_rule_to_the_choice_and_a_resume_keeps_the_choice(tmp_path):
    config = cli.parse_args(["--strategy", "auto", "--epochs", "3"])
    assert cli.make_strategy(config) is None and config.scale_lr == "auto" and config.auto_utilisation == 0.9
    assert cli.parse_args(["--strategy", "auto", "--lr", "0.1"]).scale_lr is False  # a given --lr is kept
    record = {"candidate": {"strategy": "diloco", "compression": "int8", "period": 50, "hierarchical": False},
              "reason": "auto: diloco τ=50 int8, ..."}
    saved = dict(cli.effective_config(config), auto_choice=record, scale_lr=False, run_dir=str(tmp_path / "run"))
    run_dir = saved_run(tmp_path / "run", checkpoint.FORMAT_VERSION, saved)
    resumed = cli.parse_args(["--resume", run_dir, "--epochs", "4"])
    assert resumed.auto_choice == record and resumed.strategy == "auto"
    strategy = cli.make_strategy(resumed)
    assert (type(strategy).__name__, strategy.period, strategy.compression.name) == ("DiLoCo", 50, "int8")
