"""infer-lab bench engine: throughput and latency of the from-scratch serving engine."""

from __future__ import annotations

from ._args import add_model_arguments

NAME = "bench"
ORDER = 60
HELP = "benchmark the from-scratch serving engine (throughput, TTFT/ITL percentiles, KV blocks)"
DESCRIPTION = """\
Run N random-prompt requests (EOS ignored, exact lengths) through the engine of modules 07-10
and report output tokens/s, requests/s, TTFT and ITL percentiles, KV blocks and prefix hits.
Every optimization is a switch, so its effect can be measured:

  infer-lab bench engine --requests 16 --concurrency 16 --compare-hf      continuous batching vs HF, one by one
  infer-lab bench engine --mode static                                   static batching (slots idle until all finish)
  infer-lab bench engine --prefix-cache radix --shared-prefix 48         a shared system prompt
  infer-lab bench engine --chunk-tokens 64 --prompt-len 512              chunked prefill, 64 tokens per step
  infer-lab bench engine --decode-path per-sequence                      attention one sequence at a time

The H200 targets of module 08 (Mistral-7B shape, random bf16 weights, built on the GPU):

  infer-lab bench engine --model mistral-7b --weights random --requests 256 --concurrency 256 --prompt-len 512 --output-len 128
  infer-lab bench engine --model mistral-7b --weights random --requests 1 --concurrency 1 --prompt-len 512 --output-len 256 --compile

Decode paths (--decode-path), slowest first: per-sequence (one attention call per request),
batched (one call for all decoding requests), static (fixed padded shapes, preallocated
buffers), cuda-graphs (static, captured once and replayed: no per-kernel launch cost).
auto = cuda-graphs on a GPU, batched on a CPU. --compile adds torch.compile's fusion of the
small ops (norms, RoPE, SiLU) to the static and cuda-graphs paths.

--json prints one JSON object on stdout (progress goes to stderr).
"""


def add_arguments(p) -> None:
    p.add_argument("target", choices=["engine"], help="what to benchmark (the serving engine)")
    add_model_arguments(p)
    p.add_argument("--requests", type=int, default=16, help="number of requests (default 16)")
    p.add_argument(
        "--concurrency",
        type=int,
        default=16,
        help="batch slots: requests running at once (default 16)",
    )
    p.add_argument(
        "--prompt-len", type=int, default=64, help="prompt tokens per request (default 64)"
    )
    p.add_argument(
        "--output-len", type=int, default=32, help="output tokens per request (default 32)"
    )
    p.add_argument(
        "--mode", choices=["static", "continuous"], default="continuous", help="batching policy"
    )
    p.add_argument(
        "--kv", choices=["paged", "contiguous", "nocache"], default="paged", help="KV cache layout"
    )
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (paged)")
    p.add_argument("--prefix-cache", choices=["none", "hash", "radix"], default="none")
    p.add_argument(
        "--shared-prefix", type=int, default=0, help="leading prompt tokens shared by all requests"
    )
    p.add_argument(
        "--chunk-tokens", type=int, default=None, help="chunked prefill: token budget per step"
    )
    p.add_argument(
        "--decode-path",
        choices=["auto", "per-sequence", "batched", "static", "cuda-graphs"],
        default="auto",
        help="how decode steps run (default auto: cuda-graphs on a GPU, batched on a CPU)",
    )
    p.add_argument(
        "--fuse",
        choices=["on", "off"],
        default="on",
        help="one GEMM for q|k|v and one for gate|up (default on; off runs five GEMMs)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile both halves of every layer (fuses norms, RoPE, SiLU; compiles in the warm-up)",
    )
    p.add_argument(
        "--compare-hf",
        action="store_true",
        help="also time transformers generate, one request at a time",
    )
    p.add_argument(
        "--save", default=None, help="also write the JSON to this path (e.g. assets/results/x.json)"
    )
    p.add_argument("--json", action="store_true", help="print JSON only")


def run(args) -> int:
    import json
    import sys
    from pathlib import Path

    from ..bench.engine import benchmark_with_metadata
    from ..models import load_model

    if args.chunk_tokens is not None and args.chunk_tokens < 1:
        raise ValueError(f"--chunk-tokens must be >= 1, got {args.chunk_tokens}")
    lm = load_model(args.model, weights=args.weights, device=args.device, dtype=args.dtype)
    print(
        f"[bench] {lm.describe()}: {args.requests} requests, concurrency {args.concurrency}, "
        f"prompt {args.prompt_len}, output {args.output_len}, {args.mode}, kv {args.kv}, "
        f"decode path {args.decode_path}",
        file=sys.stderr,
    )
    result = benchmark_with_metadata(
        lm,
        compare_hf=args.compare_hf,
        requests=args.requests,
        concurrency=args.concurrency,
        prompt_len=args.prompt_len,
        output_len=args.output_len,
        mode=args.mode,
        prefix_cache=args.prefix_cache,
        chunk_tokens=args.chunk_tokens,
        kv_mode=args.kv,
        block_size=args.block_size,
        shared_prefix_len=args.shared_prefix,
        decode_path=args.decode_path,
        fuse_projections=args.fuse == "on",
        compile_layers=args.compile,
    )
    result["command"] = (
        "infer-lab " + " ".join(sys.argv[1:])
        if sys.argv[0].endswith("infer-lab")
        else "infer-lab bench engine (via python)"
    )
    text = json.dumps(result, indent=None if args.json else 2)
    if args.save:
        Path(args.save).parent.mkdir(parents=True, exist_ok=True)
        Path(args.save).write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(text)
        return 0
    ttft, itl = result["ttft_ms"], result["itl_ms"]
    print(
        f"output {result['output_tokens_per_s']:.1f} tok/s, {result['requests_per_s']:.2f} req/s; "
        f"TTFT p50 {ttft['p50']:.1f} ms p99 {ttft['p99']:.1f} ms; "
        + (
            f"ITL p50 {itl['p50']:.1f} ms p99 {itl['p99']:.1f} ms"
            if itl
            else "no ITL (1 token each)"
        )
    )
    if result.get("kv_blocks_total"):
        print(
            f"KV blocks: peak {result['kv_blocks_peak_used']} of {result['kv_blocks_total']}; "
            f"prefix hit rate {result['prefix_hit_rate']:.1%}; preemptions {result['num_preemptions']}"
        )
    path = result["decode_path"]
    print(
        f"decode: batched attention {path['batched_decode']}, static {path['static_decode']}, "
        f"CUDA graphs {path['cuda_graphs']} ({path['graphs_captured']} captured"
        + (f" in {result['graph_capture_s']:.1f} s" if "graph_capture_s" in result else "")
        + f"), fused projections {path['fused_projections']}, compiled {path['compiled']}"
    )
    if "baseline_hf_sequential_tokens_per_s" in result:
        print(
            f"HF generate one by one: {result['baseline_hf_sequential_tokens_per_s']:.1f} tok/s -> engine is "
            f"{result['speedup_vs_hf_sequential']:.2f}x"
        )
    return 0
