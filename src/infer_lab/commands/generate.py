"""infer-lab generate: one completion, with its timings."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from ._args import add_model_arguments

if TYPE_CHECKING:
    import torch

NAME = "generate"
ORDER = 20
HELP = "generate a completion (greedy) and report TTFT and ITL"
DESCRIPTION = """\
Generate a greedy completion for PROMPT with the model's chat template, and time it:
TTFT (time to first token: the prefill) and ITL (each decode step after it).

  infer-lab generate "What is the capital of France?"
  infer-lab generate --json --max-new-tokens 16 "Hello"
  infer-lab generate --model mistral-7b --weights random --device cuda "anything"
  infer-lab generate --engine paged "Hello"          our from-scratch engine instead of transformers
  infer-lab generate --engine paged --speculative ngram --num-speculative-tokens 4 "Repeat: a b c"

--speculative (chapter 12) lets a proposer guess up to K tokens that the target verifies in one
forward pass: ngram (prompt lookup: what followed the last n <= 3 tokens earlier in the text;
ngram:N for n <= N) or self:L (the target's own first L layers). With exact arithmetic greedy output
is token-identical to plain decoding; in floating point a batched verification adds in a different
order (on a GPU in bf16 above all), which can flip a near-tie: `infer-lab bench spec` checks it.
--json then adds proposed_tokens, accepted_tokens and target_passes.

With --weights random the prompt is replaced by random token ids of the same length budget
(--prompt-len) and the text is meaningless; memory and timing are true.
"""


def add_arguments(p) -> None:
    p.add_argument("prompt", nargs="?", default="What is the capital of France?")
    add_model_arguments(p)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=32, help="random-weights prompt length in tokens")
    p.add_argument("--engine", default="hf", choices=["hf", "nocache", "contiguous", "paged"],
                   help="hf: transformers with its DynamicCache; the others: our engine (chapter 08)")
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt as plain text")
    p.add_argument("--ignore-eos", action="store_true",
                   help="generate exactly --max-new-tokens, past the end-of-sequence token (for timing)")
    p.add_argument("--speculative", default=None, metavar="PROPOSER",
                   help="speculative decoding with our engine: ngram, ngram:N or self:L (default off)")
    p.add_argument("--num-speculative-tokens", type=int, default=4, metavar="K",
                   help="with --speculative: most tokens guessed per target pass (default 4)")
    p.add_argument("--kv-dtype", choices=["auto", "int8", "fp8"], default="auto",
                   help="our engine's KV cache storage (--engine paged): int8 or fp8 with per-token per-head "
                        "scales; close to, not equal to, full-precision greedy output")
    p.add_argument("--compiled-decode", action="store_true",
                   help="our engine on a CPU: compile the one-token decode step (GEMVs as fused multiply-sum "
                        "loops; needs a C++ compiler, tens of seconds the first time, then cached on disk)")
    p.add_argument("--json", action="store_true", help="print JSON on stdout")


def run(args) -> int:
    from ..harness import summarize  # defers torch (harness)
    from ..models import load_model  # defers torch (models)

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.speculative is not None:
        _check_speculative(args.engine, args.speculative, args.num_speculative_tokens)
    if args.compiled_decode and args.engine == "hf":
        raise ValueError("--compiled-decode compiles our engine's decode step: use --engine paged")
    lm = load_model(args.model, weights=args.weights, device=args.device, dtype=args.dtype)
    if lm.tokenizer is None or lm.is_random:
        ids = lm.random_ids(1, args.prompt_len)
    elif args.no_chat_template:
        ids = lm.tokenizer(args.prompt, return_tensors="pt")["input_ids"].to(lm.device)
    else:
        ids = lm.chat_ids(args.prompt)
    kv_dtype = None if args.kv_dtype == "auto" else args.kv_dtype
    if kv_dtype is not None and args.engine != "paged":
        raise ValueError(f"--kv-dtype quantizes our engine's paged KV pool: use --engine paged (got {args.engine})")
    if args.compiled_decode and not args.json:
        print("[compiling the one-token decode step: tens of seconds the first time, seconds after]",
              file=sys.stderr, flush=True)
    out = generate_text(lm, ids, args.max_new_tokens, mode=args.engine, ignore_eos=args.ignore_eos,
                        speculative=args.speculative, num_speculative_tokens=args.num_speculative_tokens,
                        kv_dtype=kv_dtype, compiled_decode=args.compiled_decode)
    token_ids, ttft_s, itl_s = out["token_ids"], out["ttft_s"], out["itl_s"]
    eos = lm.eos_token_ids
    shown = token_ids[:-1] if token_ids and token_ids[-1] in eos else token_ids
    text = lm.tokenizer.decode(shown, skip_special_tokens=True) if lm.tokenizer is not None else ""
    itl = summarize(itl_s) if itl_s else None
    result = {"model": lm.name, "weights": lm.source, "device": str(lm.device), "kv_dtype": kv_dtype or "auto",
              "dtype": str(lm.dtype).replace("torch.", ""), "engine": args.engine, "prompt_tokens": ids.shape[1],
              "text": text, "token_ids": token_ids, "ttft_ms": ttft_s * 1e3, "itl_ms": [t * 1e3 for t in itl_s],
              "itl_ms_p50": itl.p50 * 1e3 if itl else None, "itl_ms_p90": itl.p90 * 1e3 if itl else None}
    if args.speculative is not None:
        result.update(speculative=args.speculative, num_speculative_tokens=args.num_speculative_tokens,
                      proposed_tokens=out["proposed_tokens"], accepted_tokens=out["accepted_tokens"],
                      target_passes=out["target_passes"])
    if args.json:
        print(json.dumps(result))
        return 0
    print(text if text else f"(random weights: {len(token_ids)} token ids) {token_ids}")
    tail = f", ITL p50 {result['itl_ms_p50']:.1f} ms, p90 {result['itl_ms_p90']:.1f} ms" if itl else ""
    if args.speculative is not None:
        tail += (f" · {args.speculative}, k {args.num_speculative_tokens}: {len(token_ids)} tokens in "
                 f"{out['target_passes']} target passes, {out['accepted_tokens']}/{out['proposed_tokens']} "
                 "guesses accepted")
    engine = args.engine + (", compiled decode" if args.compiled_decode else "")
    print(f"\n[{lm.describe()} · {engine} · prompt {ids.shape[1]} tokens · TTFT {result['ttft_ms']:.1f} ms{tail}]")
    return 0


def _check_speculative(mode: str, speculative: str, k: int) -> None:
    """Speculation needs our engine with a KV cache, a known proposer and k >= 1: say so clearly."""
    if mode not in ("contiguous", "paged"):
        raise ValueError(f"--speculative runs in our engine with a KV cache: use --engine paged or "
                         f"contiguous (got --engine {mode})")
    kind, _, arg = speculative.partition(":")
    if not ((kind == "ngram" and (not arg or arg.isdigit())) or (kind == "self" and arg.isdigit())):
        raise ValueError(f"--speculative takes ngram, ngram:N or self:L, got {speculative!r}")
    if k < 1:
        raise ValueError(f"--num-speculative-tokens must be >= 1, got {k}")


def generate_text(
    lm: Any, prompt_ids: torch.Tensor | list[int], max_new_tokens: int, mode: str = "paged",
    ignore_eos: bool = False, speculative: str | None = None, num_speculative_tokens: int = 4,
    compiled_decode: bool = False,
    kv_dtype: str | None = None,
) -> dict[str, Any]:
    """One greedy generation, timed, for ``infer-lab generate --engine MODE``.

    Args:
        lm: a loaded model (:func:`infer_lab.models.load_model`).
        prompt_ids: the prompt, ``(1, n)`` or ``(n,)`` tensor or a list of ids.
        max_new_tokens: most tokens to generate; stops at EOS (included) unless ``ignore_eos``.
        mode: ``"hf"`` (transformers with its DynamicCache), ``"nocache"``, ``"contiguous"`` or ``"paged"``.
        speculative: a proposer for our engine (``"ngram"``, ``"ngram:N"``, ``"self:L"``) or None.
        num_speculative_tokens: most guesses per target pass (``k``) with ``speculative``.
        kv_dtype: ``None``, ``"int8"`` or ``"fp8"``: how the paged pool stores K/V.
        compiled_decode: our engine's one-token steps compiled (:mod:`infer_lab.engine.cpu.cpu_decode`).
    Returns:
        ``{"token_ids": list[int], "ttft_s": float, "itl_s": list[float]}`` (seconds); our
        engine adds ``target_passes``, ``proposed_tokens`` and ``accepted_tokens``.
    """
    import torch  # defers torch

    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    ids = prompt_ids if isinstance(prompt_ids, torch.Tensor) else torch.tensor(prompt_ids)
    ids = ids.reshape(1, -1)
    if mode == "hf":
        from ..harness import timed_generate  # defers torch (harness)

        timed_generate(lm, ids, 1)  # warm-up: the first call pays one-time setup costs
        rec = timed_generate(lm, ids, max_new_tokens, ignore_eos=ignore_eos)
        return {"token_ids": rec.token_ids[0], "ttft_s": rec.ttft_s, "itl_s": rec.itl_s}
    from ..engine import Engine, EngineConfig, SamplingParams  # defers torch

    if mode not in ("nocache", "contiguous", "paged"):
        raise ValueError(f"mode must be one of hf, nocache, contiguous, paged; got {mode!r}")
    if speculative is not None:
        _check_speculative(mode, speculative, num_speculative_tokens)
    config = EngineConfig(
        kv_mode=mode, max_num_seqs=1, max_model_len=ids.shape[1] + max_new_tokens + 1,
        speculative=speculative, num_speculative_tokens=num_speculative_tokens, kv_dtype=kv_dtype,
        compiled_decode=compiled_decode,
    )
    Engine.from_loaded(lm, config).generate(
        [ids[0, :4]], SamplingParams(max_tokens=2, ignore_eos=True)
    )  # warm-up
    ignore = ignore_eos or lm.is_random
    params = SamplingParams(max_tokens=max_new_tokens, ignore_eos=ignore,
                            stop_token_ids=() if ignore else tuple(sorted(lm.eos_token_ids)))
    out = Engine.from_loaded(lm, config).generate([ids[0]], params)[0]
    return {"token_ids": out.token_ids, "ttft_s": out.ttft_s, "itl_s": out.itl_s,
            "target_passes": out.target_passes, "proposed_tokens": out.proposed_tokens,
            "accepted_tokens": out.accepted_tokens}
