"""infer-lab quantize: shrink a model's weights and measure memory, speed and quality."""

from __future__ import annotations

import json
import sys

from ..units import fmt_bytes
from ._args import add_model_arguments

NAME = "quantize"
ORDER = 50
HELP = "quantize a model (int8, int4, nf4, fp8, bitsandbytes) and report exact bytes, speed and quality"
DESCRIPTION = """\
Quantize every linear layer of a model and report, side by side with the unquantized model:

  weight_bytes        exact bytes of the stored tensors (codes + scales), never an allocator reading
  decode tokens/s     greedy decode with the KV cache, warm-up and repeats
  top1_agreement      how often the quantized model picks the same next token (held-out prompts)
  perplexity          with --eval: on the shipped evaluation text (Python stdlib docstrings)

Methods:
  int8        from scratch: absmax, one scale per output channel
  int4        from scratch: group-wise (g128 zero-point; also int4-g64, int4-g128-sym), packed 2 per byte
  nf4         from scratch: NF4 levels, absmax per 64 weights, packed 2 per byte
  fp8         from scratch: e4m3 weights, one scale per output channel
  bnb-int8    bitsandbytes LLM.int8 through transformers (needs CUDA + bitsandbytes)
  bnb-nf4     bitsandbytes NF4 through transformers (needs CUDA + bitsandbytes)

Examples:
  infer-lab quantize --method int8 --eval
  infer-lab quantize --method int4-g64 --eval --json
  infer-lab quantize --model mistral-7b --weights random --method bnb-nf4 --device cuda
"""


def add_arguments(p) -> None:
    add_model_arguments(p, dtype=False)
    p.add_argument(
        "--method", required=True, help="int8, int4[-gN][-sym], nf4[-gN], q4_1[-gN], fp8, bnb-int8 or bnb-nf4"
    )
    p.add_argument(
        "--eval", action="store_true", help="also measure perplexity on the evaluation text"
    )
    p.add_argument(
        "--eval-tokens", type=int, default=1024, help="tokens of the evaluation text to score"
    )
    p.add_argument(
        "--eval-file", default=None, help="your own plain-text file instead of the shipped one"
    )
    p.add_argument("--new-tokens", type=int, default=16, help="tokens per timed decode")
    p.add_argument(
        "--repeats", type=int, default=3, help="timed decode repeats (after one warm-up)"
    )
    p.add_argument(
        "--prompt-tokens", type=int, default=64, help="tokens per held-out prompt (top-1 agreement)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run(args) -> int:
    from ..quant.quantize_model import METHODS, parse_method  # defers torch

    if args.method not in METHODS:
        parse_method(args.method)  # raises with the list of methods when unknown
    for name in ("eval_tokens", "new_tokens", "repeats", "prompt_tokens"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")

    from ..models import load_model, resolve_device  # defers torch (models)
    from ..quant.comparison import compare_methods  # defers torch

    if args.method.startswith("bnb-"):
        from ..quant.bnb import require_bitsandbytes  # defers torch

        require_bitsandbytes(resolve_device(args.device))  # fail before loading anything

    def log(msg: str) -> None:
        print(f"[quantize] {msg}", file=sys.stderr, flush=True)

    lm = load_model(args.model, weights=args.weights, device=args.device)
    log(f"loaded {lm.describe()}")
    result = compare_methods(
        lm,
        [args.method],
        evaluate=args.eval,
        eval_tokens=args.eval_tokens,
        eval_file=args.eval_file,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        prompt_tokens=args.prompt_tokens,
        log=log,
    )
    row = result["methods"][0]
    out = {
        "model": lm.name,
        "weights": lm.source,
        "device": result["environment"]["device_name"],
        "method": row["method"],
        "weight_bytes": row["weight_bytes"],
        "weight_bytes_unquantized": result["baseline"]["weight_bytes"],
        "compression": result["baseline"]["weight_bytes"] / row["weight_bytes"],
        "decode_tokens_per_s": row["decode_tokens_per_s"],
        "decode_tokens_per_s_unquantized": result["baseline"]["decode_tokens_per_s"],
        "top1_agreement": row["top1_agreement"],
        "environment": result["environment"],
    }
    if args.eval:
        out.update(
            perplexity=row["perplexity"],
            perplexity_unquantized=result["baseline"]["perplexity"],
            eval_scored_tokens=row["eval_scored_tokens"],
        )
    if args.json:
        print(json.dumps(out, indent=1))
        return 0

    print(f"{lm.describe()}: {out['method']}")
    print(
        f"  weights       {fmt_bytes(out['weight_bytes'])}  (unquantized {fmt_bytes(out['weight_bytes_unquantized'])},"
        f" {out['compression']:.2f}x smaller)"
    )
    print(
        f"  decode        {out['decode_tokens_per_s']:.1f} tok/s  (unquantized "
        f"{out['decode_tokens_per_s_unquantized']:.1f} tok/s)"
    )
    print(f"  top-1 agree   {100 * out['top1_agreement']:.1f}% of next tokens")
    if args.eval:
        print(
            f"  perplexity    {out['perplexity']:.3f}  (unquantized {out['perplexity_unquantized']:.3f}, "
            f"{out['eval_scored_tokens']} tokens)"
        )
    return 0
