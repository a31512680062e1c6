"""infer-lab tp: greedy generation with the model split over N processes (tensor parallelism)."""

from __future__ import annotations

import json
from typing import Any

NAME = "tp"
ORDER = 25
HELP = "tensor parallelism for real: the model split over N processes, every all-reduce counted"
DESCRIPTION = """\
Split the model's layers over --world-size processes and generate greedily. Each rank holds
its share of the attention heads (whole KV groups) and of the MLP columns; after the
row-parallel o and down projections an all-reduce adds the ranks' partial sums: two per
layer and step. The embedding and the LM head are replicated on every rank.

On a CPU the ranks are processes joined by gloo; with one CUDA GPU per rank they use nccl
(that path is written but was not run on a multi-GPU machine here). On a 2-core CPU two
ranks are slower than one process: the output shows how much of each step is spent inside
the all-reduces.

  infer-lab tp --world-size 2 "What is the capital of France?"
  infer-lab tp --world-size 2 --max-new-tokens 8 --compare "Hello"     also world size 1: same tokens?
  infer-lab tp --world-size 2 --json "Hello"
  infer-lab tp --world-size 3 "Hello"      SmolLM2-135M has 3 KV heads: at most 3 ranks
"""


def add_arguments(p) -> None:
    p.add_argument("prompt", nargs="?", default="What is the capital of France?")
    p.add_argument("--world-size", type=int, default=2, help="ranks (processes) to split the model over")
    p.add_argument("--model", default="smollm2-135m", help="catalog name, config.json path or hub id")
    p.add_argument("--weights", choices=["pretrained", "random"], default="pretrained")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto",
                   help="auto: nccl with a GPU per rank, else gloo on the CPU")
    p.add_argument("--threads-per-rank", type=int, default=None,
                   help="torch threads per rank (default: this machine's threads / world size)")
    p.add_argument("--compare", action="store_true", help="also run world size 1 here and compare the tokens")
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt as plain text")
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-new-tokens")
    p.add_argument("--json", action="store_true", help="print JSON on stdout")


def _prompt_ids(lm: Any, args) -> list[int]:
    if lm.tokenizer is None or lm.is_random:
        return lm.random_ids(1, 16)[0].tolist()
    if args.no_chat_template:
        return lm.tokenizer(args.prompt)["input_ids"]
    return lm.chat_ids(args.prompt)[0].tolist()


def _rank_summary(run: Any, rank: int) -> dict[str, Any]:
    pre, dec = run.prefill_step(rank), run.decode_split(rank)
    r = run.ranks[rank]
    return {
        "rank": rank,
        "threads": r.threads,
        "split_params": r.split_params,
        "kv_cache_bytes": r.kv_cache_bytes,
        "prefill": {"tokens": pre.tokens, "wall_ms": pre.wall_s * 1e3, "comm_ms": pre.comm_s * 1e3,
                    "compute_ms": pre.compute_s * 1e3, "allreduces": pre.allreduce_calls},
        "decode": {"steps": dec.steps, "wall_ms_p50": dec.wall_s * 1e3, "comm_ms_p50": dec.comm_s * 1e3,
                   "compute_ms_p50": dec.compute_s * 1e3, "allreduces_per_step": dec.allreduce_calls,
                   "allreduce_bytes_per_step": dec.allreduce_bytes},
    }


def run(args) -> int:
    import torch  # defers torch

    from ..models import load_model  # defers torch (models)
    from ..parallel.runtime import (  # defers torch
        TPGroup,
        default_backend,
        run_local,
        tp_engine_model,
    )
    from ..parallel.shard import plan_shards  # defers torch

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.world_size < 1:
        raise ValueError(f"--world-size must be >= 1, got {args.world_size}")
    lm = load_model(args.model, weights=args.weights, device="cpu")
    em = tp_engine_model(lm)
    plan = plan_shards(em.shape, args.world_size)  # a clear error before any process starts
    ids = _prompt_ids(lm, args)
    backend = default_backend() if args.backend == "auto" else args.backend
    if args.world_size == 1:
        result = run_local(em, [ids], args.max_new_tokens, args.ignore_eos, threads=args.threads_per_rank)
        backend = "none"
    else:
        with TPGroup(em, args.world_size, backend=backend, threads_per_rank=args.threads_per_rank) as group:
            result = group.generate([ids], args.max_new_tokens, args.ignore_eos)
    tokens = result.token_ids[0]
    eos = lm.eos_token_ids
    shown = [t for t in tokens if t not in eos]
    text = lm.tokenizer.decode(shown, skip_special_tokens=True) if lm.tokenizer is not None else ""
    out: dict[str, Any] = {
        "model": lm.name, "weights": lm.source, "world_size": args.world_size, "backend": backend,
        "plan": plan.describe(), "prompt_tokens": len(ids), "text": text, "token_ids": tokens,
        "allreduce_count": result.allreduce_count, "allreduce_bytes": result.allreduce_bytes,
        "allreduces_per_step_expected": 2 * em.shape.layers if args.world_size > 1 else 0,
        "ranks": [_rank_summary(result, r) for r in range(args.world_size)],
        "torch_threads_here": torch.get_num_threads(),
    }
    if args.compare and args.world_size > 1:
        one = run_local(em, [ids], args.max_new_tokens, args.ignore_eos)
        out["world_size_1"] = {"token_ids": one.token_ids[0], "decode_wall_ms_p50": one.decode_split().wall_s * 1e3}
        out["identical_to_world_size_1"] = one.token_ids[0] == tokens
    if args.json:
        print(json.dumps(out))
        return 0
    print(text if text else f"(random weights) {tokens}")
    print(f"\ntoken ids: {tokens}")
    print(f"[{lm.describe()} · world size {args.world_size} ({backend}) · {plan.describe()}]")
    print(f"all-reduces: {out['allreduce_count']} in {len(result.steps)} steps "
          f"({out['allreduces_per_step_expected']} per step expected), {out['allreduce_bytes']:,} bytes in all")
    for r in out["ranks"]:
        p, d = r["prefill"], r["decode"]
        print(f"rank {r['rank']} ({r['threads']} thread(s)): prefill {p['wall_ms']:.1f} ms "
              f"({p['comm_ms']:.1f} in all-reduces); decode step p50 {d['wall_ms_p50']:.1f} ms = "
              f"{d['compute_ms_p50']:.1f} compute + {d['comm_ms_p50']:.1f} all-reduces "
              f"({d['allreduces_per_step']} calls, {d['allreduce_bytes_per_step']:,} bytes)")
    if "identical_to_world_size_1" in out:
        same = "identical" if out["identical_to_world_size_1"] else "DIFFERENT"
        print(f"world size 1 here: {same} tokens, decode step p50 {out['world_size_1']['decode_wall_ms_p50']:.1f} ms")
    return 0
