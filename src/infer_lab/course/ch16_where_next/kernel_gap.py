"""The kernels section: a CUDA-graph decode saved on a GPU against the datasheet roofline."""

from __future__ import annotations

from dataclasses import dataclass

from ...analysis import roofline
from ...catalog import resolve_gpu_name
from ...figures import finish, subplots
from ..saved import load_saved
from ..tables import Column


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


def sol_figure(rows: list[SolRow]):
    """Saved step times next to the roofline, by batch (log x)."""
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
