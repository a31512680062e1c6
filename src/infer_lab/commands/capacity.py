"""infer-lab capacity: what fits, how fast and at what cost, per GPU."""

from __future__ import annotations

import json

from ..analysis.capacity import (
    PRESETS,
    cheapest,
    compare_gpus,
    get_preset,
    plan,
    plan_layouts,
    price_vs_cost,
    recommend,
)
from ..units import fmt_bytes
from ._args import context_warnings

NAME = "capacity"
ORDER = 24
HELP = "capacity planner: users, ITL/TTFT, tokens/s and $ per million tokens per GPU"
DESCRIPTION = """\
GPU memory = weights + overhead + KV; max users = KV budget / KV per user; ITL and TTFT
from the roofline; $ per million tokens = $/hour / tokens per hour. Without --gpu every
catalog GPU is compared (each at the smallest count of 1/2/4/8 whose best layout meets the
SLOs), best first. Predictions are roofline bounds: real engines reach a fraction of them.

More than one GPU is a layout: TP (tensor parallel: every layer split, two all-reduces per
layer on the GPU's NVLink or PCIe, so N GPUs are less than N times faster), DP (replicas: no
traffic per token, but each holds the whole model) or PP (pipeline stages, --pipeline).
With --gpus N every TP x DP split of N is listed, best first; --parallelism forces one.
With --gpu the planner also recommends how many GPUs (1/2/4/8) and which layout.

  infer-lab capacity --model mistral-7b --context 4096 --itl-slo-ms 50
  infer-lab capacity --model llama-3-70b --gpu H200 --gpus 2 --context 8192 --users 32
  infer-lab capacity --model llama-3-8b --gpu H100-PCIe --gpus 4 --itl-slo-ms 50   TP4 vs TP2xDP2 vs DP4
  infer-lab capacity --model llama-3-70b --gpu H100-SXM --gpus 8 --parallelism tp4xdp2
  infer-lab capacity --model llama-3-8b --preset premium-chat --json
"""


def add_arguments(p) -> None:
    p.add_argument("--model", default="mistral-7b", help="catalog name or path to a config.json")
    p.add_argument("--gpu", default=None, help="catalog GPU name (default: compare all)")
    p.add_argument(
        "--gpus", type=int, default=None, help="GPUs of that type (default 1; with no --gpu: auto)"
    )
    p.add_argument(
        "--preset", choices=list(PRESETS), help="a workload preset (flags below override it)"
    )
    p.add_argument(
        "--weight-dtype",
        default=None,
        help="fp32, bf16, fp16, fp8, int8, int4, nf4, mxfp4 (default bf16)",
    )
    p.add_argument("--kv-dtype", default=None, choices=["fp32", "bf16", "fp16", "fp8", "int8"])
    p.add_argument("--context", type=int, default=None, help="tokens per sequence (default 4096)")
    p.add_argument(
        "--prompt", type=int, default=None, help="prompt tokens for the TTFT (default: --context)"
    )
    p.add_argument(
        "--users",
        type=int,
        default=None,
        help="concurrent users (default: the most within the SLO)",
    )
    p.add_argument(
        "--target-tokens-per-s",
        type=float,
        default=None,
        help="throughput to reach instead of --users",
    )
    p.add_argument("--itl-slo-ms", type=float, default=None)
    p.add_argument("--ttft-slo-ms", type=float, default=None)
    p.add_argument(
        "--min-users", type=int, default=None, help="fewer users than this misses the SLO"
    )
    p.add_argument(
        "--memory-fraction", type=float, default=0.9, help="share of GPU memory the server may use"
    )
    p.add_argument(
        "--price-usd-per-hour", type=float, default=None, help="your price per GPU-hour (one --gpu)"
    )
    p.add_argument(
        "--parallelism",
        default=None,
        help="force one layout: tp4, tp2xdp2, dp4, tp8xpp2 (needs --gpu)",
    )
    p.add_argument(
        "--pipeline", action="store_true", help="also consider pipeline-parallel layouts"
    )
    p.add_argument(
        "--link",
        default=None,
        help="catalog interconnect instead of the GPU's own (e.g. pcie5-x16)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def run(args) -> int:
    kwargs = dict(
        context=4096,
        prompt_tokens=None,
        itl_slo_ms=None,
        ttft_slo_ms=None,
        weight_dtype="bf16",
        kv_dtype="bf16",
        min_users=1,
    )
    if args.preset:
        work = get_preset(args.preset)
        kwargs.update(
            context=work.context,
            prompt_tokens=work.prompt_tokens,
            itl_slo_ms=work.itl_slo_ms,
            ttft_slo_ms=work.ttft_slo_ms,
            weight_dtype=work.weight_dtype,
            kv_dtype=work.kv_dtype,
            min_users=work.min_users,
        )
    for flag, key in (
        ("context", "context"),
        ("prompt", "prompt_tokens"),
        ("itl_slo_ms", "itl_slo_ms"),
        ("ttft_slo_ms", "ttft_slo_ms"),
        ("weight_dtype", "weight_dtype"),
        ("kv_dtype", "kv_dtype"),
        ("min_users", "min_users"),
    ):
        if getattr(args, flag) is not None:
            kwargs[key] = getattr(args, flag)
    kwargs.update(
        users=args.users,
        target_tokens_per_s=args.target_tokens_per_s,
        memory_fraction=args.memory_fraction,
    )
    if args.link:
        kwargs["link"] = args.link
    rec = None
    if args.gpu:
        n = 1 if args.gpus is None else args.gpus
        if args.parallelism:
            plans = [
                plan(
                    args.model,
                    args.gpu,
                    n,
                    parallelism=args.parallelism,
                    price_usd_per_hour=args.price_usd_per_hour,
                    **kwargs,
                )
            ]
        else:
            plans = plan_layouts(
                args.model,
                args.gpu,
                n,
                pipeline=args.pipeline,
                price_usd_per_hour=args.price_usd_per_hour,
                **kwargs,
            )
        rec = recommend(
            args.model,
            args.gpu,
            pipeline=args.pipeline,
            price_usd_per_hour=args.price_usd_per_hour,
            **kwargs,
        )
    else:
        if args.price_usd_per_hour is not None:
            raise ValueError(
                "--price-usd-per-hour needs one --gpu (each catalog GPU has its own price)"
            )
        if args.parallelism:
            raise ValueError("--parallelism needs one --gpu (and --gpus to match it)")
        plans = compare_gpus(args.model, n_gpus=args.gpus, pipeline=args.pipeline, **kwargs)
    best = cheapest(plans)
    paradox = price_vs_cost(plans)
    warnings = context_warnings(args.model, kwargs.get("context"))
    if args.json:
        print(
            json.dumps(
                {
                    "inputs": {
                        "model": args.model,
                        "gpu": args.gpu,
                        "preset": args.preset,
                        **kwargs,
                    },
                    "plans": [p.as_dict() for p in plans],
                    "cheapest_meeting_slo": f"{best.n_gpus}x {best.gpu}" if best else None,
                    "cheapest_parallelism": best.parallelism if best else None,
                    "price_vs_cost": paradox,
                    "recommended": rec.as_dict() if rec else None,
                    "warnings": warnings,
                },
                indent=1,
            )
        )
        return 0
    p0 = plans[0]
    slo = (
        ", ".join(
            f"{k} {v:g} ms"
            for k, v in (("ITL SLO", kwargs["itl_slo_ms"]), ("TTFT SLO", kwargs["ttft_slo_ms"]))
            if v
        )
        or "no latency SLO"
    )
    print(
        f"{p0.model}: weights {p0.weight_dtype}, KV {p0.kv_dtype}, context {p0.context:,}, prompt "
        f"{p0.prompt_tokens:,}, {slo}; roofline bounds, catalog prices"
    )
    print(
        f"{'GPU':>28s} {'layout':>10s} {'fits':>5s} {'users':>6s} {'ITL ms':>8s} {'AR ms':>6s} {'TTFT ms':>8s} "
        f"{'tok/s':>9s} {'$/h':>7s} {'$/M out':>8s} {'$/M in':>8s}  verdict"
    )
    for p in plans:
        label = f"{p.n_gpus}x {p.gpu}"
        if p.itl_ms is None:
            print(
                f"{label:>28s} {p.parallelism:>10s} {'no':>5s}  short by {fmt_bytes(p.fit.shortfall_bytes)}"
            )
            continue
        verdict = "meets SLO" if p.meets_slo else p.why_not
        print(
            f"{label:>28s} {p.parallelism:>10s} {'yes' if p.fits else 'no':>5s} {p.users:6d} {p.itl_ms:8.1f} "
            f"{p.allreduce_ms_per_step:6.2f} {p.ttft_ms:8.0f} {p.tokens_per_s:9,.0f} {p.usd_per_hour:7.2f} "
            f"{p.usd_per_m_output_tokens:8.3f} {p.usd_per_m_input_tokens:8.3f}  {verdict}"
        )
    print(
        "AR ms: the tensor-parallel all-reduces inside one decode step (2 per layer), part of the ITL"
    )
    if best:
        print(
            f"\ncheapest meeting the SLOs: {best.n_gpus}x {best.gpu} as {best.parallelism} at "
            f"${best.usd_per_m_output_tokens:.3f} per M output tokens"
        )
    elif not any(p.fits for p in plans):
        short = min(plans, key=lambda p: p.fit.shortfall_bytes)
        print(f"\n{p0.model} does not fit: even {short.n_gpus}x {short.gpu} is short by "
              f"{fmt_bytes(short.fit.shortfall_bytes)} for weights + KV at this context and these users "
              "(add GPUs, lower --context or --users, or quantize the weights)")
    else:
        print("\nno configuration meets the SLOs")
    if rec:
        if rec.plan:
            print(f"recommended: {rec.n_gpus}x {rec.gpu} as {rec.parallelism} ({rec.reason})")
        else:
            print(f"recommended: none ({rec.reason})")
    if paradox and paradox["expensive_gpu_wins"]:
        print(
            f"the cheapest per hour ({paradox['cheapest_per_hour']}, ${paradox['cheapest_per_hour_usd_per_hour']:.2f}/h) "
            f"costs {paradox['cost_per_token_ratio']:.1f}x more per token than {paradox['cheapest_per_token']} "
            f"(${paradox['cheapest_per_token_usd_per_hour']:.2f}/h)"
        )
    return 0
