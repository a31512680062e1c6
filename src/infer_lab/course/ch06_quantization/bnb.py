"""Chapter 06's saved part: bitsandbytes int8 / NF4 on an H200, bytes read vs time per format."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..tables import Column


@dataclass(frozen=True)
class WeightRead:
    """One linear layer in one format at one batch: the bytes it must read vs the time it took."""

    format: str
    batch: int
    weight_bytes: int
    floor_s: float  # weight bytes / datasheet bandwidth
    measured_s: float

    @property
    def achieved_Bps(self) -> float:
        return self.weight_bytes / self.measured_s

    @property
    def measured_over_floor(self) -> float:
        return self.measured_s / self.floor_s


FORMAT_BITS = {"bf16": 16, "int8": 8, "nf4": 4}


def weight_reads(bnb_rows: list[dict[str, Any]], out_features: int, in_features: int,
                 bandwidth_Bps: float) -> list[WeightRead]:
    """Rows ``{"batch", "bf16_us", "int8_us", "nf4_us"}`` as bytes read vs time (the floor at ``bandwidth_Bps``)."""
    out = []
    for row in bnb_rows:
        for fmt, bits in FORMAT_BITS.items():
            nbytes = out_features * in_features * bits // 8
            out.append(WeightRead(fmt, row["batch"], nbytes, nbytes / bandwidth_Bps, row[f"{fmt}_us"] * 1e-6))
    return out


WEIGHT_READ_COLUMNS = [
    Column("format", "format", "text"), Column("batch", "batch", "int"), Column("weight_bytes", "weight (codes only)", "bytes"),
    Column("floor_s", "memory floor (µs)", scale=1e6), Column("measured_s", "measured (µs)", scale=1e6),
    Column("achieved_Bps", "achieved (GB/s)", scale=1e-9), Column("measured_over_floor", "measured / floor", "ratio"),
]
BNB_SHAPE = (14336, 4096)  # out, in: one Mistral-7B MLP up projection, as the baseline script measured it


def bnb_text(reads: list[WeightRead], datasheet_Bps: float, copy_Bps: float | None, nf4_error: float | None) -> str:
    """Why LLM.int8 is slower than bf16 at batch 1, every number from the saved rows."""
    b1 = {r.format: r for r in reads if r.batch == 1}
    bf16, int8, nf4 = b1["bf16"], b1["int8"], b1["nf4"]
    share = int8.achieved_Bps / datasheet_Bps
    text = (
        f"At batch 1, int8 reads {100 * int8.weight_bytes / bf16.weight_bytes:.0f}% of bf16's bytes yet takes "
        f"**{int8.measured_s / bf16.measured_s:.1f}× longer** ({int8.measured_s * 1e6:.0f} µs vs "
        f"{bf16.measured_s * 1e6:.0f} µs). It reaches {int8.achieved_Bps / 1e9:.0f} GB/s: "
        f"**{100 * share:.1f}% of the {datasheet_Bps / 1e12:.1f} TB/s datasheet bandwidth, about 1/{1 / share:.0f}**"
    )
    if copy_Bps:
        text += f" ({100 * int8.achieved_Bps / copy_Bps:.1f}% of the {copy_Bps / 1e12:.2f} TB/s measured copy)"
    text += (
        ". LLM.int8 quantizes the activations, splits out outlier features and runs them in 16-bit, multiplies "
        f"in int8 and dequantizes the output: several kernels per call. NF4 takes {nf4.measured_s * 1e6:.0f} µs, "
        f"{nf4.measured_s / bf16.measured_s:.1f}× bf16, for a quarter of the bytes."
    )
    if nf4_error is not None:
        text += f" NF4's output differs from bf16's by {100 * nf4_error:.1f}% (relative norm, random weights)."
    return text
