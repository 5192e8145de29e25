"""The models the cost model projects: parameters, batch and compute per step, each with where it came from.

Imports no TensorFlow. A compute time per step c is read from a committed
measurement where this project has one (``docs/results/``), never copied
here by hand; the others are cited or assumed, and say so. Every c measured
here is a CPU figure on this 2-core machine (one rank a core, or
oversubscribed): a GPU computes these small models far faster, so at scale
their communication weighs more than these rows show.

Trainable parameters (float32, so 4·N bytes of gradients) were counted with
Keras 3.15.1 (``sum(v.size for v in model.trainable_variables)``):
``hvd_easgd.app.models.build(name, (8, 8, 1), 10)`` for the digits models,
``build("student_mlp", (32,), 10)`` for the teacher workload and
``keras.applications.ResNet50(weights=None)``.
"""
import json
import pathlib
import statistics
from typing import NamedTuple, Optional

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "results"
DENSE = "dense layers: 6N"
# He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016), Table 1: 3.8e9 multiply-adds a
# 224x224 image forward; 2 FLOPs each, and the backward pass twice the forward.
RESNET50_FLOPS = 3 * 2 * 3.8e9
TOKENS_PER_SAMPLE = 2048  # the 1 B model's assumed sequence length: 6N FLOPs a token
TF_BENCHMARKS = ("https://github.com/tensorflow/docs/blob/62da04c02d67fdcabb7bc64633f217f073fa5f63/"
                 "site/en/r1/guide/performance/benchmarks.md")


# The benchmarks' model names (``--models``, a results row's "model") -> the name here.
WORKLOAD_OF = {"cnn": "digits_cnn", "wide_mlp": "wide_mlp"}


class Workload(NamedTuple):
    params: int
    batch: int  # samples per rank and step
    compute: float  # c, seconds per step and rank, no communication
    basis: str  # "measured", "cited" or "assumed"
    source: str  # where c comes from (a committed file and field, a URL, or the assumption)
    # A sample's forward and backward FLOPs, for what c does not measure (format_compute.flop_share); None
    # where unknown. A dense model's is 6N (2N forward, 4N backward).
    flops_per_sample: Optional[float] = None
    flops_source: str = ""


def _json(relative):
    return json.loads((RESULTS / relative).read_text())


def _cnn():
    path = "default-collectives/quiet-np1-np2-run1/results.json"
    rows = [r for r in _json(path)["rows"] if r["config"] == "no_comm" and r["model"] == "cnn" and r["np"] == 1]
    rate = statistics.median(r["samples_per_sec"]["median"] for r in rows)
    batch = rows[0]["batch_per_rank"]
    return Workload(38_282, batch, batch / rate, "measured",
                    f"docs/results/{path}: no_comm at np 1, {rate:,.0f} samples/s at batch {batch} "
                    f"(median of its {len(rows)} rows)")


def _wide_mlp():
    path = "wire/2x1/results.json"
    result = _json(path)
    analysis = result["analysis"][0]
    batch = next(r["batch_per_rank"] for r in result["rows"] if r["model"] == "wide_mlp")
    return Workload(5_431_818, batch, analysis["compute_seconds_per_step"], "measured",
                    f"docs/results/{path}: analysis compute_seconds_per_step (no_comm, 2 hosts × 1 rank), "
                    f"batch {batch}", 6 * 5_431_818, DENSE)


def _teacher():
    path = "tta_teacher/results.json"
    tta = _json(path)["time_to_accuracy"]
    rate, batch = tta["ceiling"]["samples_per_second_per_rank"], tta["batch_per_rank"]
    return Workload(1_093_642, batch, batch / rate, "measured",
                    f"docs/results/{path}: time_to_accuracy ceiling, {rate:,.0f} samples/s per rank at batch "
                    f"{batch} ({tta['model']} on --data {tta['data']})", 6 * 1_093_642, DENSE)


def _one_billion(params=1_000_000_000, batch=8, step=1.0):
    flops = 6.0 * params * TOKENS_PER_SAMPLE
    return Workload(params, batch, step, "assumed",
                    f"assumed: {step:g} s a step at {batch} samples a rank (a 1 B-parameter model on one accelerator)",
                    flops, f"assumed: a language model's 6N a token, {TOKENS_PER_SAMPLE} tokens a sample (so "
                    f"{step:g} s a step is {flops * batch / step / 1e12:.0f} TFLOP/s)")


def models():
    """{name: Workload} for every model the projection lists, in its order."""
    return {
        "digits_cnn": _cnn(),
        "wide_mlp": _wide_mlp(),
        "overlap_mlp": _teacher(),
        "resnet50": Workload(25_583_592, 64, 64 / 219, "cited",
                             f"219 images/s on one P100 at batch 64 (tf_cnn_benchmarks, synthetic data): "
                             f"{TF_BENCHMARKS}", RESNET50_FLOPS,
                             "3.8e9 multiply-adds forward a 224×224 image (He et al. 2016, Table 1), ×2 ×3"),
        "1b": _one_billion(),
    }

