"""One token on a CPU, compiled: every GEMV a fused multiply-and-sum, every small op fused.

When one sequence decodes alone (one user chatting), each step multiplies one row of
activations by every weight matrix: a GEMV per projection (four per layer, and the LM head),
which together read every one of those weights per token. The memory's read speed
sets the bound; how close a step comes depends on how fast each GEMV streams its matrix.

PyTorch's CPU GEMMs are built for many rows. At one row they read the weights well below the
speed at which ``Tensor.sum`` reads the same tensors: ``infer-lab bench gemm`` times one row
through ``F.linear``, oneDNN's prepacked GEMM (:mod:`.prepack`), the compiled GEMV below and
a plain sum (the course's 2-core EPYC: ``infer_lab/results/gemm-cpu-t2-2026-12-02.json``,
``one_row``). Written as ``(weight * x).sum(-1)``, a GEMV is one elementwise
product and one row reduction: nothing a GEMM kernel's blocking helps with. ``torch.compile``
(its CPU backend, inductor, which writes C++ and compiles it with the machine's compiler)
fuses the product into the reduction, so each weight row is streamed once, vectorized, rows
split across the threads, with no temporary. The same compile fuses each half-layer's
norm, RoPE, SiLU and residuals around its GEMVs into a few kernels, which removes most of
the per-operation overhead: run one by one, a step is hundreds of small operations, each
paying Python's and the dispatcher's fixed cost.

Only steps of exactly one token use this (:class:`~.config.EngineConfig` ``compiled_decode``):
the graphs are compiled for that shape once per process and dtype (inductor also caches
them on disk, so the next process loads them in seconds). Steps of more rows keep the
engine's GEMMs. The sums run in another order than a GEMM's, so logits differ by float
rounding only; greedy tokens match transformers' on the course's model (tested).
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from typing import Any

import torch
import torch.nn.functional as F

from ... import fast_paths
from ..layers import LayerFunctions, attention_inputs, layer_output, rms_norm

DTYPES = (torch.float32, torch.bfloat16)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` for one row ``x (1, in)`` and ``weight (out, in)``: ``(1, out)``.

    Written as a product and a row sum so that a compiler can fuse them into one pass over
    ``weight``. Run eagerly it would first build the whole ``(out, in)`` product: use it
    compiled (:func:`layer_functions`).
    """
    if x.shape[0] != 1:
        raise ValueError(f"gemv multiplies one row; got {x.shape[0]} (use a GEMM for more)")
    y = (weight * x).sum(-1)[None]
    return y if bias is None else y + bias


def compiler() -> str | None:
    """The C++ compiler inductor would use here (``$CXX``, else ``g++``, ``c++`` or ``clang++``), or None."""
    found = os.environ.get("CXX")
    if found:
        return shutil.which(found)
    return next((path for name in ("g++", "c++", "clang++") if (path := shutil.which(name))), None)


def _probe() -> str | None:
    if compiler() is None:
        return "torch.compile on a CPU needs a C++ compiler (g++ or clang++), and none was found"
    w, x = fast_paths.numbers(8, 32, 4), fast_paths.numbers(1, 32, 5)
    if not fast_paths.close(torch.compile(gemv, dynamic=False)(x, w), F.linear(x, w), 1e-4):
        return "the compiled GEMV gave other numbers than F.linear"
    return None


def verdict() -> fast_paths.Verdict:
    """Whether torch.compile builds and runs a GEMV on this CPU (what ``compiled_decode`` and
    ``compile_layers`` need): probed once per process by compiling a
    tiny one (a few seconds; more the first time on a machine, before inductor's disk cache)."""
    return fast_paths.ask("torch-compile", _probe)


def unsupported_reason(device: torch.device | str, dtype: torch.dtype) -> str | None:
    """Why one-token compiled decode cannot run for this model, or None when it can."""
    if torch.device(device).type != "cpu":
        return f"it is a CPU path (the model is on {device}; a GPU runs CUDA graphs instead)"
    if dtype not in DTYPES:
        return f"it compiles fp32 or bf16 weights, not {dtype}"
    return verdict().refusal()


@functools.cache
def compiled_gemv() -> Any:
    """:func:`gemv` alone through torch.compile (one graph per weight shape), for measuring it."""
    return torch.compile(gemv, dynamic=False)


def _logits(h: torch.Tensor, final_norm: torch.Tensor, lm_head: torch.Tensor, eps: float) -> torch.Tensor:
    return gemv(rms_norm(h, final_norm, eps), lm_head).float()


@functools.cache
def layer_functions() -> LayerFunctions:
    """The compiled halves and LM head for one-token steps (made once per process; compiled at first use)."""
    return LayerFunctions(
        fused=True,
        custom=(
            torch.compile(functools.partial(attention_inputs, mm=gemv), dynamic=False),
            torch.compile(functools.partial(layer_output, mm=gemv), dynamic=False),
        ),
        logits=torch.compile(_logits, dynamic=False),
    )


@torch.inference_mode()
def compile_for(model: Any) -> float:
    """Compile (or load from inductor's disk cache) the one-token graphs for ``model``'s shapes; seconds taken.

    ``model`` is an :class:`~.model.EngineModel` with plain weights. Runs one layer and the
    LM head on zeros, so the first real step does not pay the compilation.
    """
    t0 = time.perf_counter()
    fns = layer_functions()
    first, second = fns.halves()
    shape, w = model.shape, model.layers[0]
    h = torch.zeros(1, shape.hidden, dtype=model.dtype, device=model.device)
    cos, sin = model._rope(torch.zeros(1, dtype=torch.long, device=model.device))
    eps = shape.rms_norm_eps
    q, _, _ = first(h, w.input_norm, w.qkv_proj, w.qkv_bias, cos, sin, eps,
                    shape.heads, shape.kv_heads, shape.head_dim, True)  # fmt: skip
    second(h, q.flatten(1), w.o_proj, w.post_attention_norm, w.gate_up_proj, w.down_proj, eps, True)
    fns.logits(h, model.final_norm, model.lm_head, eps)
    return time.perf_counter() - t0

