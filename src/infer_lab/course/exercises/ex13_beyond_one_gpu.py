"""Chapter 13's exercises: the ring all-reduce term, a TP step's all-reduces, and KV copies under TP."""

from __future__ import annotations

from ...analysis.memory import kv_bytes_per_element
from ...analysis.parallel import allreduce_cost, kv_replication, tp_allreduces
from ...catalog import get_interconnect
from ...shape import model_shape
from . import Exercise
from .checking import Mistake, factor_of_2

NUMBER = "13"
SLUG = "beyond_one_gpu"
TITLE = "13 · Beyond one GPU"

RING_CASES = (("nvlink4-nvswitch", 8, 1_000_000_000), ("nvlink4-nvswitch", 8, 262_144), ("nvlink4-nvswitch", 2, 64 << 20),
              ("pcie4-x16", 4, 16 << 20), ("nvlink3-nvswitch", 4, 8_192), ("infiniband-ndr400", 16, 512 << 20),
              ("nvlink4-nvswitch", 1, 1 << 20))


def check_ring(fns, r) -> None:
    for link_name, n, size in RING_CASES:
        link = get_interconnect(link_name)
        busbw = link.bus_bandwidth_Bps(n)
        case = (f"{n} ranks on {link_name}, {size:,} B each: bus bandwidth {busbw / 1e9:g} GB/s, hop "
                f"{link.hop_latency_s * 1e6:g} us, launch {link.base_latency_s * 1e6:g} us")
        got = r.call(fns.ring_allreduce_s, n, size, busbw, link.hop_latency_s, link.base_latency_s, case=case)
        cost = allreduce_cost(n, size, link)
        wrong = None
        if n > 1:
            wrong = {"S / B: each rank sends 2(N-1)/N x S over the ring, not S": cost.base_s + cost.latency_s
                     + size / busbw,
                     "the bandwidth term alone: every step of the ring also pays a hop's latency, and the "
                     "collective its launch": cost.bandwidth_s,
                     "(N-1) steps: a ring all-reduce is a reduce-scatter AND an all-gather, 2(N-1) steps":
                     cost.base_s + cost.latency_s / 2 + cost.bandwidth_s / 2,
                     "the bidirectional bandwidth: a rank sends and receives at once, so the per-direction "
                     "(bus) bandwidth is the ceiling": cost.base_s + cost.latency_s + cost.bandwidth_s / 2}
        if n == 1:
            r.close(case, got, 0.0, abs_tol=1e-15, unit="s", hint="one rank has nothing to reduce: 0 s")
            continue
        r.close(case, got, cost.total_s, rel_tol=1e-9, unit="s", wrong=wrong)


TP_CASES = (("llama-3-70b", 8, 16, "bf16"), ("llama-3-70b", 4, 1, "bf16"), ("mistral-7b", 2, 64, "fp32"),
            ("qwen2.5-7b", 4, 8, "bf16"))


def check_tp_allreduces(fns, r) -> None:
    for model, tp, batch, dtype in TP_CASES:
        s = model_shape(model)
        comm = tp_allreduces(s, tp, batch, "nvlink4-nvswitch", dtype)
        case = f"{model} at TP{tp}: {s.layers} layers, hidden {s.hidden}, decode batch {batch}, {dtype} activations"
        got = r.call(fns.tp_decode_allreduces, s.layers, s.hidden, batch, kv_bytes_per_element(dtype), case=case)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            r.record(case, False, f"return (count, bytes each), got {got!r:.60}")
            continue
        r.close(case + ": all-reduces per step", got[0], comm.count,
                mistakes=[Mistake(0.5, "half of them: each layer all-reduces twice, after attention AND after the MLP")])
        mistakes = factor_of_2()
        if batch > 1:
            mistakes.append(Mistake(1 / batch, f"off by the batch ({batch}): every token of the step has its own "
                                               "hidden vector"))
        r.close(case + ": bytes of each", got[1], comm.message_bytes, unit="B", mistakes=mistakes)


KV_CASES = (("llama-3-70b", 8), ("llama-3-70b", 16), ("mistral-7b", 4), ("smollm2-135m", 2), ("smollm2-135m", 4),
            ("deepseek-v3", 8), ("qwen2.5-7b", 8), ("llama-3-8b", 1))


def check_kv_copies(fns, r) -> None:
    for model, tp in KV_CASES:
        s = model_shape(model)
        case = f"{model} ({'MLA' if s.mla else f'{s.kv_heads} KV heads'}) at TP{tp}"
        got = r.call(fns.kv_copies, s.kv_heads, tp, bool(s.mla), case=case)
        hint = ("an MLA latent is not split by heads: every rank caches all of it" if s.mla else
                "each rank holds ceil(kv_heads / tp) heads: with fewer KV heads than ranks, heads are duplicated")
        r.close(case, got, kv_replication(s, tp), rel_tol=1e-9, unit="copies", hint=hint)


EXERCISES = [
    Exercise("ring_allreduce_s", "The all-reduce term", "implement",
             "Write the ring all-reduce time from the ranks, the message, the bus bandwidth and the "
             "latencies; checked against analysis.parallel on the catalog's interconnects.", check_ring),
    Exercise("tp_decode_allreduces", "A TP step's all-reduces", "predict",
             "Predict how many all-reduces a tensor-parallel decode step makes and how big each is; checked "
             "against analysis.parallel.tp_allreduces.", check_tp_allreduces),
    Exercise("kv_copies", "KV copies under tensor parallelism", "predict",
             "Predict how many copies of the KV cache a TP group holds; checked against "
             "analysis.parallel.kv_replication (GQA, MQA-like and MLA models).", check_kv_copies),
]
