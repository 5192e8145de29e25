"""The models the cost model projects: parameters, batch and compute per step, each with where it came from.

Imports no TensorFlow. A compute time per step c is read from a committed
measurement where this project has one (``docs/results/``), never copied
here by hand; the others are measured elsewhere, cited or assumed, and say
so. Every c measured here is a CPU figure on this 2-core machine (one rank a
core, or oversubscribed): a GPU computes these small models far faster, so
at scale their communication weighs more than these rows show. The
accelerator rows are ResNet-50 on a 2016 P100 (cited) and, measured on an
NVIDIA H200 with PyTorch (``benchmarks/data/h200-2026-12-04.json``, read
here field by field; its README says how it was measured), ResNet-50 and a
1.07 B-parameter language model, with what their formats' encodings cost on
that device (``Workload.format_seconds``).

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

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "results"
H200 = pathlib.Path(__file__).resolve().parents[1] / "data" / "h200-2026-12-04.json"
H200_SOURCE = "benchmarks/data/h200-2026-12-04.json"
DENSE = "dense layers: 6N"
# He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016), Table 1: 3.8e9 multiply-adds a
# 224x224 image forward; 2 FLOPs each, and the backward pass twice the forward.
RESNET50_FLOPS = 3 * 2 * 3.8e9
TOKENS_PER_SAMPLE = 2048  # the 1 B model's sequence length (the H200 measurement's)
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
    # Seconds one pass of a format's own work takes over this model on the device c was measured on, where
    # that was measured: "powersgd:<rank>", a step's PowerSGD encode of every weight matrix; "int8", "int4",
    # one block-256 quantise + dequantise of all N values (format_compute.shares turns them into shares of c).
    format_seconds: Optional[dict] = None
    format_source: str = ""


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


def h200():
    """The H200 measurement, as committed (``benchmarks/data/README.md``)."""
    return json.loads(H200.read_text())


def _quantise_seconds(anchor, params):
    """{format: seconds of one block-256 quantise + dequantise of ``params`` values}, scaled from the anchor's
    1.07 B elements (an elementwise pass: its time goes with the elements)."""
    q = anchor["quantise_block256"]
    return {name: q[name]["median_ms"] * 1e-3 * params / q["elements"] for name in ("int8", "int4")}


def _format_source(anchor, powersgd):
    q = anchor["quantise_block256"]
    return (f"{H200_SOURCE}: {powersgd}.powersgd_r4_encode ({_powersgd_ms(anchor, powersgd):.1f} ms, unfused P = MQ, "
            f"QR, Q = MᵀP) and quantise_block256 (int8 {q['int8']['median_ms']:.1f} ms, int4 "
            f"{q['int4']['median_ms']:.1f} ms for {q['elements']:,} fp32 values, scaled to N)")


def _powersgd_ms(anchor, model):
    return anchor[model]["powersgd_r4_encode"]["median_ms"]


def _resnet50_h200(batch=64, precision="bf16"):
    # Batch 64, as the P100 row and the Horovod paper; bf16, as one trains on an H200 (the file also holds fp32
    # with TF32 convolutions, 27.7 ms, and batch 256, 82.2 / 55.3 ms). The gradients still travel in fp32.
    anchor = h200()
    r = anchor["resnet50"]
    step = r[f"b{batch}_{precision}"]
    return Workload(r["params"], batch, step["median_ms"] * 1e-3, "measured elsewhere",
                    f"{H200_SOURCE}: resnet50.b{batch}_{precision} median, {step['images_per_s']:,.0f} images/s on "
                    f"one H200 (PyTorch, {precision} autocast, channels_last; torchvision's {r['params']:,} "
                    f"parameters)", RESNET50_FLOPS, "3.8e9 multiply-adds forward a 224×224 image (He et al. 2016, "
                    "Table 1), ×2 ×3",
                    {"powersgd:4": _powersgd_ms(anchor, "resnet50") * 1e-3, **_quantise_seconds(anchor, r["params"])},
                    _format_source(anchor, "resnet50"))


def _one_billion():
    anchor = h200()
    lm = anchor["lm_1b"]
    batch = lm["tokens_per_step"] // TOKENS_PER_SAMPLE
    return Workload(lm["params"], batch, lm["median_ms"] * 1e-3, "measured elsewhere",
                    f"{H200_SOURCE}: lm_1b median, {batch} × {TOKENS_PER_SAMPLE:,} tokens on one H200 (PyTorch, "
                    f"bf16 autocast, fused AdamW; {lm['achieved_TFLOPs']:.0f} TFLOP/s)",
                    lm["model_TFLOPs_per_step"] * 1e12 / batch,
                    f"measured elsewhere: 6N a token plus causal attention, {TOKENS_PER_SAMPLE:,} tokens a sample "
                    "(the measurement's own count)",
                    {"powersgd:4": _powersgd_ms(anchor, "lm_1b") * 1e-3, **_quantise_seconds(anchor, lm["params"])},
                    _format_source(anchor, "lm_1b"))


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
        "resnet50_h200": _resnet50_h200(),
        "1b": _one_billion(),
    }

