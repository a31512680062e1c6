"""Chapter 00's exercises: the ridge point, the intensity of a decode step, and counting a layer's FLOPs."""

from __future__ import annotations

from ...analysis.roofline import decode_ops, gpu_roof
from ...shape import model_shape
from . import Exercise
from .checking import Mistake, factor_of_2, forgot_layers

NUMBER = "00"
SLUG = "setup"
TITLE = "00 · Setup"

GPUS = ("H100-SXM", "H200", "A100-80GB", "L40S", "T4")
DENSE_MODELS = ("mistral-7b", "llama-3-8b", "qwen2.5-7b", "smollm2-135m")
INTENSITY_TOL = 0.10  # the roofline also reads the KV cache, activations and the LM head


def check_ridge_point(fns, r) -> None:
    for gpu in GPUS:
        roof = gpu_roof(gpu)
        case = f"{gpu}: {roof.peak_flops / 1e12:g} TFLOP/s bf16, {roof.bandwidth_Bps / 1e12:g} TB/s"
        got = r.call(fns.ridge_point, roof.peak_flops, roof.bandwidth_Bps, case=case)
        r.close(case, got, roof.ridge_point, rel_tol=1e-6, unit="FLOP/B",
                wrong={"the inverse (bytes per FLOP): divide FLOP/s by bytes/s": roof.bandwidth_Bps / roof.peak_flops})


def _roofline_intensity(model: str, dtype: str, batch: int, context: int = 512) -> float:
    ops = decode_ops(model, batch, context, weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype)
    return sum(o.flops for o in ops) / sum(o.bytes for o in ops)


def check_decode_intensity(fns, r) -> None:
    for model, dtype, bytes_per_weight, batch in (
        ("mistral-7b", "bf16", 2, 1), ("mistral-7b", "fp32", 4, 1), ("llama-3-8b", "bf16", 2, 1),
        ("mistral-7b", "bf16", 2, 8), ("smollm2-135m", "fp32", 4, 1),
    ):
        case = f"{model}, {dtype} weights ({bytes_per_weight} B each), batch {batch}, context 512"
        got = r.call(fns.decode_intensity, batch, bytes_per_weight, case=case)
        mistakes = [Mistake(0.5, "half the roofline's count: a multiply-add is 2 FLOP per weight"),
                    Mistake(2.0, "twice the roofline's count: each weight is used in ONE multiply-add (2 FLOP), "
                                 "and read once")]
        if batch > 1:
            mistakes.append(Mistake(1 / batch, f"off by the batch ({batch}): the {batch} sequences share one read "
                                               f"of the weights, so the FLOPs grow {batch}x and the bytes do not"))
        r.close(case, got, _roofline_intensity(model, dtype, batch), rel_tol=INTENSITY_TOL, unit="FLOP/B",
                mistakes=mistakes)


def _mlp_op_flops(model: str, batch: int) -> float:
    ops = decode_ops(model, batch, 512)
    return next(o.flops for o in ops if o.name.startswith("MLP"))


def check_mlp_flops(fns, r) -> None:
    for model, batch in (("mistral-7b", 1), ("llama-3-8b", 4), ("qwen2.5-7b", 1), ("smollm2-135m", 16)):
        s = model_shape(model)
        case = f"{model}: {batch} token(s), hidden {s.hidden}, intermediate {s.intermediate}, {s.layers} layers"
        got = r.call(fns.mlp_flops, batch, s.hidden, s.intermediate, s.layers, case=case)
        r.close(case, got, _mlp_op_flops(model, batch), rel_tol=1e-9, unit="FLOP",
                mistakes=[Mistake(2 / 3, "two thirds of it: a gated MLP has THREE matrices (gate, up, down)"),
                          forgot_layers(s.layers),
                          *factor_of_2("a multiply-add is 2 FLOP", "count 2 FLOP per weight per token, not 4")])


EXERCISES = [
    Exercise("ridge_point", "The ridge point of a GPU", "predict",
             "Predict the arithmetic intensity (FLOP per byte) at which a kernel stops being limited by "
             "memory; checked against the roofline of every catalog GPU.", check_ridge_point),
    Exercise("decode_intensity", "How much work a decode step does per byte", "predict",
             "Predict the FLOP per byte of one decode step from the batch and the bytes per weight; checked "
             "against the roofline's op-by-op count for real models (within 10 %).", check_decode_intensity),
    Exercise("mlp_flops", "Count the MLP's FLOPs", "implement",
             "Count the FLOPs of the gated MLP in one forward pass over a few tokens; checked exactly "
             "against the roofline's MLP op.", check_mlp_flops),
]
