"""Every switch of the engine in one dataclass, so each optimization can be turned off and measured."""

from __future__ import annotations

from dataclasses import dataclass

from ..quant.kernels import parse_method

KV_MODES = ("nocache", "contiguous", "paged")
PREFIX_CACHES = ("none", "hash", "radix")


@dataclass(frozen=True)
class EngineConfig:
    """Every switch of the engine, so each optimization can be turned off and measured.

    Attributes:
        kv_mode: ``"nocache"`` (recompute everything), ``"contiguous"`` (a max-length region per
            request) or ``"paged"`` (blocks on demand).
        block_size: tokens per KV block (paged mode).
        num_blocks: blocks in the pool; default ``max_num_seqs * ceil(max_model_len / block_size)``,
            the same memory the contiguous mode reserves. Must hold one full-length request.
        max_model_len: longest prompt + output in tokens; default ``min(model limit, 2048)``.
        policy: ``"continuous"`` or ``"static"`` batching.
        max_num_seqs: batch slots (requests running at once).
        chunked_prefill: split prompts under ``max_num_batched_tokens`` per step.
        max_num_batched_tokens: token budget of one step when chunking (tokens).
        prefix_cache: ``"none"``, ``"hash"`` (block-aligned) or ``"radix"`` (token-granular); paged only.
        step_log_limit: how many recent :class:`StepRecord` to keep (``None``: all; a long-running
            server sets a bound so the log cannot grow without limit).
        batched_decode: attend all single-token (decode) sequences of a step in one call
            instead of one call per sequence.
        fuse_projections: run one GEMM for q|k|v and one for gate|up (the weights are stored
            stacked either way, since the model was loaded; off runs five GEMMs over their rows).
        prepack_weights: multiply by copies of the weights reordered once for oneDNN's GEMM
            (:mod:`~.cpu.prepack`): on a CPU, 2-3x faster GEMMs at decode's small batches, for one
            more copy of the weights in memory. ``None``: on a CPU, with fused projections, not
            compiled, fp32 or bf16 weights, when the copy takes at most half the free memory,
            at the step sizes where it measured faster on this machine (:mod:`~.cpu.gemm_choice`,
            timed once per process); ``True``: at every step size; ``False``: never.
        static_decode: run pure-decode steps through :class:`~.graph_runner.StaticDecodeRunner`
            (fixed padded shapes; paged only; ``None``: on a CUDA device with paged KV).
        cuda_graphs: capture those steps in CUDA graphs (``None``: whenever ``static_decode``
            runs on a CUDA device).
        compile_layers: let ``torch.compile`` fuse the small ops (norms, RoPE, SiLU) of both
            halves of every decoder layer, on every path. Off by default: the first steps then
            pay the compilation (tens of seconds on a CPU).
        compiled_decode: run every step of exactly one token (one sequence decoding alone)
            through :mod:`~.cpu.cpu_decode`: compiled half-layers whose GEMVs are fused
            multiply-and-sum loops over the plain weights. CPU only, needs a C++ compiler;
            compiled when the engine is built (tens of seconds on a 2-core CPU the first time,
            seconds once inductor's disk cache has it). Off by default for that cost.
        speculative: speculative decoding's proposer: ``"ngram"`` (prompt lookup, n <= 3),
            ``"ngram:N"``, ``"self:L"`` (the target's first L layers as the draft) or ``"draft"``
            (a separate draft model given to :meth:`Engine.from_loaded`); ``None``: off.
        num_speculative_tokens: most tokens guessed per sequence and step (``k``).
        kv_dtype: how the paged pool stores K/V: ``None`` (the model's dtype), ``"int8"``
            (per-token, per-head absmax scales) or ``"fp8"`` (e4m3, per-token per-head scales).
            Quantized KV is close to, not equal to, full precision: greedy outputs may differ.
        dtype: the engine's compute dtype, ``"fp32"`` or ``"bf16"`` (a bf16 copy of the weights is
            made once; on a CPU with AVX-512-bf16 or AMX, oneDNN's bf16 GEMMs read half the
            bytes); ``None``: the model's own dtype. bf16 is close to, not equal to, fp32.
            Against transformers in bf16, a prompt's forward is bit for bit the same; decode
            agrees but is not identical, because one token's attention groups the query heads
            into rows, which SDPA rounds differently (:func:`~.layers.span_decode_attention`).
        weight_quant: multiply by quantized GEMM weights through PyTorch's fused CPU kernels
            (:mod:`infer_lab.quant.kernels`): ``"int8"`` (per output row), ``"int4"`` (groups
            of 32 inputs) or ``"int4-gN"``; ``None``: the model's own weights. Fewer bytes per
            token, so a faster batch-1 decode; close to, not equal to, full precision.
        decode_threads: CPU: torch threads for a step that only decodes (one new token per
            request, no prompt chunk); prompt steps keep every thread. ``None``: every thread.
            A decode step is a chain of small, memory-bound GEMMs where each extra thread adds a
            fork and a join per op, and a server needs some CPU for HTTP (vLLM 0.32's CPU build
            reserves a core for its scheduler process). A knob to measure: nothing sets it by
            default, and on the 2-core machine one decode thread was not faster through HTTP.
    """

    kv_mode: str = "paged"
    block_size: int = 16
    num_blocks: int | None = None
    max_model_len: int | None = None
    policy: str = "continuous"
    max_num_seqs: int = 16
    chunked_prefill: bool = False
    max_num_batched_tokens: int = 512
    prefix_cache: str = "none"
    step_log_limit: int | None = None
    batched_decode: bool = True
    fuse_projections: bool = True
    prepack_weights: bool | None = None
    static_decode: bool | None = None
    cuda_graphs: bool | None = None
    compile_layers: bool = False
    compiled_decode: bool = False
    speculative: str | None = None
    num_speculative_tokens: int = 4
    kv_dtype: str | None = None
    weight_quant: str | None = None
    dtype: str | None = None
    decode_threads: int | None = None

    def validate(self) -> None:
        if self.decode_threads is not None and self.decode_threads < 1:
            raise ValueError(f"decode_threads must be >= 1 (or None: every thread), got {self.decode_threads}")
        if self.dtype not in (None, "fp32", "bf16"):
            raise ValueError(f"dtype must be None, 'fp32' or 'bf16', got {self.dtype!r}")
        if self.kv_mode not in KV_MODES:
            raise ValueError(f"kv_mode must be one of {', '.join(KV_MODES)}, got {self.kv_mode!r}")
        if self.prefix_cache not in PREFIX_CACHES:
            raise ValueError(
                f"prefix_cache must be one of {', '.join(PREFIX_CACHES)}, got {self.prefix_cache!r}"
            )
        if self.prefix_cache != "none" and self.kv_mode != "paged":
            raise ValueError("prefix caching shares KV blocks, so it needs kv_mode='paged'")
        if self.chunked_prefill and self.kv_mode == "nocache":
            raise ValueError(
                "chunked prefill needs a KV cache to keep the earlier chunks (kv_mode != 'nocache')"
            )
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.static_decode and self.kv_mode != "paged":
            raise ValueError(
                "static_decode reads K/V through block tables, so it needs kv_mode='paged'"
            )
        if self.speculative is not None and self.kv_mode == "nocache":
            raise ValueError("speculative decoding verifies guesses against cached K/V: needs a KV cache")
        if self.kv_dtype is not None and self.kv_mode != "paged":
            raise ValueError(f"kv_dtype={self.kv_dtype!r} quantizes the paged pool: needs kv_mode='paged'")
        if self.kv_dtype not in (None, "int8", "fp8"):
            raise ValueError(f"kv_dtype must be None, 'int8' or 'fp8', got {self.kv_dtype!r}")
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        if self.prepack_weights and not self.fuse_projections:
            raise ValueError("prepacked weights are the fused ones: prepack_weights needs fuse_projections")
        if self.prepack_weights and self.compile_layers:
            raise ValueError("torch.compile cannot trace prepacked (oneDNN) weights: "
                             "turn off prepack_weights or compile_layers")
        if self.weight_quant is not None:
            parse_method(self.weight_quant)
            if self.prepack_weights:
                raise ValueError("quantized weights have their own kernels: turn off prepack_weights")
            if self.compile_layers or not self.fuse_projections:
                raise ValueError("weight_quant needs fuse_projections and no compile_layers")
            if self.compiled_decode:
                raise ValueError("quantized weights have their own kernels: turn off compiled_decode")
        if self.compiled_decode and (self.compile_layers or not self.fuse_projections):
            raise ValueError("compiled_decode compiles the fused layer itself: "
                             "it needs fuse_projections and no compile_layers")
        if self.cuda_graphs and self.static_decode is False:
            raise ValueError("cuda_graphs capture the static decode path: leave static_decode on")
