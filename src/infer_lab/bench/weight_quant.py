"""The engine on quantized (or bf16) weights: one user's decode speed against fp32, and the quality cost.

Decode at batch 1 streams every GEMM weight once per token, so its speed limit is bytes per
token. int8 weights are a quarter of fp32's bytes and int4 (groups of 32) about a sixth; with
fused kernels (:mod:`infer_lab.quant.kernels`) the engine should decode correspondingly faster.
``bf16`` (the engine's ``dtype`` option) halves the bytes with oneDNN's bf16 GEMMs, on CPUs that
have AVX-512-bf16 or AMX.

:func:`decode_speed` times the engine at batch 1 on one prompt, fp32 and each method in turn,
interleaved over ``rounds`` rounds (median), and checks nothing about tokens: quantized weights
change them. :func:`quality` scores the same engine models on the shipped evaluation text:
perplexity over non-overlapping windows, and top-1 agreement with the fp32 model's next-token
prediction at every scored position (chapter 06's two measures). With ``llama_cpp``, llama.cpp
decodes the embedded model's own GGUF file in the same rounds (:mod:`.llama_cpp`).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from ..engine import AttentionMetadata, Engine, EngineConfig, EngineModel, SamplingParams
from ..evaluation import eval_token_ids
from ..harness import env_metadata
from ..models import embedded_gguf_path
from ..quant.kernels import parse_method, refusal
from .ledger import (
    copy_bandwidth,
    decode_step_bytes,
    engine_weight_bytes,
    kv_dtype_of,
    ledger_row,
    mean_decode_context,
)
from .llama_cpp import LlamaCppDecoder, summarize

METHODS = ("int8", "int4")
DTYPES = {"bf16": torch.bfloat16}  # not quantization, but measured the same way (EngineConfig.dtype)


def check_method(method: str) -> None:
    """Refuse a name that is neither a weight quantization (int8, int4, int4-gN) nor ``bf16``."""
    if method not in DTYPES:
        parse_method(method)


def _model(base: EngineModel, method: str) -> EngineModel:
    return base.cast(DTYPES[method]) if method in DTYPES else base.quantized(method)


def _config(method: str | None) -> dict[str, Any]:
    if method is None:
        return {}
    return {"dtype": method} if method in DTYPES else {"weight_quant": method}


@torch.inference_mode()
def _window_logits(model: EngineModel, ids: torch.Tensor) -> torch.Tensor:
    """Logits ``(len(ids), vocab)`` of one window, every position, no cache."""
    n = len(ids)
    meta = AttentionMetadata(query_lens=[n], context_lens=[n], sample_indices=list(range(n)))
    return model.forward(ids, torch.arange(n), meta, None)


def quality(lm: Any, methods: tuple[str, ...] = METHODS, eval_tokens: int = 1024,
            window: int = 256) -> dict[str, dict[str, float]]:
    """Perplexity and top-1 agreement with fp32 of the engine's model on each method's weights.

    Scores ``eval_tokens`` of the evaluation text in windows of ``window`` tokens (the tail
    that fills no window is dropped). Returns ``{method: {perplexity, perplexity_change,
    top1_agreement, scored_tokens}}``, with the model's own dtype under its name.
    """
    if lm.tokenizer is None:
        raise ValueError(f"{lm.name} has no tokenizer: quality needs real weights and text")
    ids = eval_token_ids(lm.tokenizer, eval_tokens)
    n_windows = len(ids) // window
    if n_windows == 0:
        raise ValueError(f"{len(ids)} evaluation tokens do not fill one window of {window}")
    base = EngineModel.from_hf(lm.model).plain
    models = {str(lm.dtype).replace("torch.", ""): base, **{m: _model(base, m) for m in methods}}
    reference: list[torch.Tensor] = []
    out: dict[str, dict[str, float]] = {}
    for name, model in models.items():
        nll, agree, scored = 0.0, 0, 0
        for w in range(n_windows):
            chunk = ids[w * window : (w + 1) * window]
            logits = _window_logits(model, chunk)[:-1]
            nll -= float(torch.log_softmax(logits, -1).gather(1, chunk[1:, None]).double().sum())
            top1 = logits.argmax(-1)
            if model is base:
                reference.append(top1)
            agree += int((top1 == reference[w]).sum())
            scored += len(top1)
        out[name] = {"perplexity": math.exp(nll / scored), "top1_agreement": agree / scored,
                     "scored_tokens": scored}
    first = next(iter(out.values()))["perplexity"]
    for row in out.values():
        row["perplexity_change"] = row["perplexity"] / first - 1
    return out


LLAMA_CPP = "llama.cpp"  # the contender's name in results


def decode_speed(lm: Any, methods: tuple[str, ...] = METHODS, prompt_len: int = 128, new_tokens: int = 128,
                 rounds: int = 3, seed: int = 0, llama_cpp: bool = False) -> dict[str, dict[str, Any]]:
    """One user's decode on the engine: fp32 (its usual GEMM plan) and each method, interleaved.

    Every round runs one fresh engine per contender on the same random prompt (EOS ignored,
    greedy) and records decode tokens/s = (new tokens - 1) / (time after the first token);
    the median over rounds is reported, with the GEMM weights' stored bytes per token and the
    ledger (:func:`~.ledger.ledger_row`: every weight and the K/V at the mean decode context).
    ``llama_cpp``: llama.cpp on the embedded model's GGUF file runs in the same rounds
    (:mod:`.llama_cpp`; only for the embedded model, with llama-cpp-python installed).
    """
    if rounds < 1 or new_tokens < 2:
        raise ValueError("rounds must be >= 1 and new_tokens >= 2")
    decoder = _llama_cpp_decoder(lm, prompt_len + new_tokens + 1) if llama_cpp else None
    prompt = lm.random_ids(1, prompt_len, seed=seed)[0].tolist()
    names = (None, *methods, *((LLAMA_CPP,) if decoder else ()))
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    tokens: dict[str | None, list[int]] = {}

    def run(method: str | None) -> tuple[float, Engine | None]:
        if method == LLAMA_CPP:
            rate, tokens[method] = decoder.decode(prompt, new_tokens)
            return rate, None
        engine = Engine.from_loaded(lm, EngineConfig(max_num_seqs=1, max_model_len=prompt_len + new_tokens + 1,
                                                     **_config(method)))
        (out,) = engine.generate([prompt], params)
        tokens[method] = out.token_ids
        return len(out.itl_s) / sum(out.itl_s), engine

    for m in names:  # warm-up: builds (and caches) each quantized model, times nothing
        run(m)
    rates: dict[str | None, list[float]] = {m: [] for m in names}
    engines: dict[str | None, Engine | None] = {}
    for r in range(rounds):
        for m in names[r % len(names):] + names[: r % len(names)]:
            rate, engines[m] = run(m)
            rates[m].append(rate)
    base_name = str(lm.dtype).replace("torch.", "")
    fp = statistics.median(rates[None])
    context, copy = mean_decode_context([prompt_len], [new_tokens]), copy_bandwidth(lm.device)
    out = {}
    for m in names[:-1] if decoder else names:
        e = engines[m]
        med = statistics.median(rates[m])
        step = decode_step_bytes(lm, 1, context, weight_bytes=engine_weight_bytes(lm, e.model),
                                 kv_dtype=kv_dtype_of(e.model.dtype, e.config.kv_dtype))
        out[m or base_name] = {
            "decode_tokens_per_s": med, "by_round": rates[m], "speedup_vs_base": med / fp,
            "gemm_weight_bytes_per_token": e.model.gemm_weight_bytes_stored(),
            "gemm_path": e.gemm_plan.describe() if m is None or m in DTYPES else _kernel(e.model),
            "ledger": ledger_row(med, 1, step, copy),
        }
    if decoder:
        row = out[LLAMA_CPP] = summarize(rates[LLAMA_CPP], tokens[LLAMA_CPP], tokens[None], decoder, fp)
        # Its file's weights, and its K/V cache in llama.cpp's default type, fp16.
        step = decode_step_bytes(lm, 1, context, weight_bytes=row["gemm_weight_bytes_per_token"], kv_dtype="fp16")
        row["ledger"] = ledger_row(row["decode_tokens_per_s"], 1, step, copy)
    return out


def _llama_cpp_decoder(lm: Any, context_tokens: int) -> Any:
    """llama.cpp on ``lm``'s own GGUF file: only the embedded model has one (the others would be
    different weights, not the same model in another runtime)."""
    if lm.source != "embedded":
        raise ValueError(f"--llama-cpp runs the embedded model's GGUF file; {lm.name} ({lm.source}) has none")
    return LlamaCppDecoder(embedded_gguf_path(), context_tokens, torch.get_num_threads())


def _kernel(model: EngineModel) -> str:
    return getattr(model.layers[0].qkv_proj, "kernel", "F.linear")


def refused_methods(methods: tuple[str, ...]) -> dict[str, str]:
    """The quantization methods whose kernels this machine refuses (probed once), with why.

    ``bf16`` is never among them: where oneDNN's bf16 GEMM is refused, the engine multiplies
    bf16 weights with plain ``F.linear``, and its ``gemm_path`` says so.
    """
    return {m: why for m in methods if m not in DTYPES and (why := refusal(m)) is not None}


def weight_quant_benchmark(lm: Any, methods: tuple[str, ...] = METHODS, prompt_len: int = 128,
                           new_tokens: int = 128, rounds: int = 3, eval_tokens: int = 1024,
                           window: int = 256, with_quality: bool = True, llama_cpp: bool = False) -> dict[str, Any]:
    """:func:`decode_speed` and (with a tokenizer) :func:`quality`, as JSON with the environment.

    A method whose kernel this machine refuses is left out, with the reason under ``skipped``.
    """
    t0 = time.perf_counter()
    skipped = refused_methods(methods)
    methods = tuple(m for m in methods if m not in skipped)
    result: dict[str, Any] = {
        "speed": decode_speed(lm, methods, prompt_len, new_tokens, rounds, llama_cpp=llama_cpp),
        "skipped": skipped,
        "prompt_len": prompt_len, "new_tokens": new_tokens, "rounds": rounds,
        "copy_bandwidth": copy_bandwidth(lm.device).as_dict(),
        "threads": torch.get_num_threads(),
    }
    if with_quality and lm.tokenizer is not None and not lm.is_random:
        result["quality"] = quality(lm, methods, eval_tokens, window)
    result["elapsed_s"] = time.perf_counter() - t0
    result["environment"] = env_metadata(lm)
    return result
