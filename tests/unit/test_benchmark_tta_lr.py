"""The time-to-accuracy rows take their learning rate from train.py's --scale-lr rule."""
import pytest

from benchmarks.suite import compare, configurations, names, worker
from hvd_easgd.app import cli
from hvd_easgd.strategies import EASGD, GradientAccumulation, PeriodicAverage, SyncAverage, registry

pytestmark = pytest.mark.unit


def test_each_strategy_row_asks_the_rule_as_train_py_would(monkeypatch):
    calls = []

    def rule(cls, size, accumulate=1, adaptive=False):
        if size > 1:  # train.py's parser also asks at size 1, to refuse a rule-less strategy early
            calls.append((size, accumulate, cls.name))
        return 3.0 + accumulate  # distinct per k, so the product shows which k was asked for

    for cls in (SyncAverage, EASGD, PeriodicAverage):  # the strategies' own hooks, as train.py asks them
        monkeypatch.setattr(cls, "lr_scale_factor", classmethod(rule))
    assert worker.scaled_learning_rate(0.02, 2, "accum4_sync") == pytest.approx(0.02 * 7.0)
    assert worker.scaled_learning_rate(0.02, 4, "easgd_tau10_overlap") == pytest.approx(0.02 * 4.0)
    assert worker.scaled_learning_rate(0.5, 3, "sync") == pytest.approx(0.5 * 4.0)
    assert calls == [(2, 4, "sync"), (4, 1, "easgd"), (3, 1, "sync")]
    # Hierarchical takes its inter strategy's flat rule; DiLoCo, which --scale-lr refuses, trains at --lr.
    assert worker.scaled_learning_rate(0.02, 4, "hier_easgd_tau10") == pytest.approx(0.02 * 4.0)
    assert worker.scaled_learning_rate(0.02, 4, "sync_two_level") == pytest.approx(0.02 * 4.0)
    assert worker.scaled_learning_rate(0.02, 4, "periodic_tau10") == pytest.approx(0.02 * 4.0)
    assert worker.scaled_learning_rate(0.02, 4, "diloco_tau10") == 0.02
    assert calls[3:] == [(4, 1, "easgd"), (4, 1, "sync"), (4, 1, "periodic")]


def test_every_strategy_row_has_a_train_py_equivalent():
    with_flags = {row.name for row in names.TABLE if row.train_py}
    assert with_flags == set(names.STRATEGIES + names.TOPOLOGY + names.COMPRESSION + names.STREAMING
                             + names.OVERLAP)
    for name in with_flags:
        args = cli.parse_args(list(names.BY_NAME[name].train_py))
        assert args.strategy in registry.available(), name
        assert args.accumulate == (4 if name.startswith("accum4_") else 1), name
        # the flat rows train as train.py would build them: the same strategy, the same parameters
        built, trained = configurations.make_strategy(name), cli.make_strategy(args)
        if type(built).__name__ != "Hierarchical":
            assert repr(built) == repr(trained), name
    assert isinstance(configurations.make_strategy("accum4_sync"), GradientAccumulation)


def fake_mwms_worker(index, tta):
    out = {"index": index, "batch_per_rank": 32, "steps_per_repeat": 200, "steps_per_execution": 20,
           "timed_steps_per_repeat": 180, "repeat_seconds": [1.0] * 6, "trainable_params": 38282,
           "versions": {"tf_keras": "2.18.0"}, "threads": {"intra_op": 1, "inter_op": 1}}
    if tta:
        out.update(tta=[{"seed": 0, "epoch_seconds": [0.5, 0.5], "accuracy": [0.9, 0.96]}], tta_lr=0.04)
    return out


def test_mwms_trains_at_syncaverages_learning_rate(monkeypatch, tmp_path):
    launched = {}

    def launch(num_workers, out_dir, log_path, timeout, worker_args):
        launched[num_workers] = worker_args
        return [fake_mwms_worker(i, "--tta-lr" in worker_args) for i in range(num_workers)]

    monkeypatch.setattr(compare.mwms, "ensure_tf_keras", lambda: None)
    monkeypatch.setattr(compare.mwms, "launch", launch)
    monkeypatch.setattr(compare, "foreign_cpu_busy", lambda: 0.0)
    args = compare.parse_args(["--np", "1,2"])
    results = {"time_to_accuracy": {"np": 2, "per_config": {"sync": {"lr": 0.04}, "accum4_sync": {"lr": 0.16}}},
               "failures": [], "launches": [], "rows": [], "versions": {}}
    compare.run_mwms(args, str(tmp_path), results)
    assert launched[2][launched[2].index("--tta-lr") + 1] == "0.04"
    assert "--tta-lr" not in launched[1] and "--tta-seeds" not in launched[1]
    assert launched[2][launched[2].index("--repeats") + 1] == "6"  # the model.fit group's repeats
    assert results["_mwms_tta"]["lr"] == 0.04 and not results["failures"]


def test_mwms_worker_refuses_time_to_accuracy_without_a_learning_rate(capsys):
    with pytest.raises(SystemExit):
        compare.mwms.parse_args(["--worker", "--index", "0", "--out-dir", "x", "--tta-seeds", "1"])
    assert "--tta-seeds needs --tta-lr" in capsys.readouterr().err


def test_the_tta_workload_flags_reach_the_rated_link_worker():
    from benchmarks.suite import rated_links

    args = compare.parse_args(["--link-rates", "100mbit", "--configs", "sync,diloco_tau10_f4", "--models", "cnn",
                               "--tta-model", "student_mlp", "--tta-batch", "256", "--tta-lr", "0.05",
                               "--tta-cap", "90"])
    cmd = rated_links.worker_command(args, "out.json", tta=True)
    flags = worker.parse_args(cmd[cmd.index("benchmarks.suite.worker") + 1:])
    assert (flags.tta_model, flags.tta_batch, flags.tta_lr, flags.tta_cap) == ("student_mlp", 256, 0.05, 90.0)
    assert flags.tta_config_list == ["sync", "diloco_tau10_f4"]  # the baselines never train to accuracy
    assert worker.TTA_DATA[flags.tta_model] == "teacher"


def test_the_links_token_bucket_reaches_the_alpha_sweep():
    from benchmarks.suite import rated_links

    args = compare.parse_args(["--link-rates", "10mbit", "--configs", "sync", "--models", "cnn"])
    cmd = rated_links.worker_command(args, "out.json", qdisc="tbf rate 10000000 burst 65536 latency 50ms")
    flags = worker.parse_args(cmd[cmd.index("benchmarks.suite.worker") + 1:])
    assert flags.alpha_sweep and flags.link_bucket == 65536.0
    cmd = rated_links.worker_command(args, "out.json")
    assert worker.parse_args(cmd[cmd.index("benchmarks.suite.worker") + 1:]).link_bucket is None


def test_no_alpha_sweep_leaves_the_sweep_out_of_the_rated_launch_and_needs_link_rates(capsys):
    from benchmarks.suite import rated_links

    args = compare.parse_args(["--link-rates", "100mbit", "--configs", "sync", "--models", "cnn", "--no-alpha-sweep"])
    cmd = rated_links.worker_command(args, "out.json", qdisc="tbf rate 100000000 burst 125000 latency 50ms")
    assert not worker.parse_args(cmd[cmd.index("benchmarks.suite.worker") + 1:]).alpha_sweep
    with pytest.raises(SystemExit) as exit_:
        compare.parse_args(["--quick", "--no-alpha-sweep"])
    assert exit_.value.code == 2 and "--no-alpha-sweep" in capsys.readouterr().err
