"""PNG plots of a results.json (matplotlib, Agg backend: no display needed).

* ``throughput_<model>.png``: samples/s per configuration, one bar per
  (np, controller), error bars from the min to the max repeat;
* ``accuracy_vs_time.png``: test accuracy against training wall time, mean
  over seeds, one line per strategy;
* ``bytes_per_sample.png``: measured payload bytes per sample next to the
  analytic expectation;
* ``throughput_vs_link_rate.png`` (rated-link runs): samples/s against the
  measured link rate, one line per configuration, a panel per throughput
  pass and one of the time-to-accuracy epochs;
* ``time_to_accuracy_by_rate.png`` (rated-link runs with time to accuracy):
  test accuracy against wall time, one panel per link rate, every seed thin
  and the per-epoch median bold.
"""
import os
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, NullFormatter, ScalarFormatter  # noqa: E402

from .curves import mean_curve, samples_per_second, throughput_model_name, workload_name  # noqa: E402
from .runner import summary  # noqa: E402

ORDER = ("no_comm", "raw_horovod", "sync", "easgd_tau4", "easgd_tau10", "easgd_tau10_overlap", "accum4_sync",
         "sync_two_level", "hier_easgd_tau10", "periodic_tau10", "diloco_tau10",
         "raw_horovod_fit", "sync_fit", "mwms_fit")


def _save(fig, ax, path, axis="both"):
    """The finish every plot shares: legend, grid, tight layout, PNG, close."""
    ax.legend(fontsize=8)
    ax.grid(axis=axis, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _save_panels(fig, axes, path):
    """The finish of a figure of several panels: a legend and grid in each; returns [its file name]."""
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [os.path.basename(path)]


def _configs(rows):
    present = {r["config"] for r in rows}
    return [c for c in ORDER if c in present] + sorted(present - set(ORDER))


def throughput(rows, model, path):
    rows = [r for r in rows if r["model"] == model]
    if not rows:
        return None
    configs = _configs(rows)
    groups = sorted({(r["np"], r["controller"]) for r in rows})
    width = 0.8 / len(groups)
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(configs)), 4.5))
    for g, (np_, controller) in enumerate(groups):
        xs, heights, low, high = [], [], [], []
        for i, config in enumerate(configs):
            row = next((r for r in rows if r["config"] == config and (r["np"], r["controller"]) == (np_, controller)),
                       None)
            if row is None:
                continue
            s = row["samples_per_sec"]
            xs.append(i - 0.4 + width * (g + 0.5))
            heights.append(s["median"])
            low.append(s["median"] - s["min"])
            high.append(s["max"] - s["median"])
        ax.bar(xs, heights, width, yerr=[low, high], capsize=3, label=f"np={np_} {controller}")
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels(configs, rotation=30, ha="right")
    ax.set_ylabel("samples/s (median; bars: min–max)")
    ax.set_title(f"Throughput, {model}")
    return _save(fig, ax, path, axis="y")


def _accuracy_curves(ax, tta, title):
    for name, res in tta["per_config"].items():
        seconds, accuracy = mean_curve(res["runs"])
        ax.plot(seconds, accuracy, marker="o", markersize=3, label=name)
    ax.axhline(tta["target"], color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("training wall time, s (mean over seeds)")
    ax.set_ylabel("test accuracy (the kept model)")
    ax.set_title(title)
    ax.set_ylim(max(0.0, min(ax.get_ylim()[0], 0.5)), 1.0)


def accuracy_vs_time(tta, path):
    if not tta:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _accuracy_curves(ax, tta, f"{workload_name(tta)}, np={tta['np']} {tta['controller']}, {tta['seeds']} seeds")
    return _save(fig, ax, path)


def _median_curve(runs):
    """Per epoch (over the epochs every seed trained): the median over seeds of the wall time and of the accuracy."""
    length = min(len(r["curve"]) for r in runs)
    return ([statistics.median(r["curve"][e]["seconds"] for r in runs) for e in range(length)],
            [statistics.median(r["curve"][e]["accuracy"] for r in runs) for e in range(length)])


def _seed_curves(ax, tta, targets):
    """One colour per configuration: each seed's measured epochs as a thin line, their per-epoch median bold;
    each target a grey line."""
    for name, res in tta["per_config"].items():
        seconds, accuracy = _median_curve(res["runs"])
        line, = ax.plot(seconds, accuracy, marker="o", markersize=3, linewidth=2, label=f"{name} (median)")
        for run in res["runs"]:
            ax.plot([p["seconds"] for p in run["curve"]], [p["accuracy"] for p in run["curve"]],
                    color=line.get_color(), linewidth=0.7, alpha=0.45)
    for target, style in zip(targets, ("--", ":")):
        ax.axhline(target, color="grey", linestyle=style, linewidth=1)
        ax.annotate(f"target {target:g}", (1.0, target), xycoords=("axes fraction", "data"), ha="right",
                    va="bottom", fontsize=7, color="grey")


def _plain_log_ticks(ax, axis="x", steps=(1, 2, 5)):
    """Plain numbers at ``steps`` of each decade on a log ``axis`` (seconds at 1-2-5; a loss's range under a
    decade takes finer steps): its default labels a range under a decade only at its minor ticks, as 3×10¹,
    4×10¹, ..., which overlap, or by the one power of ten inside it (10⁰)."""
    low, high = ax.get_xlim() if axis == "x" else ax.get_ylim()
    ticks = [m * 10 ** e for e in range(-2, 6) for m in steps if low <= m * 10 ** e <= high]
    scale = ax.xaxis if axis == "x" else ax.yaxis
    scale.set_major_locator(FixedLocator(ticks))
    scale.set_major_formatter(ScalarFormatter())
    scale.set_minor_formatter(NullFormatter())


def time_to_accuracy_by_rate(ttas, out_dir, name="time_to_accuracy_by_rate.png", targets=None):
    """Test accuracy against training wall time, one panel per link rate; per seed thin, median bold.

    Args:
      ttas: the run's ``time_to_accuracy_by_rate``.
      out_dir: where the PNG goes.
      name: its file name.
      targets: the accuracies drawn as lines (default: each run's own target).

    Returns:
      [the file name], or [] when no rate was timed to accuracy.
    """
    if not ttas:
        return []
    fig, axes = plt.subplots(1, len(ttas), figsize=(7 * len(ttas), 4.8), squeeze=False)
    for ax, tta in zip(axes[0], ttas):
        link = tta["link"]
        _seed_curves(ax, tta, targets or (tta["target"],))
        ax.set_xscale("log")
        _plain_log_ticks(ax)
        ax.set_xlabel("training wall time, s (log scale; slowest rank, no evaluation)")
        ax.set_ylabel("test accuracy (the kept model)")
        ax.set_title(f"{workload_name(tta)}, {link['nominal']} ({link['measured_mbit']:,.0f} Mbit/s measured), "
                     f"np={tta['np']}, {tta['seeds']} seeds", fontsize=9)
        ax.set_ylim(max(0.0, min(ax.get_ylim()[0], 0.5)), 1.0)
    return _save_panels(fig, axes[0], os.path.join(out_dir, name))


def bytes_per_sample(rows, path):
    rows = [r for r in rows if r["np"] > 1 and r["bytes_per_sample"] is not None and r["loop"] == "custom"]
    if not rows:
        return None
    first = min((r["np"], r["controller"]) for r in rows)
    rows = [r for r in rows if (r["np"], r["controller"]) == first]
    labels = [f"{r['config']}\n{r['model']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(rows)), 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["bytes_per_sample"] for r in rows], 0.4, label="measured (comm.account())")
    ax.bar([x + 0.2 for x in xs], [r["expected_bytes_per_sample"] for r in rows], 0.4, label="analytic")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("payload bytes per sample, per rank")
    ax.set_title(f"Communication, np={first[0]} {first[1]}")
    return _save(fig, ax, path, axis="y")


def write_all(results, out_dir):
    made = [throughput(results["rows"], model, os.path.join(out_dir, f"throughput_{model}.png"))
            for model in ("cnn", "resnet")]
    made.append(accuracy_vs_time(results.get("time_to_accuracy"), os.path.join(out_dir, "accuracy_vs_time.png")))
    made.append(bytes_per_sample(results["rows"], os.path.join(out_dir, "bytes_per_sample.png")))
    return [os.path.basename(p) for p in made if p]


def _errorbar(ax, points, **style):
    """``points``: (rate, summary) pairs; the median with a min–max bar."""
    points = sorted(points, key=lambda p: p[0])
    y = [p[1]["median"] for p in points]
    err = [[m - p[1]["min"] for p, m in zip(points, y)], [p[1]["max"] - m for p, m in zip(points, y)]]
    ax.errorbar([p[0] for p in points], y, yerr=err, marker="o", capsize=3, **style)


def throughput_vs_link_rate(results, out_dir, name="throughput_vs_link_rate.png"):
    """``throughput_vs_link_rate.png``: samples/s against the measured link rate, one line per
    configuration: a panel per model of the throughput passes and, where the run timed accuracy,
    one of the time-to-accuracy workload's training epochs (with the no-communication ceiling)."""
    rows = results["rows"]
    models = [m for m in results["models"] if any(r["model"] == m for r in rows)]
    # Samples/s of the epochs need their steps (results from before the worker recorded them have none).
    ttas = [tta for tta in results.get("time_to_accuracy_by_rate") or [] if "steps_per_epoch" in tta]
    panels = len(models) + (1 if ttas else 0)
    if not panels:
        return []
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.5), squeeze=False)
    topology = results["topology"]
    hosts = f"{topology['hosts']} hosts × {topology['ranks_per_host']} rank"
    for ax, model in zip(axes[0], models):
        model_rows = [r for r in rows if r["model"] == model]
        for config in _configs(model_rows):
            _errorbar(ax, [(r["link"]["measured_mbit"], r["samples_per_sec"]) for r in model_rows
                           if r["config"] == config], label=config)
        ax.set_title(f"throughput pass: {throughput_model_name(model)}, {hosts}", fontsize=9)
    if ttas:
        ax = axes[0][len(models)]
        for config in _configs([{"config": c} for c in ttas[0]["per_config"]]):
            _errorbar(ax, [(tta["link"]["measured_mbit"],
                            summary([samples_per_second(tta, run) for run in tta["per_config"][config]["runs"]]))
                           for tta in ttas if config in tta["per_config"]], label=config)
        ceilings = sorted((tta["link"]["measured_mbit"], tta["ceiling"]["samples_per_second"])
                          for tta in ttas if tta.get("ceiling"))
        if ceilings:
            ax.plot(*zip(*ceilings), color="grey", linestyle="--", marker="_", markersize=14,
                    label="no communication (ceiling)")
        ax.set_title(f"time-to-accuracy epochs: {workload_name(ttas[0])}, {hosts}", fontsize=9)
    for ax in axes[0]:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("link rate, measured (Mbit/s)")
        ax.set_ylabel("samples/s (all ranks; median, bars min–max)")
    return _save_panels(fig, axes[0], os.path.join(out_dir, name))
