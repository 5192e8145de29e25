"""Accuracy-vs-time curves: when a run reached the target, and means over seeds.

A curve is a list of ``{"epoch", "seconds", "accuracy"}`` points, one per
epoch, ``seconds`` being cumulative training wall time. Shared by the
Horovod worker and the MWMS baseline so both are summarised alike; the
reports name the workloads a run trained from here too.
"""
import statistics


def workload_name(tta):
    """What a time to accuracy trained (results from before --tta-model trained the digits CNN)."""
    if tta.get("model", "cnn") == "cnn":
        return "Digits CNN"
    return f"{tta['model']} on --data {tta['data']}"


# The throughput passes' models (``--models``): the digits CNN trains on digits, the wide MLP on
# digits features too (``benchmarks.suite.worker.throughput``), whatever the time to accuracy trains.
THROUGHPUT_MODELS = {"cnn": "digits CNN (8×8×1)", "resnet": "ResNet, synthetic 32×32×3",
                     "wide_mlp": "wide MLP (5.4 M parameters) on digits"}


def throughput_model_name(model):
    """What a throughput row's ``model`` trained."""
    return THROUGHPUT_MODELS.get(model, model)


def first_at_or_above(curve, target):
    """The first point of ``curve`` whose accuracy is at or above ``target``, or None.

    Accuracy is measured once per epoch, so its ``seconds`` is when the target was
    seen, up to one epoch after it was crossed: no point between epochs is made up.
    """
    return next((point for point in curve if point["accuracy"] >= target), None)


def samples_per_second(tta, run):
    """Samples/s of all ranks over one seed's training epochs: every epoch trains
    ``steps_per_epoch`` steps of ``batch_per_rank`` on each of ``np`` ranks (a
    configuration whose accumulation window does not divide it trains fewer: not
    one of the workloads timed here)."""
    curve = run["curve"]
    samples = len(curve) * tta["steps_per_epoch"] * tta["batch_per_rank"] * tta["np"]
    return samples / curve[-1]["seconds"]


def summarise(seed, curve, target):
    reached = first_at_or_above(curve, target)
    return {"seed": seed, "epochs_to_target": reached["epoch"] if reached else None,
            "seconds_to_target": reached["seconds"] if reached else None,
            "final_accuracy": curve[-1]["accuracy"], "train_seconds": curve[-1]["seconds"], "curve": curve}


def mean_over_seeds(runs):
    """Means over seeds; times to target over the seeds that reached it."""
    reached = [r for r in runs if r["epochs_to_target"] is not None]

    def mean(key, subset):
        return statistics.fmean(r[key] for r in subset) if subset else None

    return {"final_accuracy": mean("final_accuracy", runs), "train_seconds": mean("train_seconds", runs),
            "epochs_to_target": mean("epochs_to_target", reached),
            "seconds_to_target": mean("seconds_to_target", reached),
            "seeds_reaching_target": len(reached), "runs": runs}


def mean_curve(runs):
    """Pointwise mean (seconds, accuracy) per epoch over seeds, for plotting."""
    length = min(len(r["curve"]) for r in runs)
    return ([statistics.fmean(r["curve"][e]["seconds"] for r in runs) for e in range(length)],
            [statistics.fmean(r["curve"][e]["accuracy"] for r in runs) for e in range(length)])
