"""``--strategy auto``: the job chooses its strategy, τ and format from the cost model and its own measurements.

Given what a job measured of itself at start-up (``Measurements``: c, its compute per step with no
communication, and each level's link α and B) and what each candidate configuration would send for
its model (the strategy's own ``expected_traffic``), the cost model (``cost_model.py``) predicts each
candidate's step, and ``choose`` applies one rule:

    the most synchronous candidate whose predicted compute utilisation, c ÷ step, is at least the
    target (``--auto-utilisation``, 0.9 by default); among equally synchronous ones that reach it,
    the most precise format (fewer bits only where they are what reaches the target). If none
    reaches the target, the one with the highest utilisation.

*Most synchronous* orders the candidates by how many steps pass between two synchronisations across
hosts (``Candidate.period``: 1 for SyncAverage and the two-level allreduce, τ for a local-update
strategy), and at equal period puts one whose ranks within a host stay identical (Hierarchical) first.
A more synchronous configuration, and at equal period a more precise format, is preferred because it
is the more faithful computation: a compressed format's evidence is "within 1 % of its fp32 twin", not
equal to it, so fewer bits are taken where they buy the utilisation, not where the link does not need them.

Only what that evidence allows is a candidate (``CANDIDATE_FAMILIES``): a configuration whose parity
table shows it losing more than the goal is never chosen, and a τ beyond the largest measured is not
offered. A family the framework trains that the evidence does not allow yet (``WITHHELD_FAMILIES``: top-k
DiLoCo, PowerSGD) is predicted beside them and never chosen: config.yaml keeps what it would have given, and
where it beats a choice below the target a second line says so and why it was withheld. Importing this module imports no TensorFlow (measuring does, when it runs): the strategies'
traffic reaches the rule as plain figures (``traffic_entry``), so the rule is tested on hand-written
measurements.
"""
import time
from typing import NamedTuple

from . import cost_model
from ..compute_timing import TIMED_STEPS, WARM_STEPS, compute_seconds

AUTO = "auto"  # train.py's --strategy auto
DEFAULT_UTILISATION = 0.9
# The local-update periods offered: those the parity tables measured within the goal. On the language model
# (one epoch, 1,281 updates) DiLoCo at τ = 10 is within it and at τ = 50 is not (docs/language-model.md).
PERIODS = (10,)
# (strategy, compression) pairs the parity evidence allows; a family not listed is never a candidate.
CANDIDATE_FAMILIES = (("sync", "none"), ("sync", "fp16"), ("sync", "bf16"),
                      ("diloco", "none"), ("diloco", "int8"), ("diloco", "int4"))
# Families the framework trains and the evidence does not allow yet, each with why. ``auto`` predicts them beside
# the candidates, so config.yaml shows what each would have given on this job's links, and never chooses one;
# an entry moves to CANDIDATE_FAMILIES when its parity row is within the goal.
WITHHELD_FAMILIES = {
    ("diloco", "topk"): "its loss on the language model is further from SyncAverage's than the goal allows, and "
                        "at 10 Mbit/s it reached the target loss no sooner than int4 DiLoCo "
                        "(docs/compression.md#across-a-slow-link-time-to-a-target-loss)",
    ("sync", "powersgd"): "at the library's rank 4 its loss on the language model is behind SyncAverage's by more "
                          "than the goal; train.py's rank 16 for the transformer keeps it, but the image set's "
                          "parity row and the cost model's validation are at rank 4 only "
                          "(docs/language-model.md#where-a-goal-is-missed-at-2-ranks)",
}


class Candidate(NamedTuple):
    """One configuration ``--strategy auto`` may choose: a strategy at a period and a wire format,
    possibly two-level (``hierarchical``: SyncAverage within each host, this one across hosts)."""
    strategy: str
    compression: str = "none"
    period: int = 1
    hierarchical: bool = False

    @property
    def label(self):
        """How the one line names it, e.g. ``diloco τ=50 int8`` or ``hierarchical sync``."""
        parts = (["hierarchical"] if self.hierarchical else []) + [self.strategy]
        if self.period > 1:
            parts.append(f"τ={self.period}")
        if self.compression != "none":
            parts.append(self.compression)
        return " ".join(parts)

    def flags(self):
        """The train.py flags that train it."""
        if self.hierarchical:
            flags = ["--strategy", "hierarchical", "--inter", self.strategy]
        else:
            flags = ["--strategy", self.strategy]
        if self.period > 1:
            flags += ["--tau", str(self.period)]
        if self.compression != "none":
            flags += ["--compression", self.compression]
        return tuple(flags)

    def build(self):
        """The strategy, not yet bound (SyncAverage within each host for a two-level one)."""
        from ..strategies import DiLoCo, Hierarchical, SyncAverage

        if self.strategy == "sync":
            flat = SyncAverage(compression=self.compression)
        elif self.strategy == "diloco":
            flat = DiLoCo(period=self.period, compression=self.compression)
        else:
            raise ValueError(f"`strategy` must be sync or diloco. Received: strategy={self.strategy!r}")
        return Hierarchical(inter=flat) if self.hierarchical else flat

    def order(self):
        """Most synchronous first: the period across hosts, then a host's ranks kept identical (at equal
        order, ``choose`` puts the more bytes, the more precise format, first)."""
        return (self.period, 0 if self.hierarchical else 1)


def candidates(hosts, ranks_per_host, families=CANDIDATE_FAMILIES, periods=PERIODS):
    """Every candidate at ``hosts`` × ``ranks_per_host``: each allowed family, the local-update ones at
    every period, and with several hosts of several ranks each also two-level (Hierarchical)."""
    two_level = hosts > 1 and ranks_per_host > 1
    found = []
    for strategy, compression in families:
        for period in ((1,) if strategy == "sync" else periods):
            for hierarchical in ((False, True) if two_level else (False,)):
                found.append(Candidate(strategy, compression, period, hierarchical))
    return found


class Link(NamedTuple):
    """A level's link: α, seconds a message, and B, bytes a second (``link_probe``)."""
    alpha: float
    bandwidth: float


class Measurements(NamedTuple):
    """What the job measured of itself at start-up."""
    compute: float  # c: seconds a step with no communication (the slowest rank's)
    hosts: int
    ranks_per_host: int
    across: Link  # between hosts
    within: Link = Link(cost_model.INTRA_ALPHA, cost_model.INTRA_BANDWIDTH)


class Prediction(NamedTuple):
    candidate: Candidate
    step: float  # predicted seconds a step
    wire_bytes: float  # what a rank sends a step, on the wire
    utilisation: float  # c ÷ step


def traffic_entry(expected):
    """A strategy's ``ExpectedTraffic`` for this very model as the cost model's traffic entry (the
    committed table's form at N = 0: every byte in ``bytes_a``)."""
    def level(traffic):
        return {"collectives": {kind: {"bytes_a": sent, "bytes_b": 0.0, "calls": calls}
                                for kind, sent, calls, _ in traffic.by_collective}}

    return {"ranks_per_group": expected.ranks_per_group, "within_group": level(expected.within_group),
            "across_groups": level(expected.across_groups), "overlapped": expected.overlapped}


def predict(candidate, expected, measured):
    """The candidate's predicted step over the measured links, from its ``ExpectedTraffic``."""
    reference = {"hosts": measured.hosts, "ranks_per_host": measured.ranks_per_host}
    entry = traffic_entry(expected)
    comm = cost_model.comm_time(entry, reference, 0, measured.hosts, measured.ranks_per_host,
                                tuple(measured.across), tuple(measured.within))
    step = cost_model.step_time(measured.compute, comm, expected.overlapped)
    return Prediction(candidate, step, expected.total.wire_bytes, measured.compute / step)


class Choice(NamedTuple):
    prediction: Prediction
    reason: str  # the one line rank 0 prints
    ranked: tuple  # every candidate's Prediction, most synchronous first
    withheld: tuple = ()  # (Prediction, why) of each withheld family's configuration, never chosen


def choose(predictions, measured, target=DEFAULT_UTILISATION):
    """The rule of the module docstring over ``predictions``; returns a ``Choice``."""
    if not predictions:
        raise ValueError("`predictions` must hold at least one candidate's. Received: predictions=[]")
    if not 0 < target <= 1:
        raise ValueError(f"`target` must satisfy 0 < target <= 1 (a share of the step). Received: target={target}")
    ranked = sorted(predictions, key=lambda p: (p.candidate.order(), -p.wire_bytes))
    reaching = [p for p in ranked if p.utilisation >= target]
    # none reaching: the highest utilisation, and of equal ones the first in the order (max keeps the first)
    chosen = reaching[0] if reaching else max(ranked, key=lambda p: p.utilisation)
    return Choice(chosen, reason(chosen, ranked, measured, target, bool(reaching)), tuple(ranked))


def reason(chosen, ranked, measured, target, reached):
    """``auto: diloco τ=50 int8, predicted utilisation 0.93 (sync 0.08, diloco τ=25 0.84) on a 94 Mbit/s
    link, c = 41 ms``: the choice, SyncAverage's figure, and the best of the more synchronous ones."""
    others = []
    sync = next((p for p in ranked if p.candidate == Candidate("sync")), None)
    if sync is not None and sync is not chosen:
        others.append(sync)
    before = [p for p in ranked if p.candidate.order() < chosen.candidate.order() and p is not sync]
    if before:
        others.append(max(before, key=lambda p: p.utilisation))
    detail = f" ({', '.join(f'{p.candidate.label} {p.utilisation:.2f}' for p in others)})" if others else ""
    link = (f"a {measured.across.bandwidth * 8 / 1e6:,.0f} Mbit/s link" if measured.hosts > 1
            else "one host")
    short = "" if reached else f", below the target {target:g}: the highest predicted"
    return (f"auto: {chosen.candidate.label}, predicted utilisation {chosen.utilisation:.2f}{detail}{short} "
            f"on {link}, c = {_milliseconds(measured.compute)}")


def _milliseconds(seconds):
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:.1f} ms"


def choose_for(measured, expected_of, target=DEFAULT_UTILISATION, families=CANDIDATE_FAMILIES, periods=PERIODS,
               withheld=WITHHELD_FAMILIES):
    """``choose`` over every candidate at the measured layout; ``expected_of(candidate)`` is that
    candidate's ``ExpectedTraffic`` for the model (its strategy's hook), or None where it cannot run.
    The ``withheld`` families (``{(strategy, compression): why}``) are predicted too, into ``Choice.withheld``,
    and never chosen."""
    def predicted(families_):
        found = []
        for candidate in candidates(measured.hosts, measured.ranks_per_host, families_, periods):
            expected = expected_of(candidate)
            if expected is not None:
                found.append(predict(candidate, expected, measured))
        return found

    choice = choose(predicted(families), measured, target)
    aside = [(p, withheld[(p.candidate.strategy, p.candidate.compression)])
             for p in predicted(tuple(f for f in withheld if f not in families))]
    return choice._replace(withheld=tuple(aside))


def withheld_line(choice, target=DEFAULT_UTILISATION):
    """``auto: withheld diloco τ=10 topk, predicted utilisation 0.97: why``: where the choice is below the
    target, the withheld configuration of the highest predicted utilisation above the choice's (what a user on
    this link might ask for, and why it was not taken); None where the choice reaches the target or none is."""
    better = [(p, why) for p, why in choice.withheld if p.utilisation > choice.prediction.utilisation]
    if choice.prediction.utilisation >= target or not better:
        return None
    best, why = max(better, key=lambda entry: entry[0].utilisation)
    return f"auto: withheld {best.candidate.label}, predicted utilisation {best.utilisation:.2f}: {why}"


# --- what the job measures of itself --------------------------------------------------------------------
# The link probe's allreduce is the model's own payload, at most this: its rate is the one that payload gets,
# and at 10 Mbit/s 8 MB costs 2 x 6.4 s of a budget of a few percent of a run.
PROBE_MAX_BYTES = 8e6
# The α sweep's sizes: the small messages where latency, not bandwidth, takes the time.
SWEEP_BYTES = (8, 512, 8192, 65536)


def measure_compute(model, loss, optimizer, batches, comm, warm=WARM_STEPS, timed=TIMED_STEPS):
    """c: seconds of one training step with no communication, the slowest rank's
    (``compute_seconds`` on every rank)."""
    return max(comm.allgather_json(compute_seconds(model, loss, optimizer, batches, warm, timed)))


def measure_links(comm, payload_bytes):
    """``(hosts, ranks_per_host, across, within)``: the job's layout and each level's ``Link``, from the
    link probe (``link_probe``) with the model's payload; the cost model's within-host figures on one host."""
    from . import link_probe

    groups = comm.host_groups()
    hosts, n = len(groups), len(groups[0])
    within = Link(cost_model.INTRA_ALPHA, cost_model.INTRA_BANDWIDTH)
    if hosts == 1:
        return hosts, n, within, within
    megabytes = min(payload_bytes, PROBE_MAX_BYTES) / 1e6
    levels = link_probe.levels(comm, megabytes) if n > 1 else None
    if levels:
        sweep = levels["within_host"]["alpha_sweep"]
        within = Link(sweep["alpha"], levels["within_host"]["bits_per_second"] / 8)
        bandwidth = levels["across_hosts"]["bits_per_second"] / 8
    else:
        bandwidth = link_probe.measure(comm, megabytes, hosts=hosts)["bits_per_second"] / 8
    alpha = link_probe.alpha_sweep(comm, bandwidth, sizes=SWEEP_BYTES, hosts=hosts)["alpha"]
    return hosts, n, Link(alpha, bandwidth), within


def auto(model, loss, optimizer, batches, comm=None, target=DEFAULT_UTILISATION):
    """Chooses the strategy for ``model`` on this job's ranks and links: measures c (a few steps of
    ``batches`` with no communication) and the links, predicts every candidate, applies the rule (module
    docstring). Rank 0 decides and every rank takes its decision.

    Args:
      model: the Keras model, built; its weights are not changed.
      loss: its loss (a callable ``loss(y_true, y_pred)``).
      optimizer: the inner optimizer it will train with (a copy is stepped).
      batches: an iterable of ``(x, y)`` of this rank's own batches (a few are read).
      comm: the communicator (default ``hvd_easgd.communicator()``).
      target: the compute utilisation to reach, 0 < target <= 1.

    Returns:
      ``(strategy, record)``: the chosen strategy, not yet bound, and what was measured and why it was
      chosen (JSON-ready; ``record["reason"]`` is the line rank 0 prints).

    Example::

        strategy, record = hvd_easgd.auto(model, loss, keras.optimizers.Adam(1e-3), dataset.take(8))
        opt = hvd_easgd.DistributedOptimizer(keras.optimizers.Adam(1e-3), strategy=strategy)
    """
    from ..startup.runtime import communicator

    comm = comm or communicator()
    started = time.perf_counter()
    compute = measure_compute(model, loss, optimizer, batches, comm)
    payload = sum(int(v.numpy().nbytes) for v in model.trainable_variables)
    hosts, n, across, within = measure_links(comm, payload)
    measured = Measurements(compute, hosts, n, across, within)

    def expected_of(candidate):
        return candidate.build().expected_traffic(model.trainable_variables, model.non_trainable_variables,
                                                  hosts, n)

    choice = choose_for(measured, expected_of, target)
    record = comm.allgather_json(_record(choice, measured, target) if comm.rank == 0 else None)[0]
    record["measure_seconds"] = max(comm.allgather_json(time.perf_counter() - started))
    return strategy_of(record), record


def strategy_of(record):
    """The strategy a record of ``auto`` chose (a resume builds it again from config.yaml's), not yet bound."""
    return Candidate(**record["candidate"]).build()


def _record(choice, measured, target):
    """What config.yaml keeps of the choice: the measurements, the candidate, the reason."""
    chosen = choice.prediction
    return {"candidate": dict(chosen.candidate._asdict()), "flags": list(chosen.candidate.flags()),
            "reason": choice.reason, "target": target, "predicted_step": chosen.step,
            "utilisation": chosen.utilisation, "compute": measured.compute, "hosts": measured.hosts,
            "ranks_per_host": measured.ranks_per_host, "across": dict(measured.across._asdict()),
            "within": dict(measured.within._asdict()),
            "predictions": [_entry(p) for p in choice.ranked],
            "withheld": [dict(_entry(p), why=why) for p, why in choice.withheld],
            "withheld_line": withheld_line(choice, target)}


def _entry(prediction):
    return {"candidate": prediction.candidate.label, "step": prediction.step,
            "utilisation": prediction.utilisation, "wire_bytes": prediction.wire_bytes}
