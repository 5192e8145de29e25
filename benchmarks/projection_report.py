"""The projection page: every strategy and format at 8 to 1,024 hosts, generated from committed inputs only.

``python -m benchmarks project --report`` writes, from the traffic table
(``docs/results/traffic/traffic.json``), the models (``workloads.py``, whose
compute times come from committed measurements where there are some) and the
time-to-accuracy results (``docs/results/tta_teacher/results.json``):

* ``docs/results/projection/projection.json``: samples/s and scaling
  efficiency per model, link, configuration and host count;
* ``docs/results/projection/horovod_paper.json``: the paper check
  (``paper_check.py``);
* ``benchmarks/figures/projection_<model>.png``: efficiency against hosts,
  one panel per link (the site shows benchmarks/figures/ as figures/);
* ``docs/projection.md``: the page, tables and the "which strategy where"
  reading.

``tests/unit/test_projection_report.py`` checks that the committed JSON and
page equal what this module computes from the committed inputs. Nothing here
ran at these sizes, and no latency can be emulated on this machine (no
``netem``): the across-sites rows are projection only.
"""
import json
import pathlib

from hvd_easgd import cost_model

from . import calibration, format_compute, paper_check, workloads

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "results" / "projection"
PAGE = ROOT / "docs" / "projection.md"
FIGURES = ROOT / "benchmarks" / "figures"  # served as figures/ by docs/hooks/figures.py
TTA = ROOT / "docs" / "results" / "tta_teacher" / "results.json"
COMMAND = "python -m benchmarks project --report"
HOSTS, RANKS_PER_HOST = (8, 64, 512, 1024), 8
DATACENTRE_ALPHA = 5e-6  # assumed: "a few µs" a message within a datacentre
# (name, bytes/s, α): within a datacentre, then across sites at 1 to 100 ms.
DATACENTRE, ACROSS_SITES, SITE_LATENCIES_MS = ("10gbit", "100gbit", "400gbit"), ("1gbit", "100mbit"), (1, 10, 100)
LINKS = tuple((f"{rate} α 5 µs", calibration.LINKS[rate], DATACENTRE_ALPHA) for rate in DATACENTRE) \
    + tuple((f"{rate} α {ms} ms", calibration.LINKS[rate], ms * 1e-3) for rate in ACROSS_SITES
            for ms in SITE_LATENCIES_MS)
# Not strategies: the ceiling, and a hand-written Horovod loop that sends what sync sends.
LEFT_OUT = ("no_comm", "raw_horovod")


def _round(x):
    return float(f"{x:.6g}")


def step_ratios(path=TTA):
    """{configuration: epochs to the target ÷ SyncAverage's}, from the committed time-to-accuracy run."""
    tta = json.loads(pathlib.Path(path).read_text())["time_to_accuracy"]
    per = tta["per_config"]
    base = per["sync"]["epochs_to_target"]
    ratios = {name: _round(c["epochs_to_target"] / base) for name, c in per.items()
              if c.get("epochs_to_target") is not None}
    about = {k: tta[k] for k in ("target", "np", "model", "data", "seeds", "batch_per_rank")}
    link = tta.get("link")
    about["link"] = link.get("nominal") if isinstance(link, dict) else link
    return ratios, about


def compute():
    """Everything the page shows, as data."""
    table = calibration.load_table()
    models = workloads.models()
    configurations = [c for c in table["configurations"] if c not in LEFT_OUT]
    measured = format_compute.load()
    encoding = {}
    for model, w in models.items():
        estimates = format_compute.estimates(w)
        encoding[model] = {name: {"share": _round(share), "basis": basis,
                                  "estimate": None if estimates.get(name) is None else _round(estimates[name])}
                           for name, (share, basis) in format_compute.shares((model, w), measured).items()
                           if name in configurations}
    grid = {}
    for model, w in models.items():
        grid[model] = {}
        shares = {name: e["share"] for name, e in encoding[model].items()}
        for link, bandwidth, alpha in LINKS:
            rows = cost_model.project(table, w.params, w.compute, HOSTS, RANKS_PER_HOST, (alpha, bandwidth), w.batch,
                                      configurations, shares)
            per = {}
            for name, _, rate, eff in rows:
                entry = per.setdefault(name, {"samples_per_second": [], "efficiency": []})
                entry["samples_per_second"].append(_round(rate))
                entry["efficiency"].append(_round(eff))
            grid[model][link] = per
    ratios, about = step_ratios()
    return {"command": COMMAND, "hosts": list(HOSTS), "ranks_per_host": RANKS_PER_HOST,
            "links": [{"name": n, "bytes_per_second": b, "alpha_seconds": a} for n, b, a in LINKS],
            "models": {m: w._asdict() for m, w in models.items()},
            "configurations": {c: table["configurations"][c]["description"] for c in configurations},
            "encoding": encoding, "step_ratios": ratios, "step_ratios_from": about, "projection": grid}


def best(data, model, link, at):
    """(configurations, samples/s to the target ÷ SyncAverage's) at host index ``at``, among measured ratios;
    configurations that tie (the same bytes and ratio) are joined with " = "."""
    per = data["projection"][model][link]
    ratios = {c: r for c, r in data["step_ratios"].items() if c in per}
    score = {c: per[c]["samples_per_second"][at] / r for c, r in ratios.items()}
    top = max(score.values())
    winners = [c for c, v in score.items() if v >= top * (1 - 1e-9)]
    return " = ".join(winners), top / score["sync"]


def _latencies(data, alpha=1e-3):
    """Halving/doubling's and the ring's latency per allreduce at the largest cluster and ``alpha`` (1 ms)."""
    hosts = data["hosts"][-1]
    return (f"{cost_model.allreduce_latencies(hosts) * alpha * 1e3:.0f} ms",
            f"{2 * (hosts * data['ranks_per_host'] - 1) * alpha:.1f} s")


def _cell(values):
    return " / ".join(f"{v:.2f}" for v in values)


def _models_table(data):
    lines = ["| model | trainable parameters | batch a rank | c (ms a step) | basis | source of c |",
             "|---|---:|---:|---:|---|---|"]
    for m, w in data["models"].items():
        lines.append(f"| {m} | {w['params']:,} | {w['batch']} | {1e3 * w['compute']:.2f} | {w['basis']} "
                     f"| {w['source']} |")
    return "\n".join(lines)


def _share_cell(entry):
    beside = "" if entry["estimate"] is None or not entry["basis"].startswith("measured") else \
        f"; FLOPs estimate {entry['estimate']:.3g}, ×{entry['share'] / entry['estimate']:.1f}"
    return f"{entry['share']:.3g} ({entry['basis']}{beside})"


def _flops_table(data):
    lines = ["| model | FLOPs a sample (forward and backward) | from |", "|---|---:|---|"]
    for m, w in data["models"].items():
        lines.append(f"| {m} | " + (f"{w['flops_per_sample']:.3g}" if w["flops_per_sample"] else "—")
                     + f" | {w['flops_source'] or 'unknown (its share is measured)'} |")
    return "\n".join(lines)


def _encoding_table(data):
    names = list(dict.fromkeys(name for shares in data["encoding"].values() for name in shares))
    lines = ["| model | " + " | ".join(f"{name}: share of c" for name in names) + " |",
             "|---|" + "---|" * len(names)]
    for model, shares in data["encoding"].items():
        lines.append(f"| {model} | " + " | ".join(_share_cell(shares[n]) if n in shares else "—" for n in names)
                     + " |")
    return "\n".join(lines)


def _efficiency_tables(data):
    out = []
    links = [link["name"] for link in data["links"]]
    for model, per_link in data["projection"].items():
        w = data["models"][model]
        ideal = [h * data["ranks_per_host"] * w["batch"] / w["compute"] for h in data["hosts"]]
        out += [f"### {model}", "",
                f"![scaling efficiency against hosts, {model}, one panel per link]"
                f"(figures/projection_{model}.png)", "",
                f"Scaling efficiency at {' / '.join(str(h) for h in data['hosts'])} hosts × "
                f"{data['ranks_per_host']} ranks; the no-communication ideal is "
                f"{' / '.join(f'{x:.3g}' for x in ideal)} samples/s.", "",
                "| configuration | " + " | ".join(links) + " |", "|---|" + "---:|" * len(links)]
        for name in per_link[links[0]]:
            out.append(f"| {name} | " + " | ".join(_cell(per_link[link][name]["efficiency"]) for link in links) + " |")
        out += ["", f"Samples/s over the cluster at {' / '.join(str(h) for h in data['hosts'])} hosts:",
                "", "| configuration | " + " | ".join(links) + " |", "|---|" + "---:|" * len(links)]
        for name in per_link[links[0]]:
            rates = (per_link[link][name]["samples_per_second"] for link in links)
            out.append(f"| {name} | " + " | ".join(" / ".join(f"{x:.3g}" for x in r) for r in rates) + " |")
        out.append("")
    return "\n".join(out)


def _where_table(data):
    lines = ["| model | link | best at 8 hosts (× sync to target) | best at 1,024 hosts (× sync to target) |",
             "|---|---|---|---|"]
    by_link = {}
    for model in data["projection"]:
        for link in (x["name"] for x in data["links"]):
            first, gain_first = best(data, model, link, 0)
            last, gain_last = best(data, model, link, -1)
            by_link.setdefault(link, []).append(last)
            lines.append(f"| {model} | {link} | {first} ({gain_first:.2f}×) | {last} ({gain_last:.2f}×) |")
    return "\n".join(lines), by_link


def _where_reading(by_link):
    """One line per link: which configurations win at 1,024 hosts, over how many of the models."""
    out = []
    for link, winners in by_link.items():
        counts = {w: winners.count(w) for w in dict.fromkeys(winners)}
        out.append(f"- {link}: " + ", ".join(f"{w} ({n} of {len(winners)} models)" for w, n in counts.items()))
    return "\n".join(out)


def _ratios_table(data):
    lines = ["| configuration | epochs to target ÷ sync's |", "|---|---:|"]
    lines += [f"| {c} | {r:.3g} |" for c, r in data["step_ratios"].items()]
    return "\n".join(lines)


def render(data=None, paper=None):
    """docs/projection.md from the computed data and the paper check."""
    data = data or compute()
    paper = paper or paper_check.results()
    about = data["step_ratios_from"]
    where, by_link = _where_table(data)
    unranked = [c for c in data["configurations"] if c not in data["step_ratios"]]
    links = ", ".join(f"{calibration.LINKS[r] * 8 / 1e9:g} Gbit/s" for r in DATACENTRE + ACROSS_SITES)
    return f"""# Projection: every strategy at 8 to 1,024 hosts

<!-- Generated by `{data['command']}` from docs/results/traffic/traffic.json, benchmarks/workloads.py (and the
committed measurements it reads), benchmarks/paper_check.py and docs/results/tta_teacher/results.json.
Do not edit: tests/unit/test_projection_report.py checks that this page equals its render. -->

Regenerate everything on this page (the tables, `docs/results/projection/*.json` and the plots,
`benchmarks/figures/projection_*.png`) with

    {data['command']}

(after `python -m benchmarks traffic`, which rewrites the traffic table from the strategies' hooks, whenever a
strategy's traffic changed; `{data['command']} --check` fails while a committed file is stale).

This is the α–β cost model of the [Benchmarks](benchmarks.md) page (`hvd_easgd/cost_model.py`), projected;
nothing here ran at these sizes. The across-sites rows (1 Gbit/s and 100 Mbit/s at 1 to 100 ms a message)
are **projection only**: no latency can be emulated on this machine (no `netem`), so the model's α was never
measured there. Each configuration's bytes and calls per step come from its strategy's own `expected_traffic`
hook (the traffic table), each collective charged by its own formula; within a host the model charges shared
memory at {cost_model.INTRA_BANDWIDTH / 1e9:g} GB/s and {cost_model.INTRA_ALPHA * 1e6:g} µs a message (assumed).
Where this machine can measure, the same formulas are checked against the virtual cluster, row by row, on
[the validation page](cost-model-validation.md).

## Inputs

Hosts: {', '.join(f'{h:,}' for h in data['hosts'])}, each with {data['ranks_per_host']} ranks. Links (the
host's link, both ways): {links}, with α = {DATACENTRE_ALPHA * 1e6:g} µs a message within a datacentre
(assumed: a few µs) and 1, 10 or 100 ms across sites.

Compute per step c per model, measured here where there is a measurement (a CPU figure on this 2-core machine:
an accelerator computes these small models far faster, so their real efficiency is lower than shown), cited
or assumed otherwise:

{_models_table(data)}

PowerSGD encodes every gradient matrix on every step, work that c does not hold: its configurations compute
c·(1 + s) a step, with s measured in one process where `python -m benchmarks validate --measure-formats` ran
(`docs/results/validation/format_compute.json`, this machine's CPU, against the same c) and otherwise estimated
as its products' floating-point operations against the step's, 6rN / (b·f) at rank r, per-rank batch b and f
FLOPs a sample (`benchmarks/format_compute.py`; r/b for dense layers). A measured share is shown beside that
estimate where both exist. A quantising format (DiLoCo's int8 and int4) encodes once a period, in several
elementwise passes (encode, decode and add the parts received, encode the sum, decode the gathered parts, keep the
error): its share is the one measured at p = {max(format_compute.RANKS)} (alltoall + allgather, the form every p from 3 runs) over its
period, and unknown (0) for a model nothing measured, since such passes are bound by memory, not FLOPs. f per
model:

{_flops_table(data)}

{_encoding_table(data)}

{paper_check.render(paper)}
## Projected scaling efficiency

Efficiency = c / step time (1 is the no-communication ceiling); each cell is the efficiency at
{', '.join(f'{h:,}' for h in data['hosts'])} hosts.

{_efficiency_tables(data)}
## Which strategy where

Throughput alone misleads: a local-update strategy can need more steps to reach a target. The reading weighs
each projected samples/s by the strategy's measured epochs to the target against SyncAverage's (the same
batch, so steps to the target in the same ratio), from docs/results/tta_teacher/results.json: {about['model']}
on --data {about['data']}, target {about['target']}, np {about['np']}, per-rank batch
{about['batch_per_rank']}, {about['seeds']} seeds, over {about['link']}. These ratios are the inputs:

{_ratios_table(data)}

They were measured at {about['np']} ranks on one workload; at thousands of ranks local-update strategies
usually need more steps still, so the gains below are upper bounds for them. Not ranked, for want of a
measured ratio: {', '.join(unranked)}.

{where}

The best to the target at 1,024 hosts, per link:

{_where_reading(by_link)}

Read it as: where SyncAverage's one allreduce a step is nearly free against the model's compute, its fewer
epochs win; where the link's bandwidth or latency makes that allreduce cost more than the extra epochs of a
strategy that communicates once every τ steps, that strategy wins, by the factor shown. Every allreduce is
the faster of a ring and halving/doubling nearest ranks first ([cost model](benchmarks.md)): across sites the
latter's 2·⌈log2 H⌉ latencies, {_latencies(data)[0]} a call at {data['hosts'][-1]:,} hosts and 1 ms, against the
ring's {_latencies(data)[1]} at {data['hosts'][-1] * data['ranks_per_host']:,} ranks. Latency still weighs on
Streaming DiLoCo's fragments (more calls of fewer bytes) there.
"""


def _plot(data, model, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    links = [x["name"] for x in data["links"]]
    fig, axes = plt.subplots(3, 3, figsize=(13, 10), sharex=True, sharey=True)
    colours = plt.get_cmap("tab20").colors  # 14 configurations: tab10 would repeat its colours
    for ax, link in zip(axes.flat, links):
        for i, (name, values) in enumerate(data["projection"][model][link].items()):
            ax.plot(data["hosts"], values["efficiency"], marker="os^"[i % 3], markersize=3, label=name,
                    color=colours[i % len(colours)], linestyle="-" if i % 2 == 0 else "--")
        ax.set_xscale("log", base=2)
        ax.set_title(link, fontsize=9)
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel(f"hosts ({data['ranks_per_host']} ranks each)")
    for ax in axes[:, 0]:
        ax.set_ylabel("scaling efficiency")
    axes.flat[0].legend(fontsize=6, ncol=2)
    fig.suptitle(f"{model}: projected scaling efficiency (cost model; projection only)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def files():
    """{path: text} of every generated text file (the plots are drawn by ``write``)."""
    data, paper = compute(), paper_check.results()
    dump = lambda obj: json.dumps(obj, indent=1, sort_keys=True) + "\n"  # noqa: E731
    return {OUT / "projection.json": dump(data), OUT / "horovod_paper.json": dump(paper), PAGE: render(data, paper)}


def write(check=False):
    """Writes (or, with ``check``, compares) every generated file; returns the paths written or stale."""
    texts = files()
    if check:
        return [path for path, text in texts.items() if not path.exists() or path.read_text() != text]
    OUT.mkdir(parents=True, exist_ok=True)
    for path, text in texts.items():
        path.write_text(text)
    data = json.loads(texts[OUT / "projection.json"])
    plots = []
    for model in data["projection"]:
        path = FIGURES / f"projection_{model}.png"
        _plot(data, model, path)
        plots.append(path)
    return list(texts) + plots
