"""infer-lab bench engine | spec | gemm: the from-scratch serving engine, its speculative decoding, its GEMMs."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import infer_lab

from ..units import gb, human
from ._args import add_model_arguments

if TYPE_CHECKING:
    from ..bench.engine_run import EngineBenchmark

NAME = "bench"
ORDER = 60
HELP = ("benchmark the from-scratch serving engine (engine: throughput, TTFT/ITL, KV; spec: speculative "
        "decoding; gemm: plain vs prepacked weights)")
DESCRIPTION = """\
Four benchmarks: `bench engine` (below first), `bench spec` (speculative decoding), `bench gemm`
(the GEMMs of one step, plain against prepacked weights) and `bench quant` (quantized weights).

Each report shows, beside its decode tok/s, the ledger (bench/ledger.py): the bytes one decode step
streams (every weight once, plus each sequence's K/V at the mean context), the GB/s that makes at
the decode speed (decode steps only, prefill excluded), and that as a fraction of this machine's
copy bandwidth (measured once per run, on every core, well past the last-level cache). --save
writes one JSON per run (the project keeps them in assets/results/): the machine, the versions,
the command line with every argument, and the raw samples beside the summaries.

bench engine: run N random-prompt requests (EOS ignored, exact lengths) through the engine of chapters 08-11
and report output tokens/s, requests/s, TTFT and ITL percentiles, KV blocks and prefix hits.
Every optimization is a switch, so its effect can be measured:

  infer-lab bench engine --compare-hf --workload mixed                   vs HF three ways, same requests
  infer-lab bench engine --kv-dtype int8                                 int8 KV blocks (per-token scales)
  infer-lab bench engine --policy static                                 static batching (slots idle until all finish)
  infer-lab bench engine --prefix-cache radix --shared-prefix 48         a shared system prompt
  infer-lab bench engine --chunked-prefill --max-num-batched-tokens 64 --prompt-len 512   chunked prefill, 64 tokens per step
  infer-lab bench engine --decode-path per-sequence                      attention one sequence at a time

The H200 targets of chapter 09 (Mistral-7B shape, random bf16 weights, built on the GPU):

  infer-lab bench engine --model mistral-7b --weights random --requests 256 --max-num-seqs 256 --prompt-len 512 --output-len 128
  infer-lab bench engine --model mistral-7b --weights random --requests 1 --max-num-seqs 1 --prompt-len 512 --output-len 256 --compile-layers

Decode paths (--decode-path), slowest first: per-sequence (one attention call per request),
batched (one call for all decoding requests), static (fixed padded shapes, preallocated
buffers), cuda-graphs (static, captured once and replayed: no per-kernel launch cost).
auto = cuda-graphs on a GPU, batched on a CPU. --compile-layers adds torch.compile's fusion of
the small ops (norms, RoPE, SiLU) to every decode path.

--compare-hf times three transformers contenders on exactly the engine's requests, interleaved
with the engine over --rounds rounds after a warm-up: HF sequential (generate, one request at a
time), HF padded batch (generate on left-padded groups of --max-num-seqs) and HF continuous
batching (transformers' own manager). It reports each one's tok/s (median over rounds), the
engine's ratio to each, and whether the outputs were token-identical (the contenders are timed end to
end, prefill included, so the ledger is the engine's alone). The strongest of the
three is the fair baseline; one-at-a-time HF alone flatters any engine. On a CPU a fourth runs:
HF padded batch with every nn.Linear on the same prepacked weights as the engine (not an HF
feature), which splits the engine's lead into the GEMM backend's share and the scheduler's.

--prepack-weights: on a CPU the engine multiplies by weights reordered once for oneDNN. auto: on a
CPU, with fused projections, no --compile-layers, fp32 or bf16 weights, when the copy fits in half
the free memory, at the step sizes where it measured faster on this machine (timed once per
process; the report's "GEMM path" line says which); off is F.linear, as transformers does.

--compiled-decode (CPU): when one sequence decodes alone, a step is one matrix-vector product
(GEMV) per weight matrix, and the GEMM kernels read the weights well below the memory's speed.
This runs those steps through torch.compile'd layers whose GEMVs are fused multiply-and-sum
loops, with the norms and RoPE fused around them (engine/cpu/cpu_decode.py). Measure one user with
--max-num-seqs 1 --requests 4 --prompt-len 128 --output-len 128: with --compare-hf that also times
the engine without it and transformers' own compiled path (static KV cache + torch.compile'd
forward, compiled in the warm-up: a minute or more on 2 cores), compiled against compiled.

--workload uniform: every request --prompt-len in / --output-len out. mixed: seeded lengths,
prompts in [prompt-len/4, 2*prompt-len], outputs in [output-len/4, output-len].

The torch thread count is recorded in the JSON (set it with OMP_NUM_THREADS or --threads); on
a busy 2-core machine one thread is often faster than two.

--json prints one JSON object on stdout (progress goes to stderr).

bench spec: speculative decoding (chapter 12) against plain decoding of the same engine on the
same prompts, greedy, for one proposer at several k. A proposer guesses k tokens; the target
checks all of them in ONE forward pass, keeps the longest prefix it agrees with and adds its own
next token, so one pass yields 1..k+1 tokens. With exact arithmetic the output is token-identical
to plain decoding; in floating point a batched verification adds in a different order (on a GPU in
bf16 above all), which can flip a near-tie, so every run checks it and reports whether it was identical.

  infer-lab bench spec --proposer ngram --k 1,2,4,8 --workload grounded
  infer-lab bench spec --proposer self:24 --k 1,2,4 --workload chat --max-new-tokens 32
  infer-lab bench spec --proposer ngram --k 4 --batch 8                 8 concurrent requests

Proposers: ngram (prompt lookup: find the last n <= 3 tokens earlier in the prompt + output and
propose what followed; ngram:N for n <= N) and self:L (the target's own first L layers, final
norm and LM head). Workloads (data/speculative_prompts.json): grounded (copy, edit or quote the
given text) and chat (open-ended). Plain runs before and after the speculative runs of each
prompt; every engine warms up first.

Each row:
  acceptance      accepted / proposed guesses, as the engine counts them. Not the per-token
                  alpha of the textbook: guesses after the first rejection are never tested.
  alpha (MLE)     kept / tested guesses: the per-token acceptance backed out of each pass.
  tokens/pass     tokens per target pass after the first token (plain decoding: 1).
  passes/token    target forward passes per output token (prefill pass included).
  tok/s, speedup  output tokens per wall-clock second, and plain's time over speculative's.
  predicted       the textbook speedup E / (k c + 1), with E = (1 - a^(k+1)) / (1 - a) the
                  expected tokens per pass at per-token acceptance a, and c the draft cost per
                  guess over a plain decode step (both measured in this run: a at k = 1 when
                  --k includes 1, else backed out over all k); "predicted (v)"
                  replaces the 1 by v = the measured cost of a (k+1)-token verification pass
                  over a 1-token decode step, which on a CPU is well above 1.

--json prints one JSON object (rows, the plain baseline, the environment); --save also writes it.

bench gemm: every weight multiplication of one engine step (q|k|v, o, gate|up, down in every
layer, then the LM head), over the model's real weights in layer order, at each --batches size
(rows = tokens in the step), through F.linear (PyTorch's BLAS on a plain matrix) and through
oneDNN on weights reordered once at load ("prepacked", what the engine does on a CPU). Prints
ms per step for each, the speedup, and the weight bytes streamed per second with their fraction of
the copy bandwidth (GEMM weights only: no attention, no K/V; no decode tok/s either). CPU only.
When --batches includes 1 it also times one row (one user's step) two more ways: the compiled
multiply-sum GEMV of --compiled-decode (it compiles on first use) and a plain Tensor.sum over
every weight, the speed of merely reading them: the mark a GEMV could reach.

  infer-lab bench gemm --batches 1,4,16,64,256 --threads 2

bench quant: one user's decode on the engine with quantized GEMM weights (--methods, default
int8,int4) against the same engine in the model's dtype, interleaved over --rounds rounds
(median decode tok/s after the first token, fresh engine each run, --prompt-len in /
--output-len out), with the bytes of GEMM weights each streams per token; then perplexity
and top-1 agreement with the unquantized model on the shipped evaluation text (skip with
--no-quality). int8: per-row scales, aten._weight_int8pack_mm; int4: groups of 32,
aten._weight_int4pack_mm_for_cpu (both PyTorch CPU kernels, bf16 activations inside);
bf16: the engine's dtype option (all weights bf16, oneDNN bf16 GEMMs where the CPU has
AVX-512-bf16 or AMX).

  infer-lab bench quant --methods int8,int4,bf16 --prompt-len 128 --output-len 128 --threads 2

  infer-lab bench quant --prompt-len 128 --output-len 128 --threads 2
"""


def add_arguments(p) -> None:
    p.add_argument("target", choices=["engine", "spec", "gemm", "quant"],
                   help="engine: the serving engine; spec: speculative decoding vs plain decoding; "
                        "gemm: one step's GEMMs, plain vs prepacked weights; quant: one user's decode "
                        "on int8/int4 weights vs the model's dtype")
    add_model_arguments(p)
    p.add_argument("--requests", type=int, default=16, help="number of requests (default 16)")
    p.add_argument(
        "--max-num-seqs", "--concurrency", dest="max_num_seqs", type=int, default=16,
        help="batch slots: requests running at once (EngineConfig.max_num_seqs; default 16; "
             "--concurrency is its old name)",
    )
    p.add_argument(
        "--prompt-len", type=int, default=64, help="prompt tokens per request (default 64)"
    )
    p.add_argument(
        "--output-len", type=int, default=32, help="output tokens per request (default 32)"
    )
    p.add_argument(
        "--policy", "--mode", dest="policy", choices=["static", "continuous"], default="continuous",
        help="batching policy (EngineConfig.policy; --mode is its old name)"
    )
    p.add_argument(
        "--kv-mode", "--kv", dest="kv_mode", choices=["paged", "contiguous", "nocache"], default="paged",
        help="KV cache layout (EngineConfig.kv_mode; --kv is its old name)"
    )
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (paged; default 16)")
    p.add_argument("--prefix-cache", choices=["none", "hash", "radix"], default="none",
                   help="reuse the K/V of a prompt prefix seen before: hash = whole blocks (block-aligned), "
                        "radix = token-granular (default none)")
    p.add_argument(
        "--shared-prefix", type=int, default=0, help="leading prompt tokens shared by all requests"
    )
    p.add_argument(
        "--chunked-prefill", action="store_true",
        help="split prompts so a step holds at most --max-num-batched-tokens tokens (EngineConfig.chunked_prefill)"
    )
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=None,
        help="with --chunked-prefill: token budget of one step (EngineConfig.max_num_batched_tokens; default 512). "
             "Without chunking the engine puts whole prompts in a step, so this needs --chunked-prefill"
    )
    p.add_argument(
        "--decode-path",
        choices=["auto", "per-sequence", "batched", "static", "cuda-graphs"],
        default="auto",
        help="how decode steps run (default auto: cuda-graphs on a GPU, batched on a CPU)",
    )
    p.add_argument(
        "--fuse-projections", "--fuse", dest="fuse_projections",
        choices=["on", "off"],
        default="on",
        help="one GEMM for q|k|v and one for gate|up (default on; off runs five GEMMs)",
    )
    p.add_argument(
        "--prepack-weights", "--prepack", dest="prepack_weights",
        choices=["auto", "on", "off"],
        default="auto",
        help="GEMMs on weights reordered once for oneDNN (default auto: on a CPU where it measured faster, "
             "see below; 2-3x faster small-batch GEMMs, one more copy of the weights; see `bench gemm`)",
    )
    p.add_argument(
        "--compile-layers", "--compile", dest="compile_layers",
        action="store_true",
        help="torch.compile both halves of every layer (fuses norms, RoPE, SiLU; compiles in the warm-up)",
    )
    p.add_argument(
        "--compiled-decode",
        action="store_true",
        help="engine, CPU: steps of one token (one user decoding) run compiled layers whose GEMVs are fused "
             "multiply-sum loops (needs a C++ compiler; tens of seconds to compile the first time, then cached)",
    )
    p.add_argument(
        "--compare-hf",
        action="store_true",
        help="also time HF sequential, HF padded batch and HF continuous batching (interleaved)",
    )
    p.add_argument("--workload", choices=["uniform", "mixed", "grounded", "chat"], default=None,
                   help="engine: uniform (default) or mixed (seeded prompt and output lengths); "
                        "spec: grounded (default: copy or edit the given text) or chat (open-ended)")
    p.add_argument("--rounds", type=int, default=None,
                   help="engine --compare-hf: interleaved rounds (default 3); gemm: interleaved rounds (default 5); "
                        "spec: repeats of every prompt "
                        "(default 1)")
    p.add_argument("--kv-dtype", choices=["auto", "int8", "fp8"], default="auto",
                   help="KV cache storage: the model's dtype (auto), int8 with per-token scales, or fp8 e4m3")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument(
        "--save", default=None, help="also write the JSON to this path (e.g. src/infer_lab/results/x.json)"
    )
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.add_argument("--weight-quant", choices=["none", "int8", "int4"], default="none",
                   help="engine: GEMM weights quantized for PyTorch's fused CPU kernels (default none)")
    p.add_argument("--engine-dtype", choices=["model", "fp32", "bf16"], default="model",
                   help="engine: compute dtype (EngineConfig.dtype; default: the model's; bf16 copies the weights "
                        "once; --dtype is the loaded model's)")
    quant = p.add_argument_group("bench quant")
    quant.add_argument("--methods", default="int8,int4",
                       help="quant: comma-separated methods (int8, int4, int4-gN; bf16: the engine's bf16 dtype)")
    quant.add_argument("--no-quality", action="store_true", help="quant: skip perplexity and top-1 agreement")
    quant.add_argument("--llama-cpp", action="store_true",
                       help="quant: also time llama.cpp on the embedded model's own GGUF file (Q4_1 layers), same "
                            "prompt and threads, in the same rounds (needs llama-cpp-python, which compiles "
                            "llama.cpp at install: several minutes)")
    gemm = p.add_argument_group("bench gemm")
    gemm.add_argument("--batches", default="1,4,16,64,256",
                      help="gemm: rows (tokens) per step, comma-separated (default 1,4,16,64,256)")
    spec = p.add_argument_group("bench spec")
    spec.add_argument("--proposer", default="ngram", help="spec: ngram, ngram:N or self:L (default ngram)")
    spec.add_argument("--k", default="1,2,4,8", help="spec: guesses per pass, comma-separated (default 1,2,4,8)")
    spec.add_argument("--batch", type=int, default=1, help="spec: concurrent requests (default 1)")
    spec.add_argument("--max-new-tokens", type=int, default=64,
                      help="spec: most new tokens per request, stopping at EOS (default 64)")
    spec.add_argument("--prompts", type=int, default=None, help="spec: use the first N prompts (default all)")


def parse_ks(text: str, flag: str = "--k") -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; a clear error for anything else."""
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers like 1,2,4,8, got {text!r}") from None
    if not ks or min(ks) < 1:
        raise ValueError(f"{flag} needs integers >= 1, got {text!r}")
    return ks


WORKLOADS = {"engine": ("uniform", "mixed"), "spec": ("grounded", "chat"), "gemm": ("uniform",),
             "quant": ("uniform",)}
ROUNDS = {"engine": 3, "spec": 1, "gemm": 5, "quant": 3}


def run(args) -> int:
    known = WORKLOADS[args.target]
    args.workload = args.workload or known[0]
    if args.workload not in known:
        raise ValueError(f"bench {args.target} --workload takes {' or '.join(known)}, got {args.workload!r}")
    args.rounds = ROUNDS[args.target] if args.rounds is None else args.rounds
    if args.target == "spec":
        return run_spec(args)
    if args.target == "gemm":
        return run_gemm(args)
    if args.target == "quant":
        return run_quant(args)
    return run_engine(args)


def _command_line(kind: str) -> str:
    """The command as typed (the console script or ``python -m infer_lab``), else which bench ran."""
    script = Path(sys.argv[0])
    if script.name == "infer-lab" or script.parts[-2:] == ("infer_lab", "__main__.py"):
        return "infer-lab " + " ".join(sys.argv[1:])
    return f"infer-lab bench {kind} (via python)"


def _code_version() -> str | None:
    """``git describe --always --dirty`` of the checkout infer_lab runs from (an editable install);
    None when it runs from anywhere else (a wheel in site-packages)."""
    import subprocess  # defers subprocess off --help

    root = Path(__file__).resolve().parents[3]  # <root>/src/infer_lab/commands/bench.py
    if not (root / ".git").exists():
        return None
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=root,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def _save_or_print_json(args, result: dict, kind: str) -> bool:
    """Stamp the run, write ``--save``, print ``--json``; True when the JSON was all the output.

    The stamp: the command line and every parsed argument (so a call from Python is as
    reproducible as one from a shell), infer_lab's version and git commit, and the CPU's model
    and flags even on a GPU machine (``environment`` holds the rest: device, threads, library
    versions). Each bench keeps its raw samples beside its summaries.
    """
    from ..hardware import cpu_features  # defers torch (hardware)

    result["command"] = _command_line(kind)
    result["arguments"] = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    env = result.setdefault("environment", {})
    env.setdefault("cpu", cpu_features())
    env.update(infer_lab=infer_lab.__version__, git=_code_version())
    if args.save:
        Path(args.save).parent.mkdir(parents=True, exist_ok=True)
        Path(args.save).write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
    return bool(args.json)


def _set_threads(threads: int | None) -> None:
    if threads is not None:
        import torch  # defers torch

        if threads < 1:
            raise ValueError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)


def run_gemm(args) -> int:
    """``bench gemm``: one step's GEMMs through F.linear and through prepacked oneDNN weights (and one row's paths)."""

    from ..bench.gemm import gemm_benchmark  # defers torch
    from ..models import load_model  # defers torch (models)

    batches = tuple(parse_ks(args.batches, "--batches"))
    _set_threads(args.threads)
    lm = load_model(args.model, weights=args.weights, device=args.device, dtype=args.dtype)
    result = gemm_benchmark(lm, batches, repeats=args.rounds)
    if _save_or_print_json(args, result, "gemm"):
        return 0
    print(f"GEMMs of one step of {lm.describe()}, median of {args.rounds} rounds")
    print(f"{'batch':>5} {'F.linear ms':>11} {'prepacked ms':>12} {'speedup':>7} {'GB/s plain':>10} {'% copy':>6} "
          f"{'GB/s packed':>11} {'% copy':>6}")
    for r in result["rows"]:
        print(f"{r['batch']:>5} {r['plain_ms']:>11.1f} {r['prepacked_ms']:>12.1f} {r['speedup']:>6.2f}x "
              f"{r['plain_gb_per_s']:>10.1f} {r['plain_fraction_of_copy']:>6.0%} {r['prepacked_gb_per_s']:>11.1f} "
              f"{r['prepacked_fraction_of_copy']:>6.0%}")
    print(f"[{result['environment']['hardware']}, {result['threads']} torch threads; GEMM weights "
          f"{result['rows'][0]['weight_bytes'] / 1e9:.2f} GB per step (no attention, so no K/V); "
          f"{_copy_words(result['copy_bandwidth'])}; largest LM-head difference "
          f"{max(r['max_abs_diff'] for r in result['rows']):.1e}]")
    if result["one_row"]:
        print("one row (one user's step), the same weights read four ways:")
        for name, r in result["one_row"].items():
            print(f"  {name:<14} {r['ms']:>6.1f} ms {r['gb_per_s']:>6.1f} GB/s {r['fraction_of_copy']:>5.0%} of copy")
        if "compiled gemv" not in result["one_row"]:
            print("  (no compiled GEMV: torch.compile on a CPU needs a C++ compiler)")
    return 0


def run_quant(args) -> int:
    """``bench quant``: one user's decode on quantized weights against the model's dtype, and quality."""
    from ..bench.ledger import format_ledger  # defers torch
    from ..bench.weight_quant import LLAMA_CPP, check_method, weight_quant_benchmark  # defers torch
    from ..models import load_model  # defers torch (models)

    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    for m in methods:
        check_method(m)
    if not methods or args.rounds < 1 or args.output_len < 2:
        raise ValueError("--methods needs at least one method, --rounds >= 1 and --output-len >= 2")
    if args.llama_cpp:
        from ..bench.llama_cpp import available  # defers statistics off --help

        if (why := available()) is not None:
            raise ValueError(f"--llama-cpp: {why}")
    _set_threads(args.threads)
    lm = load_model(args.model, weights=args.weights, device=args.device, dtype=args.dtype)
    result = weight_quant_benchmark(lm, methods, args.prompt_len, args.output_len, args.rounds,
                                    with_quality=not args.no_quality, llama_cpp=args.llama_cpp)
    if _save_or_print_json(args, result, "quant"):
        return 0
    print(f"one user, {args.prompt_len} in / {args.output_len} out, decode tok/s median of {args.rounds} "
          f"interleaved rounds, {lm.describe()}")
    for name, r in result["speed"].items():
        print(f"{name:>8}: {format_ledger(r['decode_tokens_per_s'], r['ledger'])} ({r['speedup_vs_base']:.2f}x), "
              f"{r['gemm_weight_bytes_per_token'] / 1e6:.0f} MB of GEMM weights per token, {r['gemm_path']}")
    print(f"          GB/step: every weight as stored, plus the K/V at the mean decode context; "
          f"{_copy_words(result['copy_bandwidth'])}")
    if LLAMA_CPP in result["speed"]:
        r = result["speed"][LLAMA_CPP]
        print("          llama.cpp reads every tensor of the file per token, by type (MB): "
              + ", ".join(f"{k} {v / 1e6:.0f}" for k, v in r["build"]["by_type"].items())
              + f"; its first {r['same_greedy_tokens_as_base']} of {args.output_len} greedy tokens equal the "
              f"engine's (the same weight values, but its activations are rounded to 8 bits)")
        print(f"          llama.cpp build: {r['build']['system_info']}")
    for name, why in result["skipped"].items():
        print(f"{name:>8}: not measured, {why}")
    for name, q in result.get("quality", {}).items():
        print(f"{name:>8}: perplexity {q['perplexity']:.3f} ({100 * q['perplexity_change']:+.2f}%), top-1 "
              f"agreement {100 * q['top1_agreement']:.1f}% over {q['scored_tokens']} tokens")
    env = result["environment"]
    print(f"[{env['hardware']}, {', '.join(env['cpu']['flags']) if 'cpu' in env else ''}; "
          f"{result['threads']} torch threads]")
    return 0


def run_spec(args) -> int:
    """``bench spec``: one proposer at several k against plain decoding."""
    from ..bench.ledger import format_ledger  # defers torch
    from ..bench.speculative import bench_spec, parse_proposer  # defers torch
    from ..models import load_model  # defers torch (models)

    ks, proposer = parse_ks(args.k), parse_proposer(args.proposer)
    if args.batch < 1 or args.max_new_tokens < 1 or args.rounds < 1:
        raise ValueError("--batch, --max-new-tokens and --rounds must be >= 1")
    _set_threads(args.threads)
    lm = load_model(args.model, weights=args.weights, device=args.device, dtype=args.dtype)
    if lm.tokenizer is None or lm.is_random:
        raise ValueError("bench spec needs a pretrained model with a tokenizer (its prompts are text, and "
                         "random weights accept no guess); try --model smollm2-135m")
    print(f"[bench spec] {lm.describe()}: {proposer}, k {ks}, {args.workload} prompts, batch {args.batch}, "
          f"up to {args.max_new_tokens} new tokens", file=sys.stderr)
    result = bench_spec(lm, proposer, ks, workload=args.workload, batch=args.batch,
                        max_new_tokens=args.max_new_tokens, prompts=args.prompts, rounds=args.rounds)
    if _save_or_print_json(args, result, "spec"):
        return 0
    env, plain = result["environment"], result["plain"]
    print(f"plain decoding: {plain['tokens_per_s']:.1f} tok/s ({plain['decode_step_ms']:.1f} ms per decode step) "
          f"on {env['hardware']}, {env['torch_threads']} threads")
    if plain["ledger"]:
        print(f"plain, decode steps only: {format_ledger(plain['decode_tokens_per_s'], plain['ledger'])} "
              f"({_copy_words(result['copy_bandwidth'])})")
    header = (f"{'k':>3} {'accept':>7} {'alpha':>6} {'tok/pass':>8} {'pass/tok':>8} {'tok/s':>7} "
              f"{'speedup':>8} {'pred':>6} {'pred(v)':>7} {'same':>5} {'dec tok/s':>9} {'GB/step':>7} "
              f"{'GB/s':>6} {'% copy':>6}")
    print(header)
    for r in result["rows"]:
        acc = f"{r['acceptance_rate']:.0%}" if r["acceptance_rate"] is not None else "-"
        alpha = f"{r['alpha_mle']:.0%}" if r["alpha_mle"] is not None else "-"
        print(f"{r['k']:>3} {acc:>7} {alpha:>6} {r['tokens_per_pass']:>8.2f} {r['passes_per_token']:>8.2f} "
              f"{r['tokens_per_s']:>7.1f} {r['speedup']:>7.2f}x {r['predicted_speedup']:>5.2f}x "
              f"{r['predicted_speedup_verify']:>6.2f}x {'yes' if r['identical'] else 'NO':>5} "
              + _ledger_columns(r["decode_tokens_per_s"], r["ledger"]))
    print("dec tok/s: decode steps only; GB/step: the target's weights once plus every sequence's K/V "
          "(a self:L draft's reads are not counted); % copy: GB/s over the copy bandwidth")
    return 0


def _ledger_columns(tokens_per_s: float | None, ledger: dict | None) -> str:
    """``dec tok/s``, ``GB/step``, ``GB/s`` and ``% copy`` for a table row (dashes without a ledger)."""
    if ledger is None:
        return f"{'—':>9} {'—':>7} {'—':>6} {'—':>6}"
    return (f"{human(tokens_per_s):>9} {human(gb(ledger['bytes_per_step'])):>7} {human(ledger['GBps']):>6} "
            f"{ledger['fraction_of_copy']:>6.0%}")


def _copy_words(copy: dict) -> str:
    """``'copy 33.6 GB/s, 2 threads'``: the bandwidth the ledger's fractions are of (and whether
    other programs were busy when it was measured)."""
    from ..timing import BUSY_CORES  # defers torch (timing)

    words = f"copy {human(copy['GBps'])} GB/s, " + (f"{copy['threads']} threads" if copy["threads"] else copy["device"])
    if (copy.get("others_cores") or 0) >= BUSY_CORES:
        words += f", measured with other programs busy on {human(copy['others_cores'], 2, keep_zeros=True)} cores"
    return words


def _engine_ledger_line(result: EngineBenchmark) -> str:
    """The engine's ledger for people: its pure decode steps' speed, bytes per step and bandwidth."""
    from ..bench.ledger import format_ledger  # defers torch

    decode = result.run.decode
    if result.ledger is None or decode is None:
        return "decode ledger: none (" + ("no KV cache to read)" if result.config.kv_mode == "nocache"
                                          else "no pure decode step)")
    return (f"decode steps only (mean batch {human(decode.mean_batch)}, mean context "
            f"{human(decode.mean_context)} tokens): "
            f"{format_ledger(result.decode_tokens_per_s, result.ledger)} ({_copy_words(result.copy_bandwidth)})")


def engine_switches(args) -> dict:
    """The :class:`~infer_lab.engine.EngineConfig` fields the command line sets, by their own names."""
    budget = args.max_num_batched_tokens
    if budget is not None and not args.chunked_prefill:
        raise ValueError("--max-num-batched-tokens is chunked prefill's step budget: add --chunked-prefill "
                         "(without it the engine puts each prompt whole in one step)")
    if budget is not None and budget < 1:
        raise ValueError(f"--max-num-batched-tokens must be >= 1, got {budget}")
    return {
        "max_num_seqs": args.max_num_seqs, "policy": args.policy, "prefix_cache": args.prefix_cache,
        "chunked_prefill": args.chunked_prefill, "max_num_batched_tokens": budget or 512,
        "kv_mode": args.kv_mode, "block_size": args.block_size,
        "fuse_projections": args.fuse_projections == "on", "compile_layers": args.compile_layers,
        "compiled_decode": args.compiled_decode,
        "prepack_weights": {"auto": None, "on": True, "off": False}[args.prepack_weights],
        "kv_dtype": None if args.kv_dtype == "auto" else args.kv_dtype,
        "weight_quant": None if args.weight_quant == "none" else args.weight_quant,
        "dtype": None if args.engine_dtype == "model" else args.engine_dtype,
    }


def run_engine(args) -> int:
    from ..bench.engine import CONTENDER_LABELS, benchmark_with_metadata  # defers torch
    from ..models import load_model  # defers torch (models)

    switches = engine_switches(args)
    _set_threads(args.threads)
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    lm = load_model(args.model, weights=args.weights, device=args.device, dtype=args.dtype)
    print(
        f"[bench] {lm.describe()}: {args.requests} requests, max_num_seqs {args.max_num_seqs}, "
        f"prompt {args.prompt_len}, output {args.output_len}, {args.policy}, kv {args.kv_mode}, "
        f"decode path {args.decode_path}",
        file=sys.stderr,
    )
    if args.compare_hf and args.shared_prefix:
        raise ValueError("--shared-prefix needs a plain run: --compare-hf serves its own workloads, with no shared "
                         "prefix (drop one of the two)")
    extra = {} if args.compare_hf else {"shared_prefix_len": args.shared_prefix}
    result = benchmark_with_metadata(
        lm, compare_hf=args.compare_hf, rounds=args.rounds, requests=args.requests, prompt_len=args.prompt_len,
        output_len=args.output_len, decode_path=args.decode_path, workload_kind=args.workload, **extra, **switches)
    if _save_or_print_json(args, result.as_json(), "engine"):
        return 0
    run = result.run
    ttft, itl = run.ttft_ms, run.itl_ms
    print(
        f"output {result.output_tokens_per_s:.1f} tok/s"
        + (f" (median of {result.rounds} rounds; the rest from the last round)" if result.rounds > 1 else "")
        + f", {run.requests_per_s:.2f} req/s; TTFT p50 {ttft.p50:.1f} ms p99 {ttft.p99:.1f} ms; "
        + (f"ITL p50 {itl.p50:.1f} ms p99 {itl.p99:.1f} ms" if itl else "no ITL (1 token each)")
    )
    print(_engine_ledger_line(result))
    if run.kv is not None:
        print(f"KV blocks: peak {run.kv.blocks_peak_used} of {run.kv.blocks_total}; "
              f"prefix hit rate {run.prefix_hit_rate:.1%}; preemptions {run.num_preemptions}")
    path = run.decode_path
    print(
        f"decode: batched attention {path.batched_decode}, static {path.static_decode}, "
        f"CUDA graphs {path.cuda_graphs} ({path.graphs_captured} captured"
        + (f" in {run.graph_capture_s:.1f} s" if run.graph_capture_s is not None else "")
        + f"), fused projections {path.fused_projections}, prepacked weights "
        f"{path.prepacked_weights}, compiled {path.compiled}"
    )
    print(f"GEMM path: {path.gemm_plan['summary']} ({path.gemm_plan['source']})")
    if path.compiled_decode:
        print("one-token steps: compiled GEMVs (engine/cpu/cpu_decode.py; compiled in the warm-up, "
              "before the clock started)")
    for c in result.contenders:
        same = "token-identical" if c.identical_to_engine else "outputs DIFFER"
        print(f"{CONTENDER_LABELS.get(c.name, c.name)}: {c.tokens_per_s:.1f} tok/s -> engine is "
              f"{result.speedup_vs(c.name):.2f}x ({same})")
    if result.roofline is not None:
        b, one, everyone = (result.roofline[k] for k in
                            ("roofline_bound", "roofline_bound_batch_1", "roofline_bound_batch_n"))
        print(f"roofline bound on this machine's measured ceilings ({b['roof']}), {b['requests']} requests "
              f"at max_num_seqs {b['max_num_seqs']}: {b['output_tokens_per_s']:.1f} tok/s -> engine at "
              f"{result.fraction_of_roofline_bound:.0%} (bound one at a time: "
              f"{one['output_tokens_per_s']:.1f} tok/s; all in one batch: {everyone['output_tokens_per_s']:.1f} tok/s)")
    print(f"[{result.environment['hardware']}, {result.threads} torch threads]")
    return 0
