"""The benchmarks' one entry point: ``python -m benchmarks <subcommand> [options]``.

    python -m benchmarks compare --quick          # the suite (``make bench-quick``)
    python -m benchmarks compare                  # everything (``make bench``)
    python -m benchmarks defaults-report --check  # the pages rendered from committed results
    python -m benchmarks compare --help           # a subcommand's own options

A subcommand is a module with ``main(argv, prog)``: ``argv`` is what follows
the subcommand's name, ``prog`` how it was invoked (for its help and for the
command it records). A new one is one line of ``SUBCOMMANDS``. One-off
investigations are not subcommands: they live in ``benchmarks/studies/``,
each with its own ``python -m benchmarks.studies.<name>`` (see its README).
"""
import importlib
import sys
from typing import NamedTuple


class Subcommand(NamedTuple):
    module: str
    description: str


SUBCOMMANDS = {
    "compare": Subcommand("benchmarks.suite.compare", "the suite: the strategies side by side against raw Horovod, "
                                                "MWMS and no communication, on this host or a rated virtual cluster"),
    "accuracy": Subcommand("benchmarks.accuracy.accuracy", "train.py's compressed variants and their fp32 twins over "
                                                  "seeds: final accuracy and wire bytes per step, goals checked"),
    "parity": Subcommand("benchmarks.accuracy.parity", "a real workload (the language model, Fashion-MNIST) under each "
                                              "strategy over seeds: final validation loss or accuracy against "
                                              "SyncAverage's, goals checked"),
    "parity-by-np": Subcommand("benchmarks.accuracy.parity_by_np", "one workload's parity folders side by side across "
                                                          "numbers of ranks: by-np.md and a plot of the final "
                                                          "metric against np (--render: again, from sources.json)"),
    "long-run": Subcommand("benchmarks.accuracy.long_run", "the language model for half an hour or more: every rank's "
                                                  "memory per epoch, flat after the first, goal checked"),
    "slow-rank": Subcommand("benchmarks.accuracy.slow_rank", "the language model with one rank twice as slow, with and "
                                                    "without --balance speed: throughput against the sum of the "
                                                    "ranks' own speeds and validation loss, goals checked"),
    "time-to-target": Subcommand("benchmarks.accuracy.time_to_target", "the language model's time to a target validation "
                                                              "loss per strategy across rated links of the "
                                                              "virtual cluster, goals checked"),
    "traffic": Subcommand("benchmarks.costmodel.traffic_table", "write (or --check) docs/results/traffic/traffic.json "
                                                      "from the strategies' expected_traffic hooks"),
    "project": Subcommand("benchmarks.costmodel.projection", "the alpha-beta cost model: samples/s and scaling "
                                                   "efficiency at many hosts, from the traffic table; --paper "
                                                   "horovod or streaming-diloco, --report (docs/projection.md)"),
    "validate": Subcommand("benchmarks.costmodel.cluster_check", "the cost model's step times against the virtual cluster's: "
                                                    "run (--run) or re-render docs/cost-model-validation.md"),
    "tta-report": Subcommand("benchmarks.accuracy.tta_report", "re-render a rated-link run's results.md, its plots and "
                                                      "docs/time-to-accuracy.md from its results.json (--check)"),
    "defaults-report": Subcommand("benchmarks.accuracy.defaults_report", "render (or --check) the docs pages generated "
                                                                "from the committed results in docs/results/"),
}
PROG = "python -m benchmarks"


def usage():
    width = max(len(name) for name in SUBCOMMANDS)
    return "\n".join([f"usage: {PROG} <subcommand> [options]", "", "subcommands:",
                      *(f"  {name:<{width}}  {sub.description}" for name, sub in SUBCOMMANDS.items()), "",
                      f"`{PROG} <subcommand> --help` lists a subcommand's options; one-off investigations: "
                      "benchmarks/studies/README.md"])


def main(argv=None):
    """Runs the subcommand ``argv[0]`` with the rest of ``argv``; returns its exit status.

    Args:
      argv: the arguments after ``python -m benchmarks`` (default: ``sys.argv[1:]``).

    Returns:
      The subcommand's exit status; 0 for ``--help``; 2, with one line on
      stderr, when the subcommand is missing or unknown.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if not argv or argv[0] not in SUBCOMMANDS:
        received = argv[0] if argv else None
        print(f"{PROG}: `subcommand` must be one of {', '.join(SUBCOMMANDS)}. Received: subcommand={received}",
              file=sys.stderr)
        return 2
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(SUBCOMMANDS[name].module)
    return module.main(rest, prog=f"{PROG} {name}")


if __name__ == "__main__":
    sys.exit(main())
