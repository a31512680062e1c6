"""infer-lab roofline: predicted prefill and decode on a GPU's roofline."""

from __future__ import annotations

import json

from ..analysis.memory import as_shape
from ..analysis.roofline import decode_ops, gpu_roof, measured_roof, predict, prefill_ops, shard_ops
from ._args import context_warnings

NAME = "roofline"
ORDER = 22
HELP = "predicted TTFT, ITL, tokens/s and per-op FLOPs/bytes on a GPU's roofline"
DESCRIPTION = """\
Each op (projections, attention, MLP, LM head) takes max(FLOPs / peak, bytes / bandwidth);
a step takes the sum. Prefill is compute-bound, decode memory-bound; the critical batch is
where a decode step would become compute-bound. With --gpus N the model is tensor parallel:
each op's work is split over N GPUs, and every step adds 2 x layers ring all-reduces of
(tokens x hidden x 2 B) on the GPU's interconnect (NVLink, PCIe...: infer-lab capacity
--help), so N GPUs are not N times faster.

  infer-lab roofline --model mistral-7b --gpu H100-SXM --batch 1 --context 4096
  infer-lab roofline --model llama-3-70b --gpu H200 --gpus 2 --batch 32 --json
  infer-lab roofline --model smollm2-135m --gpu measured     this machine's measured ceilings
"""


def add_arguments(p) -> None:
    p.add_argument("--model", default="mistral-7b", help="catalog name or path to a config.json")
    p.add_argument(
        "--gpu", default="H100-SXM", help="catalog GPU name, or 'measured' for this machine"
    )
    p.add_argument(
        "--gpus", type=int, default=1, help="GPUs (tensor parallel, all-reduces included)"
    )
    p.add_argument(
        "--link",
        default=None,
        help="catalog interconnect instead of the GPU's own (e.g. pcie5-x16)",
    )
    p.add_argument("--batch", type=int, default=1, help="concurrent sequences in a decode step")
    p.add_argument(
        "--context", type=int, default=4096, help="tokens per sequence (decode attends this many)"
    )
    p.add_argument(
        "--prompt", type=int, default=None, help="prompt tokens for the TTFT (default: --context)"
    )
    p.add_argument(
        "--weight-dtype", default="bf16", help="fp32, bf16, fp16, fp8, int8, int4, nf4, mxfp4"
    )
    p.add_argument("--kv-dtype", default="bf16", choices=["fp32", "bf16", "fp16", "fp8", "int8"])
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def run(args) -> int:
    if args.gpu == "measured":
        from ..hardware import measure_ceilings  # defers torch (hardware)

        if args.gpus != 1:
            raise ValueError("--gpu measured is this machine's one device: --gpus must be 1")
        roof = measured_roof(measure_ceilings(quick=True))
    else:
        roof = gpu_roof(args.gpu, n_gpus=args.gpus, link=args.link)
    kw = dict(weight_dtype=args.weight_dtype, kv_dtype=args.kv_dtype)
    warnings = context_warnings(args.model, args.context)
    pred = predict(
        args.model, roof, batch=args.batch, context=args.context, prompt_tokens=args.prompt, **kw
    )
    shape = as_shape(args.model)
    pre_ops = [
        o.row(roof)
        for o in shard_ops(prefill_ops(shape, 1, pred.prompt_tokens, **kw), shape, roof.tp)
    ]
    dec_ops = [
        o.row(roof)
        for o in shard_ops(decode_ops(shape, args.batch, args.context, **kw), shape, roof.tp)
    ]
    if args.json:
        out = pred.as_dict()
        out.update(prefill_ops=pre_ops, decode_ops=dec_ops)
        out["warnings"] = warnings
        print(json.dumps(out, indent=1))
        return 0
    print(
        f"{pred.model} on {roof.name} ({roof.source}): {roof.peak_flops / 1e12:.0f} TFLOP/s, "
        f"{roof.bandwidth_Bps / 1e12:.2f} TB/s, ridge {roof.ridge_point:.0f} FLOP/B"
    )
    for title, ops in (
        (f"prefill, 1 x {pred.prompt_tokens} tokens", pre_ops),
        (f"decode step, batch {args.batch} at {args.context} tokens", dec_ops),
    ):
        print(f"\n{title}")
        print(f"  {'op':36s} {'GFLOP':>10s} {'MB':>10s} {'FLOP/B':>8s} {'ms':>8s}  bound")
        for o in ops:
            print(
                f"  {o['name']:36s} {o['flops'] / 1e9:10.2f} {o['bytes'] / 1e6:10.1f} {o['intensity']:8.1f} "
                f"{o['time_s'] * 1e3:8.3f}  {o['bound']}"
            )
    if roof.tp > 1:
        print(
            f"\nall-reduces ({roof.link.name}): {pred.decode.allreduce_count} per step; decode "
            f"{pred.decode.allreduce_s * 1e3:.2f} ms of the {pred.itl_s * 1e3:.2f} ms ITL, prefill "
            f"{pred.prefill.allreduce_s * 1e3:.2f} ms of the {pred.ttft_s * 1e3:.2f} ms TTFT"
        )
    cb = pred.critical_batch
    print(
        f"\nTTFT {pred.ttft_s * 1e3:.2f} ms | ITL {pred.itl_s * 1e3:.2f} ms | {pred.tokens_per_s:,.0f} tok/s "
        f"({pred.tokens_per_s_per_user:.0f} per user) | critical batch "
        f"{cb if cb else 'none (decode stays memory-bound at this context)'}"
    )
    return 0
