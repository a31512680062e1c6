"""infer-lab kv: KV-cache bytes per token and for a context x users, from a config alone."""

from __future__ import annotations

import json

from ..analysis.memory import attention_variants, kv_report
from ..units import fmt_bytes
from ._args import context_warnings

NAME = "kv"
ORDER = 20
HELP = "KV-cache bytes per token (per layer and total) and for a context x users"
DESCRIPTION = """\
The memory equation for the KV cache, from a catalog name or any HF config.json (no weights):

  KV bytes per token = layers x (2 x kv_heads x head_dim) x bytes per element   (MHA/GQA/MQA)
                     = layers x (kv_lora_rank + qk_rope_head_dim) x bytes         (MLA, DeepSeek)

Sliding-window layers stop growing at their window. The KV dtype is independent of the
weight dtype: int4 weights do not shrink the KV cache.

  infer-lab kv --model mistral-7b --context 4096 --users 80     131,072 B/token; 42.9 GB
  infer-lab kv --model deepseek-v3                               MLA: 70,272 B/token
  infer-lab kv --model path/to/config.json --kv-dtype fp8 --json
"""


def add_arguments(p) -> None:
    p.add_argument("--model", default="mistral-7b", help="catalog name or path to a config.json")
    p.add_argument("--kv-dtype", default="bf16", choices=["fp32", "bf16", "fp16", "fp8", "int8"])
    p.add_argument("--context", type=int, default=4096, help="tokens per sequence (default 4096)")
    p.add_argument("--users", type=int, default=1, help="concurrent sequences (default 1)")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def run(args) -> int:
    report = kv_report(args.model, context=args.context, users=args.users, kv_dtype=args.kv_dtype)
    warnings = context_warnings(args.model, args.context)
    if args.json:
        out = report.as_dict()
        out["attention_variants"] = attention_variants(args.model, args.kv_dtype)
        out["warnings"] = warnings
        print(json.dumps(out, indent=1))
        return 0
    r = report
    print(f"{r.model}: {r.attention}, {r.layers} layers, KV in {r.kv_dtype}")
    print(f"  per token per layer : {r.kv_bytes_per_token_per_layer:,} B")
    print(f"  per token           : {r.kv_bytes_per_token:,} B = {fmt_bytes(r.kv_bytes_per_token)}")
    if r.sliding_window_layers:
        print(
            f"  ({r.sliding_window_layers} of {r.layers} layers use a sliding window: capped below)"
        )
    print(
        f"  one user x {r.context:,} tokens : {r.kv_bytes_per_user:,} B = {fmt_bytes(r.kv_bytes_per_user)}"
    )
    print(
        f"  {r.users} users x {r.context:,} tokens: {r.kv_bytes_total:,} B = {fmt_bytes(r.kv_bytes_total)}"
    )
    return 0
