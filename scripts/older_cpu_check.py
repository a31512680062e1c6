"""The engine on an older CPU than this one: what a laptop without AVX-512 gets, checked in minutes.

Run it under an emulated CPU to see what an AVX2-only laptop gets, on a machine that has
AVX-512 (Debian's qemu-user; about 30-50x slower than native, so the check is small):

    qemu-x86_64 -cpu Haswell .venv/bin/python scripts/older_cpu_check.py

PyTorch reads the (emulated) CPU's features itself, so its kernels and oneDNN's refusals are
the ones such a laptop meets: on Haswell, oneDNN refuses the prepacked bf16 GEMM. The script
prints every fast path's verdict, then checks that the engine still gives transformers' greedy
tokens in fp32 and in bf16 (there on plain F.linear), and that each quantized method runs or
is refused by name. It exits non-zero on a mismatch or a crash.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2, help="chat prompts to compare (default 2)")
    parser.add_argument("--new-tokens", type=int, default=4, help="greedy tokens per prompt (default 4)")
    parser.add_argument("--with-compile", action="store_true",
                        help="also probe torch.compile (slow under emulation: inductor's Python is emulated too)")
    args = parser.parse_args()

    from infer_lab.engine import Engine, EngineConfig, SamplingParams
    from infer_lab.engine.cpu import cpu_decode, prepack
    from infer_lab.models import load_model
    from infer_lab.quant import kernels

    t0 = time.perf_counter()
    print(f"PyTorch {torch.__version__}, CPU kernels {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads")
    verdicts = [prepack.verdict(torch.float32), prepack.verdict(torch.bfloat16), kernels.verdict("int8"),
                kernels.verdict("int4")] + ([cpu_decode.verdict()] if args.with_compile else [])
    for v in verdicts:
        print(f"  {v.describe()}")

    failures = []
    for dtype in ("fp32", "bf16"):
        lm = load_model("smollm2-135m", device="cpu", dtype=dtype)
        questions = ["What is a KV cache?", "Name a fruit.", "Why is the sky blue?", "What is 2 + 2?"]
        prompts = [lm.tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                    tokenize=True, return_dict=False)
                   for q in questions[: args.prompts]]
        reference = []
        with torch.inference_mode():
            for p in prompts:
                out = lm.model.generate(torch.tensor([p]), max_new_tokens=args.new_tokens, do_sample=False)
                reference.append(out[0, len(p):].tolist())
        engine = Engine.from_loaded(lm, EngineConfig(max_num_seqs=1))
        got = [o.token_ids for o in engine.generate(prompts, SamplingParams(max_tokens=args.new_tokens))]
        same = [g == r for g, r in zip(got, reference, strict=True)]
        print(f"{dtype}: GEMM path: {engine.gemm_plan.describe()}; greedy tokens as transformers': "
              f"{sum(same)} of {len(same)}")
        if not all(same):
            failures.append(f"{dtype}: engine {got} vs transformers {reference}")
        if dtype == "fp32":
            for method in ("int8", "int4"):
                try:
                    quant = Engine.from_loaded(lm, EngineConfig(max_num_seqs=1, weight_quant=method))
                    (o,) = quant.generate(prompts[:1], SamplingParams(max_tokens=args.new_tokens))
                    print(f"{method}: runs ({quant.model.layers[0].qkv_proj.kernel}), {len(o.token_ids)} tokens")
                except ValueError as refusal:
                    print(f"{method}: refused: {refusal}")
    print(f"{time.perf_counter() - t0:.0f} s")
    for f in failures:
        print("MISMATCH", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
