"""FlashAttention's idea in plain torch: tiles and an online softmax, never the full score matrix.

A GPU kernel keeps one query tile on chip (shared memory and registers) and streams key/value tiles
past it: FlashAttention-2's loop order (FlashAttention's own Algorithm 1 keeps the K/V tiles in the
outer loop and streams the query tiles past them instead). Here the loops are ordinary Python so every quantity has a name: ``running_max`` (largest score seen so far per
query), ``running_sum`` (softmax denominator rescaled to that max) and ``output_acc`` (the
unnormalized weighted sum of values). This is for reading and testing, not for speed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .reference import expand_kv_heads, position_mask


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    window: int | None = None,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
) -> torch.Tensor:
    """Tiled attention with an online softmax; equal to softmax(QK^T·scale)V up to rounding.

    Shapes as in :mod:`infer_lab.attention.reference` (queries are the last ``q_len`` positions).
    Tiles that the causal/window mask hides completely are skipped, which is where the causal
    variant saves about half the work.
    """
    if block_q < 1 or block_k < 1:
        raise ValueError(f"block sizes must be >= 1, got block_q={block_q}, block_k={block_k}")
    k = expand_kv_heads(k, q.shape[1])
    v = expand_kv_heads(v, q.shape[1])
    q_len, kv_len = q.shape[-2], k.shape[-2]
    offset = kv_len - q_len  # absolute position of query 0
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype, device=q.device)
    for q_start in range(0, q_len, block_q):
        q_tile = q[..., q_start : q_start + block_q, :].float()
        rows = q_tile.shape[-2]
        first_query_pos, last_query_pos = offset + q_start, offset + q_start + rows - 1
        running_max = torch.full((*q_tile.shape[:-1], 1), float("-inf"), device=q.device)
        running_sum = torch.zeros_like(running_max)
        output_acc = torch.zeros(*q_tile.shape[:-1], v.shape[-1], device=q.device)
        for k_start in range(0, kv_len, block_k):
            k_end = min(k_start + block_k, kv_len)
            if causal and k_start > last_query_pos:
                break  # every later key is in the future of every query of this tile
            if window is not None and k_end - 1 <= first_query_pos - window:
                continue  # the whole key tile slid out of every query's window
            scores = (q_tile @ k[..., k_start:k_end, :].float().transpose(-2, -1)) * scale
            if causal or window is not None:
                mask = position_mask(
                    torch.arange(first_query_pos, last_query_pos + 1, device=q.device),
                    torch.arange(k_start, k_end, device=q.device),
                    causal,
                    window,
                )
                scores = scores.masked_fill(~mask, float("-inf"))
            running_max, running_sum, output_acc = online_softmax_tile(
                scores, v[..., k_start:k_end, :].float(), running_max, running_sum, output_acc)
        out[..., q_start : q_start + rows, :] = (output_acc / running_sum).to(q.dtype)
    return out


def online_softmax_tile(
    scores: torch.Tensor,
    v_tile: torch.Tensor,
    running_max: torch.Tensor,
    running_sum: torch.Tensor,
    output_acc: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one key/value tile into a query tile's running softmax: FlashAttention's inner step.

    ``scores (..., rows, tile)`` are this tile's scaled (and masked) scores, ``v_tile (..., tile, d)``
    its values. Whenever a larger score appears, what was summed so far is rescaled by
    ``exp(old max - new max)``, so ``output_acc / running_sum`` is always the softmax-weighted
    sum of the values seen so far. Returns the new ``(running_max, running_sum, output_acc)``.
    """
    new_max = torch.maximum(running_max, scores.amax(dim=-1, keepdim=True))
    # A row that has seen only masked keys keeps max -inf; use 0 so exp() gives 0, not NaN.
    safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
    correction = torch.exp(running_max - safe_max)
    probs = torch.exp(scores - safe_max)
    running_sum = running_sum * correction + probs.sum(dim=-1, keepdim=True)
    output_acc = output_acc * correction + probs @ v_tile
    return new_max, running_sum, output_acc


@dataclass(frozen=True)
class FlashTiling:
    """What the tiled path's HBM traffic follows from, each with its unit.

    ``sram_bytes`` is FlashAttention's M, in bytes: the on-chip memory one thread block holds its
    tiles in. On a GPU that is the shared memory one thread block may use (the catalog's
    ``shared_kib_max_per_block``: CUDA's per-block limit, AMD's LDS per workgroup), not the whole
    L1/shared SRAM of an SM. ``head_dim`` is d, in elements; ``bytes_per_element`` the K/V/Q/O
    element size (2: bf16).

    The loop order is FlashAttention-2's (Dao 2023), the one :func:`flash_attention` runs: query
    tiles outside, the K/V tiles walked past each, so Q is read and O written once and K and V are
    re-read once per query tile. The tile heights are an assumption taken from FlashAttention's
    Algorithm 1 (Dao et al. 2022): key tiles of ``B_c = ceil(M / 4d)`` rows, query tiles of
    ``B_r = min(B_c, d)`` rows, with M counted in elements (FlashAttention-2 picks its tile sizes by
    tuning, not by this rule). Algorithm 1 itself runs the loops the other way round: K/V blocks
    outside, Q blocks inside, so it reads K and V once and re-reads Q and O (read and written back)
    once per K/V block, Θ(N·d / M) passes over Q. ``causal``: a decoder's prefill, where a query tile
    skips the key tiles entirely in its future (as :func:`flash_attention` does). ``sram_of`` says
    whose memory M is.
    """

    sram_bytes: int
    head_dim: int
    bytes_per_element: int = 2
    causal: bool = True
    sram_of: str = ""

    def __post_init__(self) -> None:
        if self.sram_bytes < 4 * self.head_dim * self.bytes_per_element:
            raise ValueError(f"{self.sram_bytes} B of on-chip memory cannot hold one row of Q, K, V and O at head dim "
                             f"{self.head_dim}: it needs at least {4 * self.head_dim * self.bytes_per_element} B")

    @property
    def sram_elements(self) -> int:
        return self.sram_bytes // self.bytes_per_element

    @property
    def block_k(self) -> int:
        """Rows of K and V per tile: ``ceil(M / 4d)``."""
        return math.ceil(self.sram_elements / (4 * self.head_dim))

    @property
    def block_q(self) -> int:
        """Rows of Q per tile: ``min(ceil(M / 4d), d)``."""
        return min(self.block_k, self.head_dim)

    @property
    def long_sequence_saving(self) -> float:
        """Naive over tiled HBM bytes as N grows, when K and V are re-read from HBM by every query
        tile: the naive path's 4·N² against the re-reads' 2·N²·d / ``block_q`` (half that when causal)."""
        return (4 if self.causal else 2) * self.block_q / self.head_dim


def naive_attention_hbm_bytes(
    seq_len: int, head_dim: int, heads: int = 1, batch: int = 1, bytes_per_element: int = 2
) -> int:
    """HBM bytes moved by unfused attention (prefill, ``seq_len`` queries and keys).

    Per head: read Q and K (2·N·d), write the scores S (N²), read S and write P = softmax(S)
    (2·N²), read P and V (N² + N·d), write O (N·d): ``4·N·d + 4·N²`` elements. Four N² passes
    only: a real unfused path that scales, masks or drops out in separate kernels moves more,
    so this is the naive path at its cheapest.
    """
    n, d = seq_len, head_dim
    return (4 * n * d + 4 * n * n) * heads * batch * bytes_per_element


def kv_rows_read(seq_len: int, block_q: int, causal: bool = False) -> int:
    """Rows of K (and of V) that the query tiles read, summed over the tiles: ``N`` per tile, or
    only the keys up to each tile's last query when ``causal`` (the later key tiles are skipped)."""
    tiles = math.ceil(seq_len / block_q)
    if not causal:
        return seq_len * tiles
    return sum(min(seq_len, (i + 1) * block_q) for i in range(tiles))


def tiled_attention_hbm_bytes(
    seq_len: int,
    head_dim: int,
    heads: int = 1,
    batch: int = 1,
    bytes_per_element: int = 2,
    block_q: int = 128,
    causal: bool = False,
    kv_rereads_from_hbm: bool = True,
) -> int:
    """HBM bytes moved by tiled (flash) attention in FlashAttention-2's loop order, the one
    :func:`flash_attention` runs: Q read and O written once, K and V read by every query tile.

    Per head: ``2·N·d`` for Q and O, plus ``2·d`` per K/V row read (:func:`kv_rows_read`): ``2·N·d·
    ceil(N / block_q)`` without a mask. The scores never reach HBM, but the K/V re-reads still grow
    as N²·d / ``block_q``: the saving against :func:`naive_attention_hbm_bytes` is about
    ``2·block_q / d`` at long lengths (twice that when ``causal``). ``kv_rereads_from_hbm=False`` is
    the other bound: every re-read after the first hits a cache (the L2, or a last-level cache beyond
    it), so K and V come from HBM once, ``4·N·d`` in all. ``block_q`` is bounded by the shared memory
    a thread block may use: :attr:`FlashTiling.block_q`. (FlashAttention's Algorithm 1 swaps the
    loops and re-reads Q and O instead; this function does not count that order.)
    """
    n, d = seq_len, head_dim
    kv_rows = kv_rows_read(n, block_q, causal) if kv_rereads_from_hbm else n
    return (2 * n * d + 2 * d * kv_rows) * heads * batch * bytes_per_element


@dataclass(frozen=True)
class CitedHBMTraffic:
    """A measured HBM-traffic comparison from a paper, kept with the workload it was measured on, in GB
    (1e9 B). ``other_standard_gb``: what another version of the paper prints for the standard path in
    the same figure (the FlashAttention figure is the same in both), and ``other_setting`` the run it says."""

    source: str
    workload: str
    standard_gb: float
    flash_gb: float
    other_standard_gb: float | None = None
    other_setting: str = ""

    @property
    def standard_over_flash(self) -> float:
        return self.standard_gb / self.flash_gb


# FlashAttention's paper, arXiv:2205.14135v2 (June 2022), Figure 2 left: measured HBM reads + writes
# of standard attention and FlashAttention, forward + backward. Another version of the paper prints
# 35.3 GB for standard attention in that figure (4.4 GB for FlashAttention), for a run with a
# key-padding mask and no dropout.
PAPER_HBM_TRAFFIC = CitedHBMTraffic(
    "Dao et al. 2022, FlashAttention, arXiv:2205.14135v2 (June 2022), Fig. 2 left",
    "GPT-2 medium attention (sequence 1,024, head dim 64, 16 heads, batch 64), forward + backward, on an A100",
    40.3, 4.4, other_standard_gb=35.3, other_setting="a key-padding mask, no dropout")


def score_matrix_bytes(seq_len: int, heads: int, batch: int = 1, bytes_per_element: int = 2) -> int:
    """Memory the naive path must allocate for one layer's scores: ``batch·heads·N²`` elements."""
    return batch * heads * seq_len * seq_len * bytes_per_element
