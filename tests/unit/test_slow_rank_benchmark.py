"""benchmarks.accuracy.slow_rank: the configurations it launches, the hook setting it derives from the
equal-speed run, the command a slow run shows, and its table and goals, rendered from a results folder
(runs.json and each run's metrics.json) written here by hand."""
import glob
import json
import os

import pytest

from benchmarks.accuracy import slow_rank, study
from benchmarks.accuracy.study import LocalLaunch
from benchmarks.suite.runner import REPO_ROOT
from hvd_easgd.app.config import DEFAULT_BATCH_SIZE

pytestmark = pytest.mark.unit


def results(tmp_path, figures, np_=4):
    """A results folder: ``figures`` {variant: (samples/s, loss)}, seeds 0-2 at +0, +1, +2 samples/s."""
    runs = []
    for variant, (speed, loss) in figures.items():
        for seed in range(3):
            name = f"{variant}-seed{seed}"
            os.makedirs(tmp_path / name)
            (tmp_path / name / "metrics.json").write_text(json.dumps(
                {"final": {"samples_per_sec": speed + seed, "test_loss": loss}}))
            # --balance speed's shares of a global batch of 64: equal, or the last rank's cut by its speed
            shares = [16, 16, 16, 16] if "slow" not in variant else [18, 18, 18 - seed % 2, 10 + seed % 2]
            (tmp_path / name / "config.yaml").write_text(json.dumps(
                {"config": {"sample_shares": shares if variant.endswith("_balance") else None}}))
            runs.append({"run": name, "variant": variant, "twin": None, "seed": seed, "command": f"cmd {variant}"})
    (tmp_path / "runs.json").write_text(json.dumps({"workload": "language_model", "np": np_, "strategies": "diloco",
                                                    "seeds": 3, "runs": runs, "failures": []}))
    return str(tmp_path)


def test_each_strategy_runs_five_ways_and_only_the_slow_ones_set_the_hook():
    equal, slow = slow_rank.variants(["diloco"])
    assert [v.name for v in equal + slow] == ["diloco", "diloco_balance", "diloco_nudged", "diloco_slow",
                                              "diloco_slow_balance"]
    assert slow[1].flags == ("--data", "python_docs", "--strategy", "diloco", "--balance", "speed")
    launch = slow_rank.SlowRankLaunch(LocalLaunch(4), "3:0.01", slow_rank.is_slow)
    assert launch.command(slow[1], 0, "/tmp/run")[:2] == ["env", "HVD_EASGD_TEST_SLOW_RANKS=3:0.01"]
    assert launch.command(equal[1], 0, "/tmp/run")[:2] != ["env", "HVD_EASGD_TEST_SLOW_RANKS=3:0.01"]
    assert launch.shown(slow[0], 2) == ("HVD_EASGD_TEST_SLOW_RANKS=3:0.01 horovodrun -np 4 python train.py --data "
                                        "python_docs --strategy diloco --seed 2 --run-dir DIR")


def test_the_null_comparison_moves_one_sample_of_the_global_batch_from_the_last_rank_to_rank_0():
    equal, _ = slow_rank.variants(["periodic"], np_=4)
    assert equal[2].name == "periodic_nudged"
    assert equal[2].flags == ("--data", "python_docs", "--strategy", "periodic", "--balance", "speed",
                              "--sample-shares", "[33,32,32,31]")
    assert sum(slow_rank.nudged_shares(2)) == 2 * slow_rank.MICRO_BATCH == 2 * DEFAULT_BATCH_SIZE


def test_configurations_run_some_of_the_five_ways_each_with_its_strategy():
    args = slow_rank.parse_args(["--out", "/tmp/x", "--configurations", "diloco,diloco_nudged"], "slow-rank")
    assert args.configuration_list == ["diloco", "diloco_nudged"]
    assert len(slow_rank.parse_args(["--out", "/tmp/x"], "slow-rank").configuration_list) == 5
    for wrong in ("diloco_nudged", "diloco,periodic_nudged", "diloco,diloco_fast"):
        with pytest.raises(SystemExit):
            slow_rank.parse_args(["--out", "/tmp/x", "--configurations", wrong], "slow-rank")


def test_flags_reach_every_run_and_a_folder_never_mixes_two_settings(tmp_path, monkeypatch):
    launched = []
    monkeypatch.setattr(slow_rank, "continue_runs", lambda out, index, variants, *a, **k: launched.append(
        (index, variants)) or [])
    monkeypatch.setattr(slow_rank, "write_table", lambda directory: "")
    assert slow_rank.main(["--out", str(tmp_path), "--configurations", "diloco,diloco_nudged",
                           "--flags", "--outer-momentum 0.5"]) == 0
    (index, variants), = launched
    assert index == {"workload": "language_model", "np": 2, "strategies": "diloco", "flags": "--outer-momentum 0.5"}
    assert [v.flags[:6] for v in variants] == [("--data", "python_docs", "--strategy", "diloco",
                                                "--outer-momentum", "0.5")] * 2
    assert variants[1].flags[6:] == ("--balance", "speed", "--sample-shares", "[33,31]")
    # runs kept without the flags (the committed folders' runs.json has no "flags") are not continued with them
    (tmp_path / "runs.json").write_text(json.dumps({"workload": "language_model", "np": 2, "strategies": "diloco",
                                                    "seeds": 1, "runs": [], "failures": []}))
    with pytest.raises(SystemExit, match="other flags"):
        study.earlier_runs(str(tmp_path), index)
    assert study.earlier_runs(str(tmp_path), {k: v for k, v in index.items() if k != "flags"}) == []


def test_the_slow_rank_waits_the_per_rank_compute_of_a_sample(tmp_path):
    # 4 ranks at 100 samples/s together: 0.04 s a sample on each rank, so 0.04 s more makes it twice as slow
    directory = results(tmp_path, {"diloco": (100.0, 1.8)})
    assert slow_rank.hook_setting(directory, "diloco", 4) == "3:0.040000"


def test_the_goals_are_judged_against_the_sum_of_the_ranks_own_speeds_and_the_equal_ranks_loss(tmp_path):
    # the sum of own speeds with one rank at half speed: 101 x 3.5 / 4 = 88.4
    directory = results(tmp_path, {"diloco": (100.0, 1.800), "diloco_balance": (99.0, 1.801),
                                   "diloco_slow": (57.0, 1.800), "diloco_slow_balance": (78.0, 1.830)})
    text = slow_rank.render(directory)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| `")}
    assert "≥ 0.9 of the sum **missed**" in rows["`diloco_slow_balance`"]  # 79 / 88.4 = 0.89
    assert "loss within 1.5 % **missed**" in rows["`diloco_slow_balance`"]  # +1.67 %
    assert "costs ≤ 3 % against `diloco` met" in rows["`diloco_balance`"]
    assert "today's pace" in rows["`diloco_slow`"] and "| 0.66 |" in rows["`diloco_slow`"]
    assert text.startswith("`diloco_slow` runs at 0.66 of the sum of the ranks' own speeds; `diloco_slow_balance` "
                           "runs at 0.89")
    assert ("seed by seed: `diloco_balance` 16 + 16 + 16 + 16, 16 + 16 + 16 + 16, 16 + 16 + 16 + 16; "
            "`diloco_slow_balance` 18 + 18 + 18 + 10, 18 + 18 + 17 + 11, 18 + 18 + 18 + 10.\n") in text
    directory = results(tmp_path / "better", {"diloco": (100.0, 1.800), "diloco_slow_balance": (85.0, 1.820),
                                              "diloco_balance": (104.0, 1.700)})
    text = slow_rank.render(directory)
    assert "≥ 0.9 of the sum met; loss within 1.5 % met" in text
    assert "costs ≤ 3 % against `diloco` met" in text  # faster and lower: no cost
    directory = results(tmp_path / "costly", {"diloco": (100.0, 1.800), "diloco_balance": (96.0, 1.800)})
    assert "costs ≤ 3 % against `diloco` **missed**" in slow_rank.render(directory)


def test_each_seed_of_the_slow_rank_under_balance_is_compared_with_the_equal_ranks_of_the_same_seed(tmp_path):
    directory = results(tmp_path, {"diloco": (100.0, 2.0), "diloco_slow": (57.0, 2.0),
                                   "diloco_slow_balance": (85.0, 2.0)}, np_=2)
    for seed, loss in enumerate((2.1, 1.95, 2.0)):  # +5 %, -2.5 %, 0 % against the equal ranks' 2.0
        path = os.path.join(directory, f"diloco_slow_balance-seed{seed}", "metrics.json")
        with open(path, "w") as f:
            json.dump({"final": {"samples_per_sec": 85.0, "test_loss": loss}}, f)
    text = slow_rank.render(directory)
    assert text.endswith("`diloco_slow_balance`'s final validation loss against `diloco`'s of the same seed (the "
                         "same initial weights and global batches), seed by seed: 0: +5.00 %, 1: -2.50 %, "
                         "2: +0.00 %.\n")
    assert "| +0.83 % |" in text  # the mean over seeds, 2.0167 against 2.0, beside it in the table
    directory = results(tmp_path / "without", {"diloco": (100.0, 2.0), "diloco_balance": (99.0, 2.0)}, np_=2)
    assert "seed by seed: 0:" not in slow_rank.render(directory)


def test_the_null_comparison_is_compared_seed_by_seed_and_judged_by_no_goal(tmp_path):
    directory = results(tmp_path, {"diloco": (100.0, 2.0), "diloco_nudged": (99.0, 2.0)}, np_=2)
    for seed, loss in enumerate((2.2, 2.0, 1.9)):  # +10 %, 0 %, -5 % against the equal ranks' 2.0
        run = os.path.join(directory, f"diloco_nudged-seed{seed}")
        with open(os.path.join(run, "metrics.json"), "w") as f:
            json.dump({"final": {"samples_per_sec": 99.0, "test_loss": loss}}, f)
        with open(os.path.join(run, "config.yaml"), "w") as f:
            json.dump({"config": {"sample_shares": [33, 31]}}, f)
    text = slow_rank.render(directory)
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| `")}
    assert rows["`diloco_nudged`"].endswith("| +1.67 % | — (no rank slow, shares 33 + 31 set by hand: a null "
                                            "comparison) |")
    assert text.endswith("`diloco_nudged`'s final validation loss against `diloco`'s of the same seed (the same "
                         "initial weights and global batches), seed by seed: 0: +10.00 %, 1: +0.00 %, "
                         "2: -5.00 %.\n")
    assert "The shares of the global batch" not in text  # set by hand, not chosen by --balance speed
    assert text.startswith("With no rank slow, one sample moved between the ranks (`diloco_nudged`) ends +1.67 % "
                           "from `diloco`'s validation loss on the mean of 3 seeds.\n")


def test_curves_train_several_epochs_of_the_short_corpus_and_draw_each_runs_validation_loss(tmp_path):
    equal, slow = slow_rank.variants(["diloco"], ("--data", "text:/c.txt", "--epochs", "8"))
    assert slow[1].flags == ("--data", "text:/c.txt", "--epochs", "8", "--strategy", "diloco", "--balance", "speed")
    directory = results(tmp_path, {"diloco": (100.0, 1.8), "diloco_slow": (57.0, 1.8)}, np_=2)
    assert "![" not in slow_rank.write_table(directory) and not (tmp_path / slow_rank.PLOT).exists()  # one epoch
    for path in glob.glob(os.path.join(directory, "*", "metrics.json")):
        with open(path) as f:
            metrics = json.load(f)
        metrics["epochs"] = [{"seconds": 10.0, "test_loss": loss} for loss in (2.5, 2.1, 1.9)]
        with open(path, "w") as f:
            json.dump(metrics, f)
    assert slow_rank.write_table(directory).endswith(f"![validation loss against training wall time]"
                                                     f"({slow_rank.PLOT})\n")
    assert (tmp_path / slow_rank.PLOT).stat().st_size > 0


@pytest.mark.parametrize("directory", sorted(glob.glob(os.path.join(REPO_ROOT, "docs", "results", "slow-rank-*"))))
def test_every_committed_table_is_its_results_rendered(directory):
    with open(os.path.join(directory, slow_rank.TABLE)) as f:
        assert f.read() == slow_rank.render(directory)
