"""The compute a gradient format adds to every step, which the no_comm run's c does not hold.

PowerSGD encodes each gradient matrix on every step (M = G + e, P = M·Q,
Gram–Schmidt on the summed P, Q = Mᵀ·P̂, the applied P̂·Qᵀ and the new
residual M − P̂·Q_rᵀ): several passes over all of the gradients, work no
collective does. On the wide MLP's 21.7 MB of gradients the rated-link rows
kept about 40 ms a step over a prediction whose only compute was c.

Measured here in one process, on the model's own variables, with one
intra-op thread (a rank of the 2-rank launches on 2 cores): the format's
encoding alone, through a one-rank communicator whose collectives return
their inputs, against the model's plain step (``no_comm``: forward,
backward, SGD), both medians over timed calls. It is recorded as a share of
c, so each launch's own c scales it: ``cluster_check`` predicts a row of
such a configuration with compute c·(1 + share).

The quantising formats of a local-update strategy (DiLoCo int8) encode
once a period, not every step, but not in one pass: each rank encodes its
pseudo-gradient, decodes and adds what it receives, encodes that sum again
(p ≥ 3) and decodes the p parts, and decodes its own payload for the error
it keeps. On the wide MLP the rated-link rows of ``diloco_tau10_int8`` kept
about 11 ms a step over their prediction at 1 Gbit/s and at 100 Mbit/s
alike: work, not link. It is measured the same way, through a communicator
of p ranks whose alltoall and allgather hand back messages of the right
size (``EchoCommunicator``), at each p the validation runs (the two forms of
``quantised_allreduce``), once a period: its share is the period's work
over τ, against c. The fp16 format is summable and runs inside the
collective; it is left out.

    python -m benchmarks validate --measure-formats   # writes docs/results/validation/format_compute.json
"""
import json
import os
import statistics
import time

from . import workloads
from ..suite.names import TABLE
from ..suite.runner import REPO_ROOT

PATH = os.path.join(REPO_ROOT, "docs", "results", "validation", "format_compute.json")
MODELS = ("cnn", "wide_mlp")
BATCH = 32  # the validation launches' per-rank batch
CALLS = 20  # steps a timed repeat
REPEATS = 5


def powersgd_configurations():
    """{configuration name: PowerSGD rank} of the configurations that compress with PowerSGD."""
    return {config.name: int(config.flag("--powersgd-rank")) for config in TABLE
            if config.flag("--compression") == "powersgd"}


def quantised_configurations(every_step=False):
    """{configuration name: (format, period)} of the local-update configurations whose format quantises
    (the pseudo-gradients' int8 or int4: ``quantised_allreduce``), read from their train.py flags; with
    ``every_step``, also the synchronous ones (SyncAverage's int8 gradients), at period 1."""
    return {config.name: (config.flag("--compression"), int(config.flag("--tau") or 1)) for config in TABLE
            if config.flag("--compression") in QUANTISED and (every_step or config.flag("--tau") is not None)}


# The formats that are not summable (``Compression.by_name(name).summable`` is False) and not sparse (topk
# goes through the sparse allreduce, whose work is not measured yet), so go through the
# quantised allreduce; spelled out here because asking the formats imports TensorFlow, which the projection
# must not (a unit test checks the two agree).
QUANTISED = ("int8", "int4", "bf16", "sign")
RANKS = (2, 4)  # the validation launches' p: the allgather form at 2, alltoall + allgather from 3


class EchoCommunicator:
    """What ``quantised_allreduce`` asks of a communicator of ``size`` ranks, with collectives that move
    nothing: the alltoall hands back its p chunks, the allgather p copies of the message. So the
    encoding, decoding and sums one rank does at p run as they would, and the link costs nothing. The
    values are not an allreduce's (the alltoall returns this rank's own chunks, not every rank's chunk
    j); the work on them is."""

    has_alltoall = True
    rank = 0  # the rank whose work is measured

    def __init__(self, size):
        self.size = size

    def _alltoall(self, tensor):
        return tensor

    def _allgather(self, tensor):
        import tensorflow as tf

        return tf.tile(tensor, [self.size])


def _median_seconds_per_call(call, calls=CALLS, repeats=REPEATS):
    import numpy as np

    np.asarray(call())  # traces, and the first run's allocations
    per_call = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = call()
        np.asarray(out)  # waits for the last call
        per_call.append((time.perf_counter() - start) / calls)
    return statistics.median(per_call), per_call


def measure(models=MODELS, batch=BATCH, threads=1):
    """``{"models": {model: {"step_seconds", "configurations": {name: {"seconds", "share", ...}}}}, ...}``."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import hvd_easgd
    from hvd_easgd.comm.local_comm import LocalCommunicator
    from hvd_easgd.comm.powersgd import PowerSGD

    from ..suite import configurations, machine

    data = hvd_easgd.data.digits()
    comm = LocalCommunicator()
    out = {"threads": threads, "batch_per_rank": batch, "calls": CALLS, "repeats": REPEATS,
           "versions": machine.versions(), "models": {}}
    for model_name in models:
        plain = configurations.Configuration("no_comm", model_name, data.input_shape, data.num_classes, batch, comm)
        xs = tf.constant(data.x_train[:batch][None])
        ys = tf.constant(data.y_train[:batch][None])
        step, step_repeats = _median_seconds_per_call(lambda: plain.run(xs, ys))
        variables = plain.model.trainable_variables
        grads = [tf.random.stateless_normal(v.shape, seed=[7, i]) for i, v in enumerate(variables)]
        entry = {"step_seconds": step, "step_repeats": step_repeats, "configurations": {}}
        for name, rank in powersgd_configurations().items():
            powersgd = PowerSGD(rank=rank)
            powersgd.build(variables, name=f"format_compute_{name}")

            @tf.function
            def encode():
                sums, _, commit = powersgd.allreduce_sums(comm, grads)
                commit(tf.constant(True))
                return sums[0]

            seconds, repeats = _median_seconds_per_call(encode)
            entry["configurations"][name] = {"seconds": seconds, "repeats": repeats, "share": seconds / step,
                                             "rank": rank}
        for name, (format_name, period) in quantised_configurations().items():
            entry["configurations"][name] = {"format": format_name, "period": period, "by_ranks": {
                str(p): _quantised_round(p, format_name, grads, period, step) for p in RANKS}}
        out["models"][model_name] = entry
    return out


def _quantised_round(size, format_name, grads, period, step):
    """One period's quantised allreduce of ``grads`` at ``size`` ranks, with the error kept (``EchoCommunicator``):
    its seconds, and its share of the step ``step`` once spread over the ``period`` steps."""
    import tensorflow as tf

    from hvd_easgd.comm.compression import Compression
    from hvd_easgd.comm.quantised_allreduce import quantised_allreduce

    comm, compression = EchoCommunicator(size), Compression.by_name(format_name)
    residuals = [tf.zeros_like(g) for g in grads]

    @tf.function
    def round_():
        sent = [g + e for g, e in zip(grads, residuals)]  # error feedback: last period's error goes too
        reduced, errors = quantised_allreduce(comm, sent, "average", compression, record=False, with_errors=True)
        return reduced[0] + errors[0]

    seconds, repeats = _median_seconds_per_call(round_)
    return {"seconds": seconds, "repeats": repeats, "share": seconds / period / step}


def recorded(path=PATH):
    """The committed measurement (``write``'s JSON), or None when there is none."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def load(path=PATH):
    """{(model, configuration): share of c} from the committed measurement, and for a format measured at
    each p (a quantising one), {(model, configuration, p): share}; {} when there is none."""
    record = recorded(path)
    out = {}
    for model, entry in (record or {"models": {}})["models"].items():
        for name, c in entry["configurations"].items():
            if "by_ranks" in c:
                out.update({(model, name, int(p)): at["share"] for p, at in c["by_ranks"].items()})
            else:
                out[(model, name)] = c["share"]
    return out


def share_of(formats, model, config, ranks):
    """A row's encoding share from ``load``'s mapping: at its p where measured per p, else its own, else 0."""
    return formats.get((model, config, ranks), formats.get((model, config), 0.0))


def flop_share(rank, batch, params, flops_per_sample):
    """PowerSGD's products against a step, in floating-point operations: 6rN / (b·f).

    For an m×n weight at rank r, the encoding's three products (P = M·Q, Q = Mᵀ·P̂, the applied P̂·Qᵀ)
    are 2mnr each: 6rN over the N weights (the Gram–Schmidt on P, 2mr², and the residual, mn, are
    smaller). A step at a per-rank batch of b does b·f, f a sample's forward and backward FLOPs; for
    dense layers f = 6N, and the share is r/b. An estimate for a model nothing measured: the skinny
    products reach a smaller share of the machine's peak than the step's, so the shares measured here
    are above it (the projection page sets them side by side)."""
    return 6 * rank * params / (batch * flops_per_sample)


def estimates(w):
    """{configuration: ``flop_share``} of every PowerSGD configuration for a ``workloads.Workload`` (None
    where its FLOPs a sample are unknown)."""
    return {config: flop_share(rank, w.batch, w.params, w.flops_per_sample) if w.flops_per_sample else None
            for config, rank in powersgd_configurations().items()}


# A quantised allreduce's elementwise work on one rank, in passes over the N values (module docstring,
# and quantised_allreduce's), in its alltoall + allgather form at p ranks: encode N (its payload) + N/p (the
# reduced chunk), decode N (the p chunks received) + N (the p reduced chunks) + N (its own payload, for the
# error it keeps). A measured quantise + dequantise pass is one encode and one decode of N, each taken as
# half of it: (1 + 1/p + 3) / 2, which is 2 as p grows (2.0 at 1,024 hosts × 8 ranks, to 0.01 %).
QUANTISE_PASSES = 2.0


def shares(workload, measured=None):
    """{configuration: (share of c, basis)} of every configuration whose format adds compute, for
    ``workload``, a (name, ``workloads.Workload``) pair.

    A model measured on another device carries what its formats cost there (``Workload.format_seconds``,
    basis "measured elsewhere"): PowerSGD's encode a step over c, and a quantising format's
    ``QUANTISE_PASSES`` quantise + dequantise passes once a period over the period's c, SyncAverage's int8
    included (period 1). Otherwise, PowerSGD's: the committed measurement of its benchmark model where
    there is one (``load``, basis "measured"), else its ``estimates`` ("FLOPs estimate"), else 0
    ("unknown"). A quantising format's: the measurement at the largest p it was measured at (the
    alternative form, alltoall + allgather, which every p from 3 runs), else 0 ("unknown": elementwise
    passes are bound by memory, not FLOPs, so no FLOPs estimate stands in)."""
    name, w = workload
    if w.format_seconds:
        return _shares_elsewhere(w)
    measured = load() if measured is None else measured
    model = next((m for m, n in workloads.WORKLOAD_OF.items() if n == name), None)
    out = {}
    for config, estimate in estimates(w).items():
        if (model, config) in measured:
            out[config] = (measured[(model, config)], "measured")
        elif estimate is not None:
            out[config] = (estimate, "FLOPs estimate")
        else:
            out[config] = (0.0, "unknown")
    for config in quantised_configurations():
        at = [key[2] for key in measured if len(key) == 3 and key[:2] == (model, config)]
        out[config] = (measured[(model, config, max(at))], f"measured at p = {max(at)}") if at else (0.0, "unknown")
    return out


def _shares_elsewhere(w):
    """``shares`` from ``w.format_seconds``: what the formats cost on the device c was measured on. The
    H200's PowerSGD figure times P = MQ, the QR and Q = MᵀP, unfused: two of the three products (the
    applied P̂·Qᵀ and the residual are not in it), so its share is a lower bound."""
    basis, out = "measured elsewhere", {}
    for config, rank in powersgd_configurations().items():
        seconds = w.format_seconds.get(f"powersgd:{rank}")
        out[config] = (seconds / w.compute, basis) if seconds else (0.0, "unknown")
    for config, (format_name, period) in quantised_configurations(every_step=True).items():
        seconds = w.format_seconds.get(format_name)
        out[config] = (QUANTISE_PASSES * seconds / period / w.compute, basis) if seconds else (0.0, "unknown")
    return out


def write(command, path=PATH):
    result = dict(measure(), command=command)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    for model, entry in result["models"].items():
        for name, c in entry["configurations"].items():
            for at, m in ({f"p={p}": m for p, m in c["by_ranks"].items()} if "by_ranks" in c else {"": c}).items():
                print(f"{model}: c {1e3 * entry['step_seconds']:.2f} ms; {name} {at} encodes in "
                      f"{1e3 * m['seconds']:.2f} ms ({m['share']:.3f} of c)")
    return result
