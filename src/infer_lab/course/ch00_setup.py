"""Chapter 00, "Setup": what hardware you have, what it really achieves, and a model that works.

1. The device, as :func:`infer_lab.hardware.detect` sees it.
2. Its two ceilings, measured (copy bandwidth, matmul FLOP/s), beside the datasheet when there
   is one; the ridge point they imply, next to the arithmetic intensity of a decode step
   (computed by :mod:`infer_lab.analysis.roofline` for the course's model).
3. The GPU catalog: the one table every chapter reads GPU numbers from.
4. "Does the model work?": one chat question, greedy, stopping at the end-of-sequence token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis.memory import ModelLike, as_shape
from ..analysis.roofline import decode_ops
from ..catalog import get_gpu, gpu_catalog_about, list_gpus, resolve_gpu_name
from ..hardware import (
    Ceilings,
    DeviceInfo,
    catalog_spec,
    ceilings_vs_spec,
    detect,
)
from ..models import EMBEDDED_NAME
from ..units import fmt_bytes, human
from .chapter import ChapterResult, Page, Part, choose_size
from .notebook_code import notebook_function
from .saved import SavedView, load_saved
from .tables import Column, people_table

NUMBER = "00"
SLUG = "setup"
TITLE = "00 · Setup: your hardware, its measured ceilings, and a model that works"
NEEDS_MODEL = True
PARTS = {
    "ceilings": "Measure the ceilings",
    "hello": "Ask the model something",
}
QUESTION = "What is the capital of France?"
INTENSITY_DTYPES = ("bf16", "fp32")


@dataclass(frozen=True)
class Sizes:
    """How big the micro-benchmarks are, and how long the answer may get."""

    size: str
    quick_ceilings: bool  # small copy and matmul (see hardware.measure_ceilings)
    hello_max_tokens: int  # the answer stops at EOS; this is only the limit
    intensity_context: int  # the context at which the decode step's intensity is computed


def sizes(device: torch.device | str | None = None, size: str | None = None) -> Sizes:
    """``quick``: the small copy and matmul (well under a second on a CPU); ``full``: the big ones."""
    size = choose_size(device, size)
    return Sizes(size, quick_ceilings=size == "quick", hello_max_tokens=32 if size == "quick" else 64,
                 intensity_context=512)


# ---------------------------------------------------------------------------------------------
# Typed results


@dataclass(frozen=True)
class DeviceField:
    label: str
    value: str


@dataclass(frozen=True)
class CeilingRow:
    """One ceiling, measured here and on the datasheet (``None`` without one)."""

    what: str
    unit: str
    measured: float
    datasheet: float | None

    @property
    def measured_over_datasheet(self) -> float | None:
        return self.measured / self.datasheet if self.datasheet else None


@dataclass(frozen=True)
class DecodeIntensity:
    """FLOPs and bytes of one decode step (batch 1) from the roofline's op count, in one dtype."""

    model: str
    dtype: str  # weights, KV and activations
    batch: int
    context: int
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return self.flops / self.bytes


@dataclass(frozen=True)
class CeilingsResult:
    ceilings: Ceilings
    rows: list[CeilingRow]
    datasheet_name: str | None
    no_datasheet_reason: str  # shown in the datasheet columns when there is none
    decode: list[DecodeIntensity]

    @property
    def ridge_point(self) -> float:
        return self.ceilings.ridge_point


@dataclass(frozen=True)
class HelloResult:
    """One greedy chat answer; times in seconds."""

    model: str
    question: str
    answer: str
    new_tokens: int
    max_new_tokens: int
    stopped_at_eos: bool
    ttft_s: float
    tpot_s: float
    load_seconds: float
    weight_bytes: int


@dataclass
class Result(ChapterResult):
    """Chapter 00's findings; a part not run is ``None``."""

    model: str = ""
    device: DeviceInfo | None = None
    ceilings: CeilingsResult | None = None
    hello: HelloResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


# ---------------------------------------------------------------------------------------------
# The device


def device_label_of(info: DeviceInfo) -> str:
    return info.name if info.kind == "cuda" else f"CPU: {info.name} ({info.cores} cores)"


def device_fields(info: DeviceInfo) -> list[DeviceField]:
    """What the device reports, for people: only the fields it has, memory in GB and GiB."""
    rows = [("kind", info.kind), ("name", info.name),
            ("memory, total", fmt_bytes(info.memory_total_bytes)), ("memory, free", fmt_bytes(info.memory_free_bytes)),
            ("multiprocessors" if info.kind == "cuda" else "cores", info.cores),
            ("driver", info.driver), ("CUDA", info.cuda_version),
            ("SM clock (MHz)", info.sm_clock_mhz), ("memory clock (MHz)", info.mem_clock_mhz),
            ("power (W)", None if info.power_w is None else f"{info.power_w:.0f}"),
            ("power limit (W)", None if info.power_limit_w is None else f"{info.power_limit_w:.0f}"),
            ("catalog entry", info.catalog_name), ("torch threads", torch.get_num_threads())]
    return [DeviceField(label, str(value)) for label, value in rows if value is not None]


def device_table(info: DeviceInfo):
    return people_table(device_fields(info), [Column("label", "field", "text"), Column("value", "value", "text")])


def device_text(info: DeviceInfo) -> str:
    """Which device this is, and whether the catalog has its datasheet."""
    if info.catalog_name:
        entry = f"Catalog entry: **{info.catalog_name}**: its datasheet sits beside the measured ceilings below."
    else:
        entry = f"No datasheet here ({_why_no_datasheet(info)}): the measured ceilings below are what the roofline uses."
    return f"## Your device: **{device_label_of(info)}**\n\n{entry}"


def _why_no_datasheet(info: DeviceInfo) -> str:
    return "no datasheet for a CPU" if info.kind == "cpu" else f"{info.name} is not in the GPU catalog"


def no_datasheet_reason(info: DeviceInfo) -> str:
    """What the datasheet columns show when there is none: "— (no datasheet for a CPU)"."""
    return f"— ({_why_no_datasheet(info)})"


# ---------------------------------------------------------------------------------------------
# Measurements


def decode_intensities(model: ModelLike, context: int = 512, batch: int = 1) -> list[DecodeIntensity]:
    """Arithmetic intensity of one decode step in bf16 and fp32, from the roofline's op count."""
    shape = as_shape(model)
    out = []
    for dtype in INTENSITY_DTYPES:
        ops = decode_ops(shape, batch, context, weight_dtype=dtype, kv_dtype=dtype, act_dtype=dtype)
        out.append(DecodeIntensity(shape.name, dtype, batch, context, sum(o.flops for o in ops),
                                   sum(o.bytes for o in ops)))
    return out


def ceilings_result(ceilings: Ceilings, info: DeviceInfo, model: ModelLike, context: int) -> CeilingsResult:
    """Measured ceilings against the datasheet of ``info`` (if catalogued), and decode's intensity."""
    spec = catalog_spec(info)
    rows = [CeilingRow(r["what"], r["unit"], r["measured"], r["datasheet"]) for r in ceilings_vs_spec(ceilings, spec)]
    return CeilingsResult(ceilings, rows, spec.name if spec else None, no_datasheet_reason(info),
                          decode_intensities(model, context))


def run_ceilings(device: torch.device | str | None, sizes: Sizes,
                 model: ModelLike = EMBEDDED_NAME) -> CeilingsResult:
    """Run the notebook's own experiment (``ceilings_here`` of ``infer_lab/notebooks/00_setup.py``) and set
    the ceilings beside the datasheet."""
    experiment = notebook_function(NUMBER, "ceilings_here")
    return ceilings_result(experiment(device, quick=sizes.quick_ceilings), detect(device), model,
                           sizes.intensity_context)


def hello_result(lm: Any, question: str, answer: str | None, rec: Any, max_tokens: int) -> HelloResult:
    """What the notebook's ``ask`` returns (the answer, or ``None`` without a tokenizer, and the
    timed generation) as a :class:`HelloResult`."""
    ids = rec.token_ids[0]
    if answer is None:
        answer = f"({len(ids)} token ids from random weights, which have no tokenizer: {ids[:8]} ...)"
        question = "16 random token ids"
    return HelloResult(lm.describe(), question, answer, len(ids), max_tokens,
                       bool(ids) and ids[-1] in lm.eos_token_ids, rec.ttft_s, rec.tpot_s, lm.load_seconds,
                       lm.weight_bytes)


def run_hello(lm: Any, sizes: Sizes, question: str = QUESTION) -> HelloResult:
    """Run the notebook's own experiment (``ask`` of ``infer_lab/notebooks/00_setup.py``).

    A random-weights model has no tokenizer and no end-of-sequence token: it gets random prompt
    ids instead, which checks only that generation runs on this device.
    """
    experiment = notebook_function(NUMBER, "ask")
    answer, rec = experiment(lm, question, sizes.hello_max_tokens)
    return hello_result(lm, question, answer, rec, sizes.hello_max_tokens)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's parts in a row on ``lm``'s device (``parts`` picks some of :data:`PARTS`)."""
    device = detect(lm.device if lm is not None else None)
    return PAGE.measure(Result(size=sizes.size, model=lm.describe() if lm is not None else "", device=device),
                        lm, sizes, parts)


# ---------------------------------------------------------------------------------------------
# Words, tables and figures


def ceiling_columns(missing: str) -> list[Column]:
    return [Column("what", "ceiling", "text"), Column("unit", "unit", "text"),
            Column("measured", "measured"), Column("datasheet", "datasheet", missing=missing),
            Column("measured_over_datasheet", "measured / datasheet", "pct", missing=missing)]


def ceilings_table(result: CeilingsResult):
    return people_table(result.rows, ceiling_columns(result.no_datasheet_reason))


def ceilings_text(result: CeilingsResult) -> str:
    """The ridge point measured here against decode's intensity, every number computed."""
    c = result.ceilings
    by_dtype = {d.dtype: d for d in result.decode}
    bf16, fp32 = by_dtype["bf16"], by_dtype["fp32"]
    here = fp32 if c.matmul_dtype == "float32" else bf16
    datasheet = (f" The last column says how much of the {result.datasheet_name} datasheet you actually get."
                 if result.datasheet_name else "")
    return (
        f"The **ridge point** is {human(c.ridge_point, 3)} FLOP per byte here ({c.matmul_dtype} matmul ÷ copy "
        f"bandwidth): code that does fewer FLOPs per byte it moves is memory-bound on this machine.{datasheet}\n\n"
        f"A decode step of {bf16.model} at batch {bf16.batch} (context {bf16.context:,}) does "
        f"**{human(bf16.intensity, 2)} FLOP per byte in bf16** and {human(fp32.intensity, 2)} in fp32: each weight is read "
        f"once (2 or 4 bytes) for one multiply-add (2 FLOPs). In {here.dtype} that is "
        f"{c.ridge_point / here.intensity:,.0f}× below this machine's ridge point, so decode is memory-bound."
        f"\n\n{c.provenance()}"
    )


def hello_text(hello: HelloResult) -> str:
    stop = (f"stopped at the end-of-sequence token after {hello.new_tokens} tokens"
            if hello.stopped_at_eos else f"reached the {hello.max_new_tokens}-token limit without an end-of-sequence token")
    return (
        f"**Q:** {hello.question}  **A:** {hello.answer}\n\n"
        f"{hello.model} · {stop} · loaded in {human(hello.load_seconds, 3)} s · TTFT {human(hello.ttft_s * 1e3, 3)} ms · "
        f"TPOT {human(hello.tpot_s * 1e3, 3)} ms/token · weights {fmt_bytes(hello.weight_bytes)}"
    )


GPU_COLUMNS = [
    Column("name", "GPU", "text"), Column("memory_gib", "memory (GiB)"), Column("memory_type", "memory", "text"),
    Column("hbm_bandwidth_tbps", "bandwidth (TB/s)"),
    Column("bf16_tflops", "bf16 (TFLOP/s, dense)", missing="— (no bf16 tensor cores)"),
    Column("fp8_tflops", "fp8 (TFLOP/s, dense)", missing="— (no fp8 tensor cores)"),
    Column("ridge_point", "ridge, 16-bit (FLOP/B)"), Column("price_usd_per_hour", "$ per hour"),
    Column("price_source", "price source", "text"),
]


@dataclass(frozen=True)
class GPURow:
    name: str
    memory_gib: float
    memory_type: str
    hbm_bandwidth_tbps: float
    bf16_tflops: float | None
    fp8_tflops: float | None
    ridge_point: float
    price_usd_per_hour: float
    price_source: str


def gpu_rows() -> list[GPURow]:
    """The GPU catalog (``data/gpus.json``), one row per GPU."""
    return [GPURow(g.name, g.memory_gib, g.memory_type, g.hbm_bandwidth_tbps, g.bf16_tflops, g.fp8_tflops,
                   g.ridge_point(), g.price_usd_per_hour, g.price_source) for g in map(get_gpu, list_gpus())]


def gpu_table():
    return people_table(gpu_rows(), GPU_COLUMNS)


def catalog_note() -> str:
    about = gpu_catalog_about()
    return f"Prices, recorded {about['price_date']}: {about['price_note']}"


def ceilings_figure(result: CeilingsResult, source: str):
    """Measured vs datasheet bandwidth and matmul rate, as bars (the datasheet bar only when there is one)."""
    from ..figures import subplots  # defers matplotlib

    fig, axes = subplots(1, 2, figsize=(9, 3.2))
    for ax, row in zip(axes, result.rows[:2], strict=True):
        labels = ["measured"] + (["datasheet"] if row.datasheet else [])
        values = [row.measured] + ([row.datasheet] if row.datasheet else [])
        bars = ax.bar(labels, values, color=["tab:blue", "tab:gray"][: len(values)])
        ax.bar_label(bars, fmt=human)
        ax.set_ylim(0, max(values) * 1.15)
        ax.set_ylabel(row.unit)
        ax.set_title(row.what + ("" if row.datasheet else f"\n{result.no_datasheet_reason.strip('— ()')}"),
                     fontsize=10)
    fig.suptitle(f"Measured ceilings: {source}", fontsize=10)
    fig.tight_layout()
    return fig


PAGE = Page(
    PARTS,
    Part("device (analytic)",
         tables=lambda r: {"This device": device_table(r.device)} if r.device is not None else {}),
    Part("ceilings",
         lambda lm, sizes: run_ceilings(lm.device if lm is not None else None, sizes,
                                        lm.name if lm is not None else EMBEDDED_NAME),
         text=lambda r: ceilings_text(r.ceilings),
         tables=lambda r: {"Measured ceilings vs the datasheet": ceilings_table(r.ceilings)},
         figures=lambda r: {"ceilings": ceilings_figure(r.ceilings, r.ceilings.ceilings.device_name)}),
    Part("catalog (analytic)", tables=lambda r: {"The GPU catalog (datasheet peaks, dense)": gpu_table()}),
    Part("hello", run_hello, text=lambda r: hello_text(r.hello)),
)


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    header = (f"Device: **{device_label_of(result.device)}**; torch threads: {result.threads}."
              if result.device is not None else "")
    return PAGE.summary(result, header)


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


# ---------------------------------------------------------------------------------------------
# Saved GPU ceilings


def saved() -> SavedView | None:
    """The ceilings measured on an H200 by the anchor run, against the H200 datasheet."""
    found = [s for s in load_saved("*.json") if "copy_TBps" in s.data and "bf16_matmul_TFLOPs" in s.data]
    if not found:
        return None
    src = found[0]
    d = src.data
    ceilings = Ceilings(device="cuda", device_name=src.device, bandwidth_Bps=d["copy_TBps"] * 1e12,
                        matmul_flops=d["bf16_matmul_TFLOPs"] * 1e12, matmul_dtype="bfloat16",
                        copy_bytes=0, matmul_n=0)  # sizes not recorded in that file
    name = resolve_gpu_name(src.device)
    spec = get_gpu(name) if name else None
    rows = [CeilingRow(r["what"], r["unit"], r["measured"], r["datasheet"]) for r in ceilings_vs_spec(ceilings, spec)]
    missing = f"— ({src.device} is not in the GPU catalog)"
    return SavedView(
        title=f"For comparison, the ceilings of an {src.device}",
        source=src,
        tables={"Measured ceilings vs the datasheet": people_table(rows, ceiling_columns(missing))},
        notes=[f"Measured by: {src.command}"],
    )
