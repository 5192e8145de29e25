"""``python -m benchmarks project``: the cost model's command line.

    python -m benchmarks project --hosts 8,64,512,1024 --link 100gbit   # rows for every listed model
    python -m benchmarks project --paper horovod                        # the Horovod paper's table
    python -m benchmarks project --paper streaming-diloco               # Streaming DiLoCo's simulated points
    python -m benchmarks project --report                               # every committed projection file
    python -m benchmarks project --report --check                       # exit 1 if one is stale

Imports no TensorFlow and answers in well under a second (``--report``
draws its plots with matplotlib, a few seconds). The formulas are
``hvd_easgd/choosing/cost_model.py``'s (the table ``calibration.py``'s); the models ``workloads.py``'s; the papers'
inputs ``paper_check.py``'s and ``diloco_paper_check.py``'s; the generated pages ``projection_report.py``'s.
"""
import json
import pathlib
import sys

from hvd_easgd.choosing import cost_model

from . import calibration, diloco_paper_check, format_compute, paper_check, projection_report, workloads
from ..suite import committed

PAPERS = {"horovod": paper_check, "streaming-diloco": diloco_paper_check}


def _positive(text, name, kind=float):
    try:
        value = kind(text)
    except (TypeError, ValueError):
        value = None
    if value is None or value <= 0:
        raise ValueError(f"`{name}` must be a positive number. Received: {name}={text}")
    return value


def _bandwidth(text):
    if text.lower() in calibration.LINKS:
        return calibration.LINKS[text.lower()]
    try:
        return _positive(text, "link") / 8  # bits/s
    except ValueError:
        raise ValueError(f"`link` must be one of {', '.join(calibration.LINKS)} or bits/s. "
                         f"Received: link={text}") from None


def _calibration(path):
    try:
        values = json.loads(pathlib.Path(path).read_text())
        return _positive(values["alpha"], "alpha"), _positive(values["bandwidth"], "bandwidth")
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        raise ValueError(f"`calibration` must be a JSON file with alpha and bandwidth. "
                         f"Received: calibration={path}") from None


def _models(args, known):
    if args.model is not None and args.model not in known:
        raise ValueError(f"`model` must be one of {', '.join(known)}. Received: model={args.model}")
    chosen = {args.model: known[args.model]} if args.model else dict(known)
    if not (args.params or args.step_time):
        return chosen
    base = known.get(args.model)
    params = _positive(args.params, "params", int) if args.params else base and base.params
    step = _positive(args.step_time, "step_time") if args.step_time else base and base.compute
    if not params or not step:
        raise ValueError("`params` and `step_time` must both be given for a custom model. "
                         f"Received: params={args.params}, step_time={args.step_time}")
    # The model's FLOPs a sample hold while its parameters do; a share measured against this machine's c
    # does not hold for the user's (main: a custom model is never looked up in the measurements).
    flops = base.flops_per_sample if base and not args.params else None
    # What a format's own work takes on the device (seconds, not a share of c) holds while the model does.
    formats = base.format_seconds if base and not args.params else None
    return {args.model or "custom": workloads.Workload(params, base.batch if base else 64, step, "given",
                                                       "--params/--step-time", flops,
                                                       base.flops_source if flops else "", formats,
                                                       base.format_source if formats else "")}


def main(argv=None, prog="python -m benchmarks project"):
    parser = committed.parser(prog, __doc__, "with --report: exit 1 if a committed file is stale")
    parser.add_argument("--hosts", default="8,64,512,1024")
    parser.add_argument("--ranks-per-host", default="8")
    parser.add_argument("--link", default="100gbit", help=f"{', '.join(calibration.LINKS)} or bits/s")
    parser.add_argument("--model", default=None, help="one of the listed models (default: all; workloads.py)")
    parser.add_argument("--params", default=None, help="trainable parameters (your own model)")
    parser.add_argument("--step-time", default=None, help="compute seconds per step (your own model)")
    parser.add_argument("--alpha", default=str(cost_model.INTER_ALPHA), help="seconds per message across hosts")
    parser.add_argument("--bandwidth", default=None, help="bytes/s across hosts (overrides --link)")
    parser.add_argument("--calibration", default=None,
                        help="JSON with alpha (s) and bandwidth (bytes/s) across hosts (link_probe.alpha_sweep)")
    parser.add_argument("--configuration", default=None, help="one configuration of the traffic table")
    parser.add_argument("--paper", default=None, help=f"print a paper's table: {', '.join(PAPERS)}")
    parser.add_argument("--report", action="store_true",
                        help="write docs/results/projection/, docs/projection.md and docs/projection-tables.md (the "
                             "papers' tables included)")
    args = parser.parse_args(argv)
    try:
        if args.paper is not None and args.paper not in PAPERS:
            raise ValueError(f"`paper` must be one of {', '.join(PAPERS)}. Received: paper={args.paper}")
        if args.check and not args.report:
            raise ValueError("`check` must come with --report. Received: check=True, report=False")
        hosts = [_positive(h, "hosts", int) for h in args.hosts.split(",")]
        ranks = _positive(args.ranks_per_host, "ranks_per_host", int)
        bandwidth = _positive(args.bandwidth, "bandwidth") if args.bandwidth else _bandwidth(args.link)
        alpha = _positive(args.alpha, "alpha")
        if args.calibration:
            alpha, bandwidth = _calibration(args.calibration)
        models = _models(args, workloads.models())
        table = calibration.load_table()
        if args.configuration and args.configuration not in table["configurations"]:
            raise ValueError(f"`configuration` must be one of {', '.join(table['configurations'])}. "
                             f"Received: configuration={args.configuration}")
    except ValueError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    if args.report:
        return committed.status(prog, projection_report.write(check=args.check), args.check, f"{prog} --report")
    if args.paper:
        print(PAPERS[args.paper].render_table(PAPERS[args.paper].results()))
        return 0
    print(f"{'model':<12} {'configuration':<20} {'hosts':>6} {'ranks':>6} {'samples/s':>12} {'efficiency':>10}")
    measured = {} if args.params or args.step_time else format_compute.load()
    for model, w in models.items():
        params, compute, batch = w.params, w.compute, w.batch
        shares = {name: share for name, (share, _) in format_compute.shares((model, w), measured).items()}
        for name, h, rate, eff in cost_model.project(table, params, compute, hosts, ranks, (alpha, bandwidth), batch,
                                                     [args.configuration] if args.configuration else None, shares):
            print(f"{model:<12} {name:<20} {h:>6} {h * ranks:>6} {rate:>12.4g} {eff:>10.3f}")
    return 0
