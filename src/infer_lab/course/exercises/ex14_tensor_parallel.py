"""Chapter 14's exercises: the ring all-reduce term, a TP step's all-reduces, KV copies under TP, and (build)
the column/row-parallel split of a layer and its all-reduces, run on 2 processes."""

from __future__ import annotations

import math

from ...analysis.memory import kv_bytes_per_element
from ...analysis.parallel import allreduce_cost, kv_replication, tp_allreduces
from ...catalog import get_interconnect
from ...parallel.shard import (
    split_evenly,
)
from ...shape import model_shape
from . import Exercise
from .checking import Mistake, factor_of_2

NUMBER = "14"
SLUG = "tensor_parallel"
TITLE = "14 · Tensor parallelism"

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


KV_CASES = (("llama-3-70b", 8), ("llama-3-70b", 16), ("mistral-7b", 4), ("smollm2-135m", 2), ("smollm2-135m", 3),
            ("deepseek-v3", 8), ("qwen2.5-7b", 8), ("llama-3-8b", 1))


def check_kv_copies(fns, r) -> None:
    for model, tp in KV_CASES:
        s = model_shape(model)
        note = ""
        if not s.mla and tp <= s.kv_heads and s.kv_heads % tp:
            shares = [b - a for a, b in split_evenly(s.kv_heads, tp)]
            note = f": the chapter's TP engine splits them {' + '.join(map(str, shares))}"
        case = f"{model} ({'MLA' if s.mla else f'{s.kv_heads} KV heads'}) at TP{tp}{note}"
        got = r.call(fns.kv_copies, s.kv_heads, tp, bool(s.mla), case=case)
        expected = kv_replication(s, tp)
        wrong = {}
        if not s.mla and s.kv_heads % tp and tp < s.kv_heads:
            wrong["ceil(kv_heads / tp) heads on EVERY rank: the ranks hold whole heads but need not hold the "
                  "same number, so an uneven split copies nothing"] = tp * math.ceil(s.kv_heads / tp) / s.kv_heads
        if s.mla:
            hint = "an MLA latent is not split by heads: every rank caches all of it"
        elif tp > s.kv_heads:
            hint = "with more ranks than KV heads, each rank must hold one whole KV head: tp / kv_heads copies"
        else:
            hint = "up to one rank per KV head, the heads are split among the ranks and nothing is copied"
        r.close(case, got, expected, rel_tol=1e-9, unit="copies", hint=hint, wrong=wrong or None)


EXERCISES = [
    Exercise("ring_allreduce_s", "The all-reduce term", "implement",
             "Write the ring all-reduce time from the ranks, the message, the bus bandwidth and the "
             "latencies; checked against analysis.parallel on the catalog's interconnects.", check_ring),
    Exercise("tp_decode_allreduces", "A TP step's all-reduces", "predict",
             "Predict how many all-reduces a tensor-parallel decode step makes and how big each is; checked "
             "against analysis.parallel.tp_allreduces.", check_tp_allreduces),
    Exercise("kv_copies", "KV copies under tensor parallelism", "predict",
             "Predict how many copies of the KV cache a TP group holds; checked against "
             "analysis.parallel.kv_replication, which splits whole KV heads as the chapter's TP engine does "
             "(GQA, more ranks than KV heads, MLA).", check_kv_copies),
]
