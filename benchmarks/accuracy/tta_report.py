"""The time-to-accuracy page, rendered from the rated-link runs' committed ``results.json``, one a rate.

    python -m benchmarks tta-report            # tta_teacher (100 Mbit/s), tta_teacher_10mbit(_easgd): results.md, plots, page
    python -m benchmarks tta-report --check    # exit 1 if results.md or the page differs from its render
    python -m benchmarks tta-report --results docs/results/tta_teacher_smoke --no-page

It launches nothing: ``results.md`` is ``rated_links.markdown`` of the
results again (a run whose report was written by an older generator is
re-rendered, not re-run), the plots go to ``benchmarks/figures/`` (the site
shows them, ``docs/hooks/figures.py``), and ``docs/time-to-accuracy.md`` holds
issue 25's goals, each computed here from the per-seed curves: the runs at
each rate, and the overlap run (``docs/results/overlap_teacher``) for the
overlap goals.

How a figure is read off the curves. Test accuracy is measured once per
epoch, so the time to a target is the training wall time at the end of the
first epoch at or above it (no interpolation: the target was crossed up to
one epoch earlier). Figures are medians over the seeds, with their min and
max; a ratio of two configurations is of their medians, next to the range
of the per-seed ratios (seed s of each ran interleaved, epoch by epoch, in
the same launch). Samples/s of a configuration are its epochs' samples over
its training seconds (``curves.samples_per_second``), set against the
no-communication ceiling the same launch measured.
"""
import argparse
import json
import math
import os
import statistics
import sys

from hvd_easgd.choosing import cost_model

from ..suite import curves, rated_links
from ..costmodel import workloads
from ..suite.names import BASELINES, BY_NAME
from ..suite.runner import REPO_ROOT, table

RESULTS = os.path.join(REPO_ROOT, "docs", "results", "tta_teacher")
# The page's runs: the issue asks for 3 seeds at 100 Mbit/s and 1 at 10 Mbit/s, so a launch a rate; a third
# launch at 10 Mbit/s ran EASGD's seeds 1 and 2 too (and seed 0 again), since its seed 0 alone ended 1.44 pp
# below SyncAverage's there (``more_seeds`` merges it into that rate's entry).
RESULTS_BY_RATE = (RESULTS, os.path.join(REPO_ROOT, "docs", "results", "tta_teacher_10mbit"),
                   os.path.join(REPO_ROOT, "docs", "results", "tta_teacher_10mbit_easgd"))
PAGE = os.path.join(REPO_ROOT, "docs", "time-to-accuracy.md")
OVERLAP_RESULTS = os.path.join(REPO_ROOT, "docs", "results", "overlap_teacher")
OVERLAP_PAGE = os.path.join(REPO_ROOT, "docs", "overlap-results.md")
FIGURES = os.path.join(REPO_ROOT, "benchmarks", "figures")
# The workload's target (docs/benchmarks.md). Issue 25 asks that SyncAverage take 2-10 minutes to reach it at
# 100 Mbit/s: 0.9, the runs' own --target, took it under 2, so the workload's target is this harder one, below
# where SyncAverage ends (about 0.957) so that every seed can reach it. Every figure is read at both.
WORKLOAD_TARGET = 0.94
# Issue 25's goals.
TIME_RATIO_GOAL = 1 / 3  # best low-communication strategy ÷ SyncAverage, time to target
FINAL_ACCURACY_POINTS = 1.0  # each strategy's final accuracy at most 1 pp below SyncAverage's
CEILING_GOAL = 0.9  # Streaming DiLoCo with overlap: samples/s ÷ the no-communication ceiling
COMM_SHARE_GOAL = 0.9  # the workload: a SyncAverage step's share of communication
SYNC_MINUTES = (2, 10)  # the workload: SyncAverage's time to the target
GOAL_RATES = ("100mbit", "10mbit")  # the rates the goals are set at
WORKLOAD_RATE = "100mbit"  # the workload's goals, the 1/3 and the overlap goals are set at this rate only
# A SyncAverage epoch computes the same at any link rate: a rate whose SyncAverage run was capped before the
# others' epochs borrows its accuracy at their epoch from another rate's run of the same seed, if the epochs
# both ran agree to this much.
SAME_CURVE_POINTS = 0.5


def targets_of(tta):
    """The targets a page reads off the curves: the workload's, then the run's own ``--target`` if it differs."""
    return tuple(dict.fromkeys((WORKLOAD_TARGET, tta["target"])))


def epochs_run(res):
    """The epochs each seed's run trained (its cap can stop it sooner), over the seeds."""
    return median_range([len(run["curve"]) for run in res["runs"]])


def median_range(values):
    """``{"median", "min", "max"}`` of the values, or None when there are none."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _cell(stats, fmt="{:.1f}"):
    if stats is None:
        return "—"
    f = fmt.format
    if len({stats["min"], stats["max"]}) == 1:
        return f(stats["median"])
    return f"{f(stats['median'])} ({f(stats['min'])}–{f(stats['max'])})"


def time_to(res, target):
    """Per seed, the first epoch at or above ``target``: ``{"seconds", "epochs", "reached", "seeds", "per_seed"}``,
    the first two summarised over the seeds that reached it; ``per_seed`` is seconds or None, in seed order."""
    points = [curves.first_at_or_above(run["curve"], target) for run in res["runs"]]
    reached = [p for p in points if p is not None]
    return {"seconds": median_range([p["seconds"] for p in reached]),
            "epochs": median_range([p["epoch"] for p in reached]), "reached": len(reached), "seeds": len(points),
            "per_seed": [None if p is None else p["seconds"] for p in points]}


def final_accuracy(res):
    return median_range([run["final_accuracy"] for run in res["runs"]])


def throughput(tta, res):
    return median_range([curves.samples_per_second(tta, run) for run in res["runs"]])


def low_communication(tta):
    """The strategies set against SyncAverage: every configuration timed but SyncAverage and the baselines."""
    return [name for name in tta["per_config"] if name != "sync" and name not in BASELINES]


def _flag(name, flag):
    """The value of ``flag`` in configuration ``name``'s train.py flags, or None (an unknown name: None)."""
    return BY_NAME[name].flag(flag) if name in BY_NAME else None


def is_twin(name, twin):
    """``name`` overlaps (δ ≥ 1) and ``twin`` has the same train.py flags without ``--overlap``."""
    if int(_flag(name, "--overlap") or 0) < 1 or name not in BY_NAME or twin not in BY_NAME:
        return False
    flags = list(BY_NAME[name].train_py)
    at = flags.index("--overlap")
    return tuple(flags[:at] + flags[at + 2:]) == BY_NAME[twin].train_py


def streaming_with_overlap(name):
    """Streaming DiLoCo with overlap: DiLoCo with more than one fragment and δ ≥ 1."""
    return (_flag(name, "--strategy") == "diloco" and int(_flag(name, "--fragments") or 1) > 1
            and int(_flag(name, "--overlap") or 0) >= 1)


def _met(ok):
    return "met" if ok else "**not met**"


def _time_ratio(tta, target):
    """The best low-communication strategy's median time to ``target`` ÷ SyncAverage's, and the range of the
    per-seed ratios; only strategies that reached it in every seed compete, and SyncAverage must have too."""
    sync = time_to(tta["per_config"]["sync"], target)
    times = {name: time_to(tta["per_config"][name], target) for name in low_communication(tta)}
    times = {name: t for name, t in times.items() if t["seconds"] is not None and t["reached"] == t["seeds"]}
    if sync["reached"] < sync["seeds"] or not times:
        return None
    best = min(times, key=lambda name: times[name]["seconds"]["median"])
    paired = [b / s for b, s in zip(times[best]["per_seed"], sync["per_seed"])]
    return {"best": best, "value": times[best]["seconds"]["median"] / sync["seconds"]["median"],
            "paired": median_range(paired), "best_seconds": times[best]["seconds"], "sync_seconds": sync["seconds"]}


def _sync_step(tta):
    """c, one step's compute (the ceiling's batch time), and SyncAverage's median seconds per step."""
    c = tta["batch_per_rank"] / tta["ceiling"]["samples_per_second_per_rank"]
    step = statistics.median(run["curve"][-1]["seconds"] / (len(run["curve"]) * tta["steps_per_epoch"])
                             for run in tta["per_config"]["sync"]["runs"])
    return c, step


def _workload_rows(tta, targets, workload_target=WORKLOAD_TARGET):
    """Issue 25's workload: a SyncAverage step ≥ 90% communication, SyncAverage to the workload's target in 2-10
    minutes (the other targets are read for the other goals only)."""
    rows = []
    if tta.get("ceiling"):
        c, step = _sync_step(tta)
        share = 1 - c / step
        rows.append([f"workload: a `sync` step spends ≥ {COMM_SHARE_GOAL:.0%} of its time communicating",
                     f"1 − c/step = 1 − {1e3 * c:.1f} ms / {1e3 * step:.0f} ms = {share:.3f}",
                     _met(share >= COMM_SHARE_GOAL)])
    low, high = SYNC_MINUTES
    for target in [t for t in targets if t == workload_target]:
        t = time_to(tta["per_config"]["sync"], target)
        goal = f"workload: `sync` reaches {target:g} in {low:g}–{high:g} min"
        if t["seconds"] is None:
            rows.append([goal, "not reached", "**not met**"])
            continue
        minutes = t["seconds"]["median"] / 60
        rows.append([goal, f"{minutes:.2f} min; {_cell(t['seconds'])} s", _met(low <= minutes <= high)])
    return rows


def _speed_rows(tta, targets):
    """The best low-communication strategy ÷ SyncAverage, time to each target, ≤ 1/3."""
    rows = []
    for target in targets:
        r = _time_ratio(tta, target)
        goal = f"best low-communication ÷ `sync`, time to {target:g} ≤ 1/3"
        if r is None:
            rows.append([goal, "`sync` or every other configuration missed it in a seed", "not measured"])
            continue
        paired = f"per seed {r['paired']['min']:.3f}–{r['paired']['max']:.3f}"
        rows.append([goal, f"{r['value']:.3f} ({paired}): `{r['best']}` {_cell(r['best_seconds'])} s "
                           f"÷ `sync` {_cell(r['sync_seconds'])} s", _met(r["value"] <= TIME_RATIO_GOAL)])
    return rows


def sync_at_epochs(tta, others, epochs_by_seed):
    """SyncAverage's test accuracy after each seed's ``epochs`` (``{seed: epochs}``), for the final-accuracy goal.

    From this rate's own SyncAverage run where it ran that long. Where its cap stopped it sooner, from the
    same seed at another rate in ``others`` that ran that long, if the epochs both ran agree within
    ``SAME_CURVE_POINTS`` pp: SyncAverage's arithmetic does not depend on the link, only its wall time does.
    A seed SyncAverage did not run at this rate at all (another strategy ran more seeds here) is borrowed
    on the word of the seeds it did run: every one of them must agree so with the other rate's.

    Returns:
        ``{"accuracy": median_range, "borrowed": [(rate, seed, max pp apart on the shared epochs)]}``, or
        None when some seed has no such run.
    """
    own = {run["seed"]: run["curve"] for run in tta["per_config"]["sync"]["runs"]}
    values, borrowed = [], []
    for seed, epochs in epochs_by_seed.items():
        mine = own.get(seed, [])
        if len(mine) >= epochs:
            last = len(mine) == epochs  # its run's own final figure, the kept model's at the end
            values.append(next(run["final_accuracy"] for run in tta["per_config"]["sync"]["runs"]
                               if run["seed"] == seed) if last else mine[epochs - 1]["accuracy"])
            continue
        for other in others:
            theirs = {run["seed"]: run["curve"] for run in other["per_config"].get("sync", {}).get("runs", [])}
            curve = theirs.get(seed, [])
            if seed in own:
                apart = curves_apart(mine, curve)
            else:
                shared = [curves_apart(c, theirs[s]) for s, c in own.items() if s in theirs]
                apart = None if not shared or None in shared else max(shared)
            if len(curve) >= epochs and apart is not None and apart <= SAME_CURVE_POINTS:
                values.append(curve[epochs - 1]["accuracy"])
                borrowed.append((other["link"]["nominal"], seed, apart))
                break
        else:
            return None
    return {"accuracy": median_range(values), "borrowed": borrowed}


def _final_row(name, res, tta, others):
    """``name`` ends within 1 pp of SyncAverage's accuracy after as many epochs."""
    goal = f"`{name}` ends within {FINAL_ACCURACY_POINTS:g} pp of `sync`'s final accuracy"
    final = final_accuracy(res)
    reference = sync_at_epochs(tta, others, {run["seed"]: len(run["curve"]) for run in res["runs"]})
    if reference is None:
        return [goal, "`sync` ran fewer epochs here, and no run of its seeds at another rate ran as many",
                "not measured"]
    # Accuracies are counts over one test set: a gap of exactly 1 pp must not fail by a rounding error.
    gap = round(100 * (final["median"] - reference["accuracy"]["median"]), 9)
    epochs = epochs_run(res)
    measured = (f"{_cell(final, '{:.4f}')} vs {_cell(reference['accuracy'], '{:.4f}')} after "
                f"{_cell(epochs, '{:g}')} epochs ({gap:+.2f} pp" + (", at the limit)" if gap == -FINAL_ACCURACY_POINTS
                                                                     else ")"))
    if reference["borrowed"]:
        own = _own_curves_apart(name, res, others)
        if own is not None:  # the set against a borrowed reference is fair if the strategy, too, ignores the rate
            measured += f"; its own curves are within {own[1]:.2f} pp of its {own[0]} run's, seed for seed"
        rate = reference["borrowed"][0][0]
        seeds = [seed for _, seed, _ in reference["borrowed"]]
        sync = tta["per_config"]["sync"]
        ran_here = [run["seed"] for run in sync["runs"]]
        apart = max(a for _, _, a in reference["borrowed"])
        ran = epochs_run(sync)
        measured += (f"; `sync`'s from its {rate} {_seeds(seeds)}, whose shared epochs with this "
                     f"rate's {_seeds(ran_here)} agree within {apart:.2f} pp (a SyncAverage epoch computes the "
                     "same at any rate). At equal "
                     f"wall time instead, the cap: `sync` ended at {_cell(final_accuracy(sync), '{:.4f}')} after "
                     f"{_cell(ran, '{:g}')} epochs")
    return [goal, measured, _met(gap >= -FINAL_ACCURACY_POINTS)]


def _own_curves_apart(name, res, others):
    """(rate, the largest gap in pp) between ``name``'s curves here and its runs of the same seeds at the first
    other rate that ran them all, or None: whether the strategy, too, computes the same at any rate."""
    for other in others:
        theirs = {run["seed"]: run["curve"] for run in other["per_config"].get(name, {}).get("runs", [])}
        gaps = [curves_apart(run["curve"], theirs[run["seed"]]) for run in res["runs"] if run["seed"] in theirs]
        if gaps and len(gaps) == len(res["runs"]) and None not in gaps:
            return other["link"]["nominal"], max(gaps)
    return None


def _seed_counts(tta):
    """"3 seeds", or "1 seed; `easgd_tau10` 3" where a second launch added a configuration's seeds."""
    def n(count):
        return f"{count} seed{'s' if count > 1 else ''}"
    more = [f"`{name}` {len(res['runs'])}" for name, res in tta["per_config"].items()
            if len(res["runs"]) != tta["seeds"]]
    return n(tta["seeds"]) + ("; " + ", ".join(more) if more else "")


def _seeds(seeds):
    return f"run of seed {seeds[0]}" if len(seeds) == 1 else "runs of seeds " + ", ".join(map(str, seeds))


def _strategy_rows(tta, targets, others=()):
    """Each strategy: less wall time than SyncAverage to each target, final accuracy within 1 pp of its."""
    rows = []
    sync = tta["per_config"]["sync"]
    for name in low_communication(tta):
        res = tta["per_config"][name]
        for target in targets:
            mine, theirs = time_to(res, target), time_to(sync, target)
            goal = f"`{name}` reaches {target:g} in less wall time than `sync`"
            if mine["seconds"] is None:
                rows.append([goal, "neither reached it" if theirs["seconds"] is None else "not reached",
                             "not measured" if theirs["seconds"] is None else "**not met**"])
            elif theirs["seconds"] is None:
                # SyncAverage stopped at the cap without it: every epoch it ran ended later than this one's time.
                ran = max(run["curve"][-1]["seconds"] for run in sync["runs"])
                rows.append([goal, f"{_cell(mine['seconds'])} s; `sync` did not reach it in {ran:.0f} s "
                                   f"({_cell(final_accuracy(sync), '{:.4f}')} at its cap)",
                             _met(mine["reached"] == mine["seeds"] and mine["seconds"]["max"] < ran)])
            else:
                rows.append([goal, f"{_cell(mine['seconds'])} s vs {_cell(theirs['seconds'])} s",
                             _met(mine["seconds"]["median"] < theirs["seconds"]["median"])])
        rows.append(_final_row(name, res, tta, others))
    return rows


def _share(tta, name):
    return throughput(tta, tta["per_config"][name])["median"] / tta["ceiling"]["samples_per_second"]


def _overlap_rows(tta):
    """Streaming DiLoCo with overlap at ≥ 0.9 of the ceiling; every overlapped strategy at least at its twin's
    samples/s."""
    goal = f"Streaming DiLoCo with overlap, samples/s ÷ no-communication ceiling ≥ {CEILING_GOAL:g}"
    overlapped = [name for name in tta["per_config"] if streaming_with_overlap(name)]
    rows = [[goal, f"`{name}`: {_share(tta, name):.3f}", _met(_share(tta, name) >= CEILING_GOAL)]
            for name in overlapped if tta.get("ceiling")]
    if not rows:
        streaming = [n for n in tta["per_config"] if int(_flag(n, "--fragments") or 1) > 1]
        nearest = "; ".join(f"`{n}` (δ = 0): {_share(tta, n):.3f}" for n in streaming) if tta.get("ceiling") else ""
        rows.append([goal, "no configuration with overlap ran" + (f"; without it, {nearest}" if nearest else ""),
                     "not measured"])
    twins = [(name, twin) for name in tta["per_config"] for twin in tta["per_config"] if is_twin(name, twin)]
    for name, twin in twins:
        mine, theirs = (throughput(tta, tta["per_config"][n])["median"] for n in (name, twin))
        rows.append([f"`{name}` samples/s ≥ its twin `{twin}`'s", f"{mine:,.0f} vs {theirs:,.0f}",
                     _met(mine >= theirs)])
    if not twins:
        rows.append(["with δ ≥ 1, samples/s ≥ the twin's without overlap", "no configuration with overlap ran",
                     "not measured"])
    return rows


def goal_rows(results, targets, overlap=None, workload_target=WORKLOAD_TARGET):
    """One row per target (the time-to-accuracy targets) this page can read from ``results``: [goal, rate, measured, verdict].

    The workload's goals and the 1/3 are set at ``WORKLOAD_RATE``; the overlap goals there too, read from
    ``overlap`` (a run with the overlapped configurations and their twins) when given, else from ``results``."""
    rows = []
    ttas = results["time_to_accuracy_by_rate"]
    by_rate = {tta["link"]["nominal"]: tta for tta in ttas}
    for rate, tta in by_rate.items():
        if "sync" not in tta["per_config"]:
            rows.append(["every goal", rate, "no SyncAverage run to compare with", "not measured"])
            continue
        others = [t for t in ttas if t is not tta]
        found = _strategy_rows(tta, targets, others)
        if rate == WORKLOAD_RATE:
            overlapped = [t for t in (overlap or {}).get("time_to_accuracy_by_rate", [])
                          if t["link"]["nominal"] == rate] or [tta]
            found = (_workload_rows(tta, targets, workload_target) + _speed_rows(tta, targets) + found
                     + [row for t in overlapped for row in _overlap_rows(t)])
        rows += [[row[0], rate, *row[1:]] for row in found]
    for rate in [r for r in GOAL_RATES if r not in by_rate]:
        rows.append(["every goal", rate, "not run (no time to accuracy at this rate in the results)",
                     "not measured"])
    return rows


def config_rows(tta, targets):
    """Per configuration: times and epochs to each target, final accuracy, samples/s and its share of the ceiling."""
    ceiling = (tta.get("ceiling") or {}).get("samples_per_second")
    rows = []
    for name, res in tta["per_config"].items():
        cells = [f"`{name}`", f"{res['lr']:g}"]
        for target in targets:
            t = time_to(res, target)
            cells += [_cell(t["seconds"]), _cell(t["epochs"], "{:g}"), f"{t['reached']}/{t['seeds']}"]
        sps = throughput(tta, res)
        ran = epochs_run(res)
        cells += [_cell(ran, "{:g}"), _cell(final_accuracy(res), "{:.4f}"), _cell(sps, "{:,.0f}"),
                  "—" if not ceiling else f"{sps['median'] / ceiling:.3f}"]
        rows.append(cells)
    header = ["configuration", "lr"]
    for target in targets:
        header += [f"seconds to {target:g}", f"epochs to {target:g}", "seeds"]
    header += [f"epochs run (of {tta['epochs']})", "final accuracy", "samples/s", "÷ ceiling"]
    return table(header, rows, "ll" + "r" * (len(header) - 2))


def link_arithmetic(tta):
    """Why the ceiling is far: c, a step's compute, from the ceiling; T, SyncAverage's communication per step,
    from its epochs; the share a τ-strategy could reach if its whole communication were hidden, cτ/T."""
    if "sync" not in tta["per_config"] or not tta.get("ceiling"):
        return []
    c, sync_step = _sync_step(tta)
    t = sync_step - c
    return [f"At {tta['link']['nominal']}: a step computes in c = {1e3 * c:.1f} ms (per-rank batch "
            f"{tta['batch_per_rank']} at the ceiling's {tta['ceiling']['samples_per_second_per_rank']:,.0f} "
            f"samples/s per rank) and a SyncAverage step takes {1e3 * sync_step:.0f} ms (median over seeds), so "
            f"one synchronisation of the whole model costs T = {1e3 * t:.0f} ms on the link. A strategy that "
            f"synchronises every τ steps sends T/τ per step whatever its fragments (they spread the same bytes "
            f"over the period), so even with all of it hidden behind compute its share of the ceiling is at most "
            f"min(1, cτ/T): {min(1.0, 10 * c / t):.2f} at τ = 10; a share of {CEILING_GOAL:g} needs "
            f"τ ≥ {math.ceil(CEILING_GOAL * t / c)}. Without overlap it is c/(c + T/τ) = "
            f"{c / (c + t / 10):.2f} at τ = 10."]


def load(results_dir):
    with open(os.path.join(results_dir, "results.json")) as f:
        return json.load(f)


def merged(runs):
    """Several rated-link runs of one workload and topology as one: their rows, links and time-to-accuracy
    rates together, the fastest rate first (each rate's entry keeps its own cap and ceiling). Runs at the
    same rate are one rate's entry (``more_seeds``): the first run's, with the others' seeds added."""
    first = runs[0]
    models = [m for run in runs for m in run["models"]]
    by_rate = {}
    for tta in (t for run in runs for t in run["time_to_accuracy_by_rate"]):
        rate = tta["link"]["nominal"]
        by_rate[rate] = more_seeds(by_rate[rate], tta) if rate in by_rate else tta
    return dict(first, models=list(dict.fromkeys(models)),
                rows=[row for run in runs for row in run["rows"]],
                links=[link for run in runs for link in run.get("links", [])],
                time_to_accuracy_by_rate=sorted(by_rate.values(),
                                                key=lambda t: -t["link"].get("nominal_bits_per_second", 0)))


def more_seeds(tta, extra):
    """``tta`` with the seeds of ``extra`` (another launch at the same rate) its configurations lack.

    A seed both ran must have the same curve (within ``SAME_CURVE_POINTS`` pp an epoch): a seed fixes the
    arithmetic, so a second launch that computes it differently is not more of the same run (ValueError).
    The entry keeps ``tta``'s own cap, ceiling and learning rates; every figure of the page is per seed."""
    if (extra["epochs"], extra["batch_per_rank"], extra["model"]) != (tta["epochs"], tta["batch_per_rank"],
                                                                       tta["model"]):
        raise ValueError(f"runs at {tta['link']['nominal']} differ in epochs, batch or model: they cannot be "
                         "one rate's seeds")
    per_config = {name: dict(res) for name, res in tta["per_config"].items()}
    for name, res in extra["per_config"].items():
        mine = per_config.setdefault(name, dict(res, runs=[]))
        have = {run["seed"]: run for run in mine["runs"]}
        for run in res["runs"]:
            if run["seed"] not in have:
                mine["runs"] = [*mine["runs"], run]
            elif (curves_apart(have[run["seed"]]["curve"], run["curve"]) or 0.0) > SAME_CURVE_POINTS:
                raise ValueError(f"`{name}` seed {run['seed']} at {tta['link']['nominal']} differs between two "
                                 f"launches by more than {SAME_CURVE_POINTS:g} pp")
        mine["runs"] = sorted(mine["runs"], key=lambda run: run["seed"])
    return dict(tta, per_config=per_config)


def curves_apart(mine, theirs):
    """The largest gap in pp between two curves' accuracies over the epochs both ran (None if none)."""
    return max((100 * abs(a["accuracy"] - b["accuracy"]) for a, b in zip(mine, theirs)), default=None)


def _dirs(results_dirs):
    return (results_dirs,) if isinstance(results_dirs, str) else tuple(results_dirs)


def render(results_dirs=None, figures=None, overlap_dir=None):
    """The page: the runs, the goals, the table per rate, the plots.

    Args:
      results_dirs: a rated-link run's folder, or several (one a rate); default ``RESULTS_BY_RATE``, with the
        overlap goals from ``OVERLAP_RESULTS``.
      figures: the two PNG names (default from the first folder's name).
      overlap_dir: a run of the overlapped configurations, read for the overlap goals.
    """
    if results_dirs is None:
        results_dirs, overlap_dir = RESULTS_BY_RATE, overlap_dir or OVERLAP_RESULTS
    dirs = _dirs(results_dirs)
    runs = [load(d) for d in dirs]
    results = merged(runs)
    overlap = load(overlap_dir) if overlap_dir else None
    figures = figures or figure_names(os.path.basename(os.path.normpath(dirs[0])))
    ttas = results["time_to_accuracy_by_rate"]
    first = next((t for t in ttas if t["link"]["nominal"] == WORKLOAD_RATE), ttas[0])
    targets = targets_of(first)
    sources = [os.path.relpath(d, REPO_ROOT) for d in dirs]
    topology = results["topology"]
    sync_first = time_to(first["per_config"]["sync"], first["target"])["seconds"]
    checked = goal_rows(results, targets, overlap)
    lines = ["# Time to accuracy where communication dominates", "",
             _answer(first, checked), "",
             f"![test accuracy against training wall time, one panel per link rate, every seed thin and the "
             f"median bold](figures/{figures[0]})", "",
             f"<!-- Generated by `python -m benchmarks tta-report` from "
             + ", ".join(f"{source}/results.json" for source in sources)
             + (f" and {os.path.relpath(overlap_dir, REPO_ROOT)}/results.json" if overlap_dir else "")
             + "; do not edit by hand. -->", "",
             f"{curves.workload_name(first)} ([the workload](benchmarks.md#a-workload-where-communication-dominates)), "
             f"{topology['hosts']} hosts × "
             f"{topology['ranks_per_host']} rank on [the virtual cluster](virtual-cluster.md), "
             f"{topology['shaping']}, per-rank batch {first['batch_per_rank']}, {first['epochs']} epochs "
             f"at most (each run capped in training time), at "
             + " and ".join(f"{t['link']['nominal']} ({_seed_counts(t)}, cap {t['cap_seconds']:g} s)" for t in ttas)
             + ". The commands (each folder's `results.md` is its report, re-rendered from its results.json):", ""]
    for run in runs:
        lines += [f"    {run['command']}", ""]
    lines += ["Every figure is computed by `benchmarks/accuracy/tta_report.py` from the per-seed, per-epoch curves in "
              + ", ".join(f"`{source}/results.json`" for source in sources)
              + ": medians over the seeds with (min–max). A time to a target is the "
              "training wall time (slowest rank, no evaluation) at the end of the **first epoch at or above it**: "
              "accuracy is measured once per epoch and nothing is interpolated, so the target was crossed up to an "
              f"epoch earlier. A run's cap is checked at its epochs' ends, so its last epoch may overrun it. "
              f"{WORKLOAD_TARGET:g} is [the workload's target](benchmarks.md#a-workload-where-communication-"
              "dominates)"
              + ("; " + f"{first['target']:g}, the runs' own `--target`, is read from the same curves too: "
                 f"SyncAverage reached it in {sync_first['median']:.0f} s (median) at {first['link']['nominal']}, "
                 f"short of the workload's target of {SYNC_MINUTES[0]:g}–{SYNC_MINUTES[1]:g} minutes, which is why the "
                 "workload's target is the harder one. " if len(targets) > 1 and sync_first else ". ")
              + "Final accuracy is set against SyncAverage's after as many epochs, not at equal wall time. Where "
              "SyncAverage's cap stopped it sooner, its accuracy after those epochs is its run of the same seed at "
              "another rate, whose first epochs must equal this rate's (within "
              f"{SAME_CURVE_POINTS:g} pp): SyncAverage's arithmetic does not depend on the link. A second launch "
              "at a rate adds its seeds to that rate's configurations; a seed both launches ran must have the "
              "same curve.", ""]
    if overlap_dir:
        lines += [f"The overlap targets are read from [the overlap run](overlap-results.md) "
                  f"(`{os.path.relpath(overlap_dir, REPO_ROOT)}`: each overlapped configuration beside its twin, "
                  f"{overlap['time_to_accuracy_by_rate'][0]['seeds']} seeds).", ""]
    lines += ["## What was measured, against its target", "",
              table(["target", "rate", "measured", ""], checked, "llll"), ""]
    for tta in ttas:
        link = tta["link"]
        lines += [f"## {link['nominal']} ({link['measured_mbit']:,.0f} Mbit/s measured)", "",
                  config_rows(tta, targets), "",
                  f"Ceiling: no communication, {tta['ceiling']['samples_per_second']:,.0f} samples/s for "
                  f"{tta['np']} ranks ({tta['ceiling']['steps']} steps of one rank alone, the slowest rank's, "
                  f"× {tta['np']}). Samples/s: {tta['steps_per_epoch']} steps per epoch × "
                  f"{tta['batch_per_rank']} × {tta['np']} ranks per epoch, over the training seconds.", "",
                  *link_arithmetic(tta), ""]
    lines += ["## Plots", "",
              "The plot at the top of the page, test accuracy against training wall time, and:", "",
              f"![samples/s against the measured link rate: the throughput pass and the time-to-accuracy "
              f"epochs](figures/{figures[1]})", "",
              "The throughput plot's first panel is "
              + "; ".join(f"the {curves.throughput_model_name(m)}, {rated_links.throughput_pass(results, m)}"
                          for m in results["models"])
              + ". Those rows (`results.md`'s throughput tables) are the strategies' samples/s on that model; "
              "the workload above has its samples/s from its training epochs, in the last panel with the "
              "no-communication ceiling.", ""]
    return "\n".join(lines)


def _verdicts(rows):
    """How many of ``rows`` (goal_rows' or _overlap_rows') were met, of those measured."""
    measured = [row for row in rows if row[-1] != "not measured"]
    return sum(row[-1] == "met" for row in measured), len(measured)


def _answer(tta, checked):
    """The page's answer in a sentence, from the same curves as its tables: at the workload's rate, the
    fastest low-communication strategy's time to the workload's target against SyncAverage's."""
    met, measured = _verdicts(checked)
    ratio = _time_ratio(tta, WORKLOAD_TARGET)
    rate = tta["link"]["nominal"]
    if ratio is None:
        return f"At {rate}, not every strategy reached {WORKLOAD_TARGET:g}; {met} of {measured} targets met."
    share = ""
    if tta.get("ceiling"):
        c, step = _sync_step(tta)
        share = f", where a SyncAverage step spends {1 - c / step:.0%} of its time communicating"
    return (f"At {rate}{share}, `{ratio['best']}` reaches {WORKLOAD_TARGET:g} test accuracy in "
            f"{ratio['best_seconds']['median']:.0f} s of training against SyncAverage's "
            f"{ratio['sync_seconds']['median']:.0f} s ({ratio['value']:.2f} of its time; medians over the seeds). "
            f"{met} of {measured} targets met, at every rate below.")


def fragment_arithmetic(tta, hosts, params):
    """Whether one fragment can cross behind δ steps of compute, per Streaming DiLoCo with overlap: its
    4·N/F bytes, of which a host's link carries 2(H−1)/H, at the launch's measured rate, against δ·c with c
    from the ceiling. ``params``: the workload's N (benchmarks/costmodel/workloads.py)."""
    if not tta.get("ceiling"):
        return []
    c = tta["batch_per_rank"] / tta["ceiling"]["samples_per_second_per_rank"]
    rate = tta["link"]["measured_bits_per_second"] / 8
    lines = []
    for name in (n for n in tta["per_config"] if streaming_with_overlap(n)):
        tau, fragments, delta = (int(_flag(name, f)) for f in ("--tau", "--fragments", "--overlap"))
        fragment = 4 * params / fragments
        crossing = cost_model.allreduce_link_share(hosts) * fragment / rate
        lines.append(f"`{name}` (τ = {tau}, F = {fragments}, δ = {delta}): one fragment is 4·N/F = "
                     f"4·{params:,}/{fragments} = {fragment / 1e6:.2f} MB; a host's link carries 2(H−1)/H of it, "
                     f"{crossing:.2f} s at the measured {rate * 8 / 1e6:,.0f} Mbit/s. It has δ steps to cross in: "
                     f"δ·c = {delta} × {1e3 * c:.1f} ms = {delta * c:.2f} s of compute (c from the "
                     f"ceiling: per-rank batch {tta['batch_per_rank']} at "
                     f"{tta['ceiling']['samples_per_second_per_rank']:,.0f} samples/s), {delta * c / crossing:.1f}× "
                     "the crossing. The margin is this machine's: a faster CPU shrinks c, and with it δ·c.")
    return lines


def render_overlap(results_dir=OVERLAP_RESULTS, figures=None):
    """The overlap page: twins with and without ``--overlap`` on the rated link, no SyncAverage in the run.

    The goals read are the overlap ones (``_overlap_rows``): each twin's samples/s, and Streaming DiLoCo with
    overlap against the no-communication ceiling."""
    results = load(results_dir)
    figures = figures or figure_names(os.path.basename(os.path.normpath(results_dir)))
    targets = targets_of(results["time_to_accuracy_by_rate"][0])
    source = os.path.relpath(results_dir, REPO_ROOT)
    first = results["time_to_accuracy_by_rate"][0]
    checked = _overlap_rows(first)
    met, measured = _verdicts(checked)
    twins = [(name, twin) for name in first["per_config"] for twin in first["per_config"] if is_twin(name, twin)]
    speedups = [throughput(first, first["per_config"][name])["median"]
                / throughput(first, first["per_config"][twin])["median"] for name, twin in twins]
    answer = (f"At {first['link']['nominal']}, letting each sync cross behind the next δ steps of compute gives "
              + (f"{min(speedups):.2f}–{max(speedups):.2f}× the samples/s of the same strategy without overlap "
                 f"({len(twins)} pairs)" if speedups else "no pair to compare")
              + f"; {met} of {measured} targets met.")
    lines = ["# Overlap on a rated link: each strategy beside its twin without overlap", "",
             answer, "",
             f"![test accuracy against training wall time](figures/{figures[0]})", "",
             f"<!-- Generated by `python -m benchmarks tta-report --results {source} --page "
             f"{os.path.relpath(OVERLAP_PAGE, REPO_ROOT)}` from {source}/results.json; do not edit by hand. -->", "",
             f"{curves.workload_name(first)}, the workload of [time to accuracy](time-to-accuracy.md), "
             f"{results['topology']['hosts']} hosts × {results['topology']['ranks_per_host']} rank, "
             f"{results['topology']['shaping']}, per-rank batch {first['batch_per_rank']}, {first['epochs']} epochs, "
             f"{first['seeds']} seed(s). The started allreduce runs on the communicator's worker thread while the "
             "next δ steps compute ([Overlap](strategy-options.md#overlap-overlap-delta)). Command:", "",
             f"    {results['command']}", "",
             "Computed by `benchmarks/accuracy/tta_report.py` from the per-epoch curves in "
             f"`{source}/results.json`, as on the time-to-accuracy page (first epoch at or above a target, "
             "nothing interpolated).", "",
             "## Overlap: what was measured, against its target", ""]
    for tta in results["time_to_accuracy_by_rate"]:
        lines += [table(["target", "measured", ""], _overlap_rows(tta), "lll"), "",
                  f"## {tta['link']['nominal']} ({tta['link']['measured_mbit']:,.0f} Mbit/s measured)", "",
                  config_rows(tta, targets), "",
                  f"Ceiling: no communication, {tta['ceiling']['samples_per_second']:,.0f} samples/s for "
                  f"{tta['np']} ranks. Samples/s: {tta['steps_per_epoch']} steps per epoch × "
                  f"{tta['batch_per_rank']} × {tta['np']} ranks per epoch, over the training seconds.", "",
                  *fragment_arithmetic(tta, results["topology"]["hosts"], workloads.models()["overlap_mlp"].params),
                  ""]
    lines += ["## Plots", "",
              "The plot at the top of the page, test accuracy against training wall time, and:", "",
              f"![samples/s against the measured link rate](figures/{figures[1]})", ""]
    return "\n".join(lines)


def figure_names(name):
    """The PNGs of results folder ``name`` in benchmarks/figures/."""
    return (f"{name}_time_to_accuracy.png", f"{name}_throughput_vs_link_rate.png")


def write_plots(results_dirs, figures_dir=FIGURES):
    """The two PNGs of the page, into ``figures_dir``, from one run's folder or several (one a rate; matplotlib
    loads here only)."""
    from ..suite import plots

    dirs = _dirs(results_dirs)
    results = merged([load(d) for d in dirs])
    first, second = figure_names(os.path.basename(os.path.normpath(dirs[0])))
    targets = targets_of(results["time_to_accuracy_by_rate"][0])
    return (plots.time_to_accuracy_by_rate(results["time_to_accuracy_by_rate"], figures_dir, first, targets)
            + plots.throughput_vs_link_rate(results, figures_dir, second))


def render_results_md(results_dir):
    """The run's own report again, from its results.json."""
    return rated_links.markdown(load(results_dir))


def main(argv=None, prog="python -m benchmarks tta-report"):
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--results", action="append", metavar="DIR",
                   help="a rated-link run's folder, with its results.json; repeat it for one run a rate "
                        "(default docs/results/tta_teacher and docs/results/tta_teacher_10mbit, with the overlap "
                        "goals from docs/results/overlap_teacher)")
    p.add_argument("--page", default=PAGE, help="the page to write (default docs/time-to-accuracy.md)")
    p.add_argument("--no-page", action="store_true", help="rewrite results.md only (and no plots)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if results.md or the page differs from its render")
    args = p.parse_args(argv)
    dirs = args.results or list(RESULTS_BY_RATE)
    for folder in dirs:
        if not os.path.isfile(os.path.join(folder, "results.json")):
            print(f"{prog}: `--results` must be a folder with a results.json. Received: --results={folder}",
                  file=sys.stderr)
            return 2
    outputs = [(os.path.join(folder, "results.md"), render_results_md(folder)) for folder in dirs]
    if not args.no_page:
        with_sync = "sync" in load(dirs[0])["time_to_accuracy_by_rate"][0]["per_config"]
        if not with_sync:
            page = render_overlap(dirs[0])
        else:
            page = render(None if args.results is None else dirs)
        outputs.append((args.page, page))
    if args.check:
        stale = []
        for path, text in outputs:
            with open(path) as f:
                if f.read() != text:
                    stale.append(path)
        for path in stale:
            print(f"stale: {path}", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs:
        with open(path, "w") as f:
            f.write(text)
        print(path)
    if not args.no_page:
        for name in write_plots(dirs if with_sync else dirs[0]):
            print(os.path.join(FIGURES, name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
