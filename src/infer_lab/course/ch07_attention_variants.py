"""Chapter 07, "Attention variants and FlashAttention": cache less per token, and what it costs.

Measured (behind buttons):

1. Every variant (MHA, GQA, MQA, sliding window, MLA naive and absorbed) and the tiled
   online-softmax attention equal torch SDPA, in prefill and in token-by-token cached decode.
2. The quality price on real weights: SmolLM2's GQA mean-pooled to MQA, a sliding window, and
   (at full size) int8/fp8 KV caches, by perplexity on the shipped text.
3. This machine's SDPA backends across lengths, and decode attention time vs KV heads.

Analytic (live): KV bytes per token and max users per variant on real shapes, the MLA ratio
against each baseline, the scorecard, constant-state architectures, FlashAttention's HBM
bytes and the roofline decode time vs KV heads. The layers are library code in
:mod:`infer_lab.attention`; the timing is :mod:`infer_lab.bench.attention`.

The measured parts are the notebook's own code: ``@app.function`` definitions in
``infer_lab/notebooks/07_attention_variants.py`` (``against_sdpa``, ``attention_quality``,
``attention_times``) that call the library directly. This module sizes them, shows what they
return, and runs the very same functions for the tour, the tests and the Jupyter edition
(``run_*``, through :mod:`infer_lab.course.notebook_code`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis import memory as kv_memory
from ..attention import (
    PAPER_HBM_TRAFFIC,
    CitedHBMTraffic,
    FlashTiling,
    naive_attention_hbm_bytes,
    online_softmax_tile,
    score_matrix_bytes,
    tiled_attention_hbm_bytes,
)
from ..attention.kv_sizing import (
    DSA_TOP_K,
    WEIGHT_SPARE,
    MLARatio,
    PredictedDecode,
    ScorecardRow,
    SparseRead,
    StateSize,
    VariantMemory,
    constant_state_models,
    decode_time_vs_kv_heads,
    dsa_read_per_step,
    mla_ratio_explained,
    scorecard,
    variant_memory_table,
)
from ..attention.quality import VariantQuality
from ..bench.attention import BackendTime, DecodeAttentionTime
from ..catalog import OnChipMemory, get_gpu, get_on_chip_memory, gpu_catalog_about
from ..figures import finish
from ..hardware import device_label
from ..units import fmt_bytes, human
from .ch06_quantization import baseline_note
from .chapter import NO_MODEL, ChapterResult, choose_size, run_parts
from .library_code import code_block
from .notebook_code import notebook_function
from .saved import SavedView, load_saved
from .tables import Column, people_table

NUMBER = "07"
SLUG = "attention_variants"
TITLE = "07 · Attention variants and FlashAttention"
NEEDS_MODEL = True
PARTS = {
    "equivalence": "Check every variant against SDPA",
    "quality": "Measure the quality price on real weights",
    "timing": "Time SDPA backends and decode attention here",
}
DEFAULT_GPU = "H100-SXM"
DEFAULT_CONTEXT = 32768
EQUIVALENCE_TOL = 1e-5  # fp32, max |difference| from SDPA
FLASH_LENGTHS = (1024, 4096, 16384, 32768, 65536)
FLASH_SHAPE = (32, 128)  # heads, head dim: a 7B-class layer
FLASH_SHARED_KIB_RANGE = (8, 256, 1)  # the shared-memory control of part 6 (KiB): min, max, step
DSA_TOP_K_RANGE = (256, 16384, 256)  # the top-k control of part 5 (tokens): min, max, step


@dataclass(frozen=True)
class Sizes:
    """Evaluation tokens for the quality part and the timing shapes."""

    size: str
    eval_tokens: int
    eval_window: int
    quality_include: tuple[str, ...]  # "mqa", "window", "kv"
    sdpa_lengths: tuple[int, ...]
    heads: int
    head_dim: int
    decode_context: int
    decode_kv_heads: tuple[int, ...]
    repeats: int


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick``: 128 tokens and two variants, tiny timing shapes; ``full``: more text, KV caches, longer shapes."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    if on_gpu:
        return Sizes(size, eval_tokens=1024, eval_window=256, quality_include=("mqa", "window", "kv"),
                     sdpa_lengths=(1024, 4096, 16384), heads=32, head_dim=128, decode_context=32768,
                     decode_kv_heads=(1, 2, 4, 8, 16, 32), repeats=5)
    if size == "quick":
        return Sizes(size, eval_tokens=128, eval_window=128, quality_include=("mqa", "window"),
                     sdpa_lengths=(256, 512), heads=8, head_dim=64, decode_context=16384,
                     decode_kv_heads=(1, 2, 8), repeats=3)
    return Sizes(size, eval_tokens=1024, eval_window=256, quality_include=("mqa", "window", "kv"),
                 sdpa_lengths=(512, 2048), heads=8, head_dim=64, decode_context=32768,
                 decode_kv_heads=(1, 2, 4, 8), repeats=5)


# ---------------------------------------------------------------------------------------------
# Typed results


@dataclass(frozen=True)
class EquivalenceRow:
    """Max |output - SDPA output| of one variant and path, prefill and token-by-token cached decode."""

    variant: str
    path: str
    prefill_max_abs_diff: float
    decode_max_abs_diff: float

    @property
    def equal(self) -> bool:
        return max(self.prefill_max_abs_diff, self.decode_max_abs_diff) <= EQUIVALENCE_TOL


@dataclass(frozen=True)
class QualityResult:
    rows: list[VariantQuality]
    eval_tokens: int
    model: str  # lm.describe(): model, weights, hardware
    model_name: str
    embedded: bool
    skipped: str = ""


@dataclass(frozen=True)
class TimingResult:
    backends: list[BackendTime]
    decode: list[DecodeAttentionTime]
    device: str
    bandwidth_Bps: float  # measured copy bandwidth, the decode prediction's denominator
    threads: int


@dataclass
class Result(ChapterResult):
    """Chapter 07's measurements; a part not run is ``None``."""

    model: str = ""
    equivalence: list[EquivalenceRow] | None = None
    quality: QualityResult | None = None
    timing: TimingResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


# ---------------------------------------------------------------------------------------------
# Running the notebook's experiments (the code is in infer_lab/notebooks/07_attention_variants.py)

EQUIVALENCE_TOKENS = 12  # the notebook's equivalence cell starts at the same numbers
EQUIVALENCE_KV_HEADS = (2, 1)  # 4 query heads over 2 K/V heads (GQA), then over 1 (MQA)
EQUIVALENCE_WINDOW = 4
QUALITY_WINDOW = 32  # tokens each query sees in the sliding-window row


def equivalence_rows(rows: list[tuple[str, str, float, float]]) -> list[EquivalenceRow]:
    """The notebook's ``against_sdpa`` rows ``(variant, path, prefill diff, decode diff)`` as typed rows."""
    return [EquivalenceRow(*row) for row in rows]


def run_equivalence(lm: Any = None, sizes: Sizes | None = None) -> list[EquivalenceRow]:
    """Run the notebook's own ``against_sdpa`` at the cell's numbers (no model: a small random layer)."""
    against_sdpa = notebook_function(NUMBER, "against_sdpa")
    return equivalence_rows(against_sdpa(EQUIVALENCE_TOKENS, EQUIVALENCE_KV_HEADS, window=EQUIVALENCE_WINDOW))


def flash_tile_code() -> str:
    """FlashAttention's inner step, the library's real code, as the page shows it."""
    return code_block(online_softmax_tile)


def quality_result(lm: Any, rows: list[VariantQuality], eval_tokens: int) -> QualityResult:
    """The notebook's ``attention_quality`` rows as a result (random weights: why nothing was measured)."""
    embedded = lm.source == "embedded"
    if not rows:
        return QualityResult([], 0, lm.describe(), lm.name, embedded,
                             skipped=f"{lm.name} has random weights: there is no text quality to measure")
    return QualityResult(rows, eval_tokens, lm.describe(), lm.name, embedded)


def run_quality(lm: Any, sizes: Sizes) -> QualityResult:
    """Run the notebook's own ``attention_quality`` at this size."""
    attention_quality = notebook_function(NUMBER, "attention_quality")
    rows = attention_quality(lm, sizes.eval_tokens, QUALITY_WINDOW, sizes.quality_include)
    return quality_result(lm, rows, sizes.eval_tokens)


def timing_result(device: torch.device, measured: tuple[list[BackendTime], list[DecodeAttentionTime], float]
                  ) -> TimingResult:
    """The notebook's ``attention_times`` (backends, decode steps, copy bandwidth) as a result."""
    backends, decode, bandwidth = measured
    return TimingResult(backends, decode, device_label(device), bandwidth, torch.get_num_threads())


def run_timing(lm: Any, sizes: Sizes) -> TimingResult:
    """Run the notebook's own ``attention_times`` at this size."""
    device = lm.device if lm is not None else torch.device("cpu")
    attention_times = notebook_function(NUMBER, "attention_times")
    return timing_result(device, attention_times(device, sizes.sdpa_lengths, sizes.heads, sizes.head_dim,
                                                 sizes.decode_context, sizes.decode_kv_heads, sizes.repeats))


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else NO_MODEL)
    return run_parts(result, parts, PARTS, {
        "equivalence": lambda: run_equivalence(lm, sizes),
        "quality": lambda: run_quality(lm, sizes),
        "timing": lambda: run_timing(lm, sizes),
    })


# ---------------------------------------------------------------------------------------------
# Analytic parts (no model, no button)


def memory_rows(gpu: str = DEFAULT_GPU, context: int = DEFAULT_CONTEXT) -> list[VariantMemory]:
    return variant_memory_table(gpu=gpu, context=context)


@dataclass(frozen=True)
class HBMRow:
    """Attention HBM traffic of one prefill layer: naive, tiled at both bounds of the K/V re-reads,
    the naive path's score matrix and one head's K and V."""

    seq_len: int
    naive_bytes: int
    tiled_bytes: int  # K and V re-read from HBM by every query tile (no cache: the upper bound)
    tiled_kv_once_bytes: int  # K and V read from HBM once, every re-read hits a cache (the lower bound)
    score_matrix_bytes: int
    head_kv_bytes: int  # one head's K and V at this length

    @property
    def naive_over_tiled(self) -> float:
        return self.naive_bytes / self.tiled_bytes

    @property
    def naive_over_tiled_kv_once(self) -> float:
        return self.naive_bytes / self.tiled_kv_once_bytes


@dataclass(frozen=True)
class ReuseCache:
    """The on-chip cache that K/V re-reads can hit: its name and its size in bytes."""

    name: str
    size_bytes: int


@dataclass(frozen=True)
class FlashResult:
    """Part 6: the HBM model's rows, the assumptions they follow from, and the paper's measured figure."""

    tiling: FlashTiling
    heads: int
    rows: list[HBMRow]
    cache: ReuseCache | None  # the cache of ``gpu`` that K/V re-reads can hit, when on file
    gpu: str
    gpu_memory_bytes: int  # ``gpu``'s memory (HBM), what the naive path's score matrix must fit in
    paper: CitedHBMTraffic = PAPER_HBM_TRAFFIC


def unit_words(gpu: str) -> dict[str, str]:
    """What ``gpu``'s vendor calls its units, its thread blocks and their shared memory."""
    if get_gpu(gpu).vendor == "AMD":
        return {"unit": "compute unit", "block": "workgroup", "shared": "LDS (shared memory)"}
    return {"unit": "SM", "block": "thread block", "shared": "shared memory"}


def reuse_cache(chip: OnChipMemory | None) -> ReuseCache | None:
    """The cache K/V re-reads can hit: the last-level cache where one is on file (shared by the whole
    chip, beyond its L2: MI300X's L2 is split between its dies), else the L2."""
    if chip is None:
        return None
    if chip.last_level_cache_bytes:
        return ReuseCache("last-level cache (beyond its L2, shared by the whole chip)", chip.last_level_cache_bytes)
    return ReuseCache("L2", chip.l2_bytes)


def flash_tiling(gpu: str = DEFAULT_GPU, causal: bool = True, sram_bytes: int | None = None,
                 head_dim: int = FLASH_SHAPE[1]) -> FlashTiling:
    """FlashAttention's M for ``gpu``: the most shared memory one thread block may use there (the
    catalog's ``shared_kib_max_per_block``), or ``sram_bytes`` when given (labelled as ``gpu``'s when
    it is that figure). A GPU without on-chip figures on file uses :data:`DEFAULT_GPU`'s, and says so."""
    on = gpu if get_on_chip_memory(gpu) is not None else DEFAULT_GPU
    own = get_on_chip_memory(on).shared_bytes_per_block
    words = unit_words(on)
    of = (f"the most {words['shared']} one {words['block']} may use on {on}"
          + ("" if on == gpu else f" ({gpu} has no per-block figure on file)"))
    if sram_bytes is not None and sram_bytes != own:
        return FlashTiling(sram_bytes, head_dim, causal=causal, sram_of="set by hand")
    return FlashTiling(own, head_dim, causal=causal, sram_of=of)


def flash_result(tiling: FlashTiling | None = None, gpu: str = DEFAULT_GPU, lengths: tuple[int, ...] = FLASH_LENGTHS,
                 heads: int = FLASH_SHAPE[0]) -> FlashResult:
    """Analytic bytes of one layer's attention, naive and tiled, per sequence length, under ``tiling``
    (by default: the shared memory one thread block may use on ``gpu``, a causal prefill)."""
    tiling = tiling or flash_tiling(gpu)
    d, b = tiling.head_dim, tiling.bytes_per_element
    rows = [HBMRow(n, naive_attention_hbm_bytes(n, d, heads=heads, bytes_per_element=b),
                   tiled_attention_hbm_bytes(n, d, heads=heads, bytes_per_element=b, block_q=tiling.block_q,
                                             causal=tiling.causal),
                   tiled_attention_hbm_bytes(n, d, heads=heads, bytes_per_element=b, block_q=tiling.block_q,
                                             causal=tiling.causal, kv_rereads_from_hbm=False),
                   score_matrix_bytes(n, heads=heads, bytes_per_element=b), 2 * n * d * b)
            for n in lengths]
    return FlashResult(tiling, heads, rows, reuse_cache(get_on_chip_memory(gpu)), gpu, get_gpu(gpu).memory_bytes)


def flash_rows(tiling: FlashTiling | None = None) -> list[HBMRow]:
    """The rows of :func:`flash_result`."""
    return flash_result(tiling).rows


def quality_notes(quality: QualityResult | None) -> dict[str, str]:
    """Scorecard notes from measured rows ('MQA', 'sliding'), saying which model and setting they measured:
    the cost of converting a model trained with full attention, without training it again."""
    if quality is None:
        return {}
    return {row.family: f"measured here, converting {quality.model_name} without retraining ({row.variant}): "
                        f"{perplexity_change_text(row)}"
            for row in quality.rows if row.family in ("MQA", "sliding")}


def perplexity_change_text(row: VariantQuality) -> str:
    """'perplexity +1.5%' for small changes, 'perplexity ×884' (or ×3.46) for large ones."""
    ratio = 1 + row.perplexity_change
    if ratio >= 10:
        return f"perplexity ×{ratio:,.0f}"
    if ratio >= 2:
        return f"perplexity ×{ratio:.2f}"
    return f"perplexity {100 * row.perplexity_change:+.1f}%"


def scorecard_rows(gpu: str = DEFAULT_GPU, context: int = DEFAULT_CONTEXT,
                   quality: QualityResult | None = None) -> list[ScorecardRow]:
    measured = quality_notes(quality)
    return scorecard("mistral-7b", gpu, context, measured_quality=measured) + scorecard("deepseek-v3", gpu, context)


def decode_prediction(gpu: str = "H200", context: int = DEFAULT_CONTEXT) -> list[PredictedDecode]:
    return decode_time_vs_kv_heads("mistral-7b", gpu, context=context)


# ---------------------------------------------------------------------------------------------
# Words


def threads_text(n: int) -> str:
    return f"{n} torch thread" + ("s" if n != 1 else "")


def equivalence_text(rows: list[EquivalenceRow]) -> str:
    worst = max(max(r.prefill_max_abs_diff, r.decode_max_abs_diff) for r in rows)
    equal = sum(r.equal for r in rows)
    return (f"**{equal} of {len(rows)}** variant/path pairs equal SDPA within {EQUIVALENCE_TOL:g} (fp32) in prefill "
            f"and in cached decode; the largest difference is {human(worst, 2)}.")


def deployment_text(rows: list[VariantMemory]) -> str:
    """The weights and GPU count each model's rows assume, from the rows (one clause per model)."""
    parts = []
    for model in dict.fromkeys(r.model for r in rows):
        r = next(x for x in rows if x.model == model)
        weights = kv_memory.weight_bytes(model, r.weight_dtype).total
        parts.append(f"{model}, {r.weight_dtype} weights of {fmt_bytes(weights)}, on {r.n_gpus} {r.gpu}")
    return ("Each model runs in the precision its released checkpoint ships in, on the fewest GPUs that hold those "
            f"weights with {WEIGHT_SPARE:.0%} to spare, rounded up to a power of two, as tensor- and pipeline-parallel "
            "layouts split a model: " + "; ".join(parts) + ".")


def memory_text(rows: list[VariantMemory]) -> str:
    by = {(r.model, r.variant): r for r in rows}
    mistral = [r for r in rows if r.model == "mistral-7b"]
    mha, own = mistral[0], next(r for r in mistral if r.variant.startswith("GQA"))
    mla = by.get(("deepseek-v3", "MLA"))
    text = (f"Mistral-7B's GQA ({own.variant}) caches {own.mha_over_variant:.0f}× less than its MHA shape: "
            f"{fmt_bytes(own.kv_bytes_per_user)} instead of {fmt_bytes(mha.kv_bytes_per_user)} per user at "
            f"{own.context:,} tokens, so {own.max_users:,} users fit on {own.n_gpus} {own.gpu} instead of "
            f"{mha.max_users:,}.")
    if mla:
        k192 = mla_ratio_explained()["same_shape_k192"]
        text += (f" DeepSeek-V3's MLA caches {mla.mha_over_variant:.0f}× less than its MHA row, which gives K the "
                 f"value head dim ({k192.v_head_dim}); with its real K of {k192.k_head_dim} the MHA would cache "
                 f"{(k192.k_head_dim + k192.v_head_dim) / (2 * k192.v_head_dim):.2f}× more, and the ratio is "
                 f"{k192.ratio:.0f}×.")
    return deployment_text(rows) + "\n\n" + text


def mla_text(ratios: dict[str, MLARatio] | None = None) -> str:
    r = ratios or mla_ratio_explained()
    a, b, c, d = r["same_shape_k128"], r["same_shape_k192"], r["7b_layer"], r["one_layer_mistake"]
    return (
        f"Against an MHA of DeepSeek-V3's own shape, MLA caches **{a.ratio:.0f}× less** if that MHA's K had the "
        f"value head dim ({a.k_head_dim}), and **{b.ratio:.0f}× less** with DeepSeek's real K head of "
        f"{b.k_head_dim} (the MHA DeepSeek would have had to cache). Against one MHA layer of a 7B-class model it "
        f"is **{c.ratio:.1f}×**. A whole MHA model against one MLA layer gives {d.ratio:,.0f}×: the layer count, "
        "not the attention, makes that number.\n\n"
        + talk_mla_text(r)
    )


# What the workshop (talk 1) said about MLA: its demo gave 56x, and the speaker corrected it: "it wasn't ...
# 56x it was 14x ... the demo had a mistake of a computation where it did not multiply the number of layers"
# (T0-workshop).
TALK_MLA_FIRST = 56.0
TALK_MLA_CORRECTED = 14.0
TALK_MATCH = 0.05  # a computed ratio within 5% of a figure the talk said is taken as the one it probably meant


def ratio_matching(said: float, ratios: dict[str, MLARatio], tolerance: float = TALK_MATCH) -> MLARatio | None:
    """The computed ratio nearest to a figure the talk said, when within ``tolerance`` of it (else ``None``)."""
    nearest = min(ratios.values(), key=lambda x: abs(x.ratio / said - 1))
    return nearest if abs(nearest.ratio / said - 1) <= tolerance else None


def talk_mla_text(ratios: dict[str, MLARatio], first: float = TALK_MLA_FIRST,
                  corrected: float = TALK_MLA_CORRECTED) -> str:
    """The talk's 56x and 14x against the ratios computed here: which each one probably is, or that none is.

    The transcript says only that the demo "did not multiply the number of layers"; what it computed is not
    in it, so the match is a reading of the numbers, said as "probably".
    """
    def reading(said: float) -> str:
        match = ratio_matching(said, ratios)
        if match is None:
            return f"none of the ratios computed here is within {TALK_MATCH:.0%} of {said:g}×"
        return f"{said:g}× is probably the {match.ratio:.1f}× of {match.comparison}"

    both = ratio_matching(first, ratios) is not None and ratio_matching(corrected, ratios) is not None
    return (
        "**About the talk's correction.** In the workshop (talk 1) the demo gave "
        f"{first:g}×, and the speaker corrected it to {corrected:g}×, saying the demo \"did not multiply the number "
        "of layers\". "
        "What the demo computed is not in the transcript, so this is a reading of the numbers: "
        f"{reading(first)}; {reading(corrected)}. "
        + ("Read that way, both are right answers to different questions: the like-for-like one (the same model, "
           "every layer on both sides, the layer counts cancel) and one MLA layer against one layer of another "
           "model. " if both else "")
        + "Say which baseline you mean."
    )


def mla_rope_text(model: str = "deepseek-v3") -> str:
    """Why MLA caches a separate RoPE key beside its latent, with the sizes from ``model``'s shape."""
    m = kv_memory.as_shape(model).mla
    if m is None:
        raise ValueError(f"{model} has no MLA attention")
    return (
        "**RoPE, and why MLA keeps a separate key for it.** RoPE (rotary position embedding) rotates each query and "
        "key vector by angles set by its position, so a query-key dot product depends on how far apart the two "
        "tokens are. MLA rebuilds each head's key from the cached latent with an up-projection, and at decode it "
        "folds that projection into the query instead (the absorbed path). A rotation that depends on the key's "
        "position would sit between the two, and a matrix that changes with every position cannot be folded in "
        f"once. So {model} caches a {m.kv_lora_rank}-value latent without position, plus one "
        f"{m.qk_rope_head_dim}-value key that carries RoPE, shared by all heads, per token per layer."
    )


def times_fewer(ratio: float) -> str:
    """'2.0× fewer' (or '513× fewer') for a naive/tiled byte ratio above 1, '1.33× more' below it, 'as many'
    only when the two are equal. Near 1 the ratio gets the digits it needs to differ from 1 ('1.004× fewer')."""
    if ratio == 1:
        return "as many"
    factor = ratio if ratio > 1 else 1 / ratio
    digits = (0 if factor >= 10 else 1) if ratio > 1 else 2
    while f"{factor:.{digits}f}".rstrip("0").rstrip(".") == "1" and digits < 6:
        digits += 1
    return f"{factor:.{digits}f}× {'fewer' if ratio > 1 else 'more'}"


def saving_across_lengths(lengths: list[int], ratios: list[float]) -> str:
    """How naive/tiled bytes change with length, in words: one figure when every length rounds to the same
    words, else the first length's and the last's."""
    words = [times_fewer(r) for r in ratios]
    against = f"HBM bytes {'as' if words[0] == 'as many' else 'than'} naive"
    if len(set(words)) == 1:
        return f"{words[0]} {against} at every length shown"
    return f"{words[0]} {against} at {lengths[0]:,} tokens, {words[-1]} at {lengths[-1]:,}"


def cache_text(row: HBMRow, cache: ReuseCache | None, gpu: str) -> str:
    """Whether one head's K and V fit in the cache re-reads can hit, at a length: what the lower bound needs."""
    if cache is None:
        return f"The catalog has no cache size for {gpu}, so which bound is nearer cannot be judged here."
    fits = row.head_kv_bytes <= cache.size_bytes
    return (f"One head's K and V at {row.seq_len:,} tokens are {fmt_bytes(row.head_kv_bytes)}, "
            + (f"within {gpu}'s {fmt_bytes(cache.size_bytes)} of {cache.name}, so a kernel that keeps one head's "
               "tiles together can get close to the lower bound (other heads' tiles share that cache)."
               if fits else
               f"more than {gpu}'s {fmt_bytes(cache.size_bytes)} of {cache.name}, so at that length re-reads go "
               "back to HBM and the upper bound is the nearer one."))


def naive_memory_text(rows: list[HBMRow], memory_bytes: int, gpu: str) -> str:
    """Whether the naive path's score matrix (one layer) fits in ``gpu``'s memory at the lengths shown:
    from the first length where it does not, the naive rows count the bytes of a path that could not run there."""
    over = [r for r in rows if r.score_matrix_bytes > memory_bytes]
    if not over:
        big = max(rows, key=lambda r: r.score_matrix_bytes)
        return (f"The naive path's score matrix fits in {gpu}'s {fmt_bytes(memory_bytes)} of memory at every length "
                f"shown (the largest, {fmt_bytes(big.score_matrix_bytes)} for one layer at {big.seq_len:,} tokens).")
    first = over[0]
    if len(over) == 1:
        where, rows_count = f"At {first.seq_len:,} tokens", "that row counts"
    else:
        where, rows_count = f"From {first.seq_len:,} tokens on (the last {len(over)} rows)", "those rows count"
    return (f"{where} the naive path's score matrix alone, {fmt_bytes(first.score_matrix_bytes)} for one layer at "
            f"{first.seq_len:,}, is more than {gpu}'s {fmt_bytes(memory_bytes)} of memory: the naive path as modelled (every head's "
            f"scores at once) could not run on {gpu} there, so {rows_count} the bytes of a path that could not run "
            f"that way.")


def flash_assumptions_text(f: FlashResult) -> str:
    """The assumptions the table's tiled bytes follow from, with their units."""
    t = f.tiling
    mask = ("a causal prefill: each query tile skips the key tiles in its future" if t.causal else
            "no mask: every query tile reads every key tile")
    return (f"FlashAttention-2's loop order, the one `flash_attention` runs: query tiles outside, each reading the "
            f"key/value tiles it needs from HBM. Query tiles of **{t.block_q} rows** and key tiles of {t.block_k}, "
            "heights taken from FlashAttention's Algorithm 1 as an assumption (B_r = min(⌈M/4d⌉, d), B_c = ⌈M/4d⌉; "
            f"FlashAttention-2 picks its tiles by tuning instead), for M = {fmt_bytes(t.sram_bytes)}, {t.sram_of}, "
            f"head dim d = {t.head_dim}, {t.bytes_per_element} B per element, {f.heads} heads, one layer, batch 1; "
            f"{mask}")


def figure_sources_text(gpu: str) -> str:
    """Where the GPU figures of part 6 come from: the catalog's source for the on-chip ones (shared memory per
    block, caches) and the vendor's datasheet for the memory."""
    on = gpu if get_on_chip_memory(gpu) is not None else DEFAULT_GPU
    chip = get_on_chip_memory(on)
    datasheets = gpu_catalog_about()["spec_source"].split(";")[0]
    return (f"**Sources:** {on}'s shared memory per block and cache sizes: {chip.source}; {gpu}'s memory: "
            f"{datasheets} (the catalog's spec source).")


def flash_text(f: FlashResult) -> str:
    """Part 6 in words: the saving at both bounds, what it follows from, and the paper's measured figure."""
    lengths = [r.seq_len for r in f.rows]
    at = next((r for r in f.rows if r.seq_len == 4096), f.rows[0])
    paper = f.paper
    hit = f"the {f.cache.name}" if f.cache else "an on-chip cache"
    other = (f"; another version of the paper prints {paper.other_standard_gb} vs {paper.flash_gb} GB there, for "
             f"{paper.other_setting}" if paper.other_standard_gb is not None else "")
    return "\n\n".join([
        f"**Assumed:** {flash_assumptions_text(f)}. FlashAttention's own Algorithm 1 runs the loops the other way "
        "round: K/V tiles outside, so it reads K and V once and re-reads Q and O (read, then written back) once per "
        "K/V tile instead; this table does not count that order.",
        f"If K and V are re-read from HBM by every query tile (no cache: the upper bound), tiled attention moves "
        f"**{saving_across_lengths(lengths, [r.naive_over_tiled for r in f.rows])}**. Those re-reads grow as N² "
        f"too (N²·d divided by the tile height), so at long lengths this bound tends to "
        f"{f.tiling.long_sequence_saving * f.tiling.head_dim / f.tiling.block_q:.0f} × tile / d = "
        f"{f.tiling.long_sequence_saving:.2f}: the tile sets it. "
        f"If every re-read hits {hit} instead (K and V read from HBM once: the lower bound), it moves "
        f"**{saving_across_lengths(lengths, [r.naive_over_tiled_kv_once for r in f.rows])}**. "
        + cache_text(f.rows[-1], f.cache, f.gpu),
        f"What holds under any tiling: at {at.seq_len:,} tokens the naive path writes and re-reads a "
        f"{fmt_bytes(at.score_matrix_bytes)} score matrix per layer, and the tiled path writes none; its S and P "
        "tiles stay on-chip (shared memory and registers), one tile at a time. "
        + naive_memory_text(f.rows, f.gpu_memory_bytes, f.gpu),
        figure_sources_text(f.gpu),
        f"**Measured, in the paper:** {paper.standard_gb} GB against {paper.flash_gb} GB of HBM reads and writes, "
        f"**{paper.standard_over_flash:.1f}×**, for {paper.workload} ({paper.source}{other}). That is both passes "
        "of training, measured, so it is not this table's number: this model counts the forward pass only and "
        "four N² passes of the naive path.",
    ])


def dsa_reads(context: int = DEFAULT_CONTEXT, model: str = "mistral-7b", top_k: int = DSA_TOP_K) -> list[SparseRead]:
    """A DSA decode step's reads at ``context`` and at twice it (Mistral-7B's widths by default), the main
    attention reading the KV of ``top_k`` tokens."""
    return [dsa_read_per_step(model, c, top_k) for c in (context, 2 * context)]


def dsa_text(reads: list[SparseRead]) -> str:
    """Whether a DSA decode step's reads grow with the context, from :func:`dsa_reads`, with the assumption."""
    a, b = reads[0], reads[-1]
    grows = b.bytes_read > a.bytes_read
    return (f"**DSA per decode step:** the indexer reads one {a.indexer_key_dim}-value key of "
            f"{a.indexer_bytes_per_element} B per value for every cached token in each of {a.layers} layers, "
            f"{fmt_bytes(a.indexer_bytes_per_token)} per token, and the main attention reads the KV of at most "
            f"{a.top_k:,} tokens. At {a.context:,} tokens a step reads {fmt_bytes(a.bytes_read)} "
            f"({fmt_bytes(a.top_k_kv_bytes)} of top-k KV, {fmt_bytes(a.indexer_bytes)} of indexer keys); at "
            f"{b.context:,}, {fmt_bytes(b.bytes_read)}: "
            + (f"the reads **{'grow' if grows else 'do not grow'}** with the context"
               + (f", {b.bytes_read / a.bytes_read:.2f}× for 2× the tokens" if grows else "")
               + (" (the top-k part is capped; the indexer part is not)." if grows and b.top_k_kv_bytes ==
                  a.top_k_kv_bytes else ".")))


def quality_text(quality: QualityResult) -> str:
    if quality.skipped:
        return quality.skipped
    base = quality.rows[0]
    parts = []
    for r in quality.rows[1:]:
        saving = r.note or f"{base.kv_bytes_per_token / r.kv_bytes_per_token:.2f}× less KV per token"
        parts.append(f"{r.variant}: {perplexity_change_text(r)} ({r.perplexity:,.1f} vs {base.perplexity:.1f}), {saving}")
    text = "; ".join(parts) + f". Over {quality.eval_tokens} tokens of the shipped evaluation text."
    text += (" Without uptraining, pooling K/V heads is far from free: that is why GQA and MQA models are "
             "trained (or uptrained) that way.")
    note = baseline_note(quality.embedded)
    return text + ("\n\n" + note if note else "")


def timing_text(timing: TimingResult) -> str:
    ok = [b for b in timing.backends if b.available]
    longest = max(b.seq_len for b in ok)
    fastest = min((b for b in ok if b.seq_len == longest), key=lambda b: b.time_s_p50)
    few, many = timing.decode[0], timing.decode[-1]
    text = (f"On {timing.device} ({threads_text(timing.threads)}): at {longest:,} tokens the fastest available SDPA "
            f"backend is **{fastest.backend}** ({fastest.time_s_p50 * 1e3:.2f} ms); "
            f"{len(timing.backends) - len(ok)} of {len(timing.backends)} backend/length pairs cannot run here. "
            + (unavailable_text(timing) + " " if len(ok) < len(timing.backends) else "") +
            f"Decode attention over {few.context:,} tokens takes {few.time_s_p50 * 1e6:.0f} µs with {few.kv_heads} KV "
            f"head(s) and {many.time_s_p50 * 1e6:.0f} µs with {many.kv_heads}: {many.kv_bytes / few.kv_bytes:.0f}× "
            f"the bytes for {many.time_s_p50 / few.time_s_p50:.1f}× the time, against "
            f"{timing.bandwidth_Bps / 1e9:.1f} GB/s of measured copy bandwidth.")
    return text


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result`` or the analytic model."""
    lines = [f"Model: {result.model}; {threads_text(result.threads)}."]
    if result.equivalence:
        lines.append(equivalence_text(result.equivalence))
    lines.append(memory_text(memory_rows()))
    lines.append(mla_text())
    lines.append(dsa_text(dsa_reads()))
    lines.append(flash_text(flash_result()))
    if result.quality:
        lines.append(quality_text(result.quality))
    if result.timing:
        lines.append(timing_text(result.timing))
    return "\n\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Tables

EQUIVALENCE_COLUMNS = [
    Column("variant", "variant", "text"), Column("path", "path", "text"),
    Column("prefill_max_abs_diff", "prefill max |Δ| vs SDPA"), Column("decode_max_abs_diff", "cached decode max |Δ|"),
    Column("equal", f"within {EQUIVALENCE_TOL:g}", "bool"),
]
MEMORY_COLUMNS = [
    Column("model", "model", "text"), Column("variant", "variant", "text"),
    Column("kv_bytes_per_token", "KV per token, all layers", "bytes"),
    Column("kv_bytes_per_user", "KV per user", "bytes"), Column("mha_over_variant", "MHA / variant", "ratio"),
    Column("weight_dtype", "weights", "text"), Column("n_gpus", "GPUs (hold the weights)", "int"),
    Column("max_users", "max users", "int"),
]
MLA_COLUMNS = [
    Column("comparison", "comparison", "text"), Column("k_head_dim", "MHA K head dim", "int"),
    Column("mha_bytes_per_token", "MHA KV per token", "bytes"),
    Column("mla_bytes_per_token", "MLA KV per token", "bytes"),
    Column("ratio", "MHA / MLA", "ratio"), Column("fair", "fair", "bool"),
]
QUALITY_COLUMNS = [
    Column("variant", "attention", "text"), Column("perplexity", "perplexity"),
    Column("perplexity_change", "perplexity change", "pct"), Column("perplexity_ratio", "× as trained", "ratio"),
    Column("kv_bytes_per_token", "KV per token (B), measured", "int"), Column("note", "note", "text"),
]
SCORECARD_COLUMNS = [
    Column("model", "model", "text"), Column("variant", "variant", "text"), Column("quality", "quality", "text"),
    Column("kv_bytes_per_token", "KV per token", "bytes"), Column("n_gpus", "GPUs", "int"),
    Column("max_users", "max users", "int"),
    Column("decode_tok_s_batch1", "decode tok/s, batch 1 (roofline)"),
    Column("decode_tok_s_at_max_users", "decode tok/s at max users (roofline)"),
]
STATE_COLUMNS = [
    Column("architecture", "architecture", "text"), Column("state_bytes_per_user", "state per user", "bytes"),
    Column("grows_with_context", "grows with context", "bool"),
    Column("bytes_read_per_step", "read per step", "bytes", missing="— (all of it)"),
    Column("read_grows_with_context", "read grows with context", "bool", missing="— (as the state)"),
]
FLASH_COLUMNS = [
    Column("seq_len", "sequence (tokens)", "int"), Column("naive_bytes", "naive HBM traffic", "bytes"),
    Column("tiled_bytes", "tiled, K/V re-read from HBM", "bytes"),
    Column("naive_over_tiled", "naive / tiled (re-read)", "ratio"),
    Column("tiled_kv_once_bytes", "tiled, K/V once (cache hits)", "bytes"),
    Column("naive_over_tiled_kv_once", "naive / tiled (once)", "ratio"),
    Column("score_matrix_bytes", "naive score matrix, one layer", "bytes"),
]
PREDICTED_COLUMNS = [
    Column("kv_heads", "KV heads", "int"), Column("context", "context (tokens)", "int"),
    Column("kv_read_bytes", "KV read per step", "bytes"), Column("bytes", "all bytes per step", "bytes"),
    Column("step_s", "step (ms)", scale=1e3), Column("tokens_per_s", "tokens/s"),
]
BACKEND_COLUMNS = [
    Column("backend", "SDPA backend", "text"), Column("seq_len", "sequence (tokens)", "int"),
    Column("time_s_p50", "time p50 (ms)", scale=1e3, missing="— (not available here)"),
    Column("score_matrix_bytes", "score matrix (math backend)", "bytes"),
]
DECODE_COLUMNS = [
    Column("kv_heads", "KV heads", "int"), Column("context", "context (tokens)", "int"),
    Column("kv_bytes", "KV read", "bytes"), Column("time_s_p50", "measured p50 (µs)", scale=1e6),
    Column("predicted_s", "KV bytes / copy bandwidth (µs)", scale=1e6, missing="— (no bandwidth measured)"),
    Column("measured_over_predicted", "measured / predicted", "ratio", missing="—"),
]


def equivalence_table(rows: list[EquivalenceRow]):
    return people_table(rows, EQUIVALENCE_COLUMNS)


def memory_table(rows: list[VariantMemory]):
    return people_table(rows, MEMORY_COLUMNS)


def mla_table(ratios: dict[str, MLARatio] | None = None):
    return people_table(list((ratios or mla_ratio_explained()).values()), MLA_COLUMNS)


def quality_table(quality: QualityResult):
    return people_table(quality.rows, QUALITY_COLUMNS)


def scorecard_table(rows: list[ScorecardRow]):
    return people_table(rows, SCORECARD_COLUMNS)


def state_table(rows: list[StateSize] | None = None, context: int = DEFAULT_CONTEXT, top_k: int = DSA_TOP_K):
    return people_table(rows if rows is not None else constant_state_models(context=context, dsa_top_k=top_k),
                        STATE_COLUMNS)


def flash_table(flash: FlashResult | None = None):
    return people_table((flash or flash_result()).rows, FLASH_COLUMNS)


def prediction_table(rows: list[PredictedDecode]):
    return people_table(rows, PREDICTED_COLUMNS)


def backend_table(timing: TimingResult):
    """The backends that ran here (those that cannot are named in :func:`unavailable_text`)."""
    return people_table([b for b in timing.backends if b.available], BACKEND_COLUMNS)


def plain_reason(reason: str) -> str:
    """PyTorch's refusal of a backend in words for the page (its raw message never reaches it)."""
    lowered = reason.lower()
    if "no viable backend" in lowered or "not compiled" in lowered or "cuda" in lowered:
        return "no kernel for this device and dtype in this PyTorch build (it is a GPU kernel)"
    if "out of memory" in lowered:
        return "out of memory at this length"
    return "refused by PyTorch on this device"


def unavailable_text(timing: TimingResult) -> str:
    """The backends that could not run, grouped by reason, in one sentence ('' when all ran)."""
    groups: dict[str, list[str]] = {}
    for b in timing.backends:
        if not b.available:
            names = groups.setdefault(plain_reason(b.reason), [])
            if b.backend not in names:
                names.append(b.backend)
    return " ".join(f"Not run here: **{', '.join(names)}**: {why}." for why, names in groups.items())


def decode_table(timing: TimingResult):
    return people_table(timing.decode, DECODE_COLUMNS)


def tables(result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if result.equivalence:
        out["Every variant against SDPA"] = equivalence_table(result.equivalence)
    out[f"KV memory per variant on {DEFAULT_GPU}, {DEFAULT_CONTEXT:,} tokens (analytic)"] = memory_table(memory_rows())
    out["The MLA ratio against each baseline (analytic)"] = mla_table()
    if result.quality and result.quality.rows:
        out["Quality on real weights"] = quality_table(result.quality)
    out[f"Scorecard on {DEFAULT_GPU}, {DEFAULT_CONTEXT:,} tokens (analytic memory, roofline speed)"] = (
        scorecard_table(scorecard_rows(quality=result.quality)))
    out["Architectures without a growing KV cache (analytic)"] = state_table()
    out[f"Attention HBM traffic, naive vs tiled, tiles in {DEFAULT_GPU}'s shared memory per thread block "
        "(analytic)"] = flash_table()
    if result.timing:
        out["SDPA backends on this machine"] = backend_table(result.timing)
        out["Decode attention vs KV heads on this machine"] = decode_table(result.timing)
    return out


# ---------------------------------------------------------------------------------------------
# Figures


def kv_figure(rows: list[VariantMemory], title: str):
    """Horizontal bars of KV bytes per token (all layers, log scale) per model and variant."""
    from ..figures import subplots

    labels = [f"{r.model} · {r.variant}" for r in rows]
    fig, ax = subplots(figsize=(7, 0.3 * len(rows) + 1.2))
    ax.barh(labels, [r.kv_bytes_per_token for r in rows], color="#55a868")
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("KV bytes per token, all layers, bf16 (log)")
    if any(r.variant == "MLA" for r in rows):
        k = next(iter(mla_ratio_explained().values()))
        ax.set_xlabel(ax.get_xlabel() + f"\nMLA models' MHA and MQA rows give K the value head dim ({k.v_head_dim})")
    ax.set_title(title, fontsize=9)
    finish(fig)
    return fig


def flash_title(f: FlashResult) -> str:
    """The figure's title, with the assumptions its tiled lines follow from."""
    t = f.tiling
    return (f"Attention HBM traffic, one layer, {f.heads} heads × d {t.head_dim}, {t.bytes_per_element} B/element "
            f"(analytic)\nquery tile {t.block_q} rows from M = {fmt_bytes(t.sram_bytes)} "
            f"({t.sram_of}), " + ("causal" if t.causal else "no mask"))


def hbm_figure(f: FlashResult, title: str | None = None):
    """Naive vs tiled attention HBM traffic against sequence length (log-log), both tiled bounds."""
    from ..figures import subplots

    fig, ax = subplots(figsize=(6.4, 3.8))
    x = [r.seq_len for r in f.rows]
    ax.loglog(x, [r.naive_bytes for r in f.rows], "o-", label="naive (writes and re-reads S and P)")
    ax.loglog(x, [r.tiled_bytes for r in f.rows], "s-", label="tiled, K/V re-read from HBM per query tile")
    ax.loglog(x, [r.tiled_kv_once_bytes for r in f.rows], "^--", label="tiled, K/V from HBM once (re-reads hit a cache)")
    ax.set(xlabel="sequence length (tokens)", ylabel="HBM bytes, one layer (log)")
    ax.legend(fontsize=8)
    ax.set_title(title or flash_title(f), fontsize=9)
    finish(fig)
    return fig


def scorecard_figure(rows: list[ScorecardRow], title: str):
    """Two panels per variant: KV bytes per token (memory) and predicted decode tokens/s at max users."""
    from ..figures import subplots

    names = [f"{r.model} · {r.variant}" for r in rows]
    fig, (left, right) = subplots(1, 2, figsize=(9, 0.35 * len(rows) + 1.5), sharey=True)
    left.barh(names, [r.kv_bytes_per_token for r in rows], color="#55a868")
    left.set_xscale("log")
    left.set_xlabel("KV bytes per token, all layers (log)")
    right.barh(names, [r.decode_tok_s_at_max_users for r in rows], color="#c44e52")
    right.set_xlabel("decode tok/s at max users (roofline)")
    right.set_xlim(0, None)
    left.invert_yaxis()
    fig.suptitle(title, fontsize=9)
    finish(fig)
    return fig


def quality_figure(quality: QualityResult, source: str):
    """Perplexity of each variant relative to the model as trained (log axis: MQA without uptraining is far off)."""
    from ..figures import subplots

    rows = quality.rows
    fig, ax = subplots(figsize=(7, 0.45 * len(rows) + 1.2))
    ratios = [r.perplexity_ratio for r in rows]
    ax.barh([r.variant for r in rows], [x - 1 for x in ratios], left=1, color="#8172b3")  # bars start at 1×
    ax.set_xscale("log")
    ax.set_xlim(min(0.9, 0.9 * min(ratios)), 1.5 * max(ratios))
    ax.axvline(1, color="k", lw=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("perplexity / perplexity as trained (log; 1 = no change)")
    ax.set_title(f"The quality price of cheaper attention\n{source}", fontsize=9)
    finish(fig)
    return fig


def timing_figure(timing: TimingResult):
    """SDPA backend time vs length, and decode attention time vs KV heads with its bandwidth prediction."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    from ..figures import subplots

    plain = FuncFormatter(lambda v, _: f"{human(v, 4)}")
    fig, (left, right) = subplots(1, 2, figsize=(10, 3.6))
    for name in dict.fromkeys(b.backend for b in timing.backends):
        ok = [b for b in timing.backends if b.backend == name and b.available]
        if ok:
            left.plot([b.seq_len for b in ok], [b.time_s_p50 * 1e3 for b in ok], "o-", label=name)
    lengths = sorted({b.seq_len for b in timing.backends})
    left.set(xscale="log", yscale="log", xlabel="sequence length (tokens)", ylabel="prefill attention p50 (ms, log)",
             xticks=lengths)
    left.xaxis.set_major_formatter(plain)  # the lengths measured, and no minor labels between them
    left.xaxis.set_minor_formatter(NullFormatter())  # (the y axis gets plain log labels from finish)
    left.legend(fontsize=8)
    kv = [d.kv_heads for d in timing.decode]
    right.plot(kv, [d.time_s_p50 * 1e6 for d in timing.decode], "o-", label="measured p50")
    if all(d.predicted_s for d in timing.decode):
        right.plot(kv, [d.predicted_s * 1e6 for d in timing.decode], "k--", label="KV bytes / copy bandwidth")
    right.set_xscale("log", base=2)
    right.set(xlabel="KV heads", ylabel="decode attention step (µs)", ylim=(0, None), xticks=kv)
    right.xaxis.set_major_formatter(plain)
    right.xaxis.set_minor_formatter(NullFormatter())
    right.legend(fontsize=8)
    fig.suptitle(f"Attention measured on {timing.device}", fontsize=10)
    finish(fig)
    return fig


def figures(result: Result) -> dict[str, Any]:
    out = {
        "kv": kv_figure(memory_rows(), "KV bytes per token per variant, all layers (analytic)"),
        "hbm": hbm_figure(flash_result()),
        "scorecard": scorecard_figure(scorecard_rows(quality=result.quality),
                                      f"Attention variants on {DEFAULT_GPU}, {DEFAULT_CONTEXT:,} tokens: "
                                      "analytic memory, roofline speed"),
    }
    if result.quality and result.quality.rows:
        out["quality"] = quality_figure(result.quality, result.quality.model)
    if result.timing:
        out["timing"] = timing_figure(result.timing)
    return out


# ---------------------------------------------------------------------------------------------
# Saved GPU results


def saved() -> SavedView | None:
    """``scripts/gpu_checks.py --only attention`` results saved from a GPU, when there are any."""
    found = [s for s in load_saved("attention-*-cuda-*.json") if s.data.get("sdpa_backends")]
    if not found:
        return None
    src = found[0]
    backends = [BackendTime(**{k: v for k, v in r.items() if k in BackendTime.__dataclass_fields__})
                for r in src.data["sdpa_backends"]]
    decode = [DecodeAttentionTime(**{k: v for k, v in r.items() if k in DecodeAttentionTime.__dataclass_fields__})
              for r in src.data.get("decode_vs_kv_heads", [])]
    return SavedView(
        title=f"Attention timed on {src.device}",
        source=src,
        tables={"SDPA backends": people_table(backends, BACKEND_COLUMNS),
                "Decode attention vs KV heads": people_table(decode, DECODE_COLUMNS)},
        notes=[f"Measured by: {src.command}"],
    )

