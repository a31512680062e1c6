"""Section 3 of chapter 06: outlier features in the activations (the notebook's ``outlier_features``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...figures import finish, subplots
from ...quant.formats import INT8_MAX
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, part_number

if TYPE_CHECKING:
    from .scenario import Sizes


@dataclass(frozen=True)
class OutlierRow:
    """The largest input feature of one linear layer, against the median feature (one forward pass)."""

    layer: str
    top_feature: int
    top_absmax: float
    median_absmax: float
    max_over_median: float


OUTLIER_PROMPT = "Explain what a KV cache is."
OUTLIER_LAYER = "q_proj"


def outlier_rows(rows: list[dict[str, Any]]) -> list[OutlierRow]:
    """The notebook's ``outlier_features`` (``quant.linear_input_outliers``) as typed rows."""
    return [OutlierRow(r["layer"], r["top_features"][0], r["top_absmax"][0], r["median_feature_absmax"],
                       r["max_over_median"]) for r in rows]


def run_outliers(lm: Any, sizes: Sizes) -> list[OutlierRow]:
    """Run the notebook's own ``outlier_features`` on the chapter's prompt and layers."""
    return outlier_rows(notebook_function(NUMBER, "outlier_features")(lm, OUTLIER_PROMPT, OUTLIER_LAYER))


def median_feature_steps(max_over_median: float, levels: int = INT8_MAX) -> str:
    """What one int8 activation scale that reaches the largest feature leaves the median one, in words.

    The scale maps the largest |value| to ``levels`` steps, so the median feature, ``max_over_median``
    times smaller, gets ``levels / max_over_median`` of them; under half a step it rounds to zero.
    """
    steps = levels / max_over_median
    if steps < 0.5:
        return (f"{steps:.2f} of int8's {levels} steps on each side of zero, less than half a step: "
                "the median feature rounds to zero")
    return f"{steps:.1f} of int8's {levels} steps on each side of zero"


FROM_SCRATCH_PARTS = ("formats", "compare")  # the parts whose formats are this course's own (infer_lab.quant)


def weight_only_text() -> str:
    """What this chapter's formats quantize: the from-scratch ones only the weights; bitsandbytes' int8
    (``quant/bnb.py``, run on a GPU) is LLM.int8, which quantizes the activations too."""
    first, last = (part_number(k) for k in FROM_SCRATCH_PARTS)
    return (f"The from-scratch formats of parts {first}-{last} (`infer_lab.quant`) quantize **only the weights**: "
            "activations stay in float (dequantize, then multiply), so these outliers set none of their scales. "
            f"The `bnb-int8` that part {last} adds on a GPU (with bitsandbytes installed) is different: it is LLM.int8 "
            "itself, which "
            "quantizes the activations too and keeps their outlier feature columns in 16-bit")


def outliers_text(outliers: list[OutlierRow]) -> str:
    """The largest activation outlier measured, and what it would cost a per-token int8 activation scale.

    The from-scratch formats are weight-only, so the words say where these outliers matter instead:
    activation quantization (LLM.int8, which the GPU's ``bnb-int8`` runs; SmoothQuant) and the weights
    they multiply (AWQ).
    """
    worst = max(outliers, key=lambda r: r.max_over_median)
    share = sum(r.max_over_median >= 10 for r in outliers)
    kind = worst.layer.rsplit(".", 1)[-1]
    return (
        f"In `{worst.layer}` input feature {worst.top_feature} reaches {worst.top_absmax:.1f}, "
        f"**{worst.max_over_median:.0f}×** the median feature; {share} of {len(outliers)} `{kind}` layers have an "
        "input feature at least 10× their median. If the activations were quantized to int8 with one scale per "
        f"token, a scale that reaches that feature would leave the median one "
        f"{median_feature_steps(worst.max_over_median)}. {weight_only_text()}. The weight-only formats do not pay "
        "this cost; LLM.int8 (outlier features kept in 16-bit) and SmoothQuant (their scale moved into the "
        "weights) are how activation quantization avoids it, and it is why AWQ protects the weight columns these "
        "features multiply."
    )


OUTLIER_COLUMNS = [
    Column("layer", "layer", "text"), Column("top_feature", "largest feature", "int"),
    Column("top_absmax", "its max |x|"), Column("median_absmax", "median feature max |x|"),
    Column("max_over_median", "largest / median", "ratio"),
]


def outliers_table(outliers: list[OutlierRow], top: int = 8):
    return people_table(sorted(outliers, key=lambda r: -r.max_over_median)[:top], OUTLIER_COLUMNS)


def outliers_figure(outliers: list[OutlierRow], source: str):
    """Largest / median input feature per layer (a log axis when the ratios span a decade or more)."""
    ratios = [r.max_over_median for r in outliers]
    fig, ax = subplots(figsize=(7, 3))
    ax.bar(range(len(outliers)), ratios, color="#c44e52")
    if max(ratios) / min(ratios) >= 10:
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, None)
    ax.set(xlabel="decoder block (q projection input)", ylabel="largest / median feature (×)")
    ax.set_title(f"Outlier features in the activations\n{source}", fontsize=9)
    finish(fig)
    return fig
