"""Chapter 01's exercises: the share of one token's FLOPs in the layers, and how long a decode step
waits on memory for every moment of arithmetic."""

from __future__ import annotations

from ...analysis.flops import flops_by_component
from ...analysis.params import attention_params_per_layer, gated_mlp_params
from ...analysis.roofline import gpu_roof, predict_decode
from ...shape import model_shape
from . import Exercise
from .checking import Mistake, factor_of_2

NUMBER = "01"
SLUG = "foundations"
TITLE = "01 · Foundations"

SHARE_TOL = 0.01  # the estimate leaves out the norms and attention over a one-token cache
RATIO_TOL = 0.03  # the estimate leaves out the KV cache and activations (context 256)
SHARE_MODELS = ("smollm2-135m", "llama-3-8b", "mistral-7b", "llama-3-70b")


def check_layers_flop_share(fns, r) -> None:
    for model in SHARE_MODELS:
        s = model_shape(model)
        per_layer = attention_params_per_layer(s) + gated_mlp_params(s.hidden, s.intermediate, s.mlp_bias)
        case = (f"{model}: vocabulary {s.vocab:,}, hidden {s.hidden:,}, {s.layers} layers of "
                f"{per_layer:,} weights")
        got = r.call(fns.layers_flop_share, s.vocab, s.hidden, s.layers, per_layer, case=case)
        head = s.vocab * s.hidden
        wrong = {"the LM head's share, not the layers'": head / (head + s.layers * per_layer),
                 "one layer where there are many": per_layer / (per_layer + head)}
        r.close(case, got, flops_by_component(model, context=1).layers_share, rel_tol=SHARE_TOL, wrong=wrong,
                mistakes=[Mistake(100.0, "100x too large: a fraction (0..1) was asked, not a percentage")])


RATIO_CASES = (("mistral-7b", "H100-SXM", "bf16", 2), ("llama-3-70b", "H200", "fp8", 1),
               ("llama-3-8b", "A100-80GB", "bf16", 2), ("mistral-7b", "L4", "fp32", 4))


def check_memory_over_compute(fns, r) -> None:
    for model, gpu, dtype, nbytes in RATIO_CASES:
        roof = gpu_roof(gpu)
        case = (f"{model} on {gpu} ({roof.peak_flops / 1e12:g} TFLOP/s, {roof.bandwidth_Bps / 1e12:g} TB/s), "
                f"{dtype} weights, batch 1")
        got = r.call(fns.memory_over_compute, nbytes, roof.bandwidth_Bps, roof.peak_flops, case=case)
        step = predict_decode(model, roof, 1, 256, weight_dtype=dtype)
        expected = (step.bytes / roof.bandwidth_Bps) / (step.flops / roof.peak_flops)
        r.close(case, got, expected, rel_tol=RATIO_TOL, wrong={"compute over memory: the inverse": 1 / expected},
                mistakes=list(factor_of_2("each weight does 2 FLOP (a multiply and an add)",
                                          "each weight does 2 FLOP, not 1")))


EXERCISES = [
    Exercise("layers_flop_share", "The share of one token's FLOPs in the layers", "predict",
             "Predict the fraction of a decode step's FLOPs spent in the decoder layers from four numbers of "
             "the config; checked against the component-by-component count (within 1 %).",
             check_layers_flop_share),
    Exercise("memory_over_compute", "How long decode waits on memory", "predict",
             "Predict how many times longer a batch-1 decode step's bytes take to read than its FLOPs take "
             "to compute; checked against the roofline's bytes and FLOPs on datasheet GPUs (within 3 %).",
             check_memory_over_compute),
]
