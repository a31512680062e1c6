"""What both parts of chapter 04 use: each op's row on a roof, a predicted-vs-measured row, and the roofline figure."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...analysis import roofline
from ...analysis.roofline import Roof, StepPrediction
from ...figures import finish, subplots
from ...units import human


@dataclass(frozen=True)
class OpRow:
    """One op of a step summed over the layers, on a roof: FLOPs, bytes, intensity, time (s)."""

    name: str
    flops: float
    bytes: float
    intensity: float
    time_s: float
    bound: str


@dataclass(frozen=True)
class ComparisonRow:
    """One quantity predicted and measured (bytes in B, times in ms)."""

    quantity: str
    unit: str
    predicted: float
    measured: float
    batch: int | None = None
    context: int | None = None
    phase: str | None = None
    flops: float | None = None
    bytes: float | None = None
    intensity: float | None = None

    @property
    def measured_over_predicted(self) -> float:
        return self.measured / self.predicted


def op_rows(ops: list[roofline.OpCost], roof: Roof) -> list[OpRow]:
    rows = []
    for o in ops:
        r = o.row(roof)
        rows.append(OpRow(o.name, o.flops, o.bytes, o.intensity, r["time_s"], r["bound"]))
    return rows


COLORS = {"prefill": "tab:orange", "decode": "tab:blue"}


def _short_op(name: str) -> str:
    """An op's name for a figure label: 'attention (scores + weighted sum)' -> 'attention'."""
    return {"o projection": "o proj", "LM head": "LM head", "MLP (dense)": "MLP"}.get(name, name.split(" ")[0])


def roofline_figure(roof: Roof, steps: list[StepPrediction], ops: dict[str, list[OpRow]],
                    measured: list[ComparisonRow] = (), title: str = ""):
    """The roof of a device, whole steps (stars), each op (dots) and measured steps (crosses), log-log.

    A measured step sits at its predicted intensity and the FLOP/s it actually achieved
    (predicted FLOPs / measured time).
    """
    measured = [r for r in measured if r.unit == "ms" and r.flops]
    fig, ax = subplots(figsize=(7, 4.5))
    xs = [s.intensity for s in steps] + [o.intensity for g in ops.values() for o in g if o.flops and o.bytes]
    xs += [r.intensity for r in measured]
    lo, hi = max(min(xs + [roof.ridge_point]) / 4, 1e-2), max(xs + [roof.ridge_point]) * 4
    grid = np.geomspace(lo, hi, 200)
    label = f"roof: {roof.name}" + ("" if roof.source in roof.name else f" ({roof.source})")
    ax.loglog(grid, [roof.attainable_flops(x) for x in grid], "k-", lw=2, label=label)
    ax.axvline(roof.ridge_point, color="grey", ls=":", lw=1)
    ax.annotate(f"ridge {human(roof.ridge_point, 3)} FLOP/B", (roof.ridge_point, roof.peak_flops), fontsize=8,
                xytext=(5, -15), textcoords="offset points")
    for phase, group in ops.items():
        # Ops that land on the same spot (decode's projections all sit at ~1 FLOP/B) share one label.
        spots: dict[tuple[float, float], list[Any]] = {}
        for o in group:
            if o.flops and o.bytes:
                ax.scatter(o.intensity, o.flops / o.time_s, s=14, color=COLORS[phase], alpha=0.5)
                key = (round(math.log10(o.intensity), 1), round(math.log10(o.flops / o.time_s), 1))
                spots.setdefault(key, []).append(o)
        for same in spots.values():
            names = ", ".join(dict.fromkeys(_short_op(o.name) for o in same))
            ax.annotate(f"{phase}: {names}", (same[0].intensity, same[0].flops / same[0].time_s), fontsize=7,
                        color=COLORS[phase], xytext=(5, -4 if phase == "decode" else 5), textcoords="offset points")
    for s in steps:
        ax.scatter(s.intensity, s.flops / s.time_s, s=90, marker="*", color=COLORS.get(s.phase, "k"),
                   label=f"{s.phase} step, batch {s.batch}, {s.tokens:,} token{'' if s.tokens == 1 else 's'} (predicted)")
    for r in measured:
        ax.scatter(r.intensity, r.flops / (r.measured / 1e3), s=40, marker="x", color=COLORS.get(r.phase, "k"))
    if measured:
        ax.scatter([], [], marker="x", color="k", label="measured (harness): achieved FLOP/s")
    top = max([roof.peak_flops] + [r.flops / (r.measured / 1e3) for r in measured])
    ax.set_ylim(None, top * 3)
    ax.set(xlabel="arithmetic intensity (FLOP / byte), log scale", ylabel="FLOP/s, log scale")
    ax.set_title(title or f"Roofline: {roof.name}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    finish(fig)
    return fig
