"""Part 6 of chapter 07: FlashAttention's HBM traffic, naive vs tiled, from the GPU's shared memory (analytic)."""

from __future__ import annotations

from dataclasses import dataclass

from ...attention import (
    PAPER_HBM_TRAFFIC,
    CitedHBMTraffic,
    FlashTiling,
    naive_attention_hbm_bytes,
    score_matrix_bytes,
    tiled_attention_hbm_bytes,
)
from ...catalog import OnChipMemory, get_gpu, get_on_chip_memory, gpu_catalog_about
from ...figures import finish, subplots
from ...units import fmt_bytes
from ..tables import Column, people_table
from .scenario import DEFAULT_GPU

FLASH_LENGTHS = (1024, 4096, 16384, 32768, 65536)
FLASH_SHAPE = (32, 128)  # heads, head dim: a 7B-class layer
FLASH_SHARED_KIB_RANGE = (8, 256, 1)  # the shared-memory control of part 6 (KiB): min, max, step


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


FLASH_COLUMNS = [
    Column("seq_len", "sequence (tokens)", "int"), Column("naive_bytes", "naive HBM traffic", "bytes"),
    Column("tiled_bytes", "tiled, K/V re-read from HBM", "bytes"),
    Column("naive_over_tiled", "naive / tiled (re-read)", "ratio"),
    Column("tiled_kv_once_bytes", "tiled, K/V once (cache hits)", "bytes"),
    Column("naive_over_tiled_kv_once", "naive / tiled (once)", "ratio"),
    Column("score_matrix_bytes", "naive score matrix, one layer", "bytes"),
]


def flash_table(flash: FlashResult | None = None):
    return people_table((flash or flash_result()).rows, FLASH_COLUMNS)


def flash_title(f: FlashResult) -> str:
    """The figure's title, with the assumptions its tiled lines follow from."""
    t = f.tiling
    return (f"Attention HBM traffic, one layer, {f.heads} heads × d {t.head_dim}, {t.bytes_per_element} B/element "
            f"(analytic)\nquery tile {t.block_q} rows from M = {fmt_bytes(t.sram_bytes)} "
            f"({t.sram_of}), " + ("causal" if t.causal else "no mask"))


def hbm_figure(f: FlashResult, title: str | None = None):
    """Naive vs tiled attention HBM traffic against sequence length (log-log), both tiled bounds."""
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
