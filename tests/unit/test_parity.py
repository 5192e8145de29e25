"""benchmarks.accuracy.parity: the configurations it launches, the goals it judges, and its table, rendered from
a results folder (runs.json and each run's metrics.json) written here by hand."""
import glob
import json
import os

import pytest

from benchmarks.accuracy import parity, study
from benchmarks.suite.runner import REPO_ROOT, Outcome

pytestmark = pytest.mark.unit
LM = parity.WORKLOADS["language_model"]
FASHION = parity.WORKLOADS["fashion_mnist"]


def test_a_configuration_brings_the_baseline_and_its_twin_and_the_workloads_data():
    args = parity.parse_args(["--workload", "language_model", "--out", "/tmp/x", "--configurations",
                              "diloco_tau10_int4"], "parity")
    assert [v.name for v in args.variants] == ["sync", "diloco_tau10", "diloco_tau10_int4"]
    # the language model's runs train its budget: 2.5 passes, as 5 epochs of half the training split
    assert args.variants[2].flags == ("--data", "python_docs", "--strategy", "diloco", "--tau", "10",
                                      "--compression", "int4", "--epochs", "5", "--train-fraction", "0.5")
    assert args.variants[2].twin == "diloco_tau10"


@pytest.mark.parametrize("workload", sorted(parity.WORKLOADS))
def test_diloco_at_outer_momentum_0_5_is_read_against_diloco_at_its_defaults(workload):
    args = parity.parse_args(["--workload", workload, "--out", "/tmp/x", "--configurations",
                              "diloco_tau10_momentum05"], "parity")
    assert [v.name for v in args.variants] == ["sync", "diloco_tau10", "diloco_tau10_momentum05"]
    budget = parity.WORKLOADS[workload].budget
    assert args.variants[2].flags == (*parity.WORKLOADS[workload].data, "--strategy", "diloco", "--tau", "10",
                                      "--outer-momentum", "0.5", *(parity.budget_flags(budget) if budget else ()))
    assert args.variants[2].twin == "diloco_tau10"


def test_a_budget_is_half_passes_of_epochs_of_half_the_training_split(capsys):
    assert parity.budget_flags(2) == ("--epochs", "4", "--train-fraction", "0.5")
    assert parity.budget_flags(2.5) == ("--epochs", "5", "--train-fraction", "0.5")
    args = parity.parse_args(["--workload", "language_model", "--out", "/tmp/x", "--budget", "1"], "parity")
    assert args.variants[0].flags[-4:] == ("--epochs", "2", "--train-fraction", "0.5") and args.budget == 1
    for bad in ("0.75", "0"):
        with pytest.raises(SystemExit, match=f"--budget must be a positive multiple of 0.5 .* Received: --budget={bad}"):
            parity.parse_args(["--workload", "language_model", "--out", "/tmp/x", "--budget", bad], "parity")
    with pytest.raises(SystemExit):
        parity.parse_args(["--workload", "fashion_mnist", "--out", "/tmp/x", "--budget", "2"], "parity")
    assert "--budget is the language model's" in capsys.readouterr().err
    assert parity.parse_args(["--workload", "fashion_mnist", "--out", "/tmp/x"], "parity").budget is None


@pytest.mark.parametrize("workload", sorted(parity.WORKLOADS))
def test_two_groups_of_4_run_only_where_4_divides_the_ranks_into_groups(workload, capsys):
    def names(*more):
        return [v.name for v in parity.parse_args(["--workload", workload, "--out", "/tmp/x", *more], "parity").variants]
    assert "hierarchical_g4_diloco" not in names("--np", "2") and "hierarchical_g4_diloco" not in names("--np", "4")
    assert "hierarchical_g4_diloco" in names("--np", "8") and "sync_accumulate2" in names("--np", "2")
    args = parity.parse_args(["--workload", workload, "--out", "/tmp/x", "--np", "8", "--configurations",
                              "hierarchical_g4_diloco"], "parity")
    assert args.variants[1].flags[:len(parity.WORKLOADS[workload].data) + 6] == (
        *parity.WORKLOADS[workload].data, "--strategy", "hierarchical", "--ranks-per-group", "4", "--inter", "diloco")
    with pytest.raises(SystemExit):
        parity.parse_args(["--workload", workload, "--out", "/tmp/x", "--np", "6", "--configurations",
                           "sync,hierarchical_g4_diloco"], "parity")
    err = capsys.readouterr().err
    assert "hierarchical_g4_diloco need(s) a --np its --ranks-per-group divides into 2 or more groups. " \
           "Received: --np 6" in err and "Traceback" not in err


def test_unknown_configurations_and_a_missing_workload_are_refused(capsys):
    with pytest.raises(SystemExit):
        parity.parse_args(["--workload", "fashion_mnist", "--out", "/tmp/x", "--configurations", "nope"], "parity")
    assert "--configurations must be chosen from" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parity.parse_args(["--out", "/tmp/x"], "parity")
    assert "--workload and --out are required" in capsys.readouterr().err


def found(**values):
    return {name: {"values": v, "twin": "diloco_tau10" if name.endswith("int8") else None} for name, v in values.items()}


def test_a_loss_is_judged_relative_to_the_baseline_and_the_twin():
    runs = found(sync=[2.00, 2.02], diloco_tau10=[2.03, 2.03], diloco_tau10_int8=[2.06, 2.06])
    # 2.03 vs 2.01: +0.995 %, within 1.5 %; 2.06: +2.49 %, missed; vs its twin 2.03: +1.48 %, missed 1 %
    assert parity.judge(LM, "diloco_tau10", [2.03, 2.03], runs) == ["within 1.5 % of sync met"]
    assert parity.judge(LM, "diloco_tau10_int8", [2.06, 2.06], runs) == [
        "within 1.5 % of sync **missed**", "within 1 % of diloco_tau10 **missed**"]
    # a lower loss is never a miss
    assert parity.judge(LM, "diloco_tau10", [1.5], runs) == ["within 1.5 % of sync met"]
    assert parity.judge(LM, "sync", [2.00, 2.02], runs) == []


def test_an_accuracy_is_judged_in_points_and_against_its_floor():
    runs = found(sync=[0.910, 0.912], easgd_tau10=[0.906, 0.907])
    # 0.9065 vs 0.911: -0.45 pp, within; every run above 0.90
    assert parity.judge(FASHION, "easgd_tau10", [0.906, 0.907], runs) == ["≥ 0.9 met", "within 0.5 pp of sync met"]
    assert parity.judge(FASHION, "easgd_tau10", [0.899, 0.907], runs) == ["≥ 0.9 **missed**",
                                                                          "within 0.5 pp of sync **missed**"]
    assert parity.judge(FASHION, "sync", [0.910, 0.912], runs) == ["≥ 0.9 met"]


def write_run(directory, name, seed, loss, tokens_per_sec):
    os.makedirs(directory / f"{name}-seed{seed}")
    with open(directory / f"{name}-seed{seed}" / "metrics.json", "w") as f:
        json.dump({"epochs": [{"loss": 9.0}, {"loss": loss + 0.5}],
                   "final": {"test_loss": loss, "tokens_per_sec": tokens_per_sec}}, f)
    return {"run": f"{name}-seed{seed}", "variant": name, "twin": None, "seed": seed,
            "command": f"horovodrun -np 2 python train.py --data python_docs --strategy {name} --seed {seed}"}


def test_the_table_gives_the_median_the_range_and_the_mean_against_sync(tmp_path):
    runs = [write_run(tmp_path, "sync", s, loss, 30_000) for s, loss in enumerate((2.0, 2.2, 2.1))]
    runs += [write_run(tmp_path, "diloco_tau10", s, loss, 31_000 + s) for s, loss in enumerate((2.05, 2.4, 2.1))]
    with open(tmp_path / "runs.json", "w") as f:
        json.dump({"workload": "language_model", "np": 2, "seeds": 3, "flags": "", "runs": runs, "failures": []}, f)
    table = parity.write_table(str(tmp_path))
    assert (tmp_path / parity.TABLE).read_text() == table
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ") for line in table.splitlines() if "`" in line
            and line.startswith("| `")}
    # diloco: median 2.1, range 2.05-2.4, mean 2.1833 = +3.97 % of sync's 2.1: missed; median tokens/s 31,001
    # its last epoch's training loss (each run's loss + 0.5 here): mean 2.6833
    assert rows["diloco_tau10"][1:7] == ["2.1000", "2.0500–2.4000", "2.1833", "+3.97 %", "2.6833", "31,001"]
    assert "within 1.5 % of sync **missed**" in rows["diloco_tau10"][7]
    assert rows["sync"][1:5] == ["2.1000", "2.0000–2.2000", "2.1000", "—"]
    assert "2 ranks, seeds 0–2" in table
    # the answer first, from the same verdicts
    assert table.splitlines()[0] == "**Missing a goal:** `diloco_tau10` (+3.97 % vs sync)."


def write_budgeted_run(directory, name, seed, curve, final):
    """A run of 4 epochs of 1,000 tokens each: ``curve`` the kept model's loss after each, ``final`` after
    the end-of-training merge."""
    os.makedirs(directory / f"{name}-seed{seed}")
    epochs = [{"loss": loss + 0.5, "test_loss": loss, "tokens": 1000, "tokens_per_sec": 500.0} for loss in curve]
    with open(directory / f"{name}-seed{seed}" / "metrics.json", "w") as f:
        json.dump({"epochs": epochs, "final": {"test_loss": final, "tokens_per_sec": 500.0}}, f)
    return {"run": f"{name}-seed{seed}", "variant": name, "twin": None, "seed": seed,
            "command": f"horovodrun -np 2 python train.py --strategy {name} --seed {seed}"}


def test_a_budgeted_table_reads_each_configuration_at_one_pass_and_at_the_budget(tmp_path):
    runs = [write_budgeted_run(tmp_path, "sync", s, [3.0, 2.0, 1.9, 1.88 + s / 100], 1.88 + s / 100)
            for s in range(3)]
    # easgd: at one pass (epoch 2) 2.05, 2.06, 2.07: +3.0 % of sync's 2.0, missing the 3 % early goal;
    # at the budget 1.9, 1.9, 1.9 against sync's 1.89: +0.53 %, within 1.5 %
    runs += [write_budgeted_run(tmp_path, "easgd_tau10", s, [3.1, 2.05 + s / 100, 1.95, 1.92], 1.9) for s in range(3)]
    with open(tmp_path / "runs.json", "w") as f:
        json.dump({"workload": "language_model", "np": 2, "seeds": 3, "flags": "", "budget": 2.0, "runs": runs,
                   "failures": []}, f)
    table = parity.write_table(str(tmp_path))
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ") for line in table.splitlines()
            if line.startswith("| `")}
    assert rows["easgd_tau10"][1:7] == ["2.0600", "+3.00 %", "1.9000", "1.9000–1.9000", "1.9000", "+0.53 %"]
    assert rows["easgd_tau10"][-1].strip(" |") == ("within 3 % of sync at 1 pass **missed**; "
                                                   "within 1.5 % of sync met")
    assert rows["sync"][1:3] == ["2.0000", "—"]
    assert "at the budget (0.0 M tokens), median" in table  # 4 epochs of 1,000 tokens
    # sync's mean curve: 1.90 after epoch 3, 1.89 after epoch 4: -0.53 % over the last half pass
    assert ("Over the budget's last epoch (the last 0.5 of its 2 passes), sync's mean validation loss moved "
            "-0.53 % (1.9000 to 1.8900") in table
    assert "2 passes over the training split's tokens (4 epochs of 0.5 of it, the whole held-out set)" in table
    assert f"![Validation loss against tokens]({parity.CURVES})" in table
    assert (tmp_path / parity.CURVES).stat().st_size > 10_000


def test_a_budgeted_folder_plots_its_payloads_final_loss_against_their_bytes_per_outer_step(tmp_path):
    runs = []
    # (name, twin, flags, wire bytes per step at tau 10, final losses): fp32 DiLoCo and two payloads of it
    for name, twin, flags, per_step, finals in (
            ("sync", None, "", 1000.0, (1.88, 1.89, 1.90)),
            ("diloco_tau10", None, "--tau 10", 56_525.2, (1.90, 1.91, 1.92)),
            ("diloco_tau10_int4", "diloco_tau10", "--tau 10 --compression int4", 7_286.8, (1.91, 1.92, 1.96)),
            ("diloco_tau10_topk", "diloco_tau10", "--tau 10 --compression topk --density 0.03", 406.4, (1.95,) * 3)):
        for seed, final in enumerate(finals):
            run = write_budgeted_run(tmp_path, name, seed, [3.0, 2.0, 1.95, final], final)
            path = tmp_path / run["run"] / "metrics.json"
            metrics = json.loads(path.read_text())
            if name != "sync":  # SyncAverage's rows hold no tau
                metrics["epochs"][-1].update(wire_bytes_per_step=per_step, tau=10)
            path.write_text(json.dumps(metrics))
            runs.append(dict(run, twin=twin, command=f"horovodrun -np 2 python train.py --strategy x {flags}"))
    with open(tmp_path / "runs.json", "w") as f:
        json.dump({"workload": "language_model", "np": 2, "seeds": 3, "flags": "", "budget": 2.0, "runs": runs,
                   "failures": []}, f)
    _, found = parity.summarise(str(tmp_path))
    rows = parity.payload_rows(found)
    assert [(label, round(sent)) for label, sent, _ in rows] == [
        ("fp32", 565_252), ("int4", 72_868), ("topk D=0.03", 4_064)]  # a synchronisation's bytes, most first
    assert rows[1][2] == [1.91, 1.92, 1.96]
    parity.write_table(str(tmp_path))
    assert (tmp_path / parity.LOSS_VS_BYTES).stat().st_size > 10_000
    # Without a compressed row there is nothing to set against fp32: no plot.
    assert parity.payload_rows({k: v for k, v in found.items() if "--compression" not in v["command"]}) == []


def test_the_answer_also_sets_every_judged_row_against_the_baseline_at_another_rate(tmp_path):
    # sync 2.0; sync_lr_sqrt2 1.9 (-5.00 % of sync); diloco 1.92: +1.05 % of 1.9, within 1.5 %; easgd 1.95:
    # +2.63 %, behind; periodic has 2 seeds and is left out
    means = {"sync": 2.0, "sync_lr_sqrt2": 1.9, "diloco_tau10": 1.92, "easgd_tau10": 1.95}
    runs = [write_run(tmp_path, name, s, mean + (s - 1) / 100, 30_000) for name, mean in means.items() for s in range(3)]
    runs += [write_run(tmp_path, "periodic_tau10", s, 1.8, 30_000) for s in range(2)]
    with open(tmp_path / "runs.json", "w") as f:
        json.dump({"workload": "language_model", "np": 2, "seeds": 3, "flags": "", "runs": runs, "failures": []}, f)
    lines = parity.write_table(str(tmp_path)).splitlines()
    assert lines[2] == ("Against `sync_lr_sqrt2` (sync at another rate, its mean -5.00 % vs sync's; not a goal while "
                        "sync is train.py's default); within 1.5 %: `diloco_tau10` (+1.05 %); more than 1.5 % behind: "
                        "`easgd_tau10` (+2.63 %).")
    # the goals stay against sync (2.0), which every judged row meets
    assert lines[0].startswith("**Within every goal** (means over 3 seeds): `sync_lr_sqrt2`, `diloco_tau10`, "
                               "`easgd_tau10`.")
    # with 2 seeds of sync_lr_sqrt2, no such line
    (tmp_path / "sync_lr_sqrt2-seed2" / "metrics.json").unlink()
    index = json.loads((tmp_path / "runs.json").read_text())
    index["runs"] = [r for r in index["runs"] if r["run"] != "sync_lr_sqrt2-seed2"]
    (tmp_path / "runs.json").write_text(json.dumps(index))
    assert "Against" not in parity.write_table(str(tmp_path))


def test_fewer_than_three_seeds_are_not_judged(tmp_path):
    runs = [write_run(tmp_path, "sync", 0, 2.0, 30_000), write_run(tmp_path, "easgd_tau10", 0, 2.5, 30_000)]
    with open(tmp_path / "runs.json", "w") as f:
        json.dump({"workload": "language_model", "np": 2, "seeds": 1, "flags": "", "runs": runs, "failures": []}, f)
    table = parity.render(str(tmp_path))
    assert "not judged (1 of 3 seeds)" in table and "missed" not in table and "seed 0," in table


def test_a_row_is_not_judged_against_a_baseline_of_fewer_seeds_and_the_baseline_leads_the_table(tmp_path):
    # DiLoCo's 3 seeds carried into a folder before its sync has run them all: 2.05 would be "met" against
    # sync's one seed, and is not judged until sync has three.
    runs = [write_run(tmp_path, "diloco_tau10", s, loss, 30_000) for s, loss in enumerate((2.05, 2.06, 2.04))]
    runs.append(write_run(tmp_path, "sync", 0, 2.0, 30_000))
    with open(tmp_path / "runs.json", "w") as f:
        json.dump({"workload": "language_model", "np": 2, "seeds": 3, "flags": "", "runs": runs, "failures": []}, f)
    table = parity.render(str(tmp_path))
    assert "not judged (sync has 1 of 3 seeds)" in table and " met" not in table
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == ["sync", "diloco_tau10"]
    assert table.startswith("Not judged yet (fewer than 3 seeds, or a reference with fewer): `sync`, `diloco_tau10`.")


def test_one_rank_is_said_in_the_singular(tmp_path):
    runs = [write_run(tmp_path, "sync", 0, 2.0, 30_000)]
    with open(tmp_path / "runs.json", "w") as f:
        json.dump({"workload": "language_model", "np": 1, "seeds": 1, "flags": "", "runs": runs, "failures": []}, f)
    assert "\n1 rank, seed 0," in parity.render(str(tmp_path))


def test_a_folder_of_other_runs_is_not_continued(tmp_path):
    with open(tmp_path / "runs.json", "w") as f:
        json.dump({"workload": "language_model", "np": 4, "flags": "", "runs": []}, f)
    with pytest.raises(SystemExit, match="holds runs made with other np"):
        study.earlier_runs(str(tmp_path), {"workload": "language_model", "np": 2, "flags": ""})
    assert study.earlier_runs(str(tmp_path / "none"), {"np": 2}) == []


def test_a_language_model_folder_made_before_syncs_adam_rule_is_not_continued(tmp_path):
    # Its rows' commands name no --lr: a `sync` row made today (at sqrt(m) x 1e-3) is not the row beside it.
    with open(tmp_path / "runs.json", "w") as f:
        json.dump({"workload": "language_model", "np": 2, "flags": "", "budget": 2.5, "runs": []}, f)
    with pytest.raises(SystemExit, match=r"holds runs made with other rate_rules \(rate_rules=None\)"):
        parity.main(["--workload", "language_model", "--configurations", "sync", "--out", str(tmp_path)])
    assert parity.WORKLOADS["fashion_mnist"].rate_rules is None  # SGD's rules did not move: its folders continue


@pytest.mark.parametrize("directory", sorted(os.path.dirname(path) for path in glob.glob(
    os.path.join(REPO_ROOT, "docs", "results", "parity-*", study.RUNS))))  # the -by-np pages: test_parity_by_np.py
def test_every_committed_table_is_its_results_rendered(directory):
    with open(os.path.join(directory, parity.TABLE)) as f:
        assert f.read() == parity.render(directory)


def test_the_summary_names_what_meets_every_goal_what_misses_and_what_is_not_judged_yet():
    runs = found(sync=[0.910, 0.912, 0.911], easgd_tau10=[0.906, 0.907, 0.909], periodic_tau10=[0.90, 0.91])
    verdicts = {n: parity.judge(FASHION, n, runs[n]["values"], runs) for n in ("sync", "easgd_tau10")}
    text = parity.summary(FASHION, runs, verdicts, {"easgd_tau10": "-0.37 pp"})
    # sync meets its floor, easgd its floor and 0.5 pp; periodic has 2 seeds
    assert text == ("**Within every goal** (means over 3 seeds): `sync`, `easgd_tau10`. Not judged yet (fewer "
                    "than 3 seeds, or a reference with fewer): `periodic_tau10`.")


class _FakeLaunch:
    """A launch that writes a run's config.yaml and metrics.json at once, and fails the seeds in ``failing``;
    it stops the benchmark (as a user's Ctrl-C would) when asked for the seed ``interrupt_at``."""

    def __init__(self, failing=(), interrupt_at=None):
        self.failing, self.interrupt_at = failing, interrupt_at

    def command(self, variant, seed, run_dir):
        return (variant, seed, run_dir)

    def shown(self, variant, seed):
        return f"train.py {' '.join(variant.flags)} --seed {seed}"

    def run(self, cmd, log, timeout):
        variant, seed, run_dir = cmd
        if seed == self.interrupt_at:
            raise KeyboardInterrupt
        if seed in self.failing:
            return Outcome(1, 1.0, log)
        os.makedirs(run_dir, exist_ok=True)
        open(os.path.join(run_dir, "config.yaml"), "w").close()
        with open(os.path.join(run_dir, "metrics.json"), "w") as f:
            json.dump({"epochs": [], "final": {"test_accuracy": 0.9 - seed / 100}}, f)
        return Outcome(0, 1.0, log)


def test_a_stopped_benchmark_keeps_the_index_of_its_runs_and_the_next_one_continues_from_them(tmp_path):
    out, index = str(tmp_path), {"workload": "language_model", "np": 2, "flags": ""}
    sync = [study.Variant("sync", ("--strategy", "sync"), None)]
    # Seed 1 fails, seed 2 is interrupted: runs.json already names seed 0 and the failure.
    with pytest.raises(KeyboardInterrupt):
        study.continue_runs(out, index, sync, 2, 3, 60, "t", launch=_FakeLaunch(failing=(1,), interrupt_at=2))
    kept = json.loads((tmp_path / "runs.json").read_text())
    assert [r["run"] for r in kept["runs"]] == ["sync-seed0"] and kept["failures"] == ["sync-seed1: exit status 1"]
    # The next invocation runs only what is not kept, and the index ends with all three.
    launched = []
    launch = _FakeLaunch()
    launch.run = lambda cmd, log, timeout, run=launch.run: launched.append(cmd[1]) or run(cmd, log, timeout)
    assert study.continue_runs(out, index, sync, 2, 3, 60, "t", launch=launch) == []
    assert launched == [1, 2]
    kept = json.loads((tmp_path / "runs.json").read_text())
    assert [r["run"] for r in kept["runs"]] == ["sync-seed0", "sync-seed1", "sync-seed2"] and kept["seeds"] == 3


def test_rendering_a_folder_without_runs_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        parity.main(["--render", str(tmp_path)])
    assert str(refused.value) == f"{tmp_path} holds no runs.json: not a results folder of this benchmark (or no run " \
                                 "of it has finished yet)"
