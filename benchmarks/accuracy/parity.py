"""Does a strategy keep the model's quality on a real workload? ``python -m benchmarks parity``.

    python -m benchmarks parity --workload language_model --out docs/results/parity-language-model-np2
    python -m benchmarks parity --workload language_model --np 4 --configurations sync,diloco_tau10 --out DIR
    python -m benchmarks parity --workload fashion_mnist --out docs/results/parity-fashion-mnist-np2
    python -m benchmarks parity --render DIR       # rewrite DIR/parity.md from DIR's runs (no launch)
    python -m benchmarks parity-by-np --out OUT DIR DIR ...   # folders at several --np side by side (parity_by_np.py)

Each configuration is a set of ``train.py`` flags on the workload's data at
train.py's defaults otherwise (the model, optimizer, schedule, epochs and
collectives a user gets), run for seeds 0..N-1 under ``horovodrun -np N``
(``study.continue_runs``: one launch at a time, each bounded). Every run
trains the same epochs, so the same tokens or images: the language model
a budget of passes over its training split's tokens (``--budget``, 2.5 by
default: SyncAverage's loss has flattened by its end; ``budget_flags``),
Fashion-MNIST train.py's epochs. A budgeted folder's table reads every
configuration at one pass and at the budget, and ``curves.png`` plots the
validation loss against tokens (``plot``). The run's own
config.yaml and metrics.json are kept in ``OUT/<configuration>-seed<S>/`` and
``OUT/runs.json`` names every command; the table, ``OUT/parity.md``, is
rendered from them (``render``), never typed, and the workload's docs page
includes it. Invoked again with the same ``--out`` (and more ``--seeds``), it
continues: the runs already kept are not made again. A configuration that
cannot run at ``--np`` (two groups of 4 ranks below 8) is left out of the
default set there, and refused in one line when named (``runs_at``).

The goals each workload is judged by (``Workload``), on the mean over seeds:

- the language model (``--data python_docs``): every configuration's final
  validation loss within 1.5 % of SyncAverage's; a variant of DiLoCo (quantised,
  or at another outer momentum) within 1 % of DiLoCo's at its defaults, Streaming DiLoCo within 1 % of
  DiLoCo's at the same tau (each its twin);
- Fashion-MNIST (``--data fashion_mnist``): every configuration at least 0.90
  test accuracy and within 0.5 pp of SyncAverage's (50 of the 10,000 test images).

This process never imports TensorFlow: it launches, waits and copies.
"""
import os
import statistics
import sys
from typing import NamedTuple

from .study import (Variant, chosen, configurations, continue_runs, docs_link, kept_runs, parsed, parser,
                    run_or_render, write_rendered)
from ..suite.runner import table


TABLE = "parity.md"  # the rendered table, in the results folder beside runs.json
# A goal is judged on the mean over at least this many seeds: one seed's difference is not evidence.
SEEDS_TO_JUDGE = 3


class Workload(NamedTuple):
    """A workload's data, what its runs are judged by, and its configurations.

    ``metric`` is a key of metrics.json's ``final``; ``lower_is_better`` says
    which way is better; a configuration must be within ``relative`` (a share
    of the baseline's mean) or ``absolute`` (in the metric's units) of the
    ``baseline`` configuration's mean, and of its twin's within ``twin_relative``;
    ``floor``, if set, is the worst any run's metric may be.
    """
    data: tuple
    metric: str
    lower_is_better: bool
    configurations: tuple
    baseline: str = "sync"
    relative: float = None
    absolute: float = None
    twin_relative: float = None
    floor: float = None
    # Passes over the training split's tokens a run trains (``--budget``; None: train.py's own epochs). A
    # run of B passes trains 2B epochs of half the split (``budget_flags``), so its curve has a point every
    # half pass, one of them at one pass.
    budget: float = None
    # Configurations also judged at one pass, within ``early_relative`` of the baseline's mean there.
    early: tuple = ()
    early_relative: float = None
    # The baseline at other learning rates (configurations): where one has its seeds in a folder, a line under
    # the answer sets every judged configuration against it too (``against_rate_baselines``). Not a goal: the
    # goals stay against ``baseline``, train.py's default, until that default is such a rate.
    rate_baselines: tuple = ()
    # train.py's rate rules the runs are made at, kept in runs.json: a folder made at other rules is not
    # continued (its rows' commands name no --lr, so a row made today would not be the row it sits beside).
    # None: the workload's optimizer kept its rules (SGD's); a folder without the key was made before
    # SyncAverage took its Adam rule.
    rate_rules: str = None


# A budgeted run's epochs are of this share of the training split (``--train-fraction``): a point of
# the curve every half pass over the split's tokens. The held-out set is the whole one.
SLICE = 0.5
CURVES = "curves.png"  # the budgeted folder's plot, beside parity.md
# Its payloads' plot (docs/compression.md leads with it): a twin and the rows that differ from it by
# --compression alone, final loss against the wire bytes a rank sends per outer step.
LOSS_VS_BYTES = "loss-vs-bytes.png"


def _passes(budget):
    return "pass" if budget == 1 else "passes"


def budget_flags(passes):
    """train.py's flags for a run of ``passes`` passes over the training split's tokens: 2·passes epochs
    of ``SLICE`` of it. Refuses a budget that is not a whole number of half passes."""
    epochs = passes / SLICE
    if passes <= 0 or abs(epochs - round(epochs)) > 1e-9:
        raise SystemExit(f"--budget must be a positive multiple of {SLICE:g} (passes over the training split's "
                         f"tokens). Received: --budget={passes:g}")
    return ("--epochs", str(round(epochs)), "--train-fraction", f"{SLICE:g}")


# Adam's rate rules since SyncAverage took one: SyncAverage √m (m = ranks·k, flat beyond 8), PeriodicAverage
# and EASGD their own factor times SyncAverage's up to 2 ranks, flat beyond (``lr_scale_factor``). Before it:
# SyncAverage at --lr.
ADAM_RULES = "sync sqrt(m); local x sync's, flat beyond 2 ranks"

LOCAL_UPDATES = (
    ("sync", "--strategy sync", None),
    ("easgd_tau10", "--strategy easgd --tau 10", None),
    ("periodic_tau10", "--strategy periodic --tau 10", None),
    ("diloco_tau10", "--strategy diloco --tau 10", None),
    # A smaller outer momentum, steadier over issue 42's short runs (docs/slow-ranks.md): what it costs a whole run.
    ("diloco_tau10_momentum05", "--strategy diloco --tau 10 --outer-momentum 0.5", "diloco_tau10"),
)
# Issue 61's rows at 4 and 8 ranks beside LOCAL_UPDATES: two groups of 4 ranks (SyncAverage within a group,
# DiLoCo across; at 8 ranks only, as the groups must divide the ranks) and SyncAverage over two batches an
# update, half the ranks' updates of the same batch.
AT_SCALE = (
    ("hierarchical_g4_diloco", "--strategy hierarchical --ranks-per-group 4 --inter diloco", None),
    ("sync_accumulate2", "--strategy sync --accumulate 2", None),
)
WORKLOADS = {
    "language_model": Workload(
        data=("--data", "python_docs"), metric="test_loss", lower_is_better=True, relative=0.015,
        twin_relative=0.01, budget=2.5, early=("easgd_tau10", "periodic_tau10"), early_relative=0.03,
        rate_baselines=("sync_lr_sqrt2", "sync_lr_sqrt8"), rate_rules=ADAM_RULES,
        configurations=configurations(
            *LOCAL_UPDATES,
            # SyncAverage at Adam's square-root rule for a p-times larger batch (Malladi et al. 2022,
            # arXiv:2205.10287): sqrt(2) and sqrt(8) times 1e-3, at np 2 and np 8 (issue 61), measured while
            # train.py trained SyncAverage at 1e-3; the evidence for its rule (ADAM_RULES), now its default.
            ("sync_lr_sqrt2", "--strategy sync --lr 0.0014142", None),
            ("sync_lr_sqrt8", "--strategy sync --lr 0.0028284", None),
            # At np 8, SyncAverage at the linear rule (8 x 1e-3, Goyal et al.'s for SGD, with train.py's warm-up):
            # whether a global batch of 256 sequences is still below the size past which the square root holds.
            ("sync_lr8", "--strategy sync --lr 0.008", None),
            # At np 8, np 2's global batch (8 ranks x 8 sequences = 2 x 32) at np 2's rate: the same updates as the
            # table at 2 ranks, each rank a quarter of the work. What an np 8 user keeps np 2's model with.
            ("sync_b8_lr_sqrt2", "--strategy sync --batch-size 8 --lr 0.0014142", None),
            # And the local-update strategies on that global batch at their defaults (their Adam rates are flat
            # beyond 2 ranks, so np 2's): whether np 8 keeps np 2's table when the ranks split np 2's batch.
            ("easgd_tau10_b8", "--strategy easgd --tau 10 --batch-size 8", None),
            ("periodic_tau10_b8", "--strategy periodic --tau 10 --batch-size 8", None),
            ("diloco_tau10_b8", "--strategy diloco --tau 10 --batch-size 8", None),
            # At np 8, EASGD and PeriodicAverage at their rules carried on to 8 ranks (9 x and 8 x 1e-3) where today's
            # stay flat beyond 2 (3 x and 2 x: easgd_tau10 and periodic_tau10 there). Each row's runs.json keeps the
            # command it was made as (made_as), at the same float32 rate.
            ("easgd_tau10_lr9", "--strategy easgd --tau 10 --lr 0.009", None),
            ("periodic_tau10_lr8", "--strategy periodic --tau 10 --lr 0.008", None),
            # EASGD and PeriodicAverage at their Adam rules on that base rate, 3 x and 2 x 1e-3: their defaults at
            # np 2 since. Their kept runs were made as --lr 0.0014142 --scale-lr under the rules before (the
            # same rate to 1e-5); under today's, that would scale 0.0014142 by SyncAverage's factor again.
            ("easgd_tau10_lr_sqrt2", "--strategy easgd --tau 10 --lr 0.003", None),
            ("periodic_tau10_lr_sqrt2", "--strategy periodic --tau 10 --lr 0.002", None),
            # EASGD at TF1 ElasticAverageOptimizer's moving rate, alpha = 0.9/(tau p) (beta = p alpha = 0.09),
            # a tenth of ours (beta/p, beta = 0.9).
            ("easgd_tau10_tf1_alpha", "--strategy easgd --tau 10 --beta 0.09", None),
            ("diloco_tau50", "--strategy diloco --tau 50", None),
            # The DiLoCo paper's outer momentum for long periods (0.9; ours, 0.7, was chosen on digits at tau = 10),
            # alone and under Streaming DiLoCo: whether tau = 50's gap is the outer step's.
            ("diloco_tau50_momentum09", "--strategy diloco --tau 50 --outer-momentum 0.9", "diloco_tau50"),
            ("diloco_tau50_streaming_momentum09",
             "--strategy diloco --tau 50 --fragments 5 --overlap 5 --outer-momentum 0.9", "diloco_tau50_momentum09"),
            # Or whether it is made early (+11 % after the first half pass, +2 % from the third on): SyncAverage
            # over the learning rate's warm-up (160 updates, 5 % of the budget's) before the first period, as the
            # paper's runs start from a data-parallel model. 221 synchronisations instead of 64.
            ("diloco_tau50_warmup160", "--strategy diloco --tau 50 --warmup-steps 160", "diloco_tau50"),
            ("diloco_tau50_streaming_warmup160",
             "--strategy diloco --tau 50 --fragments 5 --overlap 5 --warmup-steps 160", "diloco_tau50_warmup160"),
            # The rows made before that warm-up became train.py's default (DiLoCo.default_warmup_steps: the
            # learning rate's warm-up, where it holds fewer than 10 periods): tau = 50 from the first step, and at
            # np 8 tau = 10 (whose 40 warm-up updates hold 4 periods). Each run's made_as is its command then.
            ("diloco_tau50_warmup0", "--strategy diloco --tau 50 --warmup-steps 0", "diloco_tau50"),
            ("diloco_tau50_streaming_warmup0", "--strategy diloco --tau 50 --fragments 5 --overlap 5 --warmup-steps 0",
             "diloco_tau50_warmup0"),
            ("diloco_tau10_warmup0", "--strategy diloco --tau 10 --warmup-steps 0", "diloco_tau10"),
            # Streaming DiLoCo: 5 fragments of a period of 50, each merged 5 steps after its collective starts
            # (with the progress merge, the default since the one-pass table; the mix before). Each Streaming row's
            # twin is DiLoCo at the same tau: what the fragments and the overlap cost (within 1 %: issue 61).
            ("diloco_tau50_streaming", "--strategy diloco --tau 50 --fragments 5 --overlap 5", "diloco_tau50"),
            # Which of Streaming DiLoCo's changes costs its loss: the same fragments merged at once, and
            # merged late with alpha = 0 (every rank restarts from the new synced weights, other
            # implementations' default) instead of the paper's even mix.
            ("diloco_tau50_fragments", "--strategy diloco --tau 50 --fragments 5", "diloco_tau50"),
            ("diloco_tau50_streaming_mixing0", "--strategy diloco --tau 50 --fragments 5 --overlap 5 --mixing 0",
             "diloco_tau50"),
            # The overlapped merges by name: the one that keeps the rank's own steps (x <- theta + x - x(s)),
            # and the paper's alpha-mix.
            ("diloco_tau50_streaming_progress",
             "--strategy diloco --tau 50 --fragments 5 --overlap 5 --overlap-merge progress", "diloco_tau50"),
            ("diloco_tau50_streaming_mix", "--strategy diloco --tau 50 --fragments 5 --overlap 5 --overlap-merge mix",
             "diloco_tau50"),
            # The sparse payload (1/64 of each chunk at 2 bits, with error feedback) on DiLoCo at tau = 10.
            ("diloco_tau10_topk", "--strategy diloco --tau 10 --compression topk", "diloco_tau10"),
            # Denser or finer payloads within a quarter of int4's bytes at p = 2 (0.21 and 0.12 of them): what
            # the sparse payload's loss hangs on where the default's is lost.
            ("diloco_tau10_topk_d16", "--strategy diloco --tau 10 --compression topk --density 0.0625", "diloco_tau10"),
            ("diloco_tau10_topk_d32_b4", "--strategy diloco --tau 10 --compression topk --density 0.03125 --bits 4",
             "diloco_tau10"),
            # SparseLoCo's outer step: the residual carried over stands in for the outer momentum, so none, at an
            # outer rate of 1 (theta <- theta - mean of what was sent).
            ("diloco_tau10_topk_no_momentum",
             "--strategy diloco --tau 10 --compression topk --outer-momentum 0 --outer-lr 1.0", "diloco_tau10"),
            ("diloco_tau10_int8", "--strategy diloco --tau 10 --compression int8", "diloco_tau10"),
            ("diloco_tau10_int4", "--strategy diloco --tau 10 --compression int4", "diloco_tau10"),
            # Every element at one bit, its sign, with a scale per 2048 (EF-SignSGD's): 0.246 of int4's bytes,
            # dense, where the top-k rows above lose the loss by what they leave out each period.
            ("diloco_tau10_sign", "--strategy diloco --tau 10 --compression sign", "diloco_tau10"),
            ("sync_powersgd4", "--strategy sync --compression powersgd --powersgd-rank 4", None),
            # Whether the rank is what PowerSGD's loss hangs on: four times rank 4's. train.py's default for the
            # transformer since its 3 seeds here (config.TEXT_POWERSGD_RANK): the goal's row at the default rank.
            ("sync_powersgd16", "--strategy sync --compression powersgd --powersgd-rank 16", None),
            ("sync_powersgd8", "--strategy sync --compression powersgd --powersgd-rank 8", None),
            # Or the uncompressed start under Adam (torch's start_powerSGD_iter, 1-bit Adam's warm-up): a tenth
            # of the budget's 3,200 updates at np 2 sent exact, in place of the default 10.
            ("sync_powersgd4_warmup320",
             "--strategy sync --compression powersgd --powersgd-rank 4 --powersgd-warmup-steps 320", None),
            *AT_SCALE)),
    "fashion_mnist": Workload(
        data=("--data", "fashion_mnist"), metric="test_accuracy", lower_is_better=False, absolute=0.005,
        floor=0.90,
        configurations=configurations(
            *LOCAL_UPDATES,
            ("diloco_tau10_int8", "--strategy diloco --tau 10 --compression int8", "diloco_tau10"),
            ("sync_powersgd4", "--strategy sync --compression powersgd --powersgd-rank 4", None),
            # Issue 61's int4 DiLoCo and Streaming DiLoCo (no DiLoCo at tau = 50 here to be Streaming's twin).
            ("diloco_tau10_int4", "--strategy diloco --tau 10 --compression int4", "diloco_tau10"),
            ("diloco_tau50_streaming", "--strategy diloco --tau 50 --fragments 5 --overlap 5", None),
            *AT_SCALE)),
}


def parse_args(argv, prog):
    p = parser(prog, __doc__, TABLE, timeout=1800)
    p.add_argument("--workload", choices=sorted(WORKLOADS), help="what to train (required unless --render)")
    p.add_argument("--configurations", help="comma-separated names (default: all of the workload's; a "
                                            "configuration brings its twin)")
    p.add_argument("--budget", type=float, metavar="PASSES",
                   help="passes over the training split's tokens a run trains, a multiple of 0.5 (default: the "
                        "workload's, 2.5 for the language model; none for Fashion-MNIST, which trains train.py's "
                        "epochs)")
    p.add_argument("--flags", default="", help="more train.py flags for every run (e.g. a smaller --epochs "
                                               "for a quick look; the results then answer no goal)")
    args = parsed(p, argv, required=("workload", "out"))
    if args.render:
        return args
    workload = WORKLOADS[args.workload]
    args.budget = workload.budget if args.budget is None else args.budget
    if args.budget is not None and workload.budget is None:
        p.error(f"--budget is the language model's: --workload {args.workload} trains train.py's epochs")
    extra = (budget_flags(args.budget) if args.budget is not None else ()) + tuple(args.flags.split())
    picked = chosen(p, args.configurations, workload.configurations, first=(workload.baseline,))
    misfits = [c.name for c in picked if not runs_at(c, args.np)]
    if misfits and args.configurations:
        p.error(f"{','.join(misfits)} need(s) a --np its --ranks-per-group divides into 2 or more groups. "
                f"Received: --np {args.np}")
    args.variants = [Variant(c.name, workload.data + c.flags + extra, c.twin) for c in picked if runs_at(c, args.np)]
    return args


def runs_at(variant, np_):
    """Whether ``variant`` can run at ``np_`` ranks: a hierarchical one only where its groups divide the ranks
    into 2 or more (the default configurations leave the others out at that np)."""
    flags = list(variant.flags)
    if "--ranks-per-group" not in flags:
        return True
    n = int(flags[flags.index("--ranks-per-group") + 1])
    return np_ % n == 0 and np_ // n >= 2


def main(argv=None, prog="python -m benchmarks parity"):
    args = parse_args(sys.argv[1:] if argv is None else argv, prog)

    def run(out):
        metric = WORKLOADS[args.workload].metric
        index = {"workload": args.workload, "np": args.np, "flags": args.flags}
        if args.budget is not None:  # a folder of runs of train.py's epochs has no such key, and continues as such
            index["budget"] = args.budget
        if WORKLOADS[args.workload].rate_rules:
            index["rate_rules"] = WORKLOADS[args.workload].rate_rules
        return continue_runs(out, index, args.variants,
                             args.np, args.seeds, args.timeout, "parity",
                             shown=lambda m: f"final {metric} {m['final'][metric]:.4f}")

    return run_or_render(args, write_table, run)


def write_table(directory):
    """Renders ``directory``'s table into its parity.md (and a budgeted folder's plots: its curves, and its
    payloads' loss against bytes where it has them); returns the table."""
    text = write_rendered(directory, TABLE, render)
    index, found = summarise(directory)
    if "budget" in index:
        plot(directory, index, found)
        plot_payloads(directory, found, WORKLOADS[index["workload"]])
    return text


# --- the table ---------------------------------------------------------------------------------
def summarise(directory):
    """``(runs.json, {configuration: {"values": [final metric per seed], "twin": name, "speed": [tokens or
    samples/s], "training": [the last epoch's training loss, the mean over its steps of the ranks' local
    weights], "command": the first seed's, "curves": [each seed's ``curve``] in a budgeted folder,
    "outer_bytes": [each seed's ``outer_bytes``]}})``, in the order the runs were made."""
    index, runs = kept_runs(directory)
    metric = WORKLOADS[index["workload"]].metric
    budgeted = "budget" in index
    found = {}
    for run, metrics in runs:
        final = metrics["final"]
        entry = found.setdefault(run["variant"], {"values": [], "twin": run["twin"], "speed": [], "training": [],
                                                  "command": run["command"], "curves": [], "outer_bytes": []})
        entry["values"].append(final[metric])
        entry["outer_bytes"].append(outer_bytes(metrics))
        entry["speed"].append(final.get("tokens_per_sec") or final.get("samples_per_sec"))
        entry["training"].append(metrics["epochs"][-1]["loss"] if metrics.get("epochs") else None)
        if budgeted:
            entry["curves"].append(curve(metrics, metric))
    return index, found


def outer_bytes(metrics):
    """The wire bytes a rank sent per synchronisation over the run's last epoch (its bytes per step times its
    τ), None for a run whose rows do not say (made before they held both, or of a strategy without τ)."""
    row = (metrics.get("epochs") or [{}])[-1]
    if row.get("wire_bytes_per_step") is None or not row.get("tau"):
        return None
    return row["wire_bytes_per_step"] * row["tau"]


def payload_label(command):
    """What a run's command sends, as the plot names it: its ``--compression`` (with ``--density`` and
    ``--bits`` where given), fp32 without one."""
    words = command.split()

    def flag(name):
        return words[words.index(name) + 1] if name in words else None

    label = flag("--compression") or "fp32"
    extra = [f"D={flag('--density')}" if flag("--density") else "", f"B={flag('--bits')}" if flag("--bits") else ""]
    return " ".join([label] + [e for e in extra if e])


def payload_rows(found):
    """``[(label, mean bytes per outer step, [final loss per seed])]`` of each twin that has rows differing from
    it by ``--compression`` alone and of those rows, most bytes first; [] where fewer than two have bytes."""
    compressed = [n for n, e in found.items() if e["twin"] in found and "--compression" in e["command"].split()]
    family = list(dict.fromkeys([found[n]["twin"] for n in compressed] + compressed))
    rows = [(payload_label(found[n]["command"]), statistics.fmean(found[n]["outer_bytes"]), found[n]["values"])
            for n in family if found[n]["outer_bytes"] and None not in found[n]["outer_bytes"]]
    return sorted(rows, key=lambda row: -row[1]) if len(rows) >= 2 else []


def plot_payloads(directory, found, workload):
    """``LOSS_VS_BYTES``: each payload row's mean final loss (its seeds' range as a bar) against the bytes a rank
    sends per outer step, log scale, beside the baseline's mean and its goal band; None without two rows."""
    rows = payload_rows(found)
    if not rows:
        return None
    from ..suite import plots

    fig, ax = plots.plt.subplots(figsize=(7, 4.5))
    for label, sent, values in rows:
        mean = statistics.fmean(values)
        ax.errorbar([sent], [mean], yerr=[[mean - min(values)], [max(values) - mean]], marker="o", capsize=3)
        ax.annotate(f"{label} ({len(values)})", (sent, mean), textcoords="offset points", xytext=(6, 4), fontsize=8)
    baseline = found.get(workload.baseline)
    if baseline:
        base = statistics.fmean(baseline["values"])
        ax.axhline(base, color="0.3", linewidth=1, label=f"{workload.baseline}, mean")
        ax.axhspan(base, base * (1 + workload.relative), color="0.85", label=f"within {100 * workload.relative:g} %")
        ax.legend(fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("wire bytes a rank sends per outer step")
    ax.set_ylabel("final validation loss, nats/token (mean; bar: seeds' range)")
    plots._save_panels(fig, [ax], os.path.join(directory, LOSS_VS_BYTES))
    return LOSS_VS_BYTES


def curve(metrics, metric):
    """``[(tokens trained, the metric after them)]`` of a run: one point an epoch (its evaluation of the
    kept model as the epoch ended), tokens summed over the epochs (a row's ``tokens``, or for runs made
    before rows held it, its tokens/s times its seconds)."""
    points, tokens = [], 0
    for row in metrics["epochs"]:
        tokens += row["tokens"] if "tokens" in row else round(row["tokens_per_sec"] * row["seconds"])
        points.append((tokens, row[metric]))
    return points


def at_one_pass(entry):
    """The metric of each seed one pass into the budget: its curve's point at epoch 1/SLICE."""
    return [points[round(1 / SLICE) - 1][1] for points in entry["curves"]]


def judge(workload, name, values, found, budgeted=False):
    """The goals a configuration's values answer, each "met" or "**missed**" with its figure; in a budgeted
    folder, also the early goal at one pass for the workload's ``early`` configurations."""
    mean = statistics.fmean(values)
    goals = []
    if budgeted and name in workload.early and workload.baseline in found:
        early, reference = (statistics.fmean(at_one_pass(found[n])) for n in (name, workload.baseline))
        goals.append(f"within {100 * workload.early_relative:g} % of {workload.baseline} at 1 pass "
                     + ("met" if early - reference <= workload.early_relative * abs(reference) else "**missed**"))
    if workload.floor is not None:
        worst = max(values) if workload.lower_is_better else min(values)
        good = worst <= workload.floor if workload.lower_is_better else worst >= workload.floor
        goals.append(f"{'≤' if workload.lower_is_better else '≥'} {workload.floor:g} " + ("met" if good else "**missed**"))
    comparisons = []
    if name != workload.baseline and workload.baseline in found:
        comparisons.append((workload.baseline, workload.relative, workload.absolute))
    if found.get(name, {}).get("twin") in found and workload.twin_relative is not None:
        comparisons.append((found[name]["twin"], workload.twin_relative, None))
    for other, relative, absolute in comparisons:
        reference = statistics.fmean(found[other]["values"])
        worse = _behind(workload, mean, reference)
        if relative is not None:
            goals.append(f"within {100 * relative:g} % of {other} " + ("met" if worse <= relative * abs(reference)
                                                                        else "**missed**"))
        if absolute is not None:
            goals.append(f"within {100 * absolute:g} pp of {other} " + ("met" if worse <= absolute else "**missed**"))
    return goals


def render(directory):
    """The Markdown table of the runs in ``directory``: one row per configuration, the median over seeds
    with (min–max), the mean against the baseline's, and the goals judged on the means. A budgeted
    folder's table (runs.json's ``budget``) also has each mean at one pass, leads with how far the
    baseline moved over the budget's last half pass, and links the plot of the curves (``plot``)."""
    index, found = summarise(directory)
    workload = WORKLOADS[index["workload"]]
    # The baseline's row first, whatever order the runs were made in (rows carried over from another folder).
    found = {n: found[n] for n in sorted(found, key=lambda n: n != workload.baseline)}
    budgeted = "budget" in index
    baseline = found.get(workload.baseline)
    base_mean = statistics.fmean(baseline["values"]) if baseline else None
    base_early = statistics.fmean(at_one_pass(baseline)) if budgeted and baseline else None
    rows, verdicts, versus_of = [], {}, {}
    for name, entry in found.items():
        values = entry["values"]
        mean = statistics.fmean(values)
        versus_of[name] = _versus(workload, name, mean, base_mean)
        if len(values) >= SEEDS_TO_JUDGE and not unjudged_references(workload, name, found):
            verdicts[name] = judge(workload, name, values, found, budgeted)
        speed = statistics.median(s for s in entry["speed"] if s) if any(entry["speed"]) else None
        training = [t for t in entry["training"] if t is not None]
        early = []
        if budgeted:
            early_mean = statistics.fmean(at_one_pass(entry))
            early = [f"{early_mean:.4f}", _versus(workload, name, early_mean, base_early)]
        rows.append([f"`{name}`", *early, f"{statistics.median(values):.4f}", f"{min(values):.4f}–{max(values):.4f}",
                     f"{mean:.4f}", versus_of[name], f"{statistics.fmean(training):.4f}" if training else "—",
                     "—" if speed is None else f"{speed:,.0f}",
                     ("; ".join(verdicts[name]) or "—") if name in verdicts
                     else not_judged(workload, name, found)])
    unit = "tokens/s" if workload.metric == "test_loss" else "samples/s"
    what = metric_words(workload)
    at = ""
    early_header = []
    if budgeted and found:
        tokens = next(iter(found.values()))["curves"][0][-1][0]
        at = f" at the budget ({tokens / 1e6:.1f} M tokens)"
        early_header = ["at 1 pass, mean", f"vs {workload.baseline}"]
    header = ["configuration", *early_header, f"{what}{at}, median", "min–max", "mean", f"mean vs {workload.baseline}",
              "training loss, last epoch", unit, "goals"]
    seeds = f"seeds 0–{index['seeds'] - 1}" if index["seeds"] > 1 else "seed 0"
    lines = [summary(workload, found, verdicts, versus_of)]
    for other in workload.rate_baselines:
        line = against_rate_baselines(workload, found, verdicts, other)
        lines += ["", line] if line else []
    if budgeted and baseline:
        lines += ["", flattening(workload, baseline, index["budget"]), "", f"![Validation loss against tokens]"
                  f"({docs_link(directory, CURVES)})"]
    lines += ["", f"{index['np']} rank{'s' * (index['np'] != 1)}, {seeds}, {setting(index)}. "
              f"Each row's runs are commands like `{next(iter(found.values()))['command']}`." if found else "",
              "", table(header, rows, "l" + "rr" * bool(early_header) + "rrrrrrl")]
    if index.get("failures"):
        lines += ["", "Failed runs: " + "; ".join(index["failures"])]
    return "\n".join(lines) + "\n"


def unjudged_references(workload, name, found):
    """The references ``name`` is judged against (the baseline, its twin) that the folder holds with fewer than
    ``SEEDS_TO_JUDGE`` seeds: a mean of 3 is not judged against a mean of 1."""
    references = [workload.baseline, found[name].get("twin")]
    return [r for r in references
            if r and r != name and r in found and len(found[r]["values"]) < SEEDS_TO_JUDGE]


def not_judged(workload, name, found):
    """Why a row has no verdict yet: its own seeds, or its references'."""
    seeds = len(found[name]["values"])
    if seeds < SEEDS_TO_JUDGE:
        return f"not judged ({seeds} of {SEEDS_TO_JUDGE} seeds)"
    return "not judged (" + ", ".join(f"{r} has {len(found[r]['values'])} of {SEEDS_TO_JUDGE} seeds"
                                      for r in unjudged_references(workload, name, found)) + ")"


def metric_words(workload):
    """What the workload's metric is, as a table's header names it."""
    return "validation loss (nats/token)" if workload.metric == "test_loss" else "test accuracy"


def setting(index):
    """How a folder's runs were made besides their ranks and seeds, as its table says it (from its runs.json
    ``index``): its budget if it has one, ``train.py's defaults otherwise``, and its ``--flags`` if any."""
    budget = (f"{index['budget']:g} {_passes(index['budget'])} over the training split's tokens "
              f"({budget_flags(index['budget'])[1]} epochs of {SLICE:g} of it, the whole held-out set), "
              if "budget" in index else "")
    return budget + "train.py's defaults otherwise" + (f", with `{index['flags']}`" if index.get("flags") else "")


def _behind(workload, mean, reference):
    """How far ``mean`` is worse than ``reference`` in the metric's units (negative where it is better)."""
    return (mean - reference) if workload.lower_is_better else (reference - mean)


def _versus(workload, name, mean, base_mean):
    if not base_mean or name == workload.baseline:
        return "—"
    return (f"{100 * (mean - base_mean) / base_mean:+.2f} %" if workload.relative is not None
            else f"{100 * (mean - base_mean):+.2f} pp")


def flattening(workload, baseline, budget):
    """How far the baseline's mean curve moved over the budget's last epoch (its last ``SLICE`` of a
    pass, the last fifth of the default 2.5 passes), in a sentence: the budget is long enough where
    that is under 2 %."""
    last = statistics.fmean(points[-1][1] for points in baseline["curves"])
    before = statistics.fmean(points[-2][1] for points in baseline["curves"])
    return (f"Over the budget's last epoch (the last {SLICE:g} of its {budget:g} {_passes(budget)}), {workload.baseline}'s "
            f"mean validation loss moved {100 * (last - before) / before:+.2f} % ({before:.4f} to {last:.4f}, the "
            "kept model as each epoch ended).")


def plot(directory, index, found):
    """``CURVES``: each configuration's mean validation loss over its seeds against tokens trained, a point
    an epoch, and its final loss (the kept model after ``merge_at_end``) as a cross at the budget; ``index``
    and ``found`` are ``summarise(directory)``'s."""
    from ..suite import plots

    fig, ax = plots.plt.subplots(figsize=(8, 5))
    for name, entry in found.items():
        xs = [x / 1e6 for x, _ in entry["curves"][0]]
        ys = [statistics.fmean(points[i][1] for points in entry["curves"]) for i in range(len(xs))]
        line, = ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.2, label=f"{name} ({len(entry['values'])})")
        ax.plot([xs[-1]], [statistics.fmean(entry["values"])], marker="x", markersize=7, color=line.get_color())
    ax.set_xlabel("tokens trained, millions")
    ax.set_ylabel("validation loss, nats/token (mean over seeds)")
    ax.set_title(f"{index['np']} ranks; a point an epoch, x: the final loss after the end-of-training merge",
                 fontsize=9)
    ax.set_yscale("log")
    plots._plain_log_ticks(ax, "y", steps=(1, 1.2, 1.4, 1.6, 1.8, 2, 2.5, 3, 4, 5, 6, 8))
    plots._save_panels(fig, [ax], os.path.join(directory, CURVES))
    return CURVES


def summary(workload, found, verdicts, versus_of):
    """The table's answer in a sentence, from the same verdicts: which configurations meet every goal
    and which miss one (with their mean against the baseline), and which are not judged yet."""
    def names(chosen, with_versus=False):
        return ", ".join(f"`{n}`" + (f" ({versus_of[n]} vs {workload.baseline})" if with_versus else "")
                         for n in chosen)

    met = [n for n, goals in verdicts.items() if goals and all(g.endswith(" met") for g in goals)]
    missed = [n for n, goals in verdicts.items() if any(g.endswith("**missed**") for g in goals)]
    waiting = [n for n in found if n not in verdicts]
    parts = []
    if met:
        parts.append(f"**Within every goal** (means over {SEEDS_TO_JUDGE} seeds): {names(met)}.")
    if missed:
        parts.append(f"**Missing a goal:** {names(missed, with_versus=True)}.")
    if waiting:
        parts.append(f"Not judged yet (fewer than {SEEDS_TO_JUDGE} seeds, or a reference with fewer): "
                     f"{names(waiting)}.")
    return " ".join(parts)


def against_rate_baselines(workload, found, verdicts, other):
    """A sentence setting every judged configuration's mean against ``other`` (the baseline at another
    learning rate), within the baseline's goal or behind it; "" unless ``other`` is judged (has its seeds).
    A look for when ``other``'s rate becomes train.py's default, not a goal."""
    if other not in verdicts or workload.baseline not in found:
        return ""
    reference = statistics.fmean(found[other]["values"])
    within, behind = [], []
    for name in verdicts:
        if name in (other, workload.baseline):
            continue
        mean = statistics.fmean(found[name]["values"])
        worse = _behind(workload, mean, reference)
        ok = (worse <= workload.relative * abs(reference) if workload.relative is not None
              else worse <= workload.absolute)
        (within if ok else behind).append(f"`{name}` ({_versus(workload, name, mean, reference)})")
    limit = f"{100 * workload.relative:g} %" if workload.relative is not None else f"{100 * workload.absolute:g} pp"
    parts = [f"Against `{other}` ({workload.baseline} at another rate, its mean "
             f"{_versus(workload, other, reference, statistics.fmean(found[workload.baseline]['values']))} "
             f"vs {workload.baseline}'s; not a goal while {workload.baseline} is train.py's default)"]
    if within:
        parts.append(f"within {limit}: {', '.join(within)}")
    if behind:
        parts.append(f"more than {limit} behind: {', '.join(behind)}")
    return "; ".join(parts) + "."


if __name__ == "__main__":
    sys.exit(main())
