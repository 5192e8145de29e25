"""docs/time-to-accuracy.md and the rated runs' results.md are their renders from the committed results.json,
and the page's figures are read off the curves as it says: first epoch at or above, medians over seeds."""
import json
import os

import pytest

from benchmarks.accuracy import tta_report
from tests.helpers import ROOT

pytestmark = pytest.mark.unit

SMOKE = os.path.join(ROOT, "docs", "results", "tta_teacher_smoke")


def test_the_committed_page_and_reports_equal_their_render_from_results_json():
    with open(tta_report.PAGE) as f:
        assert f.read() == tta_report.render()
    for folder in (*tta_report.RESULTS_BY_RATE, SMOKE):
        with open(os.path.join(folder, "results.md")) as f:
            assert f.read() == tta_report.render_results_md(folder), folder
    assert tta_report.main(["--check"]) == 0


def test_the_reports_name_what_each_pass_trained():
    for folder in (*tta_report.RESULTS_BY_RATE, SMOKE):
        text = tta_report.render_results_md(folder)
        # The time to accuracy trained student_mlp; the throughput rows are the digits CNN's pass.
        assert "Digits CNN," not in text and "student_mlp on --data teacher, np=2" in text
        assert ("**digits CNN (8×8×1)**, the throughput pass (`--models cnn`: 40 steps per repeat, 1 repeat, "
                "per-rank batch 32), not the time-to-accuracy workload (student_mlp)") in text
        assert "**cnn**" not in text


def _curve(points, seconds_per_epoch):
    return [{"epoch": e + 1, "seconds": seconds_per_epoch * (e + 1), "accuracy": a} for e, a in enumerate(points)]


def _run(seed, points, seconds_per_epoch):
    curve = _curve(points, seconds_per_epoch)
    return {"seed": seed, "curve": curve, "final_accuracy": curve[-1]["accuracy"],
            "train_seconds": curve[-1]["seconds"]}


def _results(tmp_path):
    """Two seeds, 3 epochs of 10 steps × batch 4 × 2 ranks (80 samples an epoch), target 0.5."""
    link = {"nominal": "100mbit", "measured_mbit": 80.0}
    sync = [_run(0, [0.2, 0.6, 0.8], 10.0), _run(1, [0.4, 0.5, 0.82], 20.0)]
    # Seed 0 reaches 0.5 at epoch 1 (2 s), seed 1 at epoch 2 (6 s), though 0.49 at epoch 1: no interpolation.
    # Final 0.70 and 0.72: median 0.71, exactly 10 pp below sync's 0.81, so it misses "within 1 pp".
    periodic = [_run(0, [0.5, 0.6, 0.70], 2.0), _run(1, [0.49, 0.55, 0.72], 3.0)]
    tta = {"target": 0.5, "epochs": 3, "seeds": 2, "np": 2, "controller": "mpi", "batch_per_rank": 4,
           "base_lr": 0.1, "model": "student_mlp", "data": "teacher", "cap_seconds": 100.0, "steps_per_epoch": 10,
           "ceiling": {"samples_per_second_per_rank": 40.0, "samples_per_second": 80.0, "steps": 20}, "link": link,
           "per_config": {"sync": {"lr": 0.2, "runs": sync}, "periodic_tau10": {"lr": 0.2, "runs": periodic}}}
    results = {"command": "python -m benchmarks.suite.compare --link-rates 100mbit", "models": ["cnn"],
               "topology": {"hosts": 2, "ranks_per_host": 1, "shaping": "tc tbf"},
               "settings": {"steps": 40, "wide_mlp_steps": 20, "repeats": 1},
               "rows": [{"model": "cnn", "batch_per_rank": 32}], "time_to_accuracy_by_rate": [tta]}
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(results))
    return str(folder), results, tta


def test_times_are_the_first_epoch_at_or_above_the_target_with_medians_over_seeds(tmp_path):
    _, results, tta = _results(tmp_path)
    periodic = tta_report.time_to(tta["per_config"]["periodic_tau10"], 0.5)
    assert periodic["per_seed"] == [2.0, 6.0] and periodic["reached"] == 2
    assert periodic["seconds"] == {"median": 4.0, "min": 2.0, "max": 6.0}
    assert periodic["epochs"] == {"median": 1.5, "min": 1, "max": 2}
    sync = tta_report.time_to(tta["per_config"]["sync"], 0.5)
    assert sync["per_seed"] == [20.0, 40.0]
    never = tta_report.time_to(tta["per_config"]["sync"], 0.9)
    assert never["seconds"] is None and never["reached"] == 0
    # 3 epochs × 80 samples over 6 s and 9 s.
    assert tta_report.throughput(tta, tta["per_config"]["periodic_tau10"]) == pytest.approx(
        {"median": (40.0 + 240 / 9) / 2, "min": 240 / 9, "max": 40.0})
    rows = {(row[0], row[1]): row[2:] for row in tta_report.goal_rows(results, (0.5, 0.8))}
    # Best ÷ sync: medians 4 / 30; per seed 2/20 and 6/40.
    assert rows[("best low-communication ÷ `sync`, time to 0.5 ≤ 1/3", "100mbit")] == [
        "0.133 (per seed 0.100–0.150): `periodic_tau10` 4.0 (2.0–6.0) s ÷ `sync` 30.0 (20.0–40.0) s", "met"]
    # 0.8: sync reaches it (30 s and 60 s), periodic_tau10 in neither seed.
    assert rows[("best low-communication ÷ `sync`, time to 0.8 ≤ 1/3", "100mbit")][1] == "not measured"
    assert rows[("`periodic_tau10` ends within 1 pp of `sync`'s final accuracy", "100mbit")] == [
        "0.7100 (0.7000–0.7200) vs 0.8100 (0.8000–0.8200) after 3 epochs (-10.00 pp)", "**not met**"]
    assert rows[("every goal", "10mbit")][-1] == "not measured"
    overlap = rows[("Streaming DiLoCo with overlap, samples/s ÷ no-communication ceiling ≥ 0.9", "100mbit")]
    assert overlap == ["no configuration with overlap ran", "not measured"]


def test_a_gap_of_exactly_one_point_is_within_it(tmp_path):
    _, results, tta = _results(tmp_path)
    for run, final in zip(tta["per_config"]["periodic_tau10"]["runs"], (0.7974, 0.7974)):
        run["final_accuracy"] = final  # 0.8074 - 0.0100 in floating point is not exactly -1 pp
    for run, final in zip(tta["per_config"]["sync"]["runs"], (0.8074, 0.8074)):
        run["final_accuracy"] = final
    rows = {row[0]: row[2:] for row in tta_report.goal_rows(results, (0.5,))}
    assert rows["`periodic_tau10` ends within 1 pp of `sync`'s final accuracy"] == [
        "0.7974 vs 0.8074 after 3 epochs (-1.00 pp, at the limit)", "met"]


def test_the_page_renders_from_any_rated_run_and_a_folder_without_results_is_refused(tmp_path, capsys):
    folder, _, _ = _results(tmp_path)
    page = tta_report.render(folder)
    assert "| `periodic_tau10` | 0.2 | — | — | 0/2 | 4.0 (2.0–6.0) | 1.5 (1–2) | 2/2 | 3 | 0.7100 (0.7000–0.7200) |" in page
    assert "](figures/run_time_to_accuracy.png)" in page
    assert tta_report.main(["--results", str(tmp_path / "nowhere"), "--check"]) == 2
    assert capsys.readouterr().err.strip() == (
        "python -m benchmarks tta-report: `--results` must be a folder with a results.json. "
        f"Received: --results={tmp_path / 'nowhere'}")


def test_the_workload_goals_come_from_the_ceiling_and_sync_s_epochs(tmp_path):
    _, results, _ = _results(tmp_path)
    rows = {row[0]: row[2:] for row in tta_report.goal_rows(results, (0.5,), workload_target=0.5)}
    # c = 4 / 40 samples/s = 100 ms; a sync step: 30 s / 30 steps and 60 s / 30 steps, median 1.5 s.
    assert rows["workload: a `sync` step spends ≥ 90% of its time communicating"] == [
        "1 − c/step = 1 − 100.0 ms / 1500 ms = 0.933", "met"]
    assert rows["workload: `sync` reaches 0.5 in 2–10 min"] == ["0.50 min; 30.0 (20.0–40.0) s", "**not met**"]
    # The window is the workload's target's only: 0.5 read beside a target of 0.8 gives no window row.
    rows = {row[0]: row[2:] for row in tta_report.goal_rows(results, (0.8, 0.5), workload_target=0.8)}
    assert rows["workload: `sync` reaches 0.8 in 2–10 min"][1] == "**not met**"
    assert "workload: `sync` reaches 0.5 in 2–10 min" not in rows


def test_an_overlapped_configuration_is_set_against_its_twin_without_overlap(tmp_path):
    assert tta_report.is_twin("easgd_tau10_overlap", "easgd_tau10")
    assert not tta_report.is_twin("easgd_tau10", "easgd_tau10_overlap")
    assert not tta_report.is_twin("easgd_tau10_overlap", "easgd_tau4")
    assert not tta_report.streaming_with_overlap("diloco_tau10_f4")  # fragments, δ = 0
    _, results, tta = _results(tmp_path)
    configs = tta["per_config"]
    configs["easgd_tau10"], configs["easgd_tau10_overlap"] = configs.pop("periodic_tau10"), configs["sync"]
    rows = {row[0]: row[2:] for row in tta_report.goal_rows(results, (0.5,))}
    # easgd_tau10_overlap has sync's curves (240 samples over 30 s and 60 s), easgd_tau10 periodic's (6 s, 9 s).
    assert rows["`easgd_tau10_overlap` samples/s ≥ its twin `easgd_tau10`'s"] == ["6 vs 33", "**not met**"]


def test_a_fragment_s_crossing_is_set_against_delta_steps_of_compute(tmp_path):
    _, _, tta = _results(tmp_path)
    tta["per_config"]["diloco_tau50_f2_overlap24"] = tta["per_config"].pop("periodic_tau10")
    tta["link"]["measured_bits_per_second"] = 8e6  # 1e6 B/s
    (line,) = tta_report.fragment_arithmetic(tta, hosts=2, params=1_000_000)
    # 4·1e6/2 = 2 MB a fragment; at 2 hosts a host's link carries 2·1/2 of it: 2 s at 1e6 B/s. c = 4/40 s =
    # 100 ms, so δ·c = 24 × 0.1 = 2.4 s: 1.2× the crossing.
    assert "(τ = 50, F = 2, δ = 24)" in line and "= 2.00 MB" in line and "2.00 s at the measured 8 Mbit/s" in line
    assert "24 × 100.0 ms = 2.40 s of compute" in line and "1.2× the crossing" in line
    assert tta_report.fragment_arithmetic(dict(tta, ceiling=None), 2, 1_000_000) == []


def test_a_rate_whose_sync_run_was_capped_borrows_its_accuracy_at_as_many_epochs_from_another_rate(tmp_path):
    _, results, fast = _results(tmp_path)
    slow = json.loads(json.dumps(fast))
    slow["link"] = {"nominal": "10mbit", "measured_mbit": 8.0, "nominal_bits_per_second": 10_000_000}
    # SyncAverage's cap stopped it after 1 epoch (200 s, the same accuracy as at 100mbit in both seeds);
    # periodic_tau10 ran 3 epochs in 30 s, and 0.5 in seed 0 at epoch 1, in seed 1 at epoch 2.
    slow["per_config"]["sync"]["runs"] = [_run(0, [0.2], 200.0), _run(1, [0.4], 200.0)]
    slow["per_config"]["periodic_tau10"]["runs"] = [_run(0, [0.5, 0.6, 0.80], 10.0), _run(1, [0.49, 0.55, 0.8], 10.0)]
    results["time_to_accuracy_by_rate"].append(slow)
    rows = {(row[0], row[1]): row[2:] for row in tta_report.goal_rows(results, (0.5, 0.9))}
    # Seeds 0 and 1 at 3 epochs: 0.8 and 0.82 from the 100mbit run, median 0.81; periodic's 0.8, -1 pp.
    final = rows[("`periodic_tau10` ends within 1 pp of `sync`'s final accuracy", "10mbit")]
    # periodic's own curves differ between the rates (this case's numbers are made up): the row says by how much.
    assert final[0].startswith("0.8000 vs 0.8100 (0.8000–0.8200) after 3 epochs (-1.00 pp, at the limit); "
                               "its own curves are within 10.00 pp of its 100mbit run's, seed for seed; "
                               "`sync`'s from its 100mbit runs of seeds 0, 1, whose shared epochs with this rate's "
                               "runs of seeds 0, 1 agree within 0.00 pp")
    assert final[0].endswith("At equal wall time instead, the cap: `sync` ended at 0.3000 (0.2000–0.4000) after 1 "
                             "epochs") and final[1] == "met"
    # 10 s and 20 s; SyncAverage never reached 0.5 in its 200 s.
    assert rows[("`periodic_tau10` reaches 0.5 in less wall time than `sync`", "10mbit")] == [
        "15.0 (10.0–20.0) s; `sync` did not reach it in 200 s (0.3000 (0.2000–0.4000) at its cap)", "met"]
    assert rows[("`periodic_tau10` reaches 0.9 in less wall time than `sync`", "10mbit")] == [
        "neither reached it", "not measured"]
    assert ("workload: `sync` reaches 0.5 in 2–10 min", "10mbit") not in rows  # set at 100mbit only
    # A SyncAverage curve that differs from the other rate's is not borrowed from.
    slow["per_config"]["sync"]["runs"][1]["curve"][0]["accuracy"] = 0.41
    rows = {(row[0], row[1]): row[2:] for row in tta_report.goal_rows(results, (0.5,))}
    assert rows[("`periodic_tau10` ends within 1 pp of `sync`'s final accuracy", "10mbit")][1] == "not measured"


def test_a_second_launch_at_a_rate_adds_its_seeds_and_a_seed_sync_did_not_run_there_is_borrowed(tmp_path):
    _, results, fast = _results(tmp_path)
    fast["per_config"]["sync"]["runs"].append(_run(2, [0.3, 0.7, 0.9], 10.0))
    fast["link"]["nominal_bits_per_second"] = 100_000_000
    slow = json.loads(json.dumps(fast))
    slow["link"] = {"nominal": "10mbit", "measured_mbit": 8.0, "nominal_bits_per_second": 10_000_000}
    slow["seeds"] = 1
    slow["per_config"]["sync"]["runs"] = [_run(0, [0.2], 200.0)]
    slow["per_config"]["periodic_tau10"]["runs"] = [_run(0, [0.5, 0.6, 0.70], 10.0)]
    extra = json.loads(json.dumps(slow))
    extra["seeds"] = 2
    del extra["per_config"]["sync"]
    # Seed 0 again, with the same curve (another launch's wall times), and seeds 1 and 2.
    extra["per_config"]["periodic_tau10"]["runs"] = [_run(0, [0.5, 0.6, 0.70], 11.0),
                                                     _run(1, [0.4, 0.6, 0.86], 10.0), _run(2, [0.5, 0.8, 0.92], 10.0)]
    first = dict(results, time_to_accuracy_by_rate=[fast, slow])
    second = dict(results, time_to_accuracy_by_rate=[extra])
    merged = tta_report.merged([first, second])
    rates = [t["link"]["nominal"] for t in merged["time_to_accuracy_by_rate"]]
    assert rates == ["100mbit", "10mbit"]
    slow_merged = merged["time_to_accuracy_by_rate"][1]
    assert [run["seed"] for run in slow_merged["per_config"]["periodic_tau10"]["runs"]] == [0, 1, 2]
    assert slow_merged["per_config"]["periodic_tau10"]["runs"][0]["curve"][0]["seconds"] == 10.0  # the first's
    assert [run["seed"] for run in slow_merged["per_config"]["sync"]["runs"]] == [0]
    assert tta_report._seed_counts(slow_merged) == "1 seed; `periodic_tau10` 3"
    rows = {(row[0], row[1]): row[2:] for row in tta_report.goal_rows(merged, (0.5,))}
    # periodic 0.70, 0.86, 0.92 (median 0.86) against sync's 0.8, 0.82, 0.9 at 3 epochs at 100mbit (0.82):
    # seeds 1 and 2 never ran SyncAverage at 10mbit, and seed 0, which did, agrees with its 100mbit run.
    final = rows[("`periodic_tau10` ends within 1 pp of `sync`'s final accuracy", "10mbit")]
    assert final[0].startswith("0.8600 (0.7000–0.9200) vs 0.8200 (0.8000–0.9000) after 3 epochs (+4.00 pp); "
                               "`sync`'s from its 100mbit runs of seeds 0, 1, 2, whose shared epochs with this "
                               "rate's run of seed 0 agree within 0.00 pp") and final[1] == "met"
    # If the seed SyncAverage ran at both rates disagrees, no seed is borrowed on its word.
    slow["per_config"]["sync"]["runs"][0]["curve"][0]["accuracy"] = 0.3
    rows = {(row[0], row[1]): row[2:] for row in tta_report.goal_rows(tta_report.merged([first, second]), (0.5,))}
    assert rows[("`periodic_tau10` ends within 1 pp of `sync`'s final accuracy", "10mbit")][1] == "not measured"
    # A seed both launches ran must have the same curve.
    extra["per_config"]["periodic_tau10"]["runs"][0]["curve"][2]["accuracy"] = 0.72
    with pytest.raises(ValueError, match="`periodic_tau10` seed 0 at 10mbit differs between two launches"):
        tta_report.merged([first, second])
