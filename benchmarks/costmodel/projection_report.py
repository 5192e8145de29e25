"""The projection pages: compute utilisation on today's accelerators, and every strategy and format at 8 to
1,024 hosts, generated from committed inputs only.

``python -m benchmarks project --report`` writes, from the traffic table
(``docs/results/traffic/traffic.json``), the models (``workloads.py``, whose
compute times come from committed measurements here or elsewhere), the
time-to-accuracy results (``docs/results/tta_teacher/results.json``) and the
papers' points (``paper_check.py``, ``diloco_paper_check.py``):

* ``docs/results/projection/projection.json``: compute utilisation (scaling
  efficiency) and samples/s per model, link, configuration and host count,
  and the H200 bandwidth sweep the first plot draws;
* ``docs/results/projection/horovod_paper.json`` and
  ``streaming_diloco_paper.json``: the two paper checks;
* ``benchmarks/figures/projection_h200.png``: the page's one plot, compute
  utilisation against link bandwidth on H200 compute;
  ``benchmarks/figures/projection_<model>.png``: efficiency against hosts,
  one panel per link (the site shows benchmarks/figures/ as figures/);
* ``docs/projection.md``: the answer in a sentence generated from these
  results, the plot, the paper checks and the inputs;
  ``docs/projection-tables.md``: the long tables.

``tests/unit/test_projection_report.py`` checks that the committed JSON and
pages equal what this module computes from the committed inputs. Nothing here
ran at these sizes, and no latency can be emulated on this machine (no
``netem``): the across-sites rows are projection only.
"""
import json
import math
import pathlib
import textwrap

from hvd_easgd.choosing import cost_model

from . import calibration, diloco_paper_check, format_compute, paper_check, workloads
from ..suite import committed

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "results" / "projection"
PAGE = ROOT / "docs" / "projection.md"
TABLES_PAGE = ROOT / "docs" / "projection-tables.md"
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
# The first plot: the models measured on an H200, one accelerator a host (each host its own link), at two
# cluster sizes, over a sweep of link rates within a datacentre (α as above).
H200_MODELS, H200_HOSTS = ("resnet50_h200", "1b"), (64, 1024)
H200_GBITS = (1, 1.5, 2, 3, 4, 6, 8, 10, 15, 20, 30, 40, 60, 80, 100, 150, 200, 300, 400)
H200_TARGET = 0.9  # the utilisation the summary asks each strategy for
MODEL_NAMES = {"resnet50_h200": "ResNet-50", "1b": "the 1 B model"}


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


def utilisation(table, w, configuration, hosts, ranks_per_host, link, share=0.0):
    """c / step time of one configuration: ``cost_model.project``'s efficiency, one cell of it."""
    entry = table["configurations"][configuration]
    comm = cost_model.comm_time(entry, table["reference"], w.params, hosts, ranks_per_host, link)
    return w.compute / cost_model.step_time(w.compute * (1 + share), comm, entry.get("overlapped", 0.0))


def needed_gbits(table, w, configuration, hosts, share, target, alpha=DATACENTRE_ALPHA, highest=1e6):
    """The link rate (Gbit/s) from which ``configuration`` reaches ``target`` utilisation at ``hosts`` × 1
    rank, by bisection on a log scale; None where even ``highest`` does not (its encoding or its latency alone
    costs more than the target leaves)."""
    def reaches(gbits):
        return utilisation(table, w, configuration, hosts, 1, (alpha, gbits * 1e9 / 8), share) >= target
    if not reaches(highest):
        return None
    low, high = 1e-3, highest
    for _ in range(100):
        middle = math.sqrt(low * high)
        low, high = (low, middle) if reaches(middle) else (middle, high)
    return _round(high)


def _encoding(models, configurations):
    measured = format_compute.load()
    encoding = {}
    for model, w in models.items():
        estimates = format_compute.estimates(w)
        encoding[model] = {name: {"share": _round(share), "basis": basis,
                                  "estimate": None if estimates.get(name) is None else _round(estimates[name])}
                           for name, (share, basis) in format_compute.shares((model, w), measured).items()
                           if name in configurations}
    return encoding


def _h200(table, models, configurations, encoding):
    """The first plot's data: utilisation against link rate on H200 compute, and the rates ``H200_TARGET`` needs."""
    sweep, needs = {}, {}
    for model in H200_MODELS:
        w, shares = models[model], {name: e["share"] for name, e in encoding[model].items()}
        sweep[model] = {str(hosts): {c: [_round(utilisation(table, w, c, hosts, 1, (DATACENTRE_ALPHA, g * 1e9 / 8),
                                                            shares.get(c, 0.0))) for g in H200_GBITS]
                                     for c in configurations} for hosts in H200_HOSTS}
        needs[model] = {c: needed_gbits(table, w, c, H200_HOSTS[-1], shares.get(c, 0.0), H200_TARGET)
                        for c in configurations}
    anchor = workloads.h200()
    return {"models": list(H200_MODELS), "hosts": list(H200_HOSTS), "ranks_per_host": 1,
            "alpha_seconds": DATACENTRE_ALPHA, "gbit_per_second": list(H200_GBITS), "target": H200_TARGET,
            "utilisation": sweep, "needs_gbit_per_second": needs,
            "device": {"gpu": anchor["gpu"].split(",")[0], "torch": anchor["torch"],
                       "host_device_bytes_per_second": 1e9 * min(anchor["h2d"].values()),
                       "device_copy_bytes_per_second": 1e9 * anchor["ceilings"]["d2d_copy_GBps_rw"],
                       "int8_fp32_bytes_per_second": 1e9 * anchor["quantise_block256"]["int8"]["GB_fp32_per_s"]}}


def compute():
    """Everything the pages show, as data."""
    table = calibration.load_table()
    models = workloads.models()
    configurations = [c for c in table["configurations"] if c not in LEFT_OUT]
    encoding = _encoding(models, configurations)
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
            "encoding": encoding, "step_ratios": ratios, "step_ratios_from": about, "projection": grid,
            "h200": _h200(table, models, configurations, encoding)}


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
    """Halving/doubling's and the ring's latency per allreduce at the largest cluster and ``alpha`` (1 ms);
    the ring's is the cost model's ring allreduce of no bytes."""
    hosts = data["hosts"][-1]
    ring = cost_model.ring_allreduce(hosts * data["ranks_per_host"], 0, alpha, bandwidth=1.0)
    return (f"{cost_model.allreduce_latencies(hosts) * alpha * 1e3:.0f} ms", f"{ring:.1f} s")


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


def _efficiency_tables(data, shown_above=None):
    """Per model, its plot and its table; ``shown_above``'s plot is the page's lead figure, not repeated."""
    out = []
    links = [link["name"] for link in data["links"]]
    for model, per_link in data["projection"].items():
        w = data["models"][model]
        ideal = [h * data["ranks_per_host"] * w["batch"] / w["compute"] for h in data["hosts"]]
        out += [f"### {model}", ""]
        if model != shown_above:
            out += [f"![scaling efficiency against hosts, {model}, one panel per link]"
                    f"(figures/projection_{model}.png)", ""]
        out += [
                f"Scaling efficiency at {' / '.join(str(h) for h in data['hosts'])} hosts × "
                f"{data['ranks_per_host']} ranks; the no-communication ideal is "
                f"{' / '.join(f'{x:.3g}' for x in ideal)} samples/s (a configuration's samples/s is its efficiency "
                "times that, in `docs/results/projection/projection.json`).", "",
                "| configuration | " + " | ".join(links) + " |", "|---|" + "---:|" * len(links)]
        for name in per_link[links[0]]:
            out.append(f"| {name} | " + " | ".join(_cell(per_link[link][name]["efficiency"]) for link in links) + " |")
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


def _gbits(x):
    if x is None:
        return "no link rate"
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _label(data, configuration):
    """A configuration as the traffic table describes it, without the package's name."""
    return data["configurations"][configuration].replace("hvd_easgd ", "")


SUMMARY_WIDTH = 118  # the summary's source lines; the page starts with at most five of them


def summary(data, diloco):
    """The page's first lines: what the plot shows, generated from the same results."""
    h = data["h200"]
    needs = h["needs_gbit_per_second"]
    least = {}
    for model in h["models"]:
        reached = {c: v for c, v in needs[model].items() if v is not None}
        least[model] = min(reached, key=reached.get)
    chosen = list(dict.fromkeys(least.values()))
    names = " and ".join(f"{MODEL_NAMES[m]}'s" for m in h["models"])
    who = (f"{_label(data, chosen[0])} (`{chosen[0]}`)" if len(chosen) == 1 else
           " and ".join(f"{_label(data, least[m])} (`{least[m]}`) for {MODEL_NAMES[m]}" for m in h["models"]))
    text = (f"On H200 compute at {h['hosts'][-1]:,} hosts, one accelerator and link each, SyncAverage keeps "
            f"{h['target']:.0%} of {names} compute busy only from "
            f"{' and '.join(_gbits(needs[m]['sync']) for m in h['models'])} Gbit/s a host; {who} does from "
            f"{' and '.join(_gbits(needs[m][least[m]]) for m in h['models'])} Gbit/s. The plot: every strategy from "
            f"{_gbits(h['gbit_per_second'][0])} to {_gbits(h['gbit_per_second'][-1])} Gbit/s at "
            f"{' and '.join(f'{x:,}' for x in h['hosts'])} hosts. The same cost model reproduces "
            f"{diloco['within']} of Streaming DiLoCo's {diloco['total']} simulated points within "
            f"{100 * diloco['assumptions']['tolerance']:g} pp.")
    return textwrap.fill(text, SUMMARY_WIDTH)


def _h200_inputs(data):
    """What the first plot assumes, with the H200 figures it uses and the two it does not."""
    h, models = data["h200"], data["models"]
    d = h["device"]
    rows = []
    for model in h["models"]:
        w, e = models[model], data["encoding"][model]
        staged = 2 * 4 * w["params"] / d["host_device_bytes_per_second"]
        rows.append(f"- {MODEL_NAMES[model][0].upper() + MODEL_NAMES[model][1:]} (`{model}`): c = "
                    f"{1e3 * w['compute']:.1f} ms a step at {w['batch']} samples, {w['params']:,} parameters "
                    f"({4 * w['params'] / 1e6:,.0f} MB of fp32 gradients); PowerSGD rank 4's encode costs "
                    f"{e['sync_powersgd4']['share']:.1%} of c a step, int8's quantised allreduce "
                    f"{e['sync_int8']['share']:.1%} every step or {e['diloco_tau10_int8']['share']:.2%} at τ = 10; "
                    f"staging a sync through host memory would add {1e3 * staged:.1f} ms.")
    return "\n".join(rows) + f"""

Each host is one {d['gpu']} with its own link, α = {h['alpha_seconds'] * 1e6:g} µs a message (within a datacentre);
for an allreduce, an 8-GPU server whose NVLink is far faster than its link behaves the same with B its link's rate
(each GPU carries an eighth of the bytes on an eighth of the link). Utilisation is c / step time, the format's
own compute included (`benchmarks/costmodel/format_compute.py`: the figures measured on the H200, two quantise + dequantise
passes a quantised allreduce). Collectives run device to device; staging through host memory, at the measured
{d['host_device_bytes_per_second'] / 1e9:.0f} GB/s each way, is the cost above, not charged. The int8 pass ran
unfused at {d['int8_fp32_bytes_per_second'] / 1e9:.0f} GB/s of fp32, {d['int8_fp32_bytes_per_second'] /
d['device_copy_bytes_per_second']:.0%} of the device's {d['device_copy_bytes_per_second'] / 1e12:.1f} TB/s copy
rate, so a fused kernel could cut the quantising formats' share several-fold. Lines that coincide (the same
bytes, calls and overlap) share one entry in the legend."""


def _horovod_line(paper):
    rows = paper["rows"]
    pct = lambda key: " / ".join(f"{100 * r[key]:.0f}" for r in rows)  # noqa: E731
    inside = all(r["predicted"] <= r["reported"] <= r["predicted_all_hidden"] for r in rows)
    return (f"Against the [Horovod paper]({paper['sources']['paper']})'s scaling efficiency at "
            f"{paper['setup']['servers'] * paper['setup']['gpus_per_server']} GPUs "
            f"({', '.join(r['model'] for r in rows)}: "
            f"{pct('reported')} %), the model predicts {pct('predicted')} % with nothing hidden and "
            f"{pct('predicted_all_hidden')} % with every allreduce behind compute"
            + ("; every reported figure lies between the two." if inside else ".")
            + " Its inputs, sources and reading are in the [full tables](projection-tables.md#checked-against-the-"
            "horovod-paper).")


def render(data=None, paper=None, diloco=None):
    """docs/projection.md: the answer, the plot, the paper checks, the inputs; the long tables are
    ``render_tables``'."""
    data = data or compute()
    paper = paper or paper_check.results()
    diloco = diloco or diloco_paper_check.results()
    about = data["step_ratios_from"]
    _, by_link = _where_table(data)
    unranked = [c for c in data["configurations"] if c not in data["step_ratios"]]
    links = ", ".join(f"{calibration.LINKS[r] * 8 / 1e9:g} Gbit/s" for r in DATACENTRE + ACROSS_SITES)
    h = data["h200"]
    return f"""# Projection: compute utilisation from 8 to 1,024 hosts

{summary(data, diloco)}

![compute utilisation against link bandwidth, ResNet-50 and the 1 B model on H200 compute, at {' and '.join(
    f'{x:,}' for x in h['hosts'])} hosts](figures/projection_h200.png)

<!-- Generated by `{data['command']}` from docs/results/traffic/traffic.json, benchmarks/costmodel/workloads.py (and the
measurements it reads), benchmarks/data/, benchmarks/costmodel/paper_check.py and docs/results/tta_teacher/results.json.
Do not edit: tests/unit/test_projection_report.py checks that this page and docs/projection-tables.md equal
their render. -->

## What the plot assumes

The α–β cost model of the [Benchmarks](benchmarks.md) page (`hvd_easgd/choosing/cost_model.py`), projected: nothing here
ran at these sizes. Each configuration's bytes and calls per step come from its strategy's own `expected_traffic`
hook (the traffic table), each collective charged by its own formula; an allreduce is the faster of a ring and
halving/doubling. The two models were measured on an H200 with PyTorch
(`benchmarks/data/h200-2026-12-04.json`, its README says how), so they are facts about the hardware, not
measurements of hvd_easgd:

{_h200_inputs(data)}

{diloco_paper_check.render(diloco)}
## Checked against the Horovod paper

{_horovod_line(paper)}

## Every strategy at 8 to 1,024 hosts

The [full tables](projection-tables.md) project every model of the inputs below over {len(data['links'])} links
({links}, with α = {DATACENTRE_ALPHA * 1e6:g} µs within a datacentre, assumed, and 1, 10 or 100 ms across
sites, projection only: no latency can be emulated here, so α was never measured there) at
{', '.join(f'{x:,}' for x in data['hosts'])} hosts × {data['ranks_per_host']} ranks, within a host shared
memory at {cost_model.INTRA_BANDWIDTH / 1e9:g} GB/s and {cost_model.INTRA_ALPHA * 1e6:g} µs a message (assumed).
Where this machine can measure, the same formulas are checked against the virtual cluster, row by row, on
[the validation page](cost-model-validation.md).

Throughput alone misleads: a local-update strategy can need more steps to reach a target. Weighing each projected
samples/s by the strategy's measured epochs to a target against SyncAverage's ({about['model']} on --data
{about['data']}, target {about['target']}, np {about['np']}, {about['seeds']} seeds, over {about['link']}: an
upper bound for local-update strategies at thousands of ranks; {len(unranked)} configurations have no ratio yet),
the best to the target at {data['hosts'][-1]:,} hosts, per link:

{_where_reading(by_link)}

Where SyncAverage's one allreduce a step is nearly free against the compute, its fewer epochs win; where the
link's bandwidth or latency makes it cost more than the extra epochs of a strategy that communicates every τ
steps, that strategy wins. Across sites, halving/doubling pays {_latencies(data)[0]} of latency a call at
{data['hosts'][-1]:,} hosts and 1 ms, the ring {_latencies(data)[1]} at {data['hosts'][-1] * data['ranks_per_host']:,}
ranks; latency still weighs on Streaming DiLoCo's fragments there. The per-model table and the ratios are in the
[full tables](projection-tables.md#which-strategy-where).

## Inputs

Compute per step c per model: measured on this 2-core machine's CPU where there is a measurement (an accelerator
computes these small models far faster, so their real efficiency is lower than shown), measured elsewhere (the
H200), cited or assumed otherwise:

{_models_table(data)}

A format's own work is charged as a share of c: PowerSGD encodes every step, a quantising format (int8, int4)
once a period. The shares are measured in one process on this machine where `python -m benchmarks validate
--measure-formats` ran (`docs/results/validation/format_compute.json`; a quantised allreduce's at p =
{max(format_compute.RANKS)}, the alltoall + allgather form), measured on the H200 for its models, and otherwise
estimated as PowerSGD's products' FLOPs against the step's, 6rN / (b·f) (`benchmarks/costmodel/format_compute.py`; f per
model in the [full tables](projection-tables.md#inputs-flops-a-sample)), or unknown (0) for an elementwise format
nothing measured:

{_encoding_table(data)}

## Regenerate

    {data['command']}

rewrites both pages, `docs/results/projection/*.json` (samples/s and efficiency for every cell, the H200 sweep,
both paper checks) and the plots `benchmarks/figures/projection_*.png`; run `python -m benchmarks traffic`
first whenever a strategy's traffic changed. `{data['command']} --check` fails while a committed file is stale.
`python -m benchmarks project --paper streaming-diloco` (or `horovod`) prints a paper's table.
"""


def render_tables(data=None, paper=None, diloco=None):
    """docs/projection-tables.md: every model and link, the per-model reading, and both paper checks in full."""
    data = data or compute()
    paper = paper or paper_check.results()
    diloco = diloco or diloco_paper_check.results()
    where, _ = _where_table(data)
    about = data["step_ratios_from"]
    unranked = [c for c in data["configurations"] if c not in data["step_ratios"]]
    first = next(iter(data["projection"]))
    return f"""# Projection: the full tables

Every number behind the [projection page](projection.md): the scaling efficiency of {len(data['configurations'])} configurations
for {len(data['projection'])} models over {len(data['links'])} links at {' / '.join(f'{x:,}' for x in data['hosts'])} hosts, which
strategy to take where, and both paper checks in full. The first model, {first} (its table is the first below):

![scaling efficiency against hosts, {first}, one panel per link](figures/projection_{first}.png)

<!-- Generated by `{data['command']}`, with docs/projection.md. Do not edit. -->

The tables behind the [projection page](projection.md), from the same command and inputs; every number here is
also in `docs/results/projection/`.

## Scaling efficiency, every model and link

Efficiency = c / step time (1 is the no-communication ceiling) at {', '.join(f'{h:,}' for h in data['hosts'])}
hosts × {data['ranks_per_host']} ranks, within a host shared memory at {cost_model.INTRA_BANDWIDTH / 1e9:g} GB/s and
{cost_model.INTRA_ALPHA * 1e6:g} µs a message (assumed). An accelerator server's NVLink is far faster than that, so
for the H200 models (`resnet50_h200`, `1b`) the [projection page](projection.md)'s plot, one accelerator a host, is
the better reading.

{_efficiency_tables(data, shown_above=first)}
## Which strategy where

Each projected samples/s weighed by the strategy's epochs to the target against SyncAverage's, measured on
{about['model']} (--data {about['data']}, target {about['target']}, np {about['np']}, per-rank batch
{about['batch_per_rank']}, {about['seeds']} seeds, over {about['link']}; the same batch, so steps to the target
in the same ratio):

{_ratios_table(data)}

Not ranked, for want of a measured ratio: {', '.join(unranked)}.

{where}

## Inputs: FLOPs a sample

{_flops_table(data)}

## Streaming DiLoCo, point by point

Each of the paper's points against the model (the [projection page](projection.md#checked-against-streaming-diloco)
says how): its CU at the paper's bandwidth and a grid step (×{diloco['assumptions']['grid_step']}) lower, the
difference in percentage points, and the bandwidth the model needs for the target.

{diloco_paper_check.render_points(diloco)}

{paper_check.render(paper)}"""


def _groups(series):
    """[(label, values)] with the configurations whose values are identical in every panel joined by " = "."""
    groups = {}
    for name, values in series.items():
        groups.setdefault(tuple(values), []).append(name)
    return [(" = ".join(names), list(values)) for values, names in groups.items()]


def _plot_h200(data, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = data["h200"]
    configurations = list(data["configurations"])
    series = {c: [v for model in h["models"] for hosts in h["hosts"] for v in h["utilisation"][model][str(hosts)][c]]
              for c in configurations}
    groups = _groups(series)
    fig, axes = plt.subplots(len(h["models"]), len(h["hosts"]), figsize=(13, 8.5), sharex=True, sharey=True)
    tab20 = plt.get_cmap("tab20").colors
    colours = tab20[0::2] + tab20[1::2]  # the ten strong colours first, then their light twins
    n = len(h["gbit_per_second"])
    for row, model in enumerate(h["models"]):
        for col, hosts in enumerate(h["hosts"]):
            ax = axes[row][col]
            panel = (row * len(h["hosts"]) + col) * n
            for i, (label, values) in enumerate(groups):
                sync = "sync" in label.split(" = ")  # the baseline: SyncAverage, in black
                ax.plot(h["gbit_per_second"], values[panel:panel + n], marker="os^D"[i % 4], markersize=3,
                        color="black" if sync else colours[i % len(colours)], linewidth=2.2 if sync else 1.2,
                        linestyle="-" if sync or i < 10 else "--", label=label)
            w = data["models"][model]
            ax.set_title(f"{MODEL_NAMES[model]} on an H200 (c = {1e3 * w['compute']:.1f} ms), {hosts:,} hosts",
                         fontsize=9)
            ax.set_xscale("log")
            ax.set_ylim(0, 1.02)
            ax.axhline(h["target"], color="grey", linewidth=0.6, linestyle=":")
            ax.grid(alpha=0.3, which="both")
    for ax in axes[-1]:
        ax.set_xlabel("link bandwidth a host (Gbit/s)")
    for ax in axes[:, 0]:
        ax.set_ylabel("compute utilisation (c / step time)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(0.745, 0.5), fontsize=6.5, frameon=False)
    fig.suptitle(f"Compute utilisation against link bandwidth, one H200 a host, α {h['alpha_seconds'] * 1e6:g} µs "
                 "(cost model; projection only)")
    fig.tight_layout(rect=(0, 0, 0.745, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)


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
    data, paper, diloco = compute(), paper_check.results(), diloco_paper_check.results()
    dump = lambda obj: json.dumps(obj, indent=1, sort_keys=True) + "\n"  # noqa: E731
    return {OUT / "projection.json": dump(data), OUT / "horovod_paper.json": dump(paper),
            OUT / "streaming_diloco_paper.json": dump(diloco), PAGE: render(data, paper, diloco),
            TABLES_PAGE: render_tables(data, paper, diloco)}


def write(check=False):
    """Writes (or, with ``check``, compares) every generated file that differs from its render, and draws the
    plots unless ``check``; returns the paths written (the plots too) or stale."""
    texts = files()
    stale = committed.update(texts, check)
    if check:
        return stale
    data = json.loads(texts[OUT / "projection.json"])
    plots = [FIGURES / "projection_h200.png"]
    _plot_h200(data, plots[0])
    for model in data["projection"]:
        path = FIGURES / f"projection_{model}.png"
        _plot(data, model, path)
        plots.append(path)
    return stale + plots
