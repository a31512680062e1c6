"""Chapter 06's exercises: an int8 absmax quantizer, the bytes of int4, and the price of an outlier."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

from ...engine import EngineModel
from ...engine.kv_cache import AttentionMetadata
from ...evaluation import eval_token_ids
from ...quant.formats import dequantize_int8, error_stats, quantize_int4, quantize_int8_absmax
from ...quant.kernels import Int8KernelWeight
from ...units import human
from . import Exercise, build
from .checking import Mistake, short_repr

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


# ---------------------------------------------------------------------------------------------
# Build it: your int8 weights inside the engine
#
# The engine's int8 mode (EngineConfig(weight_quant="int8")) quantizes every linear layer and the
# LM head once, per output row, and multiplies by PyTorch's fused int8 kernel. Here your
# quantize_int8_absmax() makes those codes and scales (through EngineModel.quantized's
# int8_quantizer), and the reference is the same engine with the library's own quantizer: the
# same kernel, the same prompts. Rounding rules differ only at exact ties (w / scale = k + 1/2,
# about 55,000 of SmolLM2's 134 million weights, stored in bf16): torch.round, like Python's round,
# takes them to the even code; C's round, or floor(|x| + 0.5), away from zero. Both are right,
# and a different tie rule can flip a greedy token,
# so when your codes differ from the library's only at ties, the tokens may differ and the quality
# bounds (perplexity and top-1 agreement against fp32 transformers, within the library int8's)
# decide. Any other difference must leave the tokens identical.

EVAL_TOKENS = 128  # teacher-forced tokens of the evaluation text for perplexity and top-1 agreement
PPL_SLACK = 1.02  # your perplexity at most 2 % above the engine's own int8
# and your top-1 agreement at most 3 points below it: on 128 tokens one token is 0.8 points, and
# breaking the model's ties half away from zero instead of to even moved it by 1.6 points
TOP1_SLACK = 0.03
TIE = 1e-3  # |w / scale| this close to k + 1/2 is a tie another rounding rule may break the other way
SCALE_TOL = 1e-3  # a scale within 0.1 % of absmax / 127 is absmax / 127 computed another way
PRUNED = (0, 5)  # the probe: layer 0's o_proj with output row 5 zeroed (a pruned channel)


class _Unusable(Exception):
    """The learner's codes or scales cannot become the kernel's int8 weight (the message says why)."""


def _int8_config():
    return build.engine_config(weight_quant="int8")


@lru_cache(maxsize=1)
def _float_model() -> EngineModel:
    return EngineModel.from_hf(build.loaded().model)


def _named_weights(model: EngineModel) -> list[tuple[str, torch.Tensor]]:
    """The weights the engine quantizes, named for messages (what EngineModel.quantized passes, in order)."""
    out = []
    for i, w in enumerate(model.layers):
        out += [(f"layer {i}'s q|k|v", w.qkv_proj), (f"layer {i}'s o_proj", w.o_proj),
                (f"layer {i}'s gate|up", w.gate_up_proj), (f"layer {i}'s down_proj", w.down_proj)]
    return out + [("the LM head", model.lm_head)]


@lru_cache(maxsize=1)
def _reference_tokens() -> tuple[tuple[int, ...], ...]:
    """Greedy tokens of the engine's own int8 path: the library's quantize_int8_absmax, the same kernel."""
    return tuple(tuple(o) for o in build.run_engine(_int8_config(), build.chat_prompts()).outputs)


@lru_cache(maxsize=1)
def _eval_ids() -> torch.Tensor:
    return eval_token_ids(build.loaded().tokenizer, EVAL_TOKENS)


@lru_cache(maxsize=1)
def _fp32_choices() -> torch.Tensor:
    with torch.inference_mode():
        return build.loaded().model(_eval_ids()[None]).logits[0].argmax(-1)


def _quality(model: EngineModel) -> tuple[float, float]:
    """(perplexity, top-1 agreement with fp32 transformers) of ``model``, teacher-forced on the evaluation text."""
    ids = _eval_ids()
    n = len(ids)
    meta = AttentionMetadata(query_lens=[n], context_lens=[n], sample_indices=list(range(n)))
    logits = model.forward(ids, torch.arange(n), meta, None)  # no cache: the whole text in one pass
    nll = F.cross_entropy(logits[:-1].double(), ids[1:]).item()
    return math.exp(nll), (logits.argmax(-1) == _fp32_choices()).double().mean().item()


@lru_cache(maxsize=1)
def _reference_quality() -> tuple[float, float]:
    return _quality(_float_model().quantized("int8"))


def _codes_and_scales(got: Any, w: torch.Tensor, where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The learner's ``(codes, scales)`` as the kernel takes them: int8 ``(out, in)`` and fp32 ``(out, 1)``."""
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        raise _Unusable(f"{where}: return a (codes, scales) pair, got {type(got).__name__}")
    try:
        codes, scales = torch.as_tensor(got[0]), torch.as_tensor(got[1])
    except (TypeError, ValueError, RuntimeError) as exc:
        raise _Unusable(f"{where}: codes and scales should be tensors ({exc})") from None
    out, inp = w.shape
    if codes.dtype != torch.int8:
        raise _Unusable(f"{where}: codes should be int8, got {codes.dtype}: round, clamp to [-127, 127], then "
                        ".to(torch.int8)")
    if tuple(codes.shape) != (out, inp):
        raise _Unusable(f"{where}: codes have shape {tuple(codes.shape)}, expected the weight's ({out}, {inp})")
    if not scales.is_floating_point():
        raise _Unusable(f"{where}: scales should be floats, got {scales.dtype}")
    if tuple(scales.shape) not in ((out, 1), (out,)):
        if scales.numel() == 1:
            why = "one scale for the whole tensor; the engine wants one per ROW (output channel): absmax over dim=1"
        elif tuple(scales.shape) in ((1, inp), (inp,)):
            why = ("one scale per COLUMN (input channel); the engine wants one per row (output channel): take "
                   "each row's absmax, over dim=1")
        else:
            why = "one scale per row (output channel) is asked"
        raise _Unusable(f"{where} ({out}x{inp}): scales have shape {tuple(scales.shape)}, expected ({out}, 1): {why}")
    return codes, scales.reshape(out, 1).float()


def _scale_problem(w: torch.Tensor, s: torch.Tensor, where: str) -> str | None:
    """Scales must be positive and finite, and each non-zero row's absmax / 127 (its largest weight at ±127)."""
    low, high = torch.aminmax(w, dim=1, keepdim=True)  # one pass over the weight
    absmax = torch.maximum(-low, high)
    bad = ~(torch.isfinite(s) & (s > 0))
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        if float(absmax[row]) == 0:
            return (f"{where}, row {row} is all zeros and got scale {human(float(s[row]), 6)}: an all-zero row needs a "
                    "positive scale (e.g. 1), or w / scale is 0 / 0")
        return f"{where}, row {row}: scale {human(float(s[row]), 6)}; a scale must be positive and finite"
    rows = absmax[:, 0] > 0
    ratio = (s[:, 0] * 127 / absmax[:, 0].clamp_min(1e-30))[rows].double()
    off = (ratio - 1).abs() > SCALE_TOL
    if not bool(off.any()):
        return None
    row = int(rows.nonzero()[int(off.nonzero()[0, 0]), 0])
    a, got = float(absmax[row]), float(s[row])
    detail = (f"{where}, row {row}: absmax {human(a, 6)}, scale {human(got, 6)}, expected absmax / 127 = {human(a / 127, 6)} "
              f"(got/expected = {human(got * 127 / a, 4)})")
    common = {127 / 128: "scale = absmax / 128: codes stop at 127, so the scale is absmax / 127",
              127 / 255: "scale = absmax / 255: symmetric int8 codes run from -127 to 127, so absmax maps to 127",
              127.0: "scale = absmax: divide it by 127, the largest code"}
    for factor, why in common.items():
        if bool(((ratio / factor - 1).abs() < SCALE_TOL).all()):
            return f"{detail}: {why}"
    if bool((s == s[0]).all()) and bool((absmax[rows] != absmax[rows][0]).any()):
        return (f"{detail}: every row has the same scale, the whole tensor's: one scale per row (output "
                "channel), from that row's own absmax")
    return f"{detail}: the row's largest magnitude maps to code ±127"


def _roundtrip_problem(w: torch.Tensor, codes: torch.Tensor, s: torch.Tensor, deq: Any, where: str) -> str | None:
    """Invariant: |w - dequantize(quantize(w))| <= scale / 2 for every weight of every row."""
    try:
        deq = torch.as_tensor(deq)
    except (TypeError, ValueError, RuntimeError):
        return f"{where}: dequantize_int8 returned {type(deq).__name__}, not a tensor"
    if tuple(deq.shape) != tuple(w.shape):
        return f"{where}: dequantize_int8 returned shape {tuple(deq.shape)}, expected the weight's {tuple(w.shape)}"
    if not deq.is_floating_point():
        return f"{where}: dequantize_int8 returned {deq.dtype}; it should return floats, codes × scale"
    deq = deq.float()
    bound = (0.5 + 1e-4) * s  # codes × scale in fp32 is within a few ulp of w: far below 1e-4 of a step
    if bool(((w - deq).abs_() <= bound).all()):  # NaN is never within the bound
        return None
    bad = ~((w - deq).abs() <= bound)
    r, c = (int(i) for i in bad.nonzero()[0])
    x, q, sc, d = float(w[r, c]), int(codes[r, c]), float(s[r]), float(deq[r, c])
    head = (f"{where}, row {r}, column {c}: w = {human(x, 6)}, code {q}, scale {human(sc, 6)}, dequantized {human(d, 6)}: off by "
            f"{human(abs(x - d) / sc)} steps (at most 0.5)")
    if abs(d - q * sc) > 1e-5 * max(abs(q * sc), sc):
        if abs(d - q / sc) <= 1e-5 * max(abs(q / sc), 1.0):
            return f"{head}; dequantize_int8 divides by the scale: multiply, w ≈ codes × scale"
        return (f"{head}; code × scale is {human(q * sc, 6)}: dequantize_int8 should return codes × scale, each row "
                "times its own scale")
    ratio = x / sc
    if q == -128 and ratio > 0:
        return f"{head}; w / scale = {human(ratio, 4)} overflowed int8 (128 wraps to -128): clamp to [-127, 127] before casting"
    if abs(ratio) > 127.5:
        return f"{head}; w / scale = {human(ratio, 4)} is beyond the largest code, 127: the scale is too small"
    ratios = w / s
    rules = (("trunc", "the codes are truncated toward zero"), ("floor", "rounded down (floor)"),
             ("ceil", "rounded up (ceil)"))
    for rule, what in rules:  # the rule that gives every code
        if bool((getattr(ratios, rule)().clamp(-128, 127) == codes.float()).all()):
            return f"{head}; w / scale = {human(ratio, 4)} became {q}: {what}, round to the nearest"
    return f"{head}; the code should be w / scale = {human(ratio, 4)} rounded to the nearest integer"


class _Scan:
    """What the learner's quantizer did to every weight the engine quantized: the invariants' first
    violations, and where its codes differ from the library's (ties, or not)."""

    def __init__(self) -> None:
        self.problems: dict[str, str] = {}
        self.weights = 0
        self.values = 0
        self.tie_diffs = 0
        self.scale_diffs = 0  # rows whose scale, in the kernel's bf16, is not the library's
        self.other_diffs = 0
        self.first_other = ""

    def note(self, key: str, problem: str | None) -> None:
        if problem and key not in self.problems:
            self.problems[key] = problem

    def compare_codes(self, w: torch.Tensor, codes: torch.Tensor, ref: torch.Tensor, where: str) -> None:
        """Count where ``codes`` differ from the library's ``ref``: by one step at a tie, or otherwise."""
        if torch.equal(codes, ref):
            return
        diff = codes != ref
        absmax = w.abs().amax(dim=1, keepdim=True)
        ratio = w / torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))  # the library's w / scale
        tie = ((ratio.abs() - ratio.abs().floor() - 0.5).abs() < TIE) & ((codes.int() - ref.int()).abs() == 1)
        ties = int((diff & tie).sum())
        self.tie_diffs += ties
        others = diff & ~tie
        self.other_diffs += int(others.sum())
        if not self.first_other and bool(others.any()):
            r, c = (int(i) for i in others.nonzero()[0])
            self.first_other = (f"{where}, row {r}, column {c}: w / scale = {human(float(ratio[r, c]), 6)}, your code "
                                f"{int(codes[r, c])}, the library's {int(ref[r, c])}")


def _learner_quantizer(fns: Any, r: Any, scan: _Scan, names: dict[int, tuple[str, Int8KernelWeight]]):
    """The learner's quantize_int8_absmax as EngineModel.quantized's int8_quantizer, checking every weight.

    ``names``: id of each weight the engine quantizes -> (its name, the library's kernel weight of it).
    """

    def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        where, ref = names.get(id(weight), (f"a {tuple(weight.shape)} weight", None))
        w = weight.detach().float()
        got = r.call(fns.quantize_int8_absmax, weight.clone(), case=f"quantize_int8_absmax on {where}")
        codes, s = _codes_and_scales(got, w, where)
        scan.weights += 1
        scan.values += w.numel()
        scan.note("scale", _scale_problem(w, s, where))
        deq = r.call(fns.dequantize_int8, got[0], got[1], case=f"dequantize_int8 on {where}")
        scan.note("roundtrip", _roundtrip_problem(w, codes, s, deq, where))
        scan.compare_codes(w, codes, ref.codes if ref is not None else quantize_int8_absmax(w)[0], where)
        if ref is not None:
            scan.scale_diffs += int((s.reshape(-1).to(ref.scales.dtype) != ref.scales).sum())
        return codes, s

    return quantize


def _use_model(engine: Any, model: EngineModel) -> None:
    """Make ``engine`` multiply by ``model``'s weights (before its first step)."""
    engine.model = model
    if engine.decode_runner is not None:
        engine.decode_runner.model = model


def _first_difference(outputs: list[list[int]], expected: Sequence[Sequence[int]]) -> str:
    prompts = build.chat_prompts()
    for i, (got, want) in enumerate(zip(outputs, expected, strict=True)):
        if list(got) != list(want):
            j = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
            return f"request {i} (prompt {build.describe(prompts[i])}) first differs at output position {j}"
    return "no request differs"


def _check_pruned_row(fns: Any, r: Any, weight: torch.Tensor, row: int, probe: str) -> None:
    """The case no real weight of the model has: an all-zero row (a pruned output channel) of ``weight``."""
    pruned = weight.clone()
    pruned[row] = 0
    case = f"an all-zero row: {probe}"
    got = r.call(fns.quantize_int8_absmax, pruned.clone(), case=case)
    try:
        codes, s = _codes_and_scales(got, pruned, probe)
        zero = float(s[row])
        if not (math.isfinite(zero) and zero > 0):
            problem = (f"row {row} is all zeros and got scale {'NaN' if math.isnan(zero) else human(zero, 6)}: an "
                       "all-zero row needs a positive scale (e.g. 1), or w / scale is 0 / 0")
        elif bool((codes[row] != 0).any()):
            problem = f"row {row} is all zeros but got codes {short_repr(codes[row].tolist(), 50)}: they should be 0"
        else:
            deq = torch.as_tensor(r.call(fns.dequantize_int8, got[0], got[1], case=case))
            back = deq[row] if deq.dim() == 2 and deq.shape[0] > row else None
            problem = (None if back is not None and bool((back == 0).all()) else
                       f"dequantize_int8 gave row {row} back as "
                       f"{short_repr(back.tolist() if back is not None else deq, 50)}, not zeros")
        r.record(case, problem is None, problem or f"scale {human(zero, 6)}, codes and dequantized row all 0")
    except _Unusable as exc:
        r.record(case, False, str(exc))


def check_int8_engine(fns, r) -> None:
    r.call(fns.quantize_int8_absmax, torch.ones(2, 4), case="setup")
    r.call(fns.dequantize_int8, torch.ones(2, 4, dtype=torch.int8), torch.ones(2, 1), case="setup")
    source = _float_model()
    own = source.quantized("int8")  # the engine's own int8 weights (the library's quantizer), kept by the model
    names = {id(t): (name, ref) for (name, t), ref in zip(_named_weights(source), own.gemm_weights(), strict=True)}
    scan = _Scan()
    quantize = _learner_quantizer(fns, r, scan, names)

    layer, row = PRUNED
    _check_pruned_row(fns, r, source.layers[layer].o_proj, row,
                      f"layer {layer}'s o_proj with output row {row} zeroed (a pruned channel)")

    case = "your codes and scales as the engine's int8 weights (every linear layer and the LM head)"
    try:
        mine = source.quantized("int8", int8_quantizer=quantize)
    except _Unusable as exc:
        r.record(case, False, str(exc))
        return
    what = f"all {scan.weights} weight matrices the engine quantizes ({human(scan.values)} weights)"
    r.record("invariant: one scale per row, the row's largest magnitude at code ±127 (scale = row absmax / 127)",
             "scale" not in scan.problems, scan.problems.get("scale", f"held on {what}"))
    r.record("invariant: |w - dequantize_int8(quantize_int8_absmax(w))| <= scale / 2, every weight of every row",
             "roundtrip" not in scan.problems, scan.problems.get("roundtrip", f"held on {what}"))

    prompts = build.chat_prompts()
    expected = _reference_tokens()
    case = (f"the int8 engine with your codes and scales ({Int8KernelWeight.kernel}): {len(prompts)} chat prompts, "
            f"{build.NEW_TOKENS} greedy tokens each, against the engine with its own int8 weights (the library's "
            "quantize_int8_absmax, the same kernel)")
    run = build.run_engine(_int8_config(), prompts, plug=lambda engine: _use_model(engine, mine))
    same = run.finished and not any(run.errors) and [list(o) for o in run.outputs] == [list(e) for e in expected]
    ties = []  # differences from the library's weights that are another right way, not a mistake
    if scan.tie_diffs:
        ties.append(f"codes at {human(scan.tie_diffs)} exact ties (w / scale = k + 1/2), by one step: your rounding "
                    "(or your arithmetic for w / scale) breaks ties another way than torch.round, which rounds half "
                    "to even")
    if scan.scale_diffs:
        ties.append(f"the scales of {human(scan.scale_diffs)} rows in their last bits (the kernel keeps them in bf16)")
    legit = ties and not scan.other_diffs and not scan.problems
    if not same and legit and run.finished and not any(run.errors):
        r.engine_runs.append(False)
        r.record(case, True, f"{_first_difference(run.outputs, expected)}, but your weights differ from the "
                             f"library's only in {' and in '.join(ties)}. Not a mistake: the quality bounds below "
                             "decide")
    else:
        if scan.problems:
            hint = next(iter(scan.problems.values()))
        elif scan.other_diffs:
            hint = (f"your codes differ from the library's at {human(scan.other_diffs)} weights beyond ties; first at "
                    f"{scan.first_other}")
        else:
            hint = ""
        build.compare(r, case, run, expected=expected, hint=hint, against="the engine's own int8 weights")
        if ties and same:
            r.outcomes[-1] = replace(r.outcomes[-1], detail=r.outcomes[-1].detail + (
                f"; your weights differ from the library's only in {' and in '.join(ties)}: no token changed"))

    ref_ppl, ref_top1 = _reference_quality()
    if scan.tie_diffs or scan.scale_diffs or scan.other_diffs:
        ppl, top1 = _quality(mine)
        ok = ppl <= ref_ppl * PPL_SLACK and top1 >= ref_top1 - TOP1_SLACK
        detail = (f"perplexity {human(ppl, 4)} (the engine's own int8: {human(ref_ppl, 4)}, limit "
                  f"{human(ref_ppl * PPL_SLACK, 4)}), top-1 agreement {top1:.1%} (own int8: {ref_top1:.1%}, limit "
                  f"{ref_top1 - TOP1_SLACK:.1%})")
        if not ok and scan.problems:
            detail += f". Hint: {next(iter(scan.problems.values()))}"
    else:  # the same codes and scales: the same model, measured once
        ok = True
        detail = (f"your codes and scales are the library's, code for code, so the model is the engine's own int8: "
                  f"perplexity {human(ref_ppl, 4)}, top-1 agreement {ref_top1:.1%}")
    r.record(f"quality against fp32 transformers, teacher-forced on {EVAL_TOKENS} tokens of the evaluation text: "
             f"perplexity within {PPL_SLACK - 1:.0%} and top-1 agreement within {TOP1_SLACK * 100:.0f} points of "
             "the engine's own int8", ok, detail)


EXERCISES.append(
    Exercise("int8_engine", "Your int8 weights inside the engine", "build",
             "Your quantize_int8_absmax() makes the engine's int8 weights (every linear layer and the LM head, "
             "multiplied by PyTorch's fused int8 kernel) and your dequantize_int8() must undo it within half a "
             "step; checked by generating with the engine on the embedded model, token for token against the "
             "engine with the library's own int8 weights, with perplexity and top-1 agreement against fp32 "
             "transformers within the library int8's bounds.", check_int8_engine,
             functions=("quantize_int8_absmax", "dequantize_int8"),
             symbol="src/infer_lab/engine/model.py::EngineModel.quantized(int8_quantizer)",
             timeout_s=build.BUILD_TIMEOUT_S))
