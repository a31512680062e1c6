"""The deck's foundations section of chapter 04: the memory hierarchy, and why decode waits on memory."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ...analysis import roofline
from ...catalog import get_gpu, get_on_chip_memory, list_gpus, memory_hierarchy_about
from ...figures import finish, subplots
from ...units import fmt_bytes, human
from ..tables import Column, people_table


@dataclass(frozen=True)
class HierarchyRow:
    """One GPU's HBM beside its on-chip SRAM and L2 (``None`` where no figure is on file)."""

    gpu: str
    memory_type: str
    hbm_bytes: int
    hbm_bandwidth_Bps: float
    sram_bytes: int | None
    sram_bandwidth_Bps: float | None  # derived: units x bytes per clock x clock
    l2_bytes: int | None

    @property
    def sram_over_hbm_bandwidth(self) -> float | None:
        return self.sram_bandwidth_Bps / self.hbm_bandwidth_Bps if self.sram_bandwidth_Bps else None

    @property
    def hbm_over_sram_bytes(self) -> float | None:
        return self.hbm_bytes / self.sram_bytes if self.sram_bytes else None


@dataclass(frozen=True)
class DecodeWait:
    """A decode step on a datasheet roof: how much of it the compute units spend waiting on memory.

    ``compute_s`` is what the step's FLOPs take at peak; ``time_s`` the roofline time (each op the
    slower of its FLOPs and its bytes); the rest is waiting for bytes.
    """

    model: str
    gpu: str
    batch: int
    context: int
    intensity: float  # FLOP/B of the whole step
    ridge_point: float
    compute_s: float
    time_s: float

    @property
    def waiting_fraction(self) -> float:
        return 1 - self.compute_s / self.time_s


def hierarchy_rows(gpus: list[str] | None = None) -> list[HierarchyRow]:
    """HBM and on-chip memory of every catalogued GPU (or ``gpus``), from the catalog."""
    rows = []
    for name in gpus or list_gpus():
        spec, chip = get_gpu(name), get_on_chip_memory(name)
        rows.append(HierarchyRow(spec.name, spec.memory_type, spec.memory_bytes, spec.bandwidth_Bps,
                                 chip.sram_bytes if chip else None, chip.sram_bandwidth_Bps if chip else None,
                                 chip.l2_bytes if chip else None))
    return rows


def decode_wait(model: str = "mistral-7b", gpu: str = "H100-SXM", batch: int = 1, context: int = 4096) -> DecodeWait:
    """One decode step of ``batch`` sequences at ``context`` on ``gpu``'s datasheet roof."""
    roof = roofline.gpu_roof(gpu)
    ops = roofline.decode_ops(model, batch, context)
    flops, nbytes = sum(o.flops for o in ops), sum(o.bytes for o in ops)
    return DecodeWait(str(roofline.as_shape(model).name), roof.name, batch, context, flops / nbytes, roof.ridge_point,
                      flops / roof.peak_flops, sum(roof.time_s(o.flops, o.bytes) for o in ops))


def decode_wait_curve(model: str = "mistral-7b", gpu: str = "H100-SXM", context: int = 4096,
                      batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)) -> list[DecodeWait]:
    return [decode_wait(model, gpu, b, context) for b in batches]


def hierarchy_text(rows: list[HierarchyRow], gpu: str = "H100-SXM") -> str:
    """The hierarchy of one GPU in words (HBM vs SRAM: size and bandwidth), from the catalog."""
    r = next(x for x in rows if x.gpu == gpu)
    if r.sram_bytes is None:
        return f"{gpu}: no on-chip figures on file ({memory_hierarchy_about().get('missing', '')})"
    return (
        f"**{r.gpu}**: {fmt_bytes(r.hbm_bytes)} of {r.memory_type} at {human(r.hbm_bandwidth_Bps / 1e12, 3)} TB/s, against "
        f"{fmt_bytes(r.sram_bytes)} of on-chip SRAM (L1/shared memory of all SMs) at about "
        f"{human(r.sram_bandwidth_Bps / 1e12, 3)} TB/s and an L2 of {fmt_bytes(r.l2_bytes)}. HBM is "
        f"{r.hbm_over_sram_bytes:,.0f}× larger; SRAM is {human(r.sram_over_hbm_bandwidth, 2)}× faster. Weights and KV "
        "live in HBM and stream through SRAM at every step: that stream is what decode waits on, and what "
        "FlashAttention keeps small by tiling inside SRAM."
    )


# Talk 2 (Daniel of Cerebras, T4-system-talk.txt line 5): "up to 90% of the time, the computer is simply waiting
# to load data from memory" during decode.
TALK_DECODE_WAIT = 0.90


def talk_wait_judgement(waiting_fraction: float, said: float = TALK_DECODE_WAIT) -> str:
    """Talk 2's "up to 90%" against the roofline's waiting fraction (both fractions of the step, 0-1)."""
    claim = f"Talk 2's \"up to {said:.0%}\" of the time waiting on memory (Daniel, Cerebras)"
    if waiting_fraction >= said:
        return (f"{claim} is on the conservative side of this bound: the roofline's {waiting_fraction:.1%} is "
                "at least that.")
    return (f"{claim} overstates this case: the roofline's {waiting_fraction:.1%} is below it, so here the compute "
            "units wait less than the talk's figure.")


def decode_wait_text(model: str = "mistral-7b", gpu: str = "H100-SXM", context: int = 4096) -> str:
    """Why decode waits on memory, from the roofline: intensity at batch 1 vs the ridge, and the time waiting."""
    one = decode_wait(model, gpu, 1, context)
    roof = roofline.gpu_roof(gpu)
    cb = roofline.critical_batch(model, roof, context)
    turn = (f"Only at a batch of about **{cb:,}** does the step turn compute-bound." if cb else
            "At this context it never turns compute-bound: each sequence brings its own KV to read.")
    return (
        f"A decode step of **{one.model}** at batch 1 and {context:,} tokens does {human(one.intensity, 2)} FLOP per byte it "
        f"moves; the **{one.gpu}** needs {one.ridge_point:,.0f} FLOP/B to keep its tensor cores busy (the ridge). "
        f"So on the roofline its compute units are busy {human(one.compute_s * 1e6, 3)} µs of a {human(one.time_s * 1e3, 3)} ms "
        f"step and **wait on memory {one.waiting_fraction:.1%} of the time**. {turn} Real kernels reach only part "
        f"of the datasheet bandwidth, so the measured step is longer still. {talk_wait_judgement(one.waiting_fraction)}"
    )


def hierarchy_table(rows: list[HierarchyRow]):
    missing = "— (no figure on file)"
    return people_table(rows, [
        Column("gpu", "GPU", "text"), Column("memory_type", "memory", "text"), Column("hbm_bytes", "HBM", "bytes"),
        Column("hbm_bandwidth_Bps", "HBM TB/s", scale=1e-12), Column("sram_bytes", "on-chip SRAM", "bytes", missing=missing),
        Column("sram_bandwidth_Bps", "SRAM TB/s (derived)", scale=1e-12, missing=missing),
        Column("l2_bytes", "L2", "bytes", missing=missing),
        Column("sram_over_hbm_bandwidth", "SRAM ÷ HBM bandwidth", "ratio", missing=missing),
    ])


def decode_wait_table(rows: list[DecodeWait]):
    return people_table(rows, [
        Column("batch", "batch", "int"), Column("intensity", "FLOP/B"), Column("ridge_point", "ridge (FLOP/B)"),
        Column("compute_s", "compute at peak (µs)", scale=1e6), Column("time_s", "roofline step (ms)", scale=1e3),
        Column("waiting_fraction", "waiting on memory", "pct"),
    ])


def hierarchy_figure(rows: list[HierarchyRow]):
    """Capacity against bandwidth, log-log: each GPU's HBM (circles) and on-chip SRAM (triangles)."""
    fig, ax = subplots(figsize=(7, 4.2))
    for i, r in enumerate(x for x in rows if x.sram_bytes):
        color = f"C{i % 10}"
        ax.scatter(r.hbm_bytes / 1e9, r.hbm_bandwidth_Bps / 1e12, marker="o", color=color, s=40)
        ax.scatter(r.sram_bytes / 1e9, r.sram_bandwidth_Bps / 1e12, marker="^", color=color, s=40)
        ax.plot([r.sram_bytes / 1e9, r.hbm_bytes / 1e9], [r.sram_bandwidth_Bps / 1e12, r.hbm_bandwidth_Bps / 1e12],
                color=color, lw=0.8, alpha=0.6, label=r.gpu)
    ax.scatter([], [], marker="o", color="k", label="HBM / GDDR (off-chip)")
    ax.scatter([], [], marker="^", color="k", label="on-chip SRAM (L1/shared, derived bandwidth)")
    ax.set(xscale="log", yscale="log", xlabel="capacity (GB = 10⁹ B), log scale", ylabel="bandwidth (TB/s), log scale")

    known = [x for x in rows if x.sram_bytes]
    size = statistics.median(x.hbm_over_sram_bytes for x in known)
    speed = statistics.median(x.sram_over_hbm_bandwidth for x in known)
    ax.set_title(f"The memory hierarchy: on-chip SRAM is {size:,.0f}× smaller and {human(speed, 2)}× faster than HBM "
                 f"(medians of {len(known)} GPUs)\ncatalog data (vendor whitepapers and datasheets), no hardware",
                 fontsize=9)
    ax.legend(fontsize=6, ncol=2, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    finish(fig)
    return fig


def decode_wait_figure(curves: dict[str, list[DecodeWait]]):
    """Share of a decode step spent waiting on memory against the batch, one line per GPU (log x)."""
    fig, ax = subplots(figsize=(7, 3.8))
    for gpu, rows in curves.items():
        ax.semilogx([r.batch for r in rows], [100 * r.waiting_fraction for r in rows], "o-", ms=3, label=gpu)
    first = next(iter(curves.values()))[0]
    ax.set_ylim(0, 100)
    ax.set(xlabel="decode batch (sequences), log scale", ylabel="% of the step waiting on memory")
    ax.set_title(f"Decode waits on memory: {first.model} at {first.context:,} tokens on datasheet roofs\n"
                 "analytic: roofline, no hardware", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    finish(fig)
    return fig
