"""The prepared GPU checks (issues #4, #5, #11, #15), in one call, most important first.

Each section saves its own JSON (hardware, versions, date, command) under $OUT as soon as it
finishes, so a run cut short by the device's time limit still returns what it measured.
A section that fails is recorded with its error and the next one runs.

    PYTHONPATH=src python3 scripts/gpu_checks.py --out $OUT                 # all sections
    PYTHONPATH=src python3 scripts/gpu_checks.py --out /tmp/x --only decode1 --smoke   # CPU dry run

Sections:
  chapters    every chapter module at its quick size for this device, with this model (on a GPU the
              learner's default: mistral-7b, random bf16 weights, no tokenizer): ok / error, seconds,
              summary; saved after each chapter. --chapters picks some (e.g. --chapters 12 13)
  decode1     batch-1 decode, Mistral-7B shape bf16, every decode path (target >= 205 tok/s)
  throughput  256 requests x (512 in / 128 out), CUDA graphs (target >= 70% of throughput_bound)
  hf          the HF transformers baseline re-measured with the course's harness (chapter 02):
              TTFT and ITL vs context, decode step vs batch (the saved anchor's shape is suspect)
  spec        n-gram speculation at batch 1 vs the same engine without it (issue #11)
  kvquant     int8 / fp8 KV blocks: bytes per token, tok/s at 64 x 512/128 (issue #15)
  sweep       decode step predicted (roofline) vs measured, batch 1..256
  attention   SDPA backends vs sequence length; decode attention time vs KV heads (roofline)
  quant       bnb int8 / nf4 (when bitsandbytes imports), fp8 and int4 on the 7B shape
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import traceback
from pathlib import Path

SECTIONS = ("chapters", "decode1", "throughput", "hf", "spec", "kvquant", "sweep", "attention", "quant")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the JSON results")
    p.add_argument("--model", default="mistral-7b")
    p.add_argument("--only", nargs="*", choices=SECTIONS, help="run only these sections")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the embedded model (CPU)")
    p.add_argument("--budget-s", type=float, default=480, help="skip sections after this time")
    p.add_argument("--chapters", nargs="*", help="chapter numbers for the chapters section (default: all)")
    args = p.parse_args()

    import torch

    from infer_lab.hardware import measure_ceilings
    from infer_lab.harness import env_metadata
    from infer_lab.models import load_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    model = "smollm2-135m" if args.smoke else args.model
    weights = "pretrained" if args.smoke else "random"
    print(f"[gpu_checks] loading {model} ({weights}) on {device}", flush=True)
    lm = load_model(model, weights=weights, device=device, dtype=None if args.smoke else "bf16")
    ceilings = measure_ceilings(lm.device, quick=args.smoke)
    command = "python3 scripts/gpu_checks.py " + " ".join(sys.argv[1:])
    stamp = time.strftime("%Y-%m-%d", time.gmtime())
    small = args.smoke

    def save(name: str, payload: dict) -> None:
        payload.update(
            environment=env_metadata(lm),
            ceilings=ceilings.as_dict(),
            command=command,
        )
        path = out / f"{name}-{lm.name}-{device}-{stamp}.json"
        path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
        print(f"[gpu_checks] wrote {path} ({time.perf_counter() - t_start:.0f} s)", flush=True)

    def chapters() -> dict:
        """Every chapter through the tour's own runner, as a learner on this device gets it."""
        from infer_lab.course import chapters as course_chapters
        from infer_lab.course.tour import TourContext, run_chapter

        ctx = TourContext(out_dir=out / "chapters", quick=True, model=model, weights=weights, device=device)
        ctx.out_dir.mkdir(parents=True, exist_ok=True)
        ctx._lm = lm
        done: dict = {}
        for mod in course_chapters(args.chapters or None):
            if time.perf_counter() - t_start > args.budget_s:
                done[mod.NUMBER] = {"ok": None, "skipped": f"past the {args.budget_s:.0f} s budget"}
                continue
            run = run_chapter(mod, ctx)
            done[mod.NUMBER] = {"ok": run.ok, "seconds": run.seconds, "error": run.error,
                                "traceback": run.traceback, "report": run.markdown}
            print(f"  {mod.NUMBER}: {'ok' if run.ok else 'FAILED ' + str(run.error)} in {run.seconds:.1f} s",
                  flush=True)
            save("chapters-partial", {"chapters": done})
        failed = [n for n, r in done.items() if r["ok"] is False]
        if failed:
            raise RuntimeError(f"chapters failed: {failed} (each one's traceback is in chapters-partial)")
        return {"chapters": done}

    def decode1() -> dict:
        from infer_lab.bench.engine import run_engine_benchmark

        rows = []
        fast = "cuda-graphs" if device == "cuda" else "static"
        # (decode path, fused projections, torch.compile): most informative first.
        variants = [
            (fast, True, False),
            (fast, True, True),
            (fast, False, False),
            ("static", True, False),
            ("batched", True, False),
            ("per-sequence", False, False),
        ]
        for path, fuse, compiled in variants:
            r = run_engine_benchmark(
                lm,
                requests=1,
                max_num_seqs=1,
                prompt_len=16 if small else 512,
                output_len=8 if small else 256,
                decode_path=path,
                fuse_projections=fuse,
                compile_layers=compiled,
            )
            itl_p50 = r.run.itl_ms.p50
            rows.append({**r.as_json(), "itl_tokens_per_s": 1e3 / itl_p50})
            print(
                f"  batch 1 {path:12s} fused={fuse} compiled={compiled}: ITL p50 "
                f"{itl_p50:.2f} ms = {1e3 / itl_p50:.1f} tok/s",
                flush=True,
            )
        roofline = ceilings.bandwidth_Bps / lm.weight_bytes
        return {"rows": rows, "weight_roofline_tokens_per_s": roofline, "target_tokens_per_s": 205}

    def throughput() -> dict:
        from infer_lab.analysis.compare import dtype_name, shape_of
        from infer_lab.analysis.roofline import gpu_roof, measured_roof
        from infer_lab.bench.engine import run_engine_benchmark
        from infer_lab.bench.predicted import throughput_bound

        n, prompt, output = (16, 16, 8) if small else (256, 512, 128)
        r = run_engine_benchmark(
            lm, requests=n, max_num_seqs=n, prompt_len=prompt, output_len=output, decode_path="auto"
        )
        shape, dtype = shape_of(lm), dtype_name(lm)
        bounds = [throughput_bound(shape, measured_roof(ceilings), n, prompt, output, dtype)]
        if device == "cuda":
            try:
                from infer_lab.hardware import detect

                roof = gpu_roof(detect().catalog_name)
                bounds.append(throughput_bound(shape, roof, n, prompt, output, dtype))
            except Exception as exc:  # a GPU missing from the catalog has no datasheet roof
                print(f"  no datasheet roof: {exc}", flush=True)
        print(
            f"  {n} x {prompt}/{output}: {r.output_tokens_per_s:.0f} output tok/s (target 10,000); "
            + "; ".join(f"bound on {b['roof']}: {b['output_tokens_per_s']:.0f}" for b in bounds),
            flush=True,
        )
        measured_bound = bounds[0]["output_tokens_per_s"]
        print(f"  {r.output_tokens_per_s / measured_bound:.0%} of the bound on the measured ceilings "
              "(target >= 70%)", flush=True)
        return {"result": r.as_json(), "target_fraction_of_bound": 0.70, "roofline_bounds": bounds}

    def hf() -> dict:
        from infer_lab.course import chapter

        ch02 = chapter("02")
        sizes = ch02.sizes(lm.device, "quick")
        result = ch02.measure(lm, sizes, parts=["ttft", "itl"])
        for p in result.ttft:
            print(f"  TTFT {p.prompt_len:6d} tokens: p50 {p.p50_s * 1e3:.1f} ms", flush=True)
        for p in result.itl:
            print(f"  step ctx {p.context:6d} batch {p.batch:4d}: p50 {p.p50_s * 1e3:.2f} ms", flush=True)
        import dataclasses

        return {"sizes": dataclasses.asdict(sizes), "result": dataclasses.asdict(result)}

    def spec() -> dict:
        from infer_lab.bench.engine import engine_config, timed_engine_run, warm_up_engine

        prompt = lm.random_ids(1, 16 if small else 512, seed=3)[0].tolist()
        lens = [8 if small else 256]
        rows = []
        for proposer in (None, "ngram", "ngram", None):  # interleaved: plain, spec, spec, plain
            config = engine_config(len(prompt) + lens[0] + 8, decode_path="auto", max_num_seqs=1)
            if proposer:
                import dataclasses as dc

                config = dc.replace(config, speculative=proposer, num_speculative_tokens=4)
            warm_up_engine(lm, config)
            run, outs = timed_engine_run(lm, config, [prompt], lens)
            r = {**run.as_json(), "proposer": proposer, "target_passes": outs[0].target_passes,
                 "accepted": outs[0].accepted_tokens, "proposed": outs[0].proposed_tokens, "tokens": outs[0].token_ids}
            rows.append(r)
            print(f"  {proposer or 'plain':6s}: {r['output_tokens_per_s']:.1f} tok/s, "
                  f"{len(outs[0].token_ids) / outs[0].target_passes:.2f} tokens per pass", flush=True)
        plain = sorted(r["output_tokens_per_s"] for r in rows if not r["proposer"])
        fast = sorted(r["output_tokens_per_s"] for r in rows if r["proposer"])
        return {"rows": rows, "speedup": fast[-1] / plain[-1],
                "identical": rows[0]["tokens"] == rows[1]["tokens"]}

    def kvquant() -> dict:
        from infer_lab.bench.engine import run_engine_benchmark

        n, prompt, output = (4, 16, 8) if small else (64, 512, 128)
        rows = []
        for kv_dtype in (None, "int8", "fp8"):
            r = run_engine_benchmark(lm, requests=n, max_num_seqs=n, prompt_len=prompt, output_len=output,
                                     decode_path="batched", kv_dtype=kv_dtype)
            rows.append({"kv_dtype": kv_dtype or "bf16", "result": r.as_json()})
            print(f"  KV {kv_dtype or 'model dtype':11s}: {r.output_tokens_per_s:.0f} tok/s", flush=True)
        return {"rows": rows}

    def sweep() -> dict:
        from infer_lab.bench.predicted import decode_step_predicted_vs_measured

        rows = decode_step_predicted_vs_measured(
            lm,
            batches=(1, 2, 4) if small else None,
            prompt_len=16 if small else 512,
            decode_steps=4 if small else 16,
            quick=small,
        )
        for r in rows:
            print(
                f"  batch {r['batch']:4d}: predicted {r['predicted_ms']:.2f} ms, "
                f"measured {r['measured_ms']:.2f} ms ({r['measured_over_predicted']:.2f}x)",
                flush=True,
            )
        return {"rows": rows}

    def attention() -> dict:
        from infer_lab.bench.attention import decode_attention_vs_kv_heads, sdpa_backend_times

        lens = [256, 1024] if small else [1024, 4096, 16384, 32768]
        backends = sdpa_backend_times(lens, device=device, heads=8 if small else 32, repeats=3)
        kv = decode_attention_vs_kv_heads(
            1024 if small else 32768,
            device=device,
            bandwidth_Bps=ceilings.bandwidth_Bps,
            batch=1 if small else 8,
        )
        return {"sdpa_backends": [dataclasses.asdict(r) for r in backends],
                "decode_vs_kv_heads": [dataclasses.asdict(r) for r in kv]}

    def quant() -> dict:
        import importlib.util

        from infer_lab.quant.comparison import compare_methods

        methods = ["int8", "int4-g128", "fp8"]
        if device == "cuda" and importlib.util.find_spec("bitsandbytes"):
            methods += ["bnb-int8", "bnb-nf4"]
        result = compare_methods(
            lm,
            methods,
            evaluate=small,
            new_tokens=8 if small else 32,
            repeats=1 if small else 3,
            layer_stats=False,
            log=lambda m: print("  " + m, flush=True),
        )
        return {"result": result, "bitsandbytes": "bnb-int8" in methods}

    chosen = args.only or list(SECTIONS)
    failed = 0
    for name in chosen:
        if time.perf_counter() - t_start > args.budget_s:
            print(
                f"[gpu_checks] skipping {name}: past the {args.budget_s:.0f} s budget", flush=True
            )
            continue
        print(f"[gpu_checks] {name}", flush=True)
        t0 = time.perf_counter()
        try:
            payload = locals()[name]()
            payload["section_seconds"] = time.perf_counter() - t0
            save(name, payload)
        except Exception as exc:  # one failing section must not lose the others
            failed += 1
            traceback.print_exc()
            save(
                name, {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            )
        if device == "cuda":
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
