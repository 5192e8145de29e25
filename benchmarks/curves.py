"""Accuracy-vs-time curves: when a run reached the target, and means over seeds.

A curve is a list of ``{"epoch", "seconds", "accuracy"}`` points, one per
epoch, ``seconds`` being cumulative training wall time. Shared by the
Horovod worker and the MWMS baseline so both are summarised alike.
"""
import statistics


def workload_name(tta):
    """What a time to accuracy trained (results from before --tta-model trained the digits CNN)."""
    if tta.get("model", "cnn") == "cnn":
        return "Digits CNN"
    return f"{tta['model']} on --data {tta['data']}"


def summarise(seed, curve, target):
    reached = next((point for point in curve if point["accuracy"] >= target), None)
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
