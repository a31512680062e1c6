"""The directions part: four directions, each with the number that motivates it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...analysis import memory, roofline
from ...attention.kv_sizing import mla_ratio_explained
from ...catalog import get_gpu, get_interconnect
from ...units import count, human
from ..ch04_prefill_decode_roofline import decode_wait
from ..tables import Column, people_table
from .kernel_gap import sol_decode_rows
from .memory_tiers import tiers
from .scenario import TIER_LINKS, Sizes
from .shared import chapter_refs, link_time_s, serving_gpus


@dataclass(frozen=True)
class Direction:
    """One direction: what it is about, the number that motivates it, where the course showed it, what to read."""

    key: str
    title: str
    motivation: str  # markdown, every number computed
    chapters: tuple[str, ...]  # "02 · The memory equation ..." for the chapters present
    tools: tuple[str, ...]


def eviction_direction(sizes: Sizes) -> Direction:
    report = memory.kv_report(sizes.model, context=sizes.long_context, users=1, kv_dtype="bf16")
    fp8 = memory.kv_bytes(sizes.model, sizes.long_context, 1, "fp8")
    hbm = get_gpu(sizes.gpu).memory_bytes
    seven_b = "mistral-7b"
    mla = mla_ratio_explained(mha_7b_model=seven_b)["7b_layer"]
    text = (f"One {sizes.long_context:,}-token request to {report.model} holds **{human(report.kv_bytes_per_user / 1e9, 3)} GB** "
            f"of KV in bf16, {report.kv_bytes_per_user / hbm:.0%} of an {sizes.gpu}'s memory before any weights. "
            f"fp8 KV halves it to {human(fp8 / 1e9, 3)} GB; one layer of MLA's latent cache (DeepSeek-V3) holds "
            f"{human(mla.ratio, 3)}× less per token than one multi-head layer of a 7B-class model ({seven_b}'s "
            "shape, all heads). "
            "Eviction keeps only the tokens attention still "
            "uses; compression keeps all of them in fewer bits or dimensions. Both trade some quality for users, "
            "so measure quality as the course does.")
    return Direction("eviction", "KV eviction and compression", text,
                     chapter_refs("memory_equation", "attention_variants", "kv_cache_paged"),
                     ("StreamingLLM (attention sinks + a window)", "H2O and SnapKV (heavy-hitter eviction)",
                      "KIVI (2-bit KV)", "vLLM --kv-cache-dtype fp8"))


def tiers_direction(sizes: Sizes) -> Direction:
    t = tiers(sizes.model, sizes.gpu, (sizes.long_context,))
    row = t.rows[0]
    pcie = next(iter(TIER_LINKS))
    text = (f"Recomputing a {row.context:,}-token prefix on {t.roof} takes **{human(row.recompute_s, 3)} s** of prefill; "
            f"its {human(row.kv_bytes / 1e9, 3)} GB of KV comes back from {pcie} in **{human(row.fetch_s[pcie], 3)} s** (each of "
            f"the {t.n_gpus} GPUs over its own link). "
            "Prefix caching keeps such KV in HBM while it fits; a tiered cache spills it to CPU memory, local "
            "disk or other machines and fetches it back instead of recomputing.")
    return Direction("tiers", "Memory tiers and offload", text,
                     chapter_refs("prefix_caching", "prefill_decode_roofline"),
                     ("LMCache (KV offload and sharing for vLLM)", "vLLM CPU offload and KV connectors",
                      "Mooncake (a KV-centric disaggregated store)", "SGLang HiCache"))


def kv_transfer_text(kv_bytes: float, transfer_s: float, prefill_s: float, link: str = "InfiniBand NDR") -> str:
    """What moving a prompt's KV (``kv_bytes``, bytes) from the prefill pool to the decode pool adds to its
    first token (``transfer_s`` seconds over ``link``): the prefill (``prefill_s``) still runs, on the other
    pool, so the transfer is added to it, not traded for it."""
    ttft_ms, move_ms, prefill_ms = (prefill_s + transfer_s) * 1e3, transfer_s * 1e3, prefill_s * 1e3
    share = (f"{transfer_s / prefill_s:.1%} of the prefill's time" if transfer_s < prefill_s else
             f"{transfer_s / prefill_s:,.2f}x the prefill's time: the transfer, not the prefill, sets the first token")
    return (f"the prefill still runs, on the prefill pool, and moving the prompt's {human(kv_bytes / 1e9, 3)} GB of KV "
            f"to the decode pool over {link} adds {human(move_ms, 3)} ms to the first token ({share}): "
            f"{human(prefill_ms, 4)} ms + {human(move_ms, 3)} ms = {human(ttft_ms, 4)} ms before decode starts.")


def links_words(name: str, link: str, n_gpus: int) -> str:
    """``n_gpus`` catalog links ``link`` (named ``name``) used side by side, one per GPU, with each one's
    line rate in Gb/s from the catalog, e.g. "8 InfiniBand NDR links of 400 Gb/s (one per GPU)"."""
    gbit = get_interconnect(link).per_direction_gbps * 8  # GB/s per direction -> Gb/s
    per_gpu = " (one per GPU)" if n_gpus > 1 else ""
    return f"{count(n_gpus, name + ' link')} of {gbit:,.0f} Gb/s{per_gpu}"


def disaggregation_direction(sizes: Sizes) -> Direction:
    n = serving_gpus(sizes.model, sizes.gpu, sizes.prompt, users=sizes.decode_batch)
    roof = roofline.gpu_roof(sizes.gpu, n_gpus=n)
    prefill = roofline.predict_prefill(sizes.model, roof, 1, sizes.prompt).time_s
    step = roofline.predict_decode(sizes.model, roof, sizes.decode_batch, sizes.prompt).time_s
    kv = memory.kv_bytes(sizes.model, sizes.prompt, 1)
    link = TIER_LINKS["another server over InfiniBand NDR"]
    move = link_time_s(kv, link, n)
    text = (f"On {roof.name}, one {sizes.prompt:,}-token prompt of {memory.as_shape(sizes.model).name} is "
            f"{prefill * 1e3:,.0f} ms of prefill: **{prefill / step:,.0f} decode steps** that {sizes.decode_batch} "
            f"users sharing the GPUs wait through ({human(step * 1e3, 3)} ms each; {n} GPUs, the fewest whose memory "
            f"holds the weights and those {sizes.decode_batch} users' KV at {sizes.prompt:,} tokens). Separate prefill and decode pools "
            f"remove that stall, at a price: {kv_transfer_text(kv, move, prefill, links_words('InfiniBand NDR', link, n))} Chunked prefill is the "
            "single-GPU answer; disaggregation and multi-node routing are the fleet's.")
    return Direction("disaggregation", "Disaggregated and multi-node serving", text,
                     chapter_refs("chunked_prefill", "tensor_parallel", "cluster", "engines"),
                     ("NVIDIA Dynamo (disaggregation, KV-aware routing)", "llm-d (Kubernetes-native distributed vLLM)",
                      "vLLM and SGLang prefill/decode disaggregation", "infer-lab cluster (this repository's simulator)"))


# Talk 2's closing topic, cited, not checked (/work/shared/talks/T4-system-talk.txt is the course's transcript):
# an agent that generates and tunes kernels, and compilers built for one workload.
TALK_KERNEL_AGENT = {
    "name": "KForge",
    "who": "talk 2's Gimlet Labs speaker (transcript lines 31-35)",
    "speedup_pct": 33,
    "model": "a 120B-parameter model",
    "hardware": "AMD hardware",
    "time": "less than a week",
    "start": "kernels that had already been optimized",
}


def kernel_agents_text(claim: dict[str, Any] = TALK_KERNEL_AGENT) -> str:
    """The talk's kernel-generating agent, reported as its speaker's claim (no baseline numbers were given)."""
    return (f"The next step is agents that write and tune the kernels: {claim['who']} described {claim['name']}, an "
            "agent that profiles the hardware and the workload and searches for faster kernels, and reported that "
            f"after {claim['time']} of running it sped {claim['model']} on {claim['hardware']} up by "
            f"{claim['speedup_pct']}% end to end, starting from {claim['start']} (reported, not measured here), then "
            "pointed at compilers generated for one model, workload and machine.")


def kernels_direction(sizes: Sizes) -> Direction:
    wait = decode_wait("mistral-7b", sizes.gpu, 1, 4096)
    sol = sol_decode_rows()
    if sol:
        b1 = sol[0]
        measured = (f"On {b1.device} ({b1.date}, saved), a plain CUDA-graph decode of {b1.model} at batch 1 took "
                    f"**{human(b1.measured_ms, 3)} ms** per token against {human(b1.predicted_ms, 3)} ms on the datasheet roof: "
                    f"{b1.predicted_ms / b1.measured_ms:.0%} of the roofline's speed. ")
    else:
        measured = "No saved GPU decode in this checkout (infer_lab/results/*sol-decode*.json). "
    text = (measured + f"Even at the roof, a batch-1 decode step waits on memory {wait.waiting_fraction:.1%} of the time "
            f"on an {wait.gpu}. Kernels close the first gap (fusion, CUDA graphs, attention that reads the "
            "paged KV once); batching and quantization shrink the second. " + kernel_agents_text())
    return Direction("kernels", "Kernels", text, chapter_refs("prefill_decode_roofline", "attention_variants", "engines"),
                     ("FlashAttention and FlashInfer", "CUDA graphs and torch.compile", "Triton, CUTLASS, ThunderKittens",
                      "Nsight Systems / Nsight Compute to see where a step goes",
                      "agent-generated kernels (talk 2's KForge) and per-workload compilers"))


def directions(sizes: Sizes) -> list[Direction]:
    return [eviction_direction(sizes), tiers_direction(sizes), disaggregation_direction(sizes), kernels_direction(sizes)]


def directions_text(rows: list[Direction]) -> str:
    parts = []
    for d in rows:
        refs = "; ".join(d.chapters) if d.chapters else "no course chapter on it in this checkout"
        parts.append(f"**{d.title}.** {d.motivation}\n\n*In the course:* {refs}. *Read next:* {', '.join(d.tools)}.")
    return "\n\n".join(parts)


DIRECTION_COLUMNS = [Column("title", "direction", "text"), Column("chapters", "in the course", "text"),
                     Column("tools", "read next", "text")]


def directions_table(rows: list[Direction]):
    flat = [{"title": d.title, "chapters": "; ".join(d.chapters) or "—", "tools": ", ".join(d.tools)} for d in rows]
    return people_table(flat, DIRECTION_COLUMNS)
