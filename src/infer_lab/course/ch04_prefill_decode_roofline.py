"""Chapter 04, "Prefill vs decode and the roofline": predicted op by op, then measured here.

1. On a datasheet GPU (analytic, live in the notebook): every op of a prefill and of a decode
   step, its FLOPs, bytes and arithmetic intensity, and ``max(FLOPs / peak, bytes / bandwidth)``
   (:mod:`infer_lab.analysis.roofline`).
2. On this machine (measured): the same arithmetic on the ceilings measured here, next to what
   the harness measures (:func:`infer_lab.bench.hf_predicted.predicted_vs_measured`): bytes must
   agree to within 1 %; times do not, and the ratio is the lesson.

Both are the notebook's own code: ``datasheet_prediction`` and ``roofline_vs_harness``, the
``@app.function`` s of ``infer_lab/notebooks/04_prefill_decode_roofline.py`` that call the library directly.
This module shows what they return and runs the same functions for the tour, the tests and the
Jupyter edition (:func:`datasheet_view`, :func:`run_compare`, through
:mod:`infer_lab.course.notebook_code`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis import memory, roofline
from ..analysis.compare import dtype_name, explain_gaps, shape_of
from ..analysis.roofline import Prediction, Roof, StepPrediction
from ..figures import finish
from ..units import human
from .chapter import ChapterResult, chapter_number, choose_size, run_parts
from .library_code import code_block
from .notebook_code import notebook_function
from .saved import SavedView, load_saved
from .tables import Column, people_table

NUMBER = "04"
SLUG = "prefill_decode_roofline"
TITLE = "04 · Prefill vs decode and the roofline: predicted, then measured"
NEEDS_MODEL = True
PARTS = {
    "datasheet": "Predict prefill and decode on a datasheet GPU (analytic: runs live)",
    "compare": "Measure prefill and decode on this machine",
}


@dataclass(frozen=True)
class Sizes:
    """The datasheet defaults (what the notebook's controls start at) and the measured sweep."""

    size: str
    model: str
    gpu: str
    batch: int
    context: int
    prompt_lengths: tuple[int, ...]  # prefill (TTFT) measurements, batch 1
    contexts: tuple[int, ...]  # decode step measurements ...
    batches: tuple[int, ...]  # ... at each of these batches
    new_tokens: int  # per decode measurement (the first is the prefill's)
    repeats: int
    quick_ceilings: bool


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick`` on a CPU: two tiny prefills and two tiny decodes (seconds); ``full``: a real sweep."""
    size = choose_size(device, size)
    on_gpu = torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    common = dict(model="mistral-7b", gpu="H100-SXM", batch=1, context=4096, quick_ceilings=size == "quick")
    if on_gpu:
        if size == "quick":
            return Sizes(size, prompt_lengths=(128, 512, 2048), contexts=(512, 2048), batches=(1, 8),
                         new_tokens=8, repeats=3, **common)
        return Sizes(size, prompt_lengths=(128, 512, 2048, 8192), contexts=(512, 2048, 8192), batches=(1, 8, 32),
                     new_tokens=16, repeats=3, **common)
    if size == "quick":
        return Sizes(size, prompt_lengths=(8, 32), contexts=(16,), batches=(1, 2), new_tokens=4, repeats=1, **common)
    return Sizes(size, prompt_lengths=(16, 64, 256, 1024), contexts=(64, 512, 2048), batches=(1, 4, 16),
                 new_tokens=8, repeats=3, **common)


# ---------------------------------------------------------------------------------------------
# Typed results


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
class DatasheetView:
    """A model on a datasheet GPU: the prediction and each op of the prefill and the decode step."""

    model: str
    roof: Roof
    batch: int
    context: int
    prediction: Prediction
    prefill_ops: list[OpRow]
    decode_ops: list[OpRow]


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


@dataclass(frozen=True)
class CompareResult:
    """Predicted vs measured on this machine's measured roof."""

    model: str
    roof: Roof
    rows: list[ComparisonRow]
    gaps: list[str]  # the ratios read in words (computed)
    steps: list[StepPrediction]  # prefill and decode at the longest prompt, for the figure
    prefill_ops: list[OpRow]
    decode_ops: list[OpRow]
    threads: int
    ceilings_note: str = ""  # when the roof's ceilings were measured, and how busy the machine was
    attention_implementation: str = ""  # transformers' attention kernel of the loaded model ("sdpa", "eager", ...)


@dataclass
class Result(ChapterResult):
    """Chapter 04's results; a part not run is ``None``."""

    model: str = ""
    datasheet: DatasheetView | None = None
    compare: CompareResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


# ---------------------------------------------------------------------------------------------
# The datasheet part (live in the notebook)


def op_rows(ops: list[roofline.OpCost], roof: Roof) -> list[OpRow]:
    rows = []
    for o in ops:
        r = o.row(roof)
        rows.append(OpRow(o.name, o.flops, o.bytes, o.intensity, r["time_s"], r["bound"]))
    return rows


def datasheet_view_of(roof: Roof, prediction: Prediction, prefill: list[roofline.OpCost],
                      decode: list[roofline.OpCost]) -> DatasheetView:
    """What the notebook's ``datasheet_prediction`` returns, as a :class:`DatasheetView`."""
    return DatasheetView(prediction.model, roof, prediction.batch, prediction.context, prediction,
                         op_rows(prefill, roof), op_rows(decode, roof))


def datasheet_view(model: str, gpu: str, batch: int = 1, context: int = 4096) -> DatasheetView:
    """TTFT of one ``context``-token prompt and the decode step at ``batch`` on ``gpu``'s datasheet:
    the notebook's own ``datasheet_prediction`` (``infer_lab/notebooks/04_prefill_decode_roofline.py``)."""
    experiment = notebook_function(NUMBER, "datasheet_prediction")
    return datasheet_view_of(*experiment(model, gpu, batch, context))


def roof_code() -> str:
    """The roofline itself, the library's real code: one op's time and the FLOP/s the roof allows."""
    return code_block(Roof.time_s, Roof.attainable_flops)


def datasheet_text(view: DatasheetView) -> str:
    roof, pred = view.roof, view.prediction
    cb = pred.critical_batch
    critical = (f"**{cb:,}**" if cb else "**never at this context**: each sequence adds its own KV reads, "
                "whose intensity stays low")
    return (
        f"**{roof.name}** (datasheet): {roof.peak_flops / 1e12:,.0f} TFLOP/s bf16 dense, "
        f"{human(roof.bandwidth_Bps / 1e12, 3)} TB/s, ridge point **{human(roof.ridge_point, 3)} FLOP/B**.\n\n"
        f"Predicted for {view.model}: TTFT **{human(pred.ttft_s * 1e3, 3)} ms** for a {view.context:,}-token prompt "
        f"(intensity {pred.prefill.intensity:,.0f} FLOP/B: {pred.prefill.bound}-bound); ITL "
        f"**{human(pred.itl_s * 1e3, 3)} ms** at batch {view.batch:,} (intensity {human(pred.decode.intensity, 3)} FLOP/B: "
        f"{pred.decode.bound}-bound), so {pred.tokens_per_s:,.0f} tokens/s in total. Critical batch, where "
        f"decode turns compute-bound: {critical}."
    )


def prefill_crossover_tokens(model: str = "mistral-7b", gpu: str = "H100-SXM", dtype: str = "bf16",
                             max_tokens: int = 1 << 20) -> int | None:
    """Shortest prompt (tokens, one sequence) whose whole prefill is compute-bound on ``gpu``'s datasheet
    (intensity at or above the ridge point), from the roofline's op count; None if none up to ``max_tokens``."""
    roof = roofline.gpu_roof(gpu)
    kw = dict(weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype)

    def compute_bound(tokens: int) -> bool:
        return roofline.predict_prefill(model, roof, 1, tokens, **kw).bound == "compute"

    return roofline.smallest_true(compute_bound, max_tokens)


def prefill_bound_text(model: str = "mistral-7b", gpu: str = "H100-SXM", dtype: str = "bf16",
                       short_prompt: int = 64) -> str:
    """When prefill is compute-bound: the crossover prompt length on ``gpu``'s datasheet and the
    intensity (FLOP/B) of a ``short_prompt``-token prefill, both from the roofline's op count."""
    roof = roofline.gpu_roof(gpu)
    kw = dict(weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype)
    short = roofline.predict_prefill(model, roof, 1, short_prompt, **kw)
    bytes_per_weight = memory.WEIGHT_FORMATS[dtype].bits / 8
    crossover = prefill_crossover_tokens(model, gpu, dtype)
    when = (f"from about **{crossover:,} prompt tokens**" if crossover else "at no prompt length up to a million "
            "tokens")
    return (f"each weight byte read serves every prompt token: 2 FLOPs per weight per token against {bytes_per_weight:g} B "
            f"per {dtype} weight, about {human(2 / bytes_per_weight, 3)} FLOP/B per prompt token. Prefill is "
            f"compute-bound only once that passes the ridge point: {when} for {roofline.as_shape(model).name} on the "
            f"{roof.name}'s datasheet (ridge {human(roof.ridge_point, 3)} FLOP/B), counting the tokens prefilled "
            f"together. A {short_prompt:,}-token prefill sits at {human(short.intensity, 3)} FLOP/B: "
            f"**{short.bound}-bound**" + (f", as is any prompt or chunked-prefill chunk shorter than {crossover:,} tokens"
                                          if crossover and short.bound == "memory" else ""))


def decode_intensity_text(model: str = "mistral-7b", context: int = 4096, dtype: str = "bf16") -> str:
    """'about 1.0 FLOP per byte at batch 1', computed from the roofline's op count."""
    ops = roofline.decode_ops(model, 1, context, weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype)
    intensity = sum(o.flops for o in ops) / sum(o.bytes for o in ops)
    return f"about {human(intensity, 2)} FLOP per byte at batch 1 ({model}, {dtype}, {context:,} tokens)"


# ---------------------------------------------------------------------------------------------
# The measured part


def _comparison_row(r: dict[str, Any]) -> ComparisonRow:
    names = {f.name for f in dataclasses.fields(ComparisonRow)}
    return ComparisonRow(**{k: v for k, v in r.items() if k in names})


def compare_result(lm: Any, ceilings: Any, raw: list[dict[str, Any]]) -> CompareResult:
    """What the notebook's ``roofline_vs_harness`` returns (the ceilings measured here and the tidy
    predicted-vs-measured rows) as a :class:`CompareResult`, with the longest prompt's steps for the figure."""
    roof = roofline.measured_roof(ceilings)
    shape, dtype = shape_of(lm), dtype_name(lm)
    kw = dict(weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype, logits="all")
    n = max([r["context"] for r in raw if r.get("phase") == "prefill"] or [1])
    steps = [roofline.predict_prefill(shape, roof, 1, n, **kw), roofline.predict_decode(shape, roof, 1, n, **kw)]
    return CompareResult(lm.describe(), roof, [_comparison_row(r) for r in raw], explain_gaps(raw), steps,
                         op_rows(roofline.prefill_ops(shape, 1, n, **kw), roof),
                         op_rows(roofline.decode_ops(shape, 1, n, **kw), roof), torch.get_num_threads(),
                         ceilings.provenance(), attention_implementation(lm))


def attention_implementation(lm: Any) -> str:
    """The attention kernel transformers runs for the loaded model (``config._attn_implementation``:
    ``"sdpa"`` by default in transformers 5.x, ``"eager"`` for the plain PyTorch one); '' if unknown."""
    return str(getattr(getattr(getattr(lm, "model", None), "config", None), "_attn_implementation", "") or "")


def run_compare(lm: Any, sizes: Sizes) -> CompareResult:
    """Run the notebook's own experiment (``roofline_vs_harness`` of ``infer_lab/notebooks/04_prefill_decode_roofline.py``)."""
    experiment = notebook_function(NUMBER, "roofline_vs_harness")
    ceilings, raw = experiment(lm, sizes.prompt_lengths, sizes.contexts, sizes.batches, sizes.new_tokens,
                               sizes.repeats, quick=sizes.quick_ceilings)
    return compare_result(lm, ceilings, raw)


def decode_ratio_text(result: CompareResult) -> str:
    """Each timed decode step: predicted, measured and the ratio, one line each."""
    rows = [r for r in result.rows if r.phase == "decode" and r.unit == "ms"]
    return "\n".join(f"- decode step, batch {r.batch}, context {r.context:,}: predicted {human(r.predicted, 3)} ms, "
                     f"measured {human(r.measured, 3)} ms, **measured ÷ predicted = {human(r.measured_over_predicted, 3)}**"
                     for r in rows)


def comparison_records(rows: list[ComparisonRow]) -> list[dict[str, Any]]:
    """Rows as plain dicts with their ratio (what a saved file holds)."""
    return [{**dataclasses.asdict(r), "measured_over_predicted": r.measured_over_predicted} for r in rows]


def save_compare(result: CompareResult, lm: Any):
    """Save a GPU comparison under ``infer_lab/results`` (what :func:`saved` shows elsewhere); return the path."""
    from ..bench.hf_predicted import save_results
    from .saved import results_dir

    return save_results(comparison_records(result.rows), lm, result.roof, results_dir())


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=lm.describe() if lm is not None else "")
    return run_parts(result, parts, PARTS, {
        "datasheet": lambda: datasheet_view(sizes.model, sizes.gpu, sizes.batch, sizes.context),
        "compare": lambda: run_compare(lm, sizes),
    })


def compare_text(result: CompareResult) -> str:
    roof = result.roof
    attention = (f" Attention kernel: transformers' `{result.attention_implementation}`."
                 if result.attention_implementation else "")
    return (f"Measured on **{result.model}**, torch threads: {result.threads}; roof: "
            f"{human(roof.peak_flops / 1e9, 3)} GFLOP/s and {human(roof.bandwidth_Bps / 1e9, 3)} GB/s (measured here, ridge "
            f"{human(roof.ridge_point, 3)} FLOP/B). {result.ceilings_note}{attention}\n\n"
            + "\n".join(f"- {line}" for line in result.gaps))


# ---------------------------------------------------------------------------------------------
# Tables and figures


OP_COLUMNS = [
    Column("name", "op (all layers)", "text"), Column("flops", "GFLOP", scale=1e-9), Column("bytes", "MB moved", scale=1e-6),
    Column("intensity", "FLOP/B"), Column("time_s", "time (µs)", scale=1e6), Column("bound", "bound", "text"),
]
COMPARE_COLUMNS = [
    Column("quantity", "quantity", "text"), Column("unit", "unit", "text"),
    Column("batch", "batch", "int"), Column("context", "context (tokens)", "int"),
    Column("predicted", "predicted"), Column("measured", "measured"),
    Column("measured_over_predicted", "measured ÷ predicted", "ratio"),
]


def ops_table(rows: list[OpRow]):
    return people_table(rows, OP_COLUMNS)


def compare_table(rows: list[ComparisonRow]):
    return people_table(rows, COMPARE_COLUMNS)


def tables(result: Result) -> dict[str, Any]:
    out = {}
    if result.datasheet:
        v = result.datasheet
        out[f"Prefill of one {v.context:,}-token prompt, {v.model} on {v.roof.name}"] = ops_table(v.prefill_ops)
        out[f"Decode step at batch {v.batch:,}, {v.model} on {v.roof.name}"] = ops_table(v.decode_ops)
    if result.compare:
        out["Predicted vs measured on this machine"] = compare_table(result.compare.rows)
    return out


def summary(result: Result) -> str:
    lines = []
    if result.datasheet:
        lines.append(datasheet_text(result.datasheet))
    if result.compare:
        lines.append(compare_text(result.compare))
    return "\n\n".join(lines)


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
    import numpy as np

    from ..figures import subplots

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


def datasheet_figure(view: DatasheetView):
    p = view.prediction
    return roofline_figure(view.roof, [p.prefill, p.decode], {"prefill": view.prefill_ops, "decode": view.decode_ops},
                           title=f"{view.model} on {view.roof.name}\ndatasheet roof, predicted only (analytic)")


def compare_figure(result: CompareResult):
    return roofline_figure(result.roof, result.steps, {"prefill": result.prefill_ops, "decode": result.decode_ops},
                           result.rows, title=f"Predicted (*) and measured (x)\n{result.model}")


def ratio_figure(rows: list[ComparisonRow], title: str):
    """Measured / predicted time per timed row, on a log axis (1 = the roofline is reached)."""
    from ..figures import subplots

    timed = [r for r in rows if r.unit == "ms"]
    labels = [f"{r.phase or r.quantity.split(' ')[0]} b{r.batch} n{r.context:,}" for r in timed]
    ratios = [r.measured_over_predicted for r in timed]
    fig, ax = subplots(figsize=(7, 3.6))
    phase_of = [r.phase or ("prefill" if "TTFT" in r.quantity or "prefill" in r.quantity else "decode") for r in timed]
    ax.bar(labels, ratios, color=[COLORS[p] for p in phase_of])
    ax.axhline(1, color="k", lw=1)
    ax.set_yscale("log")
    ax.set_ylim(min([1.0, *ratios]) / 1.5, max([1.0, *ratios]) * 1.5)
    ax.set_ylabel("measured ÷ predicted time, log scale")
    ax.set_title(title, fontsize=9)
    ax.tick_params(axis="x", rotation=45, labelsize=7)
    ax.grid(alpha=0.3, axis="y", which="both")
    finish(fig)
    return fig


def figures(result: Result) -> dict[str, Any]:
    out = {}
    if result.datasheet:
        out["datasheet_roofline"] = datasheet_figure(result.datasheet)
    if result.compare:
        out["measured_roofline"] = compare_figure(result.compare)
        out["ratio"] = ratio_figure(result.compare.rows, f"{result.compare.model}: measured ÷ predicted")
    return out


# ---------------------------------------------------------------------------------------------
# Saved GPU results


def saved() -> SavedView | None:
    """HF eager on an H200 against the roofline of that same run (and any saved comparison)."""
    from ..analysis.compare import saved_baseline_vs_roofline
    from .ch02_feel_the_pain import saved_batch1_text, saved_warning

    found = load_saved("*hf-baseline*.json")
    if not found:
        return None
    src = found[0]
    rows = [_comparison_row(r) for r in saved_baseline_vs_roofline(src.raw)]
    b1 = min((r for r in rows if r.quantity.startswith("decode") and r.batch == 1),
             key=lambda r: abs((r.context or 0) - 512))
    tables = {"HF eager vs the roofline of the same run": compare_table(rows)}
    for other in load_saved("*predicted_vs_measured*.json"):
        tables[f"Predicted vs measured, {other.device}, {other.date}"] = compare_table(
            [_comparison_row(r) for r in other.raw.get("rows", [])])
    return SavedView(
        title=f"HF transformers (eager) vs the roofline on {src.device}: {src.raw.get('model')}",
        source=src,
        tables=tables,
        figures={"ratio": ratio_figure(rows, f"HF eager on {src.device}: measured ÷ predicted (saved)")},
        notes=[
            "The roof is the copy bandwidth and bf16 matmul rate measured in that same run.",
            f"A decode step at batch 1 and {b1.context:,} tokens should take {human(b1.predicted, 3)} ms on that roof; the "
            f"run's batch-1 steps took {saved_batch1_text(src.data, b1.predicted)} (chapter "
            f"{chapter_number('batching')} quotes the same): the eager loop launches hundreds of small kernels per "
            "token and waits on the CPU between them.",
            f"Measured by: {src.command}",
        ],
        warning=saved_warning(src.data),
    )


# ---------------------------------------------------------------------------------------------
# Foundations: the memory hierarchy, and why decode waits on memory (the deck's foundations section)


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
    from ..catalog import get_gpu, get_on_chip_memory, list_gpus

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
    from ..catalog import memory_hierarchy_about
    from ..units import fmt_bytes

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
    from ..figures import subplots

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
    import statistics

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
    from ..figures import subplots

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
