"""infer-lab cluster: simulate a serving cluster, colocated vs prefill/decode disaggregated."""

from __future__ import annotations

import json

from ..cluster import report
from ..cluster.workloads import WORKLOADS, describe_trace

NAME = "cluster"
ORDER = 26
HELP = "simulate a GPU cluster: colocated vs disaggregated prefill/decode, TTFT/ITL tails, goodput"
DESCRIPTION = """\
A discrete-event simulation of serving one model on a cluster of catalog GPUs. Requests
arrive (Poisson) with the token lengths of a workload; each engine instance runs continuous
batching; every step costs what the roofline predicts for it on that GPU (TP groups pay their
all-reduces). Nothing runs on a GPU: this is the model, so it works on a laptop.

Three ways to serve the same GPUs:
  colocated            each instance prefills and decodes; a new prompt is prefilled in one
                       step and the running decodes wait for it (the ITL spikes)
  colocated, chunked   prompts are cut into chunks that ride along with the decode steps
  disaggregated P:D    P instances only prefill, D only decode; the KV cache of each prompt
                       (prompt tokens x KV bytes per token) moves over --kv-link

What to look for (vLLM's own docs say it): disaggregation does not raise throughput, but it
removes prefill from the decode steps, so the tail ITL drops, and TTFT (P) and ITL (D) can be
sized separately. Summarization is prefill-heavy, story writing decode-heavy: the best P:D
differs.

Workloads (mean prompt / output tokens, +-spread): summarize 6000/200, story 200/1200,
chat 1200/300. The arrival rate defaults to --load x a rough capacity estimate of the
colocated cluster. TTFT = first token - arrival; ITL = every gap between two tokens (pooled);
TPOT = a request's mean gap; goodput = requests/s meeting both --ttft-slo-ms and
--tpot-slo-ms, per GPU.

  infer-lab cluster --workload summarize --gpus 8 --disaggregated 4:4
  infer-lab cluster --workload story --gpus 8 --disaggregated best          sweep every P:D
  infer-lab cluster --workload chat --gpu H100-SXM --decode-gpu H200 --disaggregated 3:5
  infer-lab cluster --workload summarize --gpus 8 --tp 2 --disaggregated 2:2 --json
  infer-lab cluster --workload chat --gpus 8 --disaggregated best --saturation
"""


def add_arguments(p) -> None:
    p.add_argument("--workload", choices=list(WORKLOADS), default="chat")
    p.add_argument("--model", default="llama-3-8b", help="catalog name or config.json path")
    p.add_argument(
        "--gpu", default="H100-SXM", help="catalog GPU (the prefill GPU when --decode-gpu differs)"
    )
    p.add_argument("--decode-gpu", default=None, help="decode instances on this GPU type instead")
    p.add_argument("--gpus", type=int, default=8, help="GPUs in the cluster (default 8)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size of every instance")
    p.add_argument(
        "--disaggregated",
        default=None,
        metavar="P:D",
        help="also run P prefill + D decode instances (P + D = gpus / tp), or 'best' to sweep",
    )
    p.add_argument("--requests", type=int, default=300, help="requests in the trace")
    p.add_argument(
        "--load", type=float, default=0.7, help="arrival rate as a share of rough capacity"
    )
    p.add_argument(
        "--rate", type=float, default=None, help="arrival rate in requests/s (overrides --load)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ttft-slo-ms", type=float, default=2000.0)
    p.add_argument("--tpot-slo-ms", type=float, default=50.0)
    p.add_argument(
        "--kv-link",
        default=None,
        help="catalog interconnect for KV (default: NVLink in one box, else IB NDR)",
    )
    p.add_argument(
        "--saturation",
        action="store_true",
        help="also push the trace far past capacity: throughput ceilings, colocated vs best P:D",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def run(args) -> int:
    from ..cluster import scenarios  # defers 2 ms (its own code) off --help

    if args.gpus % args.tp:
        raise ValueError(f"--gpus {args.gpus} does not split into TP{args.tp} instances")
    instances = args.gpus // args.tp
    slo = report.SLO(args.ttft_slo_ms, args.tpot_slo_ms)
    trace = scenarios.trace_for(
        args.model,
        args.workload,
        args.gpu,
        args.gpus,
        args.requests,
        args.load,
        args.rate,
        args.seed,
        args.tp,
    )
    plain = report.summarize(
        scenarios.run_colocated(args.model, trace, args.gpu, args.gpus, args.tp, False), slo
    )
    chunked = report.summarize(
        scenarios.run_colocated(args.model, trace, args.gpu, args.gpus, args.tp, True), slo
    )
    reports, splits, best = [plain, chunked], [], None
    if args.disaggregated:
        if args.disaggregated == "best":
            ratios = [(p, instances - p) for p in range(1, instances)]
        else:
            ratios = [scenarios.parse_ratio(args.disaggregated)]
            if sum(ratios[0]) != instances:
                raise ValueError(
                    f"P:D = {args.disaggregated} must add up to {instances} instances (--gpus / --tp)"
                )
        if instances < 2:
            raise ValueError("disaggregation needs at least two instances")
        for pre, dec in ratios:
            res = scenarios.run_disaggregated(
                args.model,
                trace,
                pre,
                dec,
                args.gpu,
                args.decode_gpu,
                args.tp,
                args.tp,
                kv_link=args.kv_link,
            )
            splits.append(report.summarize(res, slo))
        best = max(
            splits, key=lambda r: (r.goodput_rps_per_gpu, r.slo_attainment, -(r.itl_ms.p99 if r.itl_ms else 0))
        )
        reports += splits
    sat = None
    if args.saturation:
        if instances < 2:
            raise ValueError(
                "--saturation compares with disaggregation: it needs at least two instances"
            )
        sat = scenarios.saturation(
            args.model, args.workload, args.gpu, args.gpus, seed=args.seed, tp=args.tp
        )
    tail = {
        "colocated_itl_ms_p99": plain.itl_ms.p99 if plain.itl_ms else None,
        "chunked_itl_ms_p99": chunked.itl_ms.p99 if chunked.itl_ms else None,
        "disaggregated_itl_ms_p99": best.itl_ms.p99 if best and best.itl_ms else None,
    }
    if args.json:
        out = {
            "inputs": {k: v for k, v in vars(args).items() if not k.startswith("_")},
            "trace": describe_trace(trace),
            "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms},
            "reports": [r.as_dict() for r in reports],
            "best_pd_ratio": best.layout if best else None,
            "tail_itl": tail,
        }
        if sat:
            out["saturation"] = {
                k: (v.as_dict() if hasattr(v, "as_dict") else v)
                for k, v in sat.items()
                if k != "disaggregated"
            }
        print(json.dumps(out, indent=1))
        return 0
    info = describe_trace(trace)
    print(
        f"{args.model}, workload {args.workload}: {info['requests']} requests at {info['mean_rate_per_s']:.2f}/s, "
        f"mean {info['mean_prompt_tokens']:.0f} prompt / {info['mean_output_tokens']:.0f} output tokens; "
        f"SLO TTFT {slo.ttft_ms:g} ms, TPOT {slo.tpot_ms:g} ms; roofline step costs (simulated, not measured)"
    )
    print(report.table(reports))
    if best:
        print(f"\nbest P:D by goodput per GPU: {best.layout}")
        print(
            f"tail ITL p99: colocated {plain.itl_ms.p99:.1f} ms, chunked prefill {chunked.itl_ms.p99:.1f} ms, "
            f"disaggregated {best.itl_ms.p99:.1f} ms"
        )
    if sat:
        print(
            f"\nthroughput ceiling (arrivals far past capacity): colocated "
            f"{sat['colocated'].output_tokens_per_s_per_gpu:,.0f}, chunked "
            f"{sat['colocated_chunked'].output_tokens_per_s_per_gpu:,.0f}, best split "
            f"{sat['best_disaggregated'].layout} {sat['best_disaggregated'].output_tokens_per_s_per_gpu:,.0f} "
            "output tok/s per GPU"
        )
    return 0
