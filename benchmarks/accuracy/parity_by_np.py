"""One workload's parity tables side by side across numbers of ranks. ``python -m benchmarks parity-by-np``.

    python -m benchmarks parity-by-np --out docs/results/parity-fashion-mnist-by-np \\
        docs/results/parity-fashion-mnist-np1 docs/results/parity-fashion-mnist-np2 \\
        docs/results/parity-fashion-mnist-np4 docs/results/parity-fashion-mnist-np8
    python -m benchmarks parity-by-np --render docs/results/parity-fashion-mnist-by-np   # again, from its sources.json

``parity`` makes one folder of runs per number of ranks (``--np``); this reads several such folders of one
workload, made the same way otherwise (the same budget and ``--flags``), and writes into ``--out``:

- ``by-np.md``: one row per configuration, one column group per np, ascending: the mean of the final metric
  over seeds with the seeds' (min–max) and their number, and the mean against the baseline's (SyncAverage's)
  at the same np, as the parity tables give it (in % for the language model, in pp for Fashion-MNIST). It
  leads with its answer, and the docs include it;
- ``by-np.png``: the final metric against np, a line per configuration (``plot``);
- ``sources.json``: the folders it was made from (relative to ``--out``), so that ``--render`` makes it again.

It never launches anything, and judges nothing: each folder's own parity.md judges its runs at its np.
"""
import argparse
import json
import os
import statistics
import sys

from .parity import SEEDS_TO_JUDGE, TABLE, WORKLOADS, _versus, metric_words, setting, summarise
from .study import RUNS, docs_link, kept_runs
from ..suite.runner import REPO_ROOT, table

PAGE, PLOT, SOURCES = "by-np.md", "by-np.png", "sources.json"
# What the folders of one page must share: runs of another setting at another np would read as np's effect.
SAME = ("workload", "budget", "flags")
# The memory of every machine these results were made on (docs/development.md): what np ranks must fit in.
MACHINE_GIB = 24


def load(directories):
    """``[(directory, its runs.json, its configurations as parity.summarise gives them)]``, by np ascending.

    Raises:
      ValueError: naming the folder at fault, where one is not a parity folder, differs from the first in
        workload, budget or flags, or has an np another folder has.
    """
    directories = list(directories)

    def refused(why, directory, more=""):
        return ValueError(f"`directories` must be parity folders (each its runs.json and {TABLE}) of one "
                          f"workload, budget and flags, at a different np each. Received: directories="
                          f"{[shown(d) for d in directories]} ({shown(directory)} {why}{more})")

    if not directories:
        raise ValueError("`directories` must name at least one parity folder. Received: directories=[]")
    indexes = []
    for directory in directories:
        missing = [name for name in (RUNS, TABLE) if not os.path.isfile(os.path.join(directory, name))]
        if missing:
            raise refused(f"has no {' or '.join(missing)}", directory)
        with open(os.path.join(directory, RUNS)) as f:
            index = json.load(f)
        if index.get("workload") not in WORKLOADS or not isinstance(index.get("np"), int):
            raise refused(f"has workload={index.get('workload')!r} and np={index.get('np')!r}", directory,
                          f", not one of parity's workloads ({', '.join(WORKLOADS)}) at a number of ranks")
        # Checked on the runs.json alone, before any run is read: a folder of another budget has other rows.
        first, settings = indexes[0] if indexes else (directory, index)
        for key in SAME:
            if index.get(key) != settings.get(key):
                raise refused(f"has {key}={index.get(key)!r}", directory,
                              f" where {shown(first)} has {key}={settings.get(key)!r}")
        twin = next((d for d, other in indexes if other["np"] == index["np"]), None)
        if twin is not None:
            raise refused(f"has np={index['np']}", directory, f", as {shown(twin)} does")
        indexes.append((directory, index))
    return sorted(((directory, *summarise(directory)) for directory, _ in indexes), key=lambda study: study[1]["np"])


def shown(directory):
    """A folder as the page names it: from the repository's root when it is under it."""
    path = os.path.abspath(directory)
    return os.path.relpath(path, REPO_ROOT) if path.startswith(REPO_ROOT + os.sep) else directory


def values_by_np(studies):
    """``{configuration: {np: [final metric per seed]}}`` over ``load``'s studies, the baseline first, then
    each configuration in the order it is first met (the studies by np, each folder's in its run order)."""
    baseline = WORKLOADS[studies[0][1]["workload"]].baseline
    rows = {}
    for _, index, found in studies:
        for name, entry in found.items():
            rows.setdefault(name, {})[index["np"]] = entry["values"]
    return dict(sorted(rows.items(), key=lambda row: row[0] != baseline))  # stable: the rest keep their order


def cells(workload, name, values, base):
    """A configuration's two cells at one np: its mean with (min–max) and its seeds (fewer than
    SEEDS_TO_JUDGE: "k of N seeds"), and its mean against the ``base`` line's; "—" for each where
    ``values`` is None (no runs there)."""
    if not values:
        return ["—", "—"]
    mean = statistics.fmean(values)
    seeds = f"{len(values)} seed{'s' * (len(values) != 1)}" if len(values) >= SEEDS_TO_JUDGE \
        else f"{len(values)} of {SEEDS_TO_JUDGE} seeds"
    return [f"{mean:.4f} ({min(values):.4f}–{max(values):.4f}), {seeds}",
            _versus(workload, name, mean, statistics.fmean(base) if base else None)]


def _and(items):
    """``items`` as prose: "a", "a and b", "a, b and c"."""
    items = [str(item) for item in items]
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def answer(workload, nps, rows):
    """The page's answer, from the same means as its table: which configurations have runs at which np, the
    baseline's mean at each, and the mean against the baseline's of every other configuration with runs at
    more than one np."""
    groups = {}
    for name, by_np in rows.items():
        groups.setdefault(tuple(n for n in nps if n in by_np), []).append(f"`{name}`")
    where = [(f"at every np here ({_and(at)})" if at == tuple(nps) and len(nps) > 1
              else f"at np {at[0]} only" if len(at) == 1 else f"at np {_and(at)}") + ": " + ", ".join(names)
             for at, names in groups.items()]
    parts = ["Runs " + "; ".join(where) + "."]
    base = rows.get(workload.baseline)
    if base:
        parts.append(f"`{workload.baseline}`'s mean final {metric_words(workload)}: "
                     + _and(f"{statistics.fmean(base[n]):.4f} at np {n}" for n in nps if n in base) + ".")
    moved = [f"`{name}` " + _and(f"{_versus(workload, name, statistics.fmean(by_np[n]), statistics.fmean(base[n]))} "
                                 f"at np {n}" for n in nps if n in by_np and n in base)
             for name, by_np in rows.items()
             if base and name != workload.baseline and len([n for n in by_np if n in base]) > 1]
    if moved:
        parts.append(f"Against `{workload.baseline}` at the same np: " + "; ".join(moved) + ".")
    return " ".join(parts)


def memory(studies):
    """What a rank cost at the largest np, in a sentence: the largest resident memory of any rank after its
    last epoch over that folder's runs (metrics.json's ``rss_mb``, every rank's), and the largest sum over a
    run's ranks, against this machine's memory; None where its runs recorded none."""
    directory, index, _ = studies[-1]
    per_run = [metrics["epochs"][-1].get("rss_mb") for _, metrics in kept_runs(directory)[1]
               if metrics.get("epochs")]
    per_run = [ranks for ranks in per_run if ranks]
    if not per_run:
        return None
    largest = max(per_run, key=sum)
    return (f"Memory at np {index['np']}: each rank's resident memory after its last epoch was at most "
            f"{max(max(ranks) for ranks in per_run):,.0f} MB over the {len(per_run)} runs, and the {len(largest)} "
            f"ranks of a run held at most {sum(largest) / 1024:.1f} GiB together, of this machine's "
            f"{MACHINE_GIB} GiB.")


def render_studies(studies, out):
    """``by-np.md`` of ``load``'s studies, written into ``out`` (which its plot's link is relative to): the
    answer, what a cell is, the table, the plot, and the folders it comes from."""
    index = studies[0][1]
    workload = WORKLOADS[index["workload"]]
    nps = [study[1]["np"] for study in studies]
    rows = values_by_np(studies)
    base = rows.get(workload.baseline, {})
    header = ["configuration"] + [column for n in nps
                                  for column in (f"np {n}: mean (min–max), seeds", f"np {n}: vs {workload.baseline}")]
    body = [[f"`{name}`"] + [cell for n in nps for cell in cells(workload, name, by_np.get(n), base.get(n))]
            for name, by_np in rows.items()]
    held = memory(studies)
    lines = [answer(workload, nps, rows) + (f" {held}" if held else ""), "",
             f"Each cell is the final {metric_words(workload)} of a configuration's runs at that np: the mean over "
             f"its seeds, their (min–max) and how many (under {SEEDS_TO_JUDGE}, how many of the {SEEDS_TO_JUDGE} "
             f"a goal is judged on); *vs {workload.baseline}* is that mean against {workload.baseline}'s at the same "
             f"np; — where there is none. Each run is its configuration's flags at its np, {setting(index)}.", "",
             table(header, body, "l" + "rr" * len(nps)), "",
             f"![Final {metric_words(workload)} against np]({docs_link(out, PLOT)})", "",
             "From " + ", ".join(f"`{shown(directory)}`" for directory, _, _ in studies) + ", each judged in its own "
             f"{TABLE} (`python -m benchmarks parity-by-np --render {shown(out)}` renders this again)."]
    return "\n".join(lines) + "\n"


def render(directories, out):
    """``by-np.md``'s text from the parity folders ``directories``, as ``write`` writes it into ``out``."""
    return render_studies(load(directories), out)


def plot(studies, out):
    """``PLOT``: each configuration's mean final metric over its seeds against np (log2, a tick at each np
    present), its seeds' range as a bar, a line per configuration; written into ``out``."""
    from ..suite import plots

    index = studies[0][1]
    workload = WORKLOADS[index["workload"]]
    nps = [study[1]["np"] for study in studies]
    rows = values_by_np(studies)
    fig, ax = plots.plt.subplots(figsize=(9, 5.5))
    # The configurations measured at one np only stand at the same x: each is moved by a share of an octave
    # so that their bars do not hide each other.
    step = min(0.04, 0.3 / max(len(rows) - 1, 1))
    for i, (name, by_np) in enumerate(rows.items()):
        at = [n for n in nps if n in by_np]
        means = [statistics.fmean(by_np[n]) for n in at]
        below, above = [m - min(by_np[n]) for m, n in zip(means, at)], [max(by_np[n]) - m for m, n in zip(means, at)]
        ax.errorbar([n * 2 ** (step * (i - (len(rows) - 1) / 2)) for n in at], means, yerr=[below, above],
                    # matplotlib's colours repeat after ten: the eleventh line on is told apart by its marker
                    marker="os^D"[i // 10 % 4], linestyle="-" if i < 10 else "--", markersize=4, capsize=3,
                    linewidth=1.2, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(nps, [str(n) for n in nps])
    ax.minorticks_off()
    ax.set_xlim(nps[0] / 1.5, nps[-1] * 1.5)
    ax.set_xlabel("ranks (np)")
    ax.set_ylabel(f"final {metric_words(workload)}, mean over seeds")
    ax.set_title(f"{index['workload']}: each run its configuration's flags at its np, {setting(index)}\n"
                 "bar: the seeds' range; points at one np moved apart a little", fontsize=9)
    plots._save_panels(fig, [ax], os.path.join(out, PLOT))
    return PLOT


def write(directories, out):
    """Writes ``by-np.md``, ``by-np.png`` and ``sources.json`` (``directories``, relative to ``out``) into
    ``out``, made if missing, from the parity folders ``directories``; returns by-np.md's text.

    Raises:
      ValueError: as ``load``, before anything is written.
    """
    studies = load(directories)
    os.makedirs(out, exist_ok=True)
    text = render_studies(studies, out)
    with open(os.path.join(out, PAGE), "w") as f:
        f.write(text)
    plot(studies, out)
    with open(os.path.join(out, SOURCES), "w") as f:
        # Relative to the page's folder: the repository's results re-render wherever it is checked out.
        json.dump({"sources": [os.path.relpath(os.path.abspath(d), os.path.abspath(out)) for d in directories]},
                  f, indent=1)
        f.write("\n")
    return text


def sources(out):
    """The parity folders ``out``'s sources.json names, as paths from here.

    Raises:
      ValueError: where ``out`` has no sources.json (this command did not write it).
    """
    path = os.path.join(out, SOURCES)
    if not os.path.isfile(path):
        raise ValueError(f"`--render` must name a folder this command wrote (its {SOURCES}). Received: "
                         f"--render={out}")
    with open(path) as f:
        return [os.path.normpath(os.path.join(out, d)) for d in json.load(f)["sources"]]


def main(argv=None, prog="python -m benchmarks parity-by-np"):
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("directories", nargs="*", metavar="DIR",
                   help="parity folders of one workload, budget and flags, one per np (python -m benchmarks parity "
                        "--np N --out DIR)")
    p.add_argument("--out", metavar="OUT", help=f"where {PAGE}, {PLOT} and {SOURCES} are written")
    p.add_argument("--render", metavar="OUT", help=f"write OUT's {PAGE} and {PLOT} again from the folders its "
                                                   f"{SOURCES} names, print the page and exit")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if bool(args.render) == bool(args.out) or bool(args.render) == bool(args.directories):
        p.error(f"`--out` must be given with one DIR or more, or `--render` alone. Received: --out={args.out} "
                f"--render={args.render} DIR={' '.join(args.directories) or None}")
    try:
        out = args.render or args.out
        print(write(sources(out) if args.render else args.directories, out), end="")
    except (ValueError, OSError) as error:  # a folder of another kind: one line, exit status 2, as argparse's
        p.error(str(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
