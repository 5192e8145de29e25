"""One slow rank, with and without ``--balance speed``: ``python -m benchmarks slow-rank``.

    python -m benchmarks slow-rank --out docs/results/slow-rank-lm-np2                 # diloco, 2 ranks, 3 seeds
    python -m benchmarks slow-rank --strategies diloco,periodic --seeds 1 --out DIR
    python -m benchmarks slow-rank --curves --seeds 6 --out docs/results/slow-rank-lm-np2-curves  # 8 short epochs
    python -m benchmarks slow-rank --curves --seeds 6 --configurations diloco,diloco_nudged --out DIR
    python -m benchmarks slow-rank --curves --seeds 6 --flags "--outer-momentum 0.5" --out DIR  # another setting
    python -m benchmarks slow-rank --render DIR          # rewrite DIR/slow-rank.md from DIR's runs

The language model (``--data python_docs``) at train.py's defaults, under each
strategy, five ways, each run for seeds 0..N-1 under ``horovodrun -np N``:

- ``S``: every rank at its own speed, equal shares (train.py's default);
- ``S_balance``: the same ranks under ``--balance speed``;
- ``S_slow``: the last rank made twice as slow (each of its steps takes twice
  as long: the test hook ``HVD_EASGD_TEST_SLOW_RANKS`` adds c seconds per
  sample, c the per-rank compute per sample of ``S``'s seed-0 run: ``slow_hook``), equal shares:
  what every strategy does today;
- ``S_slow_balance``: the same slow rank under ``--balance speed``;
- ``S_nudged``: every rank at its own speed, the shares set by hand one sample off
  equal (rank 0 takes one of the last rank's: ``nudged_shares``): a null comparison,
  what a change of the shares does to the loss where no rank is slow.

``--configurations`` runs some of them (each with its strategy's ``S``, which every
figure is read against); ``--flags`` adds train.py flags to every run (another
setting of the strategy, e.g. its outer momentum), kept in runs.json so that
one folder never mixes two settings.

Every run trains the same tokens (one epoch). With ``--curves`` every run trains ``CURVE_EPOCHS`` epochs of the
first 500 kB of the Python docs instead (the corpus of ``time-to-target``), so that its validation loss is
measured after each, and the report draws them against training wall time (``PLOT``). The hook sleeps, so the slow
rank's core idles as a slow device leaves the others alone; that emulates N
independent devices only where each rank has a core of its own
(``sample_shares.pace``), so ``--np`` defaults to 2, this machine's cores, and
should not exceed the cores where it runs. The sum of the ranks' own speeds is
then ``S``'s throughput × (N − 1/2)/N.

The goals (issue 42), on the means over seeds:

- ``S_slow_balance``'s throughput at least 0.9 × the sum of the ranks' own speeds;
  its final validation loss within 1.5 % of ``S``'s;
- ``S_balance`` costs at most 3 % against ``S``: its throughput at least 0.97 ×
  ``S``'s and its loss at most 1.03 × (it costs nothing where it is not needed;
  a faster run or a lower loss is no cost, so the bound is one-sided).

The table, ``OUT/slow-rank.md``, is rendered from each run's metrics.json
(``render``), never typed. This process never imports TensorFlow.
"""
import json
import os
import statistics
import sys

import yaml

from . import time_to_target
from .slow_hook import HOOK, SLOW_FACTOR, SlowRankLaunch, hook_setting
from .study import (LocalLaunch, Variant, continue_runs, data_under_out, docs_link, kept_runs, parsed, parser,
                    run_or_render, write_rendered)
from ..suite.runner import table

TABLE = "slow-rank.md"
PLOT = "loss_vs_time.png"  # with --curves
DATA = ("--data", "python_docs")
CURVE_EPOCHS = 8
THROUGHPUT_GOAL = 0.9  # of the sum of the ranks' own speeds
LOSS_RELATIVE = 0.015  # of the equal ranks' loss
NEEDLESS_RELATIVE = 0.03  # --balance speed on equal ranks: at most this much slower, or higher in loss, than without
MICRO_BATCH = 32  # train.py's samples per rank and step on the language model (config.DEFAULT_BATCH_SIZE)


def nudged_shares(np_):
    """The shares of ``S_nudged``: equal but for one sample that rank 0 takes from the last rank."""
    return [MICRO_BATCH + 1] + [MICRO_BATCH] * (np_ - 2) + [MICRO_BATCH - 1]


def variants(strategies, data=DATA, np_=2, extra=()):
    """``(equal-speed variants, slow-rank variants)`` of each strategy at train.py's defaults but for ``extra``
    (train.py's flags for every run), on ``data`` (train.py's flags of what to train), at ``np_`` ranks."""
    equal, slow = [], []
    # --sample-shares is the flag a resume passes --balance speed's shares back with: set by hand, it
    # skips the start-up measurement
    nudged = ("--balance", "speed", "--sample-shares", json.dumps(nudged_shares(np_), separators=(",", ":")))
    for strategy in strategies:
        flags = (*data, "--strategy", strategy, *extra)
        equal += [Variant(strategy, flags), Variant(f"{strategy}_balance", (*flags, "--balance", "speed")),
                  Variant(f"{strategy}_nudged", (*flags, *nudged))]
        slow += [Variant(f"{strategy}_slow", flags),
                 Variant(f"{strategy}_slow_balance", (*flags, "--balance", "speed"))]
    return equal, slow


def strategy_of(name):
    """The strategy of the configuration ``name`` (``diloco`` of ``diloco_slow_balance``): the ``S`` it is read
    against."""
    return name.split("_")[0]


def is_slow(name):
    """Whether the configuration ``name`` runs with the slow rank (``slow_hook.SlowRankLaunch`` sets the hook
    for it)."""
    return "_slow" in name


def parse_args(argv, prog):
    p = parser(prog, __doc__, TABLE, timeout=2400)
    p.add_argument("--strategies", default="diloco", help="comma-separated: diloco, periodic, sync (default diloco)")
    p.add_argument("--curves", action="store_true",
                   help=f"train {CURVE_EPOCHS} epochs of the first 500 kB of the Python docs instead of one of "
                        "all, and plot each run's validation loss after every epoch")
    p.add_argument("--configurations", metavar="NAMES",
                   help="comma-separated configurations to run, each with its strategy's S, e.g. diloco,diloco_nudged "
                        "(default: all)")
    p.add_argument("--flags", default="", help="more train.py flags for every run, e.g. \"--outer-momentum 0.5\" "
                                               "(kept in runs.json: a folder holds the runs of one setting)")
    args = parsed(p, argv, min_np=2)
    if args.render:
        return args
    args.strategy_list = args.strategies.split(",")
    unknown = [s for s in args.strategy_list if s not in ("diloco", "periodic", "sync")]
    if unknown:
        p.error(f"--strategies must be chosen from diloco, periodic, sync. Received: {','.join(unknown)}")
    names = [v.name for v in sum(variants(args.strategy_list, np_=args.np), [])]
    args.configuration_list = args.configurations.split(",") if args.configurations else names
    unknown = [c for c in args.configuration_list if c not in names]
    unread = sorted({strategy_of(c) for c in args.configuration_list} - set(args.configuration_list))
    if unknown or unread:
        p.error(f"--configurations must be chosen from {', '.join(names)}, with each one's strategy (every figure "
                f"is read against it). Received: --configurations={args.configurations}")
    return args


def main(argv=None, prog="python -m benchmarks slow-rank"):
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)
    return run_or_render(args, write_table, lambda out: run(args, out))


def run(args, out):
    """The equal-speed runs first, then each strategy's slow ones, its hook set from its equal run's speed;
    returns the failures."""
    os.makedirs(out, exist_ok=True)
    index = {"workload": "language_model", "np": args.np, "strategies": args.strategies}
    data = DATA
    if args.curves:
        # time-to-target's corpus, written under OUT/data as it writes it
        data = ("--data", time_to_target.WORKLOADS["language_model"].write_data(out), "--epochs", str(CURVE_EPOCHS))
        index["curves"] = True
    if args.flags:
        index["flags"] = args.flags
    equal, slow = ([v for v in group if v.name in args.configuration_list]
                   for group in variants(args.strategy_list, data, args.np, tuple(args.flags.split())))
    failures = continue_runs(out, index, equal, args.np, args.seeds, args.timeout, "slow-rank", shown=shown,
                             launch=SlowRankLaunch(LocalLaunch(args.np), "", is_slow))
    for strategy in args.strategy_list:
        mine = [v for v in slow if strategy_of(v.name) == strategy]
        if not mine:
            continue
        setting = hook_setting(out, strategy, args.np)
        print(f"[slow-rank] {strategy}: {HOOK}={setting}", flush=True)
        failures += continue_runs(out, index, mine, args.np, args.seeds, args.timeout, "slow-rank", shown=shown,
                                  launch=SlowRankLaunch(LocalLaunch(args.np), setting, is_slow))
    return failures


def shown(metrics):
    """What a progress line says of a finished run."""
    final = metrics["final"]
    return f"final validation loss {final['test_loss']:.4f}, {final['samples_per_sec']:.1f} samples/s"


def write_table(directory):
    """Renders ``directory``'s table into its slow-rank.md (and its plot, for runs of several epochs);
    returns the table."""
    plot(directory)
    return write_rendered(directory, TABLE, render)


def render(directory):
    """The Markdown table: per configuration, throughput and final validation loss over seeds (median,
    min–max, mean), against the equal-speed run's means and the sum of the ranks' own speeds, and the
    goals judged on the means (from 3 seeds on)."""
    index, runs = kept_runs(directory)
    np_ = index["np"]
    found = {}
    for run, metrics in runs:
        entry = found.setdefault(run["variant"], {"speed": [], "loss": [], "shares": [], "command": run["command"]})
        entry["speed"].append(metrics["final"]["samples_per_sec"])
        entry["loss"].append(metrics["final"]["test_loss"])
        if run["variant"].endswith(("_balance", "_nudged")):
            entry["shares"].append(_chosen_shares(os.path.join(directory, run["run"])))
    rows, answers = [], []
    for name, entry in found.items():
        strategy = strategy_of(name)
        base = found.get(strategy)
        speed, loss = statistics.fmean(entry["speed"]), statistics.fmean(entry["loss"])
        ideal = statistics.fmean(base["speed"]) * ((np_ - 1 + 1 / SLOW_FACTOR) / np_ if is_slow(name) else 1)
        loss_vs = (loss - statistics.fmean(base["loss"])) / statistics.fmean(base["loss"])
        goals = []
        if len(entry["loss"]) >= 3 and name != strategy:
            if name.endswith("_slow_balance"):
                goals = [f"≥ {THROUGHPUT_GOAL:g} of the sum " + ("met" if speed >= THROUGHPUT_GOAL * ideal
                                                                 else "**missed**"),
                         f"loss within {100 * LOSS_RELATIVE:g} % " + ("met" if loss_vs <= LOSS_RELATIVE
                                                                      else "**missed**")]
            elif name.endswith("_balance"):
                cheap = speed / ideal >= 1 - NEEDLESS_RELATIVE and loss_vs <= NEEDLESS_RELATIVE
                goals = [f"costs ≤ {100 * NEEDLESS_RELATIVE:g} % against `{strategy}` "
                         + ("met" if cheap else "**missed**")]
        rows.append([f"`{name}`", _spread(entry["speed"], "{:,.1f}"), f"{speed / ideal:.2f}",
                     _spread(entry["loss"], "{:.4f}"), f"{100 * loss_vs:+.2f} %" if name != strategy else "—",
                     "; ".join(goals) or _no_goal(name, strategy, entry)])
        if is_slow(name):
            answers.append(f"`{name}` runs at {speed / ideal:.2f} of the sum of the ranks' own speeds")
        if name.endswith("_nudged"):
            answers.append(f"with no rank slow, one sample moved between the ranks (`{name}`) ends "
                           f"{100 * loss_vs:+.2f} % from `{strategy}`'s validation loss on the mean of "
                           f"{len(entry['loss'])} seeds")
    header = ["configuration", "samples/s, median (min–max)", "of the sum of own speeds",
              "validation loss, median (min–max)", "mean vs equal ranks", "goals"]
    lead = ("; ".join(answers) + ".") if answers else ""
    lead = lead[:1].upper() + lead[1:]
    command = data_under_out(next(iter(found.values()))["command"]) if found else ""
    lines = [lead, "", f"{np_} ranks, train.py's defaults on the language model otherwise; commands "
             f"like `{command}`" + (" (OUT: the results folder)." if "OUT/data/" in command else "."), "",
             table(header, rows, "lrrrrl")]
    chosen = [f"`{name}` {', '.join(_shown_shares(s) for s in entry['shares'])}"
              for name, entry in found.items() if entry["shares"] and name.endswith("_balance")]
    if chosen:
        lines += ["", "The shares of the global batch `--balance speed` chose at start-up (rank 0 first), seed by "
                      f"seed: {'; '.join(chosen)}."]
    paired = _paired(runs)
    if paired:
        lines += ["", paired]
    if _has_curves(runs):
        lines += ["", f"![validation loss against training wall time]({docs_link(directory, PLOT)})"]
    return "\n".join(lines) + "\n"


def _paired(runs):
    """Seed by seed, each ``S_slow_balance``'s and ``S_nudged``'s final validation loss against ``S``'s of the
    same seed (the same initial weights and the same global batches: a paired comparison, which the means over
    seeds hide), a sentence each; "" without such pairs."""
    loss = {(run["variant"], run["seed"]): metrics["final"]["test_loss"] for run, metrics in runs}
    sentences = []
    for variant in dict.fromkeys(run["variant"] for run, _ in runs):
        if not variant.endswith(("_slow_balance", "_nudged")):
            continue
        base = strategy_of(variant)
        seeds = sorted(seed for name, seed in loss if name == variant and (base, seed) in loss)
        if seeds:
            sentences.append(f"`{variant}`'s final validation loss against `{base}`'s of the same seed (the same "
                             "initial weights and global batches), seed by seed: " + ", ".join(
                                 f"{seed}: {100 * (loss[variant, seed] / loss[base, seed] - 1):+.2f} %"
                                 for seed in seeds) + ".")
    return " ".join(sentences)


def _has_curves(runs):
    return any(len(metrics.get("epochs", ())) > 1 for _, metrics in runs)


def plot(directory):
    """``PLOT``: each run's validation loss after every epoch against its training wall time, a panel per
    strategy, a colour per configuration; nothing for runs of one epoch."""
    _, runs = kept_runs(directory)
    if not _has_curves(runs):
        return None
    from ..suite import plots

    strategies = list(dict.fromkeys(strategy_of(run["variant"]) for run, _ in runs))
    fig, axes = plots.plt.subplots(1, len(strategies), figsize=(7 * len(strategies), 4.5), squeeze=False)
    colours = {}
    for run, metrics in runs:
        ax = axes[0][strategies.index(strategy_of(run["variant"]))]
        points = time_to_target.curve(metrics)
        first = run["variant"] not in colours
        line, = ax.plot(*zip(*points), marker="o", markersize=3, linewidth=1.2, color=colours.get(run["variant"]),
                        label=run["variant"] if first else None)
        colours.setdefault(run["variant"], line.get_color())
    for ax, strategy in zip(axes[0], strategies):
        ax.set_xlabel("training wall time, s")
        ax.set_ylabel("validation loss, nats/token")
        slow = any(is_slow(run["variant"]) and strategy_of(run["variant"]) == strategy for run, _ in runs)
        ax.set_title(f"{strategy}: {'one rank 2x slow, and none' if slow else 'no rank slow'}; every seed a line",
                     fontsize=9)
    plots._save_panels(fig, axes[0], os.path.join(directory, PLOT))
    return PLOT


def _chosen_shares(run_dir):
    """The per-rank samples of a step that ``--balance speed`` chose, or was given by hand (config.yaml's
    ``sample_shares``), or None."""
    with open(os.path.join(run_dir, "config.yaml")) as f:
        return yaml.safe_load(f)["config"].get("sample_shares")


def _no_goal(name, strategy, entry):
    if name == strategy:
        return "— (the equal ranks)"
    if name.endswith("_slow"):
        return "— (equal shares: today's pace)"
    if name.endswith("_nudged"):
        shares = ", ".join(dict.fromkeys(_shown_shares(s) for s in entry["shares"]))
        return f"— (no rank slow, shares {shares} set by hand: a null comparison)"
    return f"not judged ({len(entry['loss'])} of 3 seeds)"


def _shown_shares(shares):
    return " + ".join(map(str, shares)) if shares else "?"


def _spread(values, fmt):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


if __name__ == "__main__":
    sys.exit(main())
