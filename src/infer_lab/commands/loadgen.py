"""infer-lab loadgen: one load generator for every OpenAI-compatible server."""

from __future__ import annotations

import json
import sys

from ..units import require_positive

NAME = "loadgen"
ORDER = 61
HELP = "measure an OpenAI-compatible server (ours, vLLM, SGLang) under load: latency percentiles, throughput, goodput"
DESCRIPTION = """\
Send a workload to any OpenAI-compatible server at several load levels and report latency
percentiles, throughput and goodput. Token counts come from the server's `usage` field
(requested with stream_options.include_usage), never from counting chunks.

Workloads (--workload):
  random          independent requests; lengths uniform in N x (1 +- --range-ratio) around
                  --input-len / --output-len (--range-ratio 0: fixed lengths, to compare with
                  other tools' random datasets; --token-prompts: input length exact, in tokens)
  shared-prefix   every request shares one long system prompt (--prefix-words): prefix caching pays off
  multiturn       conversations of --turns calls; each call resends the growing history
  agentic         per task a long shared context, then --branches propose-then-review chains (tree reuse)
  sharegpt:FILE   first human turns of a ShareGPT-format JSON file
Lengths of generated text are in words (no tokenizer needed); the real token counts are reported.

Load (--concurrency or --rate, comma-separated sweeps):
  --concurrency 1,4,16,64    closed loop: that many users, each sends its next call when the last ended
  --rate 0.5,1,2 [--burstiness B]   open loop: sessions arrive at that many per second, Poisson
                             (B=1) or gamma with shape 1/B (B>1 bursty); queueing shows up here
Each level runs --warmup unrecorded calls first (once) and is repeated --repeats times.

Metrics (all latencies with p50/p90/p99, in ms):
  TTFT   send -> first text chunk. The server's clock starts later (at its engine, after parsing
         and tokenizing): when it reports it (ours does), server TTFT and the gap are reported
         too, and the server's mean TTFT is scraped from /metrics (ours, vLLM, SGLang)
  ITL    token-weighted: every gap between text chunks of every request, pooled
  TPOT   request-weighted: (E2E - TTFT) / (output tokens - 1), one value per request
         (tools disagree on these two names: guidellm's "ITL" is this TPOT; we report both)
  tokens per chunk: output tokens / text chunks. With speculative decoding a chunk carries all
         the tokens one verification pass accepted, so chunk-gap ITL rises toward the step time
         while TPOT falls: ITL and TPOT diverge exactly by this factor
  E2E    send -> last byte
  request and output-token throughput over the wall time of the level (first send -> last end)
  goodput: completed requests per second that met every SLO given (--slo-ttft-ms/--slo-tpot-ms/--slo-e2e-ms)
During each level it scrapes /metrics (ours and vLLM's/SGLang's names) for KV usage and prefix hit rate.
Every request has a timeout (--timeout), so a dead server gives failures, never a hang.

Examples:
  infer-lab loadgen --url http://127.0.0.1:8000 --model smollm2-135m --workload shared-prefix \\
      --concurrency 1,4,16 --requests 64 --slo-ttft-ms 500 --out results/ours
  infer-lab loadgen --url http://gpu-box:8000 --model mistralai/Mistral-7B-Instruct-v0.3 \\
      --workload agentic --rate 1,2,4 --repeats 3 --json > vllm.json
  infer-lab loadgen --model smollm2-135m --endpoint completions --token-prompts \\
      --input-len 512 --output-len 128 --range-ratio 0 --ignore-eos --concurrency 1,8
"""


def _floats(text: str, name: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated numbers, got {text!r}") from None
    if not values:
        raise ValueError(f"{name} is empty")
    return values


def add_arguments(p) -> None:
    p.add_argument(
        "--url", default="http://127.0.0.1:8000", help="server base URL (with or without /v1)"
    )
    p.add_argument(
        "--model", required=True, help="model id the server expects (see GET /v1/models)"
    )
    p.add_argument(
        "--workload",
        default="random",
        help="random | shared-prefix | multiturn | agentic | sharegpt:FILE (default random)",
    )
    load = p.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency", default=None, help="closed-loop sweep, e.g. 1,4,16,64 (default 1,4)"
    )
    load.add_argument(
        "--rate", default=None, help="open-loop sweep in sessions per second, e.g. 0.5,1,2"
    )
    p.add_argument(
        "--burstiness", type=float, default=1.0, help="open loop: 1 = Poisson, >1 burstier (gamma)"
    )
    p.add_argument(
        "--requests", type=int, default=32, help="calls per level and repeat (default 32)"
    )
    p.add_argument(
        "--warmup", type=int, default=2, help="unrecorded warm-up calls before measuring"
    )
    p.add_argument(
        "--repeats", type=int, default=1, help="repeats of each level (different prompts)"
    )
    p.add_argument("--input-words", type=int, default=256, help="words of new text per call")
    p.add_argument("--output-tokens", type=int, default=128, help="max_tokens per call")
    p.add_argument(
        "--input-len",
        type=int,
        default=None,
        help="random: mean prompt length, words (tokens with --token-prompts); default --input-words",
    )
    p.add_argument(
        "--output-len",
        type=int,
        default=None,
        help="random: mean max_tokens; default --output-tokens (exact with --ignore-eos)",
    )
    p.add_argument(
        "--range-ratio",
        type=float,
        default=0.5,
        help="random: lengths uniform in N x (1 +- R); 0 = fixed lengths (default 0.5)",
    )
    p.add_argument(
        "--token-prompts",
        action="store_true",
        help="random: send prompts as token ids, so --input-len is exact in tokens "
        "(needs --endpoint completions; ours, vLLM, SGLang take them)",
    )
    p.add_argument(
        "--prefix-words",
        type=int,
        default=512,
        help="shared prefix length (shared-prefix, agentic)",
    )
    p.add_argument("--turns", type=int, default=4, help="calls per conversation (multiturn)")
    p.add_argument(
        "--branches", type=int, default=4, help="propose-then-review chains per task (agentic)"
    )
    p.add_argument(
        "--ignore-eos", action="store_true", help="ask for exactly max_tokens (vLLM/SGLang/ours)"
    )
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    p.add_argument("--api-key", default=None)
    p.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds per request before it counts as failed",
    )
    p.add_argument("--slo-ttft-ms", type=float, default=None)
    p.add_argument("--slo-tpot-ms", type=float, default=None)
    p.add_argument("--slo-e2e-ms", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="folder for loadgen.json and the three plots")
    p.add_argument("--json", action="store_true", help="print the full results JSON on stdout")


def run(args) -> int:
    from ..loadgen import (  # defers httpx, rich, torch (loadgen)
        SLO,
        ClientConfig,
        LoadPoint,
        RunConfig,
        format_table,
        run_benchmark_sync,
    )

    require_positive("--requests", args.requests)
    require_positive("--repeats", args.repeats)
    require_positive("--timeout", args.timeout)
    require_positive("--warmup", args.warmup, allow_zero=True)
    if not 0.0 <= args.range_ratio < 1.0:
        raise ValueError(f"--range-ratio must be in [0, 1), got {args.range_ratio}")
    if args.token_prompts and args.endpoint != "completions":
        raise ValueError("--token-prompts needs --endpoint completions (chat takes text only)")
    if (args.input_len is not None or args.output_len is not None) and args.workload != "random":
        raise ValueError("--input-len/--output-len are for --workload random")
    if args.token_prompts and args.workload != "random":
        raise ValueError("--token-prompts is for --workload random")
    if args.rate:
        points = [
            LoadPoint(rate_per_s=r, burstiness=args.burstiness)
            for r in _floats(args.rate, "--rate")
        ]
    else:
        levels = _floats(args.concurrency or "1,4", "--concurrency")
        if any(c != int(c) for c in levels):
            raise ValueError(f"--concurrency must be whole numbers, got {args.concurrency}")
        points = [LoadPoint(concurrency=int(c)) for c in levels]
    cfg = RunConfig(
        client=ClientConfig(
            base_url=args.url,
            model=args.model,
            endpoint=args.endpoint,
            api_key=args.api_key,
            timeout_s=args.timeout,
            temperature=args.temperature,
            ignore_eos=args.ignore_eos,
        ),
        workload=args.workload,
        points=points,
        requests=args.requests,
        warmup=args.warmup,
        repeats=args.repeats,
        seed=args.seed,
        slo=SLO(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2e_ms),
        workload_options={
            "input_words": args.input_len if args.input_len is not None else args.input_words,
            "output_tokens": args.output_len if args.output_len is not None else args.output_tokens,
            "range_ratio": args.range_ratio,
            "token_prompts": args.token_prompts,
            "prefix_words": args.prefix_words,
            "turns": args.turns,
            "branches": args.branches,
        },
    )
    # Fail on a bad workload name or file before any traffic.
    from ..loadgen.workloads import build_workload  # defers httpx, rich, torch (loadgen)

    build_workload(cfg.workload, 1, **cfg.workload_options)
    results = run_benchmark_sync(cfg, quiet=False)
    if args.out:
        from ..loadgen import save_plots, write_results  # defers httpx, rich, torch (loadgen)

        path = write_results(results, args.out)
        figs = save_plots(results, args.out)
        print(f"[loadgen] wrote {path} and {', '.join(f.name for f in figs)}", file=sys.stderr)
    if args.json:
        print(json.dumps(results, default=str))
    else:
        print(format_table(results))
    failed = sum(r["failed"] for r in results["rows"])
    if failed:
        print(
            f"[loadgen] {failed} request(s) failed: {results['rows'][-1]['errors']}",
            file=sys.stderr,
        )
    return 1 if failed else 0
