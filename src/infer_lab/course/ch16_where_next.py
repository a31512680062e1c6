"""Chapter 16, "Where to go next": four directions, each tied to a number the course computed or measured.

1. **KV eviction and compression**: how much KV one long request needs, and what fp8 KV and
   MLA-style compression take off it (the memory equation of chapter 03).
2. **Memory tiers and offload** (LMCache and friends): when fetching a cached prefix's KV from
   CPU memory or another machine beats recomputing it with a prefill (the roofline of chapter 04
   against the catalog's links).
3. **Disaggregated and multi-node serving** (NVIDIA Dynamo, llm-d): how many decode steps one
   long prefill stalls when both share a GPU, and what moving its KV to a decode pool costs.
4. **Kernels**: how far a plain CUDA-graph decode measured on an H200 is from the roofline, and
   how long decode waits on memory even at the roof.

Everything is arithmetic on the catalog plus the saved GPU results: no model, no GPU. The chapter
references name the course chapters present in this checkout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis import memory, roofline
from ..figures import finish
from ..units import count, human
from .chapter import ChapterResult, choose_size, run_parts
from .saved import SavedView, load_saved
from .tables import Column, people_table

NUMBER = "16"
SLUG = "where_next"
TITLE = "16 · Where to go next: eviction and compression, memory tiers, disaggregation, kernels"
NEEDS_MODEL = False
PARTS = {
    "directions": "Four directions, each with the number that motivates it (analytic and saved: runs live)",
    "tiers": "Fetch the KV of a cached prefix, or recompute it? (analytic: runs live)",
}
TIER_LINKS = {"CPU memory over PCIe Gen5": "pcie5-x16", "another GPU over NVLink 4": "nvlink4-nvswitch",
              "another server over InfiniBand NDR": "infiniband-ndr400"}
GPU_COUNTS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Sizes:
    """The workload the directions are computed for, and the context sweep of the tiers part."""

    size: str
    model: str
    gpu: str
    long_context: int  # one long request (eviction, compression, offload)
    prompt: int  # one long prompt arriving among decoding users (disaggregation)
    decode_batch: int
    contexts: tuple[int, ...]  # the tiers sweep


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """Analytic either way; ``full`` sweeps more contexts."""
    size = choose_size(device, size)
    step = 2 if size == "quick" else 1
    contexts = tuple(1024 * 2**i for i in range(0, 8, step))
    # Llama-3.1-70B: Llama-3-70B's shape (the same KV per token) with the 131,072 positions these contexts need
    return Sizes(size, model="llama-3.1-70b", gpu="H100-SXM", long_context=131072, prompt=32768, decode_batch=32,
                 contexts=contexts)


# ---------------------------------------------------------------------------------------------
# Typed results


@dataclass(frozen=True)
class Direction:
    """One direction: what it is about, the number that motivates it, where the course showed it, what to read."""

    key: str
    title: str
    motivation: str  # markdown, every number computed
    chapters: tuple[str, ...]  # "02 · The memory equation ..." for the chapters present
    tools: tuple[str, ...]


@dataclass(frozen=True)
class TierRow:
    """Getting one prefix's KV back: recompute it (prefill) or fetch it over a link. Seconds."""

    context: int
    kv_bytes: int
    recompute_s: float
    fetch_s: dict[str, float]

    @property
    def best_fetch(self) -> tuple[str, float]:
        return min(self.fetch_s.items(), key=lambda kv: kv[1])


@dataclass(frozen=True)
class TiersResult:
    model: str
    roof: str  # the GPU group that would recompute
    n_gpus: int
    kv_dtype: str
    rows: list[TierRow]


@dataclass
class Result(ChapterResult):
    """Chapter 16's results; a part not run is ``None``."""

    model: str = ""
    directions: list[Direction] | None = None
    tiers: TiersResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


# ---------------------------------------------------------------------------------------------
# Helpers


def chapter_refs(*slugs: str) -> tuple[str, ...]:
    """'NN · title' of the course chapters whose slug is given, for those present in this checkout."""
    from . import chapter, chapter_names

    present = {n[5:]: n for n in chapter_names()}
    return tuple(chapter(present[s][2:4]).TITLE for s in slugs if s in present)


def serving_gpus(model: str, gpu: str, context: int, kv_dtype: str = "bf16", users: int = 1) -> int:
    """The fewest GPUs (1, 2, 4, 8) of ``gpu`` whose memory holds the weights and ``users`` users of
    ``context`` tokens each; a ValueError (with the planner's reason) when not even 8 do."""
    from ..catalog import get_gpu

    spec = get_gpu(gpu)
    for n in GPU_COUNTS:
        if memory.fit(model, spec.memory_bytes, context, users=users, n_gpus=n, kv_dtype=kv_dtype).fits:
            return n
    problems = memory.scenario_problems(model, spec.memory_bytes, context, users, GPU_COUNTS[-1], kv_dtype=kv_dtype)
    raise ValueError(f"{users} x {context:,} tokens of {model} do not fit on {GPU_COUNTS[-1]}x {gpu}: "
                     + "; ".join(problems))


def scenarios(sizes: Sizes) -> list[dict[str, Any]]:
    """Every serving scenario this chapter's text describes, as the planner's fit check takes them."""
    from ..catalog import get_gpu

    mem = get_gpu(sizes.gpu).memory_bytes
    disagg = serving_gpus(sizes.model, sizes.gpu, sizes.prompt, users=sizes.decode_batch)
    return [
        dict(what="disaggregation: decoding users at the long prompt's context", model=sizes.model, memory_bytes=mem,
             context=sizes.prompt, users=sizes.decode_batch, n_gpus=disagg),
        dict(what="one long request (eviction, tiers)", model=sizes.model, memory_bytes=mem,
             context=sizes.long_context, users=1, n_gpus=serving_gpus(sizes.model, sizes.gpu, sizes.long_context)),
        *[dict(what=f"tiers sweep at {c:,} tokens", model=sizes.model, memory_bytes=mem, context=c, users=1,
               n_gpus=serving_gpus(sizes.model, sizes.gpu, max(sizes.contexts))) for c in sizes.contexts],
    ]


def link_time_s(n_bytes: float, link: str, n_gpus: int = 1) -> float:
    """Seconds to move ``n_bytes`` one way over a catalog link, each of ``n_gpus`` GPUs moving its share."""
    from ..catalog import get_interconnect

    spec = get_interconnect(link)
    return spec.base_latency_s + n_bytes / (spec.per_direction_Bps * n_gpus)


# ---------------------------------------------------------------------------------------------
# The tiers part


def tiers(model: str, gpu: str, contexts: tuple[int, ...], kv_dtype: str = "bf16") -> TiersResult:
    """For each context: the prefill that recomputes a prefix's KV on the serving GPUs vs fetching it."""
    n = serving_gpus(model, gpu, max(contexts), kv_dtype)
    roof = roofline.gpu_roof(gpu, n_gpus=n)
    rows = []
    for c in contexts:
        kv = memory.kv_bytes(model, c, 1, kv_dtype)
        recompute = roofline.predict_prefill(model, roof, 1, c, kv_dtype=kv_dtype).time_s
        rows.append(TierRow(c, kv, recompute, {name: link_time_s(kv, link, n) for name, link in TIER_LINKS.items()}))
    return TiersResult(memory.as_shape(model).name, roof.name, n, kv_dtype, rows)


def tiers_text(result: TiersResult) -> str:
    short, long = result.rows[0], result.rows[-1]
    pcie = next(iter(TIER_LINKS))
    return (
        f"{result.model} served on {result.roof}: a {short.context:,}-token prefix holds {human(short.kv_bytes / 1e9, 3)} GB "
        f"of KV; recomputing it takes {human(short.recompute_s * 1e3, 3)} ms of prefill, fetching it from {pcie} "
        f"{human(short.fetch_s[pcie] * 1e3, 3)} ms. At {long.context:,} tokens: {long.recompute_s * 1e3:,.0f} ms against "
        f"{long.fetch_s[pcie] * 1e3:,.0f} ms, **{human(long.recompute_s / long.fetch_s[pcie], 2)}× faster to fetch**. Prefill "
        "grows faster than linearly with the prefix (attention is quadratic) while a copy grows linearly, so a "
        "cheaper, bigger tier pays more the longer the shared prefix: roofline bounds on both sides."
    )


# ---------------------------------------------------------------------------------------------
# The directions part


def eviction_direction(sizes: Sizes) -> Direction:
    from ..attention.kv_sizing import mla_ratio_explained
    from ..catalog import get_gpu

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
    from ..catalog import get_interconnect

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
    from .ch04_prefill_decode_roofline import decode_wait

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


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``lm`` is not used: everything is analytic or saved)."""
    result = Result(size=sizes.size, model=sizes.model)
    return run_parts(result, parts, PARTS, {
        "directions": lambda: directions(sizes),
        "tiers": lambda: tiers(sizes.model, sizes.gpu, sizes.contexts),
    })


# ---------------------------------------------------------------------------------------------
# Saved GPU results: the kernels gap


@dataclass(frozen=True)
class SolRow:
    """One saved CUDA-graph decode step against the datasheet roofline of the same GPU."""

    device: str
    date: str
    model: str
    batch: int
    measured_ms: float
    predicted_ms: float
    weight_GBps: float | None

    @property
    def measured_over_predicted(self) -> float:
        return self.measured_ms / self.predicted_ms


def sol_decode_rows() -> list[SolRow]:
    """The newest saved ``*sol-decode*`` file's steps next to their roofline prediction (context as saved: 512)."""
    from ..catalog import resolve_gpu_name

    found = load_saved("*sol-decode*.json")
    if not found:
        return []
    src = found[0]
    gpu = resolve_gpu_name(src.device)
    model = src.raw.get("model", "mistral-7b")
    rows = []
    for key, step in sorted(((k, v) for k, v in src.data.items() if k.startswith("b") and k[1:].isdigit()),
                            key=lambda kv: int(kv[0][1:])):
        batch = int(key[1:])
        predicted = roofline.predict_decode(model, roofline.gpu_roof(gpu), batch, 512).time_s * 1e3
        rows.append(SolRow(src.device, src.date, model, batch, step["step_ms"], predicted, step.get("GBps_weights")))
    return rows


SOL_COLUMNS = [
    Column("batch", "batch", "int"), Column("measured_ms", "measured step (ms)"),
    Column("predicted_ms", "roofline step (ms, datasheet)"),
    Column("measured_over_predicted", "measured ÷ predicted", "ratio"),
    Column("weight_GBps", "weight bytes read (GB/s)", missing="— (not recorded)"),
]


def saved() -> SavedView | None:
    """A CUDA-graph decode saved on a GPU against the datasheet roofline: the gap kernels close."""
    rows = sol_decode_rows()
    if not rows:
        return None
    src = load_saved("*sol-decode*.json")[0]
    worst = max(rows, key=lambda r: r.measured_over_predicted)
    return SavedView(
        title=f"A plain CUDA-graph decode on {src.device} against the roofline: {rows[0].model}",
        source=src,
        tables={"Decode step, measured vs the datasheet roofline (context 512)": people_table(rows, SOL_COLUMNS)},
        figures={"sol_vs_roofline": sol_figure(rows)},
        notes=[f"cuBLAS GEMV, masked SDPA, no fusion: up to {human(worst.measured_over_predicted, 3)}× the roofline time "
               f"(batch {worst.batch}). Fused kernels and paged attention are what close it.",
               f"Measured by: {src.command}"],
    )


# ---------------------------------------------------------------------------------------------
# Words, tables and figures


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


def tiers_table(result: TiersResult):
    names = list(TIER_LINKS)
    flat = [{"context": r.context, "kv_bytes": r.kv_bytes, "recompute_ms": r.recompute_s * 1e3,
             **{n: r.fetch_s[n] * 1e3 for n in names}} for r in result.rows]
    cols = [Column("context", "prefix (tokens)", "int"), Column("kv_bytes", "KV", "bytes"),
            Column("recompute_ms", f"recompute on {result.roof} (ms)")]
    cols += [Column(n, f"fetch from {n} (ms)") for n in names]
    return people_table(flat, cols)


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.directions:
        out["Where to go next, and where the course showed why"] = directions_table(result.directions)
    if result.tiers:
        t = result.tiers
        out[f"Recompute or fetch a prefix's KV: {t.model}, KV in {t.kv_dtype} (analytic)"] = tiers_table(t)
    return out


def summary(result: Result) -> str:
    lines = []
    if result.directions:
        lines.append(directions_text(result.directions))
    if result.tiers:
        lines.append(tiers_text(result.tiers))
    return "\n\n".join(lines)


def tiers_figure(result: TiersResult):
    """Recompute (prefill) vs fetch over each link, against the prefix length, log-log."""
    from ..figures import subplots

    fig, ax = subplots(figsize=(7, 4))
    xs = [r.context for r in result.rows]
    ax.loglog(xs, [r.recompute_s * 1e3 for r in result.rows], "o-", color="k", label=f"recompute: prefill on {result.roof}")
    for name in TIER_LINKS:
        ax.loglog(xs, [r.fetch_s[name] * 1e3 for r in result.rows], "s--", ms=4, label=f"fetch from {name}")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="cached prefix (tokens), log scale", ylabel="ms to get its KV back, log scale")
    ax.set_title(f"Memory tiers: recompute a prefix or fetch its KV ({result.model}, KV in {result.kv_dtype})\n"
                 "analytic: roofline prefill vs catalog link bandwidths, no hardware", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    finish(fig)
    return fig


def sol_figure(rows: list[SolRow]):
    """Saved step times next to the roofline, by batch (log x)."""
    from ..figures import subplots

    fig, ax = subplots(figsize=(7, 3.6))
    xs = [r.batch for r in rows]
    ax.semilogx(xs, [r.measured_ms for r in rows], "x-", label="measured: CUDA-graph decode (saved)")
    ax.semilogx(xs, [r.predicted_ms for r in rows], "o--", color="k", label="roofline (datasheet)")
    ax.set_ylim(0, max(r.measured_ms for r in rows) * 1.15)
    ax.set(xlabel="decode batch, log scale", ylabel="step time (ms)")
    ax.set_title(f"{rows[0].model} decode on {rows[0].device}, saved {rows[0].date}: measured vs roofline", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    finish(fig)
    return fig


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.tiers:
        out["tiers"] = tiers_figure(result.tiers)
    return out
