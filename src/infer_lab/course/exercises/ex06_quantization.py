"""Chapter 06's exercises: an int8 absmax quantizer, the bytes of int4, and the price of an outlier."""

from __future__ import annotations

import math

import torch

from ...quant.formats import dequantize_int8, error_stats, quantize_int4, quantize_int8_absmax
from . import Exercise
from .checking import Mistake

NUMBER = "06"
SLUG = "quantization"
TITLE = "06 · Quantization"

ERROR_TOL = 0.05  # the estimate assumes rounding errors spread evenly over a step


def _weights(kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    w = torch.randn(8, 64, generator=g)
    if kind == "an outlier in row 3":
        w[3, 10] = 40.0
    elif kind == "an all-zero row 2":
        w[2] = 0.0
    elif kind == "row 1 led by a negative value":
        w[1, 5] = -9.0
    return w


def _tensor_mismatch(name: str, got: torch.Tensor, expected: torch.Tensor, atol: float = 0.0) -> str | None:
    if not isinstance(got, torch.Tensor):
        return f"{name} should be a torch.Tensor, got {type(got).__name__}"
    if tuple(got.shape) != tuple(expected.shape):
        return f"{name} has shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    diff = (got.double() - expected.double()).abs()
    bad = diff > atol
    if not bool(bad.any()):
        return None
    where = tuple(int(i) for i in bad.nonzero()[0])
    return (f"{name} differs at {int(bad.sum())} of {bad.numel()} positions; first at {where}: expected "
            f"{expected[where].item():.6g}, got {got[where].item():.6g}")


def check_int8(fns, r) -> None:
    for kind in ("plain random rows", "an outlier in row 3", "an all-zero row 2", "row 1 led by a negative value"):
        w = _weights(kind)
        case = f"weight {tuple(w.shape)[0]}x{tuple(w.shape)[1]} with {kind}"
        got = r.call(fns.quantize_int8_absmax, w.clone(), case=case)
        q_ref, s_ref = quantize_int8_absmax(w)
        if not (isinstance(got, tuple) and len(got) == 2):
            r.record(case, False, f"return a (codes, scales) pair, got {type(got).__name__}")
            continue
        q, scale = got
        problem = _tensor_mismatch("scale", scale, s_ref, atol=1e-7 * float(s_ref.abs().max()))
        if problem and isinstance(scale, torch.Tensor) and scale.numel() == 1:
            problem += ": one scale per ROW (output channel) is asked, not one for the whole tensor"
        elif problem and isinstance(scale, torch.Tensor) and scale.shape == s_ref.shape:
            ratios = (scale.double() / s_ref.double())[s_ref != 1]
            if ratios.numel() and bool(((ratios - 127 / 128).abs() < 1e-5).all()):
                problem += " (scale = absmax / 128: the codes stop at 127, so the scale is absmax / 127)"
            if bool(torch.isnan(scale).any()) or bool((scale == 0).any()):
                problem += " (an all-zero row needs a non-zero scale, e.g. 1, or dequantizing divides by 0)"
        if problem is None:
            if not isinstance(q, torch.Tensor) or q.dtype != torch.int8:
                problem = f"codes should be an int8 tensor, got {getattr(q, 'dtype', type(q).__name__)}"
            else:
                problem = _tensor_mismatch("codes", q, q_ref)
                if problem and bool(((w / s_ref).trunc() == q.float()).all()):
                    problem += " (the codes are truncated toward zero: round to the nearest step)"
        r.record(case, problem is None, problem or f"codes and scales match; max |error| "
                 f"{(dequantize_int8(q_ref, s_ref) - w).abs().max().item():.3g}")


INT4_CASES = ((64, 256, 128, True), (64, 256, 128, False), (32, 576, 128, False), (16, 96, 32, True),
              (1024, 1024, 64, False))


def check_int4_bytes(fns, r) -> None:
    for out_f, in_f, group, symmetric in INT4_CASES:
        w = torch.randn(out_f, in_f, generator=torch.Generator().manual_seed(1))
        kind = "symmetric (no zero point)" if symmetric else "with a zero point"
        case = f"{out_f}x{in_f} weight, groups of {group}, {kind}"
        got = r.call(fns.int4_stored_bytes, out_f, in_f, group, symmetric, case=case)
        groups = out_f * math.ceil(in_f / group)
        codes = out_f * in_f // 2
        wrong = {"the codes alone, without the scales": codes,
                 "short groups dropped: ceil, not floor, the number of groups":
                 codes + out_f * (in_f // group) * (2 if symmetric else 3)}
        if not symmetric:
            wrong["codes and scales without the zero points (one byte per group)"] = codes + 2 * groups
        r.close(case, got, quantize_int4(w, group, symmetric=symmetric).nbytes, unit="B", wrong=wrong,
                mistakes=[Mistake(2.0, "twice the answer: two 4-bit codes share one byte")])


def _outlier_row(outlier: float) -> torch.Tensor:
    w = torch.randn(1, 4096, generator=torch.Generator().manual_seed(7))
    if outlier:
        w[0, 7] = outlier
    return w


def check_outlier_error(fns, r) -> None:
    for outlier in (0.0, 5.0, 20.0, 100.0):
        w = _outlier_row(outlier)
        absmax, rms = w.abs().max().item(), w.pow(2).mean().sqrt().item()
        what = f"one outlier of {outlier:g}" if outlier else "no outlier"
        case = f"4096 N(0,1) weights with {what}: absmax {absmax:.3g}, rms {rms:.3g}"
        got = r.call(fns.int8_relative_error, absmax, rms, case=case)
        q, s = quantize_int8_absmax(w)
        measured = error_stats(w, dequantize_int8(q, s))["rel_fro"]
        step = absmax / 127 / rms
        r.close(case, got, measured, rel_tol=ERROR_TOL,
                wrong={"the step itself: the error is spread over a step, its rms is step / sqrt(12)": step,
                       "half a step (the largest error, not its rms)": step / 2})


EXERCISES = [
    Exercise("quantize_int8_absmax", "An int8 absmax quantizer", "implement",
             "Quantize a weight to int8 with one scale per row (absmax / 127); checked code for code "
             "against the library's quantizer, outliers and zero rows included.", check_int8),
    Exercise("int4_stored_bytes", "The bytes of int4", "predict",
             "Predict the stored bytes of a group-wise int4 weight (codes, scales, zero points); checked "
             "against the bytes of the library's quantized tensors.", check_int4_bytes),
    Exercise("int8_relative_error", "The price of one outlier", "predict",
             "Predict the relative error of int8 absmax from a row's absmax and rms; checked against the "
             "error measured on real quantized rows, with and without an outlier (within 5 %).",
             check_outlier_error),
]
