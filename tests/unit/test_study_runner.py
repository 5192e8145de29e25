"""benchmarks.accuracy.study, the one runner of the studies: what it keeps of a run (its folder, its command,
the quiet-machine check), the configurations it picks, the arguments every study shares, and long-run on it."""
import json
import os

import pytest

from benchmarks.accuracy import long_run, study
from benchmarks.suite.runner import Outcome

pytestmark = pytest.mark.unit


class WritingLaunch:
    """A launch that writes a run's config.yaml and metrics.json (``metrics``) at once."""

    def __init__(self, metrics):
        self.metrics = metrics

    def command(self, variant, seed, run_dir):
        return run_dir

    def shown(self, variant, seed):
        return study.shown_command("horovodrun -np 2", variant, seed)

    def run(self, run_dir, log, timeout):
        os.makedirs(run_dir)
        open(os.path.join(run_dir, "config.yaml"), "w").close()
        with open(os.path.join(run_dir, "metrics.json"), "w") as f:
            json.dump(self.metrics, f)
        return Outcome(0, 1.0, log)


EPOCHS = [{"epoch": 1, "seconds": 600.0, "test_loss": 2.0, "rss_mb": [800, 900]},
          {"epoch": 2, "seconds": 600.0, "test_loss": 1.8, "rss_mb": [810, 905]}]


def test_a_run_is_kept_with_its_command_and_the_share_of_the_cpus_others_kept_busy(tmp_path):
    variant = study.Variant("long-run", ("--data", "python_docs", "--epochs", "2"))
    failures = study.continue_runs(str(tmp_path), {"np": 2}, [variant], 2, 1, 60, "t", shown=long_run.memory,
                                   launch=WritingLaunch({"epochs": EPOCHS}))
    assert failures == []
    index = json.loads((tmp_path / study.RUNS).read_text())
    (run,) = index["runs"]
    assert index["np"] == 2 and index["seeds"] == 1 and run["run"] == "long-run-seed0"
    assert run["command"] == "horovodrun -np 2 python train.py --data python_docs --epochs 2 --seed 0 --run-dir DIR"
    assert 0.0 <= run["foreign_cpu_busy"] <= 1.0
    assert sorted(os.listdir(tmp_path / "long-run-seed0")) == ["config.yaml", "metrics.json"]
    assert not os.path.exists(tmp_path / "logs" / "long-run-seed0")  # train.py's scratch run dir is removed
    # long-run's page reads the runner's folder as it reads one from before the runner (command.txt beside it)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "metrics.json").write_text(json.dumps({"epochs": EPOCHS}))
    (legacy / "command.txt").write_text(run["command"] + "\n")
    assert long_run.render(str(tmp_path)) == long_run.render(str(legacy))
    assert "`horovodrun -np 2 python train.py --data python_docs --epochs 2 --seed 0 --run-dir DIR`" in \
        long_run.render(str(tmp_path))


def test_a_configuration_brings_its_twin_after_the_first_and_an_unknown_one_is_refused(capsys):
    known = study.configurations(("sync", "--strategy sync", None), ("diloco", "--strategy diloco", None),
                                 ("diloco_int8", "--strategy diloco --compression int8", "diloco"))
    assert known[2] == study.Variant("diloco_int8", ("--strategy", "diloco", "--compression", "int8"), "diloco")
    p = study.parser("study", "A study.", "page.md", 60)
    assert [v.name for v in study.chosen(p, "diloco_int8", known, first=("sync",))] == ["sync", "diloco",
                                                                                        "diloco_int8"]
    assert [v.name for v in study.chosen(p, None, known)] == ["sync", "diloco", "diloco_int8"]
    with pytest.raises(SystemExit):
        study.chosen(p, "diloco,nope", known)
    assert ("--configurations must be chosen from sync,diloco,diloco_int8. Received: --configurations=diloco,nope"
            in capsys.readouterr().err)


def test_the_shared_arguments_are_checked_unless_a_folder_is_rendered(capsys):
    p = study.parser("study", "A study.", "page.md", 60)
    assert study.parsed(p, ["--render", "DIR"]).render == "DIR"
    args = study.parsed(p, ["--out", "DIR"])
    assert (args.np, args.seeds, args.timeout) == (2, 3, 60)
    for argv, message in (([], "--out is required (or --render DIR)"),
                          (["--out", "DIR", "--seeds", "0"], "--np must be an integer >= 1 and --seeds >= 1. "
                                                             "Received: --np=2 --seeds=0")):
        with pytest.raises(SystemExit):
            study.parsed(study.parser("study", "A study.", "page.md", 60), argv)
        assert message in capsys.readouterr().err
    # a study without a page of its own (accuracy) needs --out; one without --seeds (long-run) is not asked for them
    assert "--render" not in study.parser("study", "A study.", None, 60).format_help()
    assert not hasattr(study.parsed(study.parser("study", "A study.", "p.md", 60, seeds=None), ["--out", "D"]),
                       "seeds")
