"""From measured rows to the headline ratios and the Markdown report.

Every ratio is computed here from rows measured in the same invocation:
nothing is typed in. Rows from the same launch ran interleaved, repeat by
repeat, so their ratio is also given per repeat (paired) as a min–max
range; a ratio against another launch (MWMS) is of medians only.
"""
import json
import os
import statistics

from . import curves
from .names import CUSTOM_LOOP, FIT, HIERARCHICAL
from .runner import spread, table

# (numerator, denominator, loop, goal, what the goal is). A goal is a number, or one per controller
# (a controller missing from it has no goal), or None. Against the no-communication ceiling, not
# against SyncAverage: "EASGD ÷ SyncAverage >= 1.8" rewarded a slow SyncAverage (issue 14).
HEADLINES = (
    ("sync", "raw_horovod", "custom", 0.97, "SyncAverage ÷ raw Horovod (custom loop)"),
    ("sync_fit", "raw_horovod_fit", "fit", 0.97, "SyncAverage ÷ raw Horovod (model.fit)"),
    ("sync", "no_comm", "custom", {"mpi": 0.75, "gloo": 0.6}, "SyncAverage ÷ no communication"),
    ("easgd_tau10", "sync", "custom", None, "EASGD τ=10 ÷ SyncAverage"),
    ("easgd_tau10", "no_comm", "custom", 0.85, "EASGD τ=10 ÷ no communication"),
    ("easgd_tau10_overlap", "no_comm", "custom", 0.85, "EASGD τ=10 overlap ÷ no communication"),
    ("accum4_sync", "sync", "custom", 1.0, "accumulation k=4 ÷ SyncAverage"),
)

# At one rank there is nothing to send: hvd_easgd's path should cost (almost) nothing over the ceiling.
ONE_RANK_HEADLINES = (
    ("sync", "no_comm", "custom", {"mpi": 0.95}, "SyncAverage ÷ no communication"),
)

MWMS_HEADLINES = (
    ("sync_fit", "SyncAverage (model.fit) ÷ MWMS (model.fit)"),
    ("sync", "SyncAverage (custom loop) ÷ MWMS (model.fit)"),
)


def goal_for(goal, controller):
    """A headline's goal under ``controller``: the number, its entry for that controller, or None."""
    return goal.get(controller) if isinstance(goal, dict) else goal


def find(rows, **match):
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return row
    return None


def ratio(a, b):
    """Ratio of medians, and per-repeat ratios when the rows were interleaved."""
    value = a["samples_per_sec"]["median"] / b["samples_per_sec"]["median"]
    ra, rb = a["samples_per_sec"]["repeats"], b["samples_per_sec"]["repeats"]
    same_launch = (a["np"], a["controller"]) == (b["np"], b["controller"]) and len(ra) == len(rb)
    paired = [x / y for x, y in zip(ra, rb)] if same_launch else None
    return {"value": value, "paired_min": min(paired) if paired else None,
            "paired_max": max(paired) if paired else None,
            "paired_median": statistics.median(paired) if paired else None}


def collectives_of(row):
    """The path a row's collectives took; rows from before the default became ``auto`` took Horovod's."""
    return row.get("collectives") or "horovod"


def add_scaling_efficiency(rows):
    """samples/s at np=n ÷ (n × samples/s at np=1), same config, model, loop, controller and collectives."""
    for row in rows:
        row["scaling_efficiency"] = None
        if row["np"] > 1:
            base = next((r for r in rows if r["np"] == 1 and collectives_of(r) == collectives_of(row) and all(
                r.get(k) == row.get(k) for k in ("config", "model", "loop", "controller"))), None)
            if base is not None:
                row["scaling_efficiency"] = row["samples_per_sec"]["median"] / (
                    row["np"] * base["samples_per_sec"]["median"])


def headline_ratios(rows, allreduce_results):
    """Each headline per (np, controller, collectives path) whose launch measured both of its rows;
    a path other than Horovod's is named in the label ("[mpi-direct]")."""
    out = []
    rows = [dict(r, collectives=collectives_of(r)) for r in rows]
    groups = sorted({(r["np"], r["controller"], r["collectives"]) for r in rows if r["controller"] != "grpc-ring"})
    for np_, controller, path in groups:
        tag = "" if path == "horovod" else f" [{path}]"
        for num, den, loop, goals, label in HEADLINES if np_ > 1 else ONE_RANK_HEADLINES:
            a = find(rows, config=num, model="cnn", loop=loop, np=np_, controller=controller, collectives=path)
            b = find(rows, config=den, model="cnn", loop=loop, np=np_, controller=controller, collectives=path)
            if a and b:
                goal = goal_for(goals, controller)
                out.append(dict(ratio(a, b), label=label + tag, np=np_, controller=controller, goal=goal,
                                met=None if goal is None else ratio(a, b)["value"] >= goal, numerator=num,
                                denominator=den, collectives=path))
        if np_ == 1:
            continue
        mwms = find(rows, config="mwms_fit", model="cnn", np=np_)
        for num, label in MWMS_HEADLINES:
            a = find(rows, config=num, model="cnn", np=np_, controller=controller, collectives=path)
            if a and mwms:
                out.append(dict(ratio(a, mwms), label=label + tag, np=np_, controller=controller, goal=None, met=None,
                                numerator=num, denominator="mwms_fit"))
    for result in allreduce_results:
        for size in result["sizes"]:
            if "hvd_fraction_of_mpi4py" in size:
                out.append({"label": f"hvd.allreduce busbw ÷ mpi4py Allreduce busbw, {size['mbytes']} MB",
                            "np": result["n"], "controller": result["controller"],
                            "value": size["hvd_fraction_of_mpi4py"], "goal": None, "met": None})
            if "hvd_fraction_of_memcpy" in size:
                out.append({"label": f"hvd.allreduce busbw ÷ memcpy bandwidth, {size['mbytes']} MB",
                            "np": result["n"], "controller": result["controller"],
                            "value": size["hvd_fraction_of_memcpy"], "goal": None, "met": None})
    return out


# --- Markdown ----------------------------------------------------------------------------------
def _sps(row):
    return spread(row["samples_per_sec"], 0)


def _num(value, fmt="{:,.1f}"):
    return "—" if value is None else fmt.format(value)


def _share(value):
    return "?" if value is None else f"{value:.0%}"


def _ratio_cell(r):
    if r.get("paired_min") is None:
        return f"{r['value']:.2f}"
    return f"{r['value']:.2f} (per repeat {r['paired_min']:.2f}–{r['paired_max']:.2f})"


def throughput_table(rows, model):
    order = {name: i for i, name in enumerate(CUSTOM_LOOP + FIT + ("mwms_fit",))}
    chosen = sorted((r for r in rows if r["model"] == model),
                    key=lambda r: (r["np"], r["controller"], collectives_of(r), r["loop"], order.get(r["config"], 99)))
    return table(
        ["config", "np", "controller", "loop", "samples/s median (min–max)", "scaling eff.",
         "bytes/sample (expected)", "calls/step (expected)", "final test acc."],
        [[f"{row['config']}{'' if collectives_of(row) == 'horovod' else f' [{collectives_of(row)}]'}",
          row["np"], row["controller"], row["loop"], _sps(row), _num(row.get("scaling_efficiency"), "{:.2f}"),
          f"{_num(row['bytes_per_sample'])} ({_num(row['expected_bytes_per_sample'])})",
          f"{_num(row['calls_per_step'], '{:.3f}')} ({_num(row['expected_calls_per_step'], '{:.3f}')})",
          _num(row.get("final_test_accuracy"), "{:.3f}")] for row in chosen],
        "lrllrrrrr")


def _ceiling_note(tta):
    """The no-communication ceiling and the cap per run, where the results have them."""
    note = ""
    if tta.get("ceiling"):
        c = tta["ceiling"]
        note += (f" No-communication ceiling: {c['samples_per_second']:,.0f} samples/s "
                 f"({c['samples_per_second_per_rank']:,.0f} per rank alone).")
    if tta.get("cap_seconds"):
        note += f" Every run capped at {tta['cap_seconds']:g} s of training (—: not reached)."
    return note


def _unscaled_note(configs):
    """The learning rates --scale-lr does not give, named for the configurations that ran."""
    notes = []
    if any(name.startswith("diloco") for name in configs):
        notes.append("DiLoCo at --lr itself (--scale-lr refuses it)")
    if any(name in HIERARCHICAL for name in configs):
        notes.append("Hierarchical at its inter strategy's flat rule for all ranks")
    return "".join(f"; {note}" for note in notes)


def tta_table(tta):
    intro = (f"{curves.workload_name(tta)}, np={tta['np']}, {tta['controller']}, per-rank batch {tta['batch_per_rank']}, "
             f"SGD momentum 0.9 at the learning rate train.py --lr {tta['base_lr']} --scale-lr gives each "
             f"configuration, {tta['epochs']} epochs, mean over {tta['seeds']} seeds; wall time = training only "
             "(slowest rank), no evaluation or tracing; EASGD evaluated on its center"
             + _unscaled_note(tta["per_config"])
             + "." + _ceiling_note(tta))
    return intro + "\n\n" + table(
        ["config", "lr", f"epochs to {tta['target']}", f"seconds to {tta['target']}", "seeds reaching it",
         "final test acc.", f"training seconds ({tta['epochs']} epochs)"],
        [[name, f"{res['lr']:g}", _num(res["epochs_to_target"]), _num(res["seconds_to_target"], "{:.2f}"),
          f"{res['seeds_reaching_target']}/{len(res['runs'])}", f"{res['final_accuracy']:.3f}",
          f"{res['train_seconds']:.2f}"] for name, res in tta["per_config"].items()],
        "lrrrrrr")


def allreduce_tables(results):
    bandwidth = table(
        ["size", "np", "controller", "hvd.allreduce busbw GB/s", "mpi4py busbw GB/s", "memcpy GB/s",
         "hvd ÷ mpi4py", "hvd ÷ memcpy"],
        [[f"{s['mbytes']} MB", res["n"], res["controller"], f"{s['hvd']['busbw_gbs']:.2f}",
          _num(s["mpi4py"]["busbw_gbs"] if s.get("mpi4py") else None, "{:.2f}"),
          _num(s["memcpy"]["gbs"] if s.get("memcpy") else None, "{:.2f}"),
          _num(s.get("hvd_fraction_of_mpi4py"), "{:.2f}"), _num(s.get("hvd_fraction_of_memcpy"), "{:.3f}")]
         for res in results for s in res["sizes"]],
        "rrlrrrrr")
    latency = table(
        ["np", "controller", "bytes", "hvd.grouped_allreduce in tf.function", "hvd_easgd comm.allreduce in tf.function",
         "mpi4py Allreduce", "memcpy"],
        [[res["n"], res["controller"], f"{res['gradients']['bytes']:,}",
          spread(res["gradients"]["hvd_grouped_allreduce_us"], 0),
          spread(res["gradients"]["hvd_easgd_comm_allreduce_us"], 0),
          spread(res["gradients"].get("mpi4py_allreduce_us"), 0), spread(res["gradients"].get("memcpy_us"), 0)]
         for res in results],
        "rlrrrrr")
    return "\n".join([bandwidth, "", "mpi4py and memcpy ran in their own MPI launch without Horovod or TensorFlow "
                       "(memcpy: rank 0 alone). One model's gradients (digits CNN) in one call, median µs per call "
                       "(min–max):", "", latency])


def headline_table(headlines):
    return table(["ratio", "np", "controller", "value", "goal"],
                 [[h["label"], h["np"], h["controller"], _ratio_cell(h),
                   "" if h["goal"] is None else f"≥ {h['goal']} {'met' if h['met'] else 'NOT met'}"]
                  for h in headlines],
                 "lrlrl")


def answer(headlines):
    """The report's first lines, from its headline ratios: how many reach their target, and which do not."""
    targeted = [h for h in headlines if h.get("goal") is not None]
    if not targeted:
        return f"{len(headlines)} headline ratios, none with a target."
    missed = [h for h in targeted if not h["met"]]
    text = f"{len(targeted) - len(missed)} of {len(targeted)} headline ratios reach their target."
    if missed:
        text += " Below it: " + "; ".join(f"{h['label']} {h['value']:.2f} (target ≥ {h['goal']:g})"
                                          for h in missed) + "."
    return text


def markdown(results):
    m, v = results["machine"], results["versions"]
    parts = [f"# hvd_easgd benchmarks, {results['timestamp']}", "",
             answer(results["headlines"]), "",
             "```bash", results["command"], "```", "",
             f"Machine: {m['cpu_model']}, {m['cores']} cores ({m['cores_usable']} usable), "
             f"{m['memory_gib']} GiB; load average at start {', '.join(f'{x:.2f}' for x in m['loadavg'])}.",
             "Versions: " + ", ".join(f"{k} {val}" for k, val in sorted(v.items()) if val) + ".", "",
             "Launches (one per np × controller, all repeats inside), with the share of the machine's CPU "
             "time that other processes used before / during each:", "",
             *[f"- np={L['np']} {L['controller']}, binding {L['binding']}"
               + (f", {' '.join(f'{k}={v}' for k, v in L['env'].items())}" if L.get("env") else "")
               + f": {_share(L.get('foreign_cpu_busy'))} / {_share(L.get('foreign_cpu_share_during'))}, "
               f"{L['seconds']:.0f} s" for L in results["launches"]], ""]
    if results.get("failures"):
        parts += ["**Failures:** " + "; ".join(results["failures"]), ""]
    parts += ["## Headline ratios", "", headline_table(results["headlines"]), ""]
    for model, title in (("cnn", "digits CNN (8×8×1)"), ("resnet", "ResNet, synthetic 32×32×3")):
        if any(r["model"] == model for r in results["rows"]):
            parts += [f"## Throughput: {title}", "", throughput_table(results["rows"], model), ""]
    if results.get("time_to_accuracy"):
        parts += ["## Time to accuracy", "", tta_table(results["time_to_accuracy"]), ""]
    if results.get("allreduce"):
        parts += ["## Allreduce microbenchmark", "", allreduce_tables(results["allreduce"]), ""]
    parts += ["## Method", "", *[f"- {note}" for note in results["method"]], ""]
    return "\n".join(parts)


def write(out_dir, results, text):
    """A suite run's record: ``results`` as results.json and its page ``text`` as results.md in ``out_dir``;
    prints the page and what was written."""
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(text)
    print(text, flush=True)
    print(f"[compare] wrote {out_dir}/results.json, results.md, {', '.join(results['plots'])}", flush=True)
