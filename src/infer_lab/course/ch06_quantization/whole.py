"""Chapter 06 as the course's chapter surface: the result, ``measure``, summary, tables, figures, saved run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ...catalog import get_gpu
from ...units import count
from ..chapter import ChapterResult, Page, Part, model_name
from ..saved import SavedView, load_saved
from ..tables import people_table
from .bnb import BNB_SHAPE, WEIGHT_READ_COLUMNS, bnb_text, weight_reads
from .compare import compare_figure, compare_table, compare_text, run_compare
from .fit import fit_table, gpt_oss_text, nf4_scheme_text, qat_vs_ptq_text, scale_schemes_text
from .formats import baseline_note, formats_figure, formats_table, formats_text, run_formats
from .kv import kv_table, kv_text, run_kv
from .outliers import outliers_figure, outliers_table, outliers_text, run_outliers
from .scenario import PARTS

if TYPE_CHECKING:
    from .compare import Comparison
    from .formats import FormatsResult
    from .kv import KVResult
    from .outliers import OutlierRow
    from .scenario import Sizes


@dataclass
class Result(ChapterResult):
    """Chapter 06's measurements; a part not run is ``None``."""

    model: str = ""
    embedded: bool = False
    formats: FormatsResult | None = None
    compare: Comparison | None = None
    outliers: list[OutlierRow] | None = None
    kv: KVResult | None = None
    threads: int = field(default_factory=torch.get_num_threads)


PAGE = Page(
    PARTS,
    Part("baseline (analytic)", text=lambda r: baseline_note(True) if r.embedded else None),
    Part("formats", run_formats,
         text=lambda r: formats_text(r.formats),
         tables=lambda r: {"Reconstruction error per format, real weights": formats_table(r.formats)},
         figures=lambda r: {"formats": formats_figure(r.formats, r.model)}),
    Part("compare", run_compare,
         text=lambda r: compare_text(r.compare, r.embedded),
         tables=lambda r: {"Methods side by side": compare_table(r.compare)},
         figures=lambda r: {"compare": compare_figure(r.compare, r.model)}),
    Part("outliers", run_outliers,
         text=lambda r: outliers_text(r.outliers),
         tables=lambda r: {"Largest input features of the q projections": outliers_table(r.outliers)},
         figures=lambda r: {"outliers": outliers_figure(r.outliers, r.model)}),
    Part("kv", run_kv,
         text=lambda r: kv_text(r.kv, r.embedded),
         tables=lambda r: {"KV-cache quantization": kv_table(r.kv)} if r.kv.rows else {}),
    Part("fit (analytic)",
         text=lambda r: [gpt_oss_text(), scale_schemes_text(), nf4_scheme_text(), qat_vs_ptq_text()],
         tables=lambda r: {"Which model fits one GPU (analytic)": fit_table()}),
)


def measure(lm: Any, sizes: Sizes, parts: list[str] | None = None) -> Result:
    """The chapter's measurements in a row (``parts`` picks some of :data:`PARTS`)."""
    result = Result(size=sizes.size, model=model_name(lm), embedded=lm is not None and lm.source == "embedded")
    return PAGE.measure(result, lm, sizes, parts)


def summary(result: Result) -> str:
    """The chapter's findings, every number from ``result``."""
    return PAGE.summary(result, f"Model: {result.model}; {count(result.threads, 'torch thread')}.")


tables, figures = PAGE.tables, PAGE.figures  # each shown part's tables and figures, in page order


def saved() -> SavedView | None:
    """bitsandbytes int8 / NF4 on one H200 linear layer, from the saved HF baseline run."""
    found = [s for s in load_saved("h200-hf-baseline-*.json") if s.data.get("bnb_linear")]
    if not found:
        return None
    src = found[0]
    datasheet = get_gpu("H200").bandwidth_Bps
    copy = src.data.get("copy_TBps")
    reads = weight_reads(src.data["bnb_linear"], *BNB_SHAPE, datasheet)
    return SavedView(
        title=(f"bitsandbytes {src.data.get('bnb', '')} on {src.device}: one {BNB_SHAPE[1]}×{BNB_SHAPE[0]} "
               "linear layer, random weights"),
        source=src,
        tables={"Bytes read vs time, per format and batch": people_table(reads, WEIGHT_READ_COLUMNS)},
        notes=[bnb_text(reads, datasheet, copy * 1e12 if copy else None, src.data.get("bnb_err_nf4_rel")),
               f"Memory floor: weight bytes / the {datasheet / 1e12:.1f} TB/s datasheet bandwidth.",
               f"Measured by: {src.command}"],
    )
