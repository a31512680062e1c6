"""Chapter 04's exercises: one op on the roof, the critical batch predicted, then searched for."""

from __future__ import annotations

from ...analysis import roofline
from ...analysis.roofline import gpu_roof
from . import Exercise
from .checking import Mistake, factor_of_2

NUMBER = "04"
SLUG = "prefill_decode_roofline"
TITLE = "04 · Prefill vs decode and the roofline"

ESTIMATE_TOL = 0.10  # the estimate leaves out the KV reads, activations and the LM head


def check_roofline_time(fns, r) -> None:
    roof = gpu_roof("H100-SXM")
    steps = (("prefill of 2,048 tokens", roofline.prefill_ops("mistral-7b", 1, 2048)),
             ("decode step, batch 1, context 4,096", roofline.decode_ops("mistral-7b", 1, 4096)))
    for phase, ops in steps:
        for op in ops:
            case = f"mistral-7b {phase} on H100-SXM, {op.name}: {op.flops:.3g} FLOP, {op.bytes:.3g} B"
            got = r.call(fns.roofline_time_s, op.flops, op.bytes, roof.peak_flops, roof.bandwidth_Bps, case=case)
            compute, memory = op.flops / roof.peak_flops, op.bytes / roof.bandwidth_Bps
            r.close(case, got, roof.time_s(op.flops, op.bytes), rel_tol=1e-9, unit="s",
                    wrong={"the sum of both times: the roofline takes the slower of the two, they overlap":
                           compute + memory,
                           "the faster of the two: the op waits for the slower one": min(compute, memory)})


def _estimate_cases():
    for gpu in ("H100-SXM", "H200", "A100-80GB", "L40S"):
        yield gpu, "bf16", 2
    yield "H100-SXM", "fp8", 1
    yield "H200", "fp8", 1


def check_critical_batch_estimate(fns, r) -> None:
    model = "llama-3-70b"
    for gpu, weight_dtype, bytes_per_weight in _estimate_cases():
        roof = gpu_roof(gpu)
        case = f"{model} on {gpu} ({roof.peak_flops / 1e12:g} TFLOP/s, {roof.bandwidth_Bps / 1e12:g} TB/s), " \
               f"{weight_dtype} weights, context 1"
        got = r.call(fns.critical_batch_estimate, roof.peak_flops, roof.bandwidth_Bps, bytes_per_weight, case=case)
        expected = roofline.critical_batch(model, roof, 1, weight_dtype=weight_dtype)
        mistakes = list(factor_of_2("each weight does 2 FLOP (one multiply-add) per sequence",
                                    "each weight does 2 FLOP per sequence, not 1"))
        # With 1-byte weights, the ridge point itself is twice the answer: that is the forgotten factor 2
        # (each weight does 2 FLOP per sequence), named as such by the mistakes above.
        r.close(case, got, expected, rel_tol=ESTIMATE_TOL, unit="sequences", mistakes=mistakes)


SEARCH_CASES = (("llama-3-70b", "H100-SXM", 1), ("llama-3-70b", "H100-SXM", 512), ("llama-3-70b", "H200", 512),
                ("mistral-7b", "A100-80GB", 512), ("llama-3-70b", "H100-SXM", 4096), ("mistral-7b", "L40S", 1))


def check_critical_batch(fns, r) -> None:
    for model, gpu, context in SEARCH_CASES:
        roof = gpu_roof(gpu)
        case = f"{model} on {gpu}, context {context:,}"
        got = r.call(fns.critical_batch, model, gpu, context, case=case)
        expected = roofline.critical_batch(model, roof, context)
        if expected is None:
            r.equal(case, got, None, hint="past some context every added sequence brings its own KV reads and "
                                         "decode never turns compute-bound: return None when no batch up to "
                                         "max_batch does")
            continue
        r.close(case, got, expected, unit="sequences",
                wrong={"the last memory-bound batch (one too few)": expected - 1,
                       "one past the smallest compute-bound batch": expected + 1},
                mistakes=[Mistake(roof.ridge_point / expected, "the ridge point: search the real step instead")])


EXERCISES = [
    Exercise("roofline_time_s", "One op on the roof", "implement",
             "Write the roofline's time of one op from its FLOPs and bytes; checked against every op of a "
             "prefill and a decode step on an H100.", check_roofline_time),
    Exercise("critical_batch_estimate", "The critical batch, predicted", "predict",
             "Predict the batch at which decode turns compute-bound from the ridge point and the bytes per "
             "weight; checked against the roofline's search at a short context (within 10 %).",
             check_critical_batch_estimate),
    Exercise("critical_batch", "The critical batch, searched for", "implement",
             "Find the smallest compute-bound decode batch at a context with the roofline's step "
             "prediction; checked exactly against analysis.roofline.critical_batch, None included.",
             check_critical_batch),
]
