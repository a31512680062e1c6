"""Section 5 of chapter 12: EAGLE, Medusa and MTP sized from configs beside their papers' figures (cited)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...analysis.speculation import (
    CitedResult,
    DraftMechanism,
    cited,
    cited_results,
    draft_mechanisms,
)
from ...engine.acceptance import predicted_speedup
from ...figures import finish, subplots
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER
from .shared import COLORS, _pct, lesson_columns

if TYPE_CHECKING:
    from .scenario import Sizes
    from .sweep import SweepResult


@dataclass(frozen=True)
class VariantsResult:
    mechanisms: list[DraftMechanism]
    cited: list[CitedResult]
    mtp_alpha: tuple[float, float]
    mtp_cost_ratio: float
    mtp_predicted_speedup: tuple[float, float]
    mtp_params: int


def variants_result(mechanisms: list[DraftMechanism]) -> VariantsResult:
    """The mechanisms ``size_mechanisms`` computed, with the papers' figures read (cited) and
    DeepSeek-V3's MTP checked against its report."""
    acceptance = cited("deepseek_v3_acceptance")
    mtp = next(m for m in draft_mechanisms("deepseek-v3") if m.method.startswith("MTP"))
    alphas = (acceptance.low, acceptance.high)
    predicted = tuple(predicted_speedup(a, acceptance.k or 1, mtp.cost_ratio) for a in alphas)
    return VariantsResult(mechanisms, cited_results(), alphas, mtp.cost_ratio, predicted, mtp.extra_params)


def run_variants(sizes: Sizes) -> VariantsResult:
    """Run the notebook's ``size_mechanisms`` on the catalog models of ``sizes`` (analytic)."""
    return variants_result(notebook_function(NUMBER, "size_mechanisms")(sizes.variant_models))


def variants_text(result: VariantsResult) -> str:
    lo, hi = result.mtp_alpha
    plo, phi = result.mtp_predicted_speedup
    speed = cited("deepseek_v3_speedup")
    params = cited("deepseek_v3_mtp_params")
    return (
        f"A consistency check across the two halves: DeepSeek-V3 reports a second-token acceptance of "
        f"{_pct(lo)}–{_pct(hi)} for its one MTP module (cited). Its draft cost computed from the config is "
        f"c = {result.mtp_cost_ratio:.3f}, so the textbook formula predicts {plo:.2f}–{phi:.2f}× at k = 1; the "
        f"report says {speed.low:.1f}× (cited). The MTP module computed from the config has "
        f"{result.mtp_params / 1e9:.1f}B parameters; the model card says {params.low / 1e9:.1f}B (cited).\n\n"
        + chain_curves_text(result) + "\n\n"
        "**Measured here:** n-gram and self-speculative decoding on the embedded model, on this machine. "
        "**Computed here from catalog configs:** the extra parameters, KV bytes and draft cost of every "
        "mechanism. **Cited, not measured:** every EAGLE, Medusa, MTP and draft-model speedup and acceptance "
        "(paper, year and section in the table; nothing was trained)."
    )


MECHANISM_COLUMNS = [
    Column("model", "target", "text"), Column("method", "mechanism", "text"),
    Column("drafts_from", "drafts from", "text"), Column("adds", "adds to the model", "text"),
    Column("extra_params", "extra parameters", "int"), Column("extra_fraction", "of the target", "pct"),
    Column("extra_weight_bytes", "extra weights (bf16)", "bytes"),
    Column("extra_kv_bytes_per_token", "extra KV per token (B, bf16)", "int"),
    Column("cost_ratio", "c (weights read per draft / per target step)", digits=2),
]

CITED_COLUMNS = [
    Column("label", "method", "text"), Column("paper", "paper", "text"), Column("year", "year", "text"),
    Column("where", "where", "text"), Column("target_model", "measured on", "text"),
    Column("setting", "setting", "text"), Column("metric", "metric", "text"),
    Column("low", "low"), Column("high", "high"), Column("url", "source", "text"),
]

MECHANISM_LESSON = ("target", "mechanism", "extra parameters", "of the target", "extra KV per token (B, bf16)",
                    "c (weights read per draft / per target step)")


def mechanisms_table(result: VariantsResult):
    rows_ = [dict(m.__dict__, extra_fraction=m.extra_fraction, extra_weight_bytes=m.extra_weight_bytes,
                  cost_ratio=m.cost_ratio) for m in result.mechanisms]
    return people_table(rows_, MECHANISM_COLUMNS)


def cited_table(result: VariantsResult):
    return people_table(result.cited, CITED_COLUMNS)


def variants_details(result: VariantsResult) -> dict[str, list[Any]]:
    """Section 5's tables: what each mechanism adds (the columns that carry it, then all), and
    what the papers report."""
    every = mechanisms_table(result)
    return {
        "What each mechanism adds to each target (computed from configs)": [
            lesson_columns(every, MECHANISM_LESSON)],
        "What each mechanism drafts from and adds, every column": [every],
        "What the papers report (cited, not measured here)": [cited_table(result)],
    }


CITED_MODEL = {"Medusa": "mistral-7b", "EAGLE": "llama-3-70b", "MTP": "deepseek-v3"}

CHAIN_ALPHAS, CHAIN_K = (0.6, 0.8, 0.9), 4  # the chain-drafting curves E/(kc+1) the variants figure draws

# Mechanisms whose papers verify a tree of candidates per pass (Medusa: tree attention, Cai et al. 2024 §2;
# EAGLE: tree attention, EAGLE-2/3: dynamic draft trees, Li et al. 2024/2025), not one chain of k guesses.
TREE_DRAFTING = ("Medusa", "EAGLE")


def above_chain_curves(result: VariantsResult, alphas: tuple[float, ...] = CHAIN_ALPHAS,
                       k: int = CHAIN_K) -> list[tuple[CitedResult, float, float]]:
    """The cited speedups the variants figure draws (at the draft cost c computed for their mechanism) whose
    high end lies above the highest chain curve E/(k·c + 1) at the largest ``alphas``: (result, c, that curve's
    speedup at c)."""
    out = []
    for method in CITED_MODEL:
        c = _mechanism_cost(method)
        bound = predicted_speedup(max(alphas), k, c)
        out += [(r, c, bound) for r in result.cited
                if r.method == method and r.metric == "speedup" and r.high > bound]
    return out


def chain_curves_text(result: VariantsResult, alphas: tuple[float, ...] = CHAIN_ALPHAS, k: int = CHAIN_K) -> str:
    """Why some cited points sit above the figure's chain curves (or that none do), from the numbers."""
    above = above_chain_curves(result, alphas, k)
    curves = (f"The grey curves are chains of k = {k} guesses, E/(k·c + 1) at α = "
              + ", ".join(f"{a}" for a in alphas) + f": a chain yields at most k + 1 = {k + 1} tokens per pass.")
    if not above:
        return curves + f" Every cited speedup drawn lies under the α = {max(alphas)} curve at its c."
    points = "; ".join(f"{r.label} {r.low:g}–{r.high:g}× (the α = {max(alphas)} chain gives {bound:.2f}× at "
                       f"c = {c:.3f})" if r.low != r.high else
                       f"{r.label} {r.high:g}× (the α = {max(alphas)} chain gives {bound:.2f}× at c = {c:.3f})"
                       for r, c, bound in above)
    trees = sorted({r.method for r, _, _ in above if r.method in TREE_DRAFTING})
    why = (f" {' and '.join(trees)} {'verifies' if len(trees) == 1 else 'verify'} a *tree* of candidate continuations in one pass (and EAGLE-2/3 grow it "
           "dynamically and deeper), so a pass can keep more than one chain's E: the chain formula is their "
           "baseline, not their bound." if trees else
           " These methods are not chain drafting at k = " + str(k) + ", so the chain formula does not bound them.")
    return curves + f" {len(above)} cited speedups lie above the highest: {points}." + why


def _mechanism_cost(method: str) -> float:
    """c computed for the mechanism on the catalog model closest to the paper's (see CITED_MODEL)."""
    prefix = {"Medusa": "Medusa", "EAGLE": "EAGLE", "MTP": "MTP"}[method]
    return next(m.cost_ratio for m in draft_mechanisms(CITED_MODEL[method]) if m.method.startswith(prefix))


def variants_figure(result: VariantsResult, sweep: SweepResult | None = None, source: str = ""):
    """Speedup vs draft cost c: the papers (hollow, cited, at c computed from a catalog config) and
    our proposers (stars, measured); and the extra parameters each mechanism adds (computed)."""
    fig, axes = subplots(1, 2, figsize=(12, 4.9))
    ax = axes[0]
    x_max = 0.62
    if sweep is not None:
        x_max = max([x_max] + [1.1 * sweep.best(p).cost_ratio for p in sweep.proposers()])
    cs = [x_max * i / 100 for i in range(0, 101)]
    for alpha in CHAIN_ALPHAS:
        ax.plot(cs, [predicted_speedup(alpha, CHAIN_K, c) for c in cs], color="0.8", lw=1)
        c_label = 0.2 * x_max  # where the three curves are far apart, right of the cited points
        ax.annotate(f"α = {alpha}, k = {CHAIN_K} chain", (c_label, predicted_speedup(alpha, CHAIN_K, c_label)),
                    xytext=(2, 2), textcoords="offset points", fontsize=8, color="0.4")
    for i, method in enumerate(CITED_MODEL):
        c = _mechanism_cost(method)
        for j, r in enumerate(x for x in result.cited if x.method == method and x.metric == "speedup"):
            ax.errorbar([c * (1 + 0.06 * j)], [r.mid], yerr=[[r.mid - r.low], [r.high - r.mid]], fmt="o",
                        mfc="none", color=COLORS[i], capsize=3,
                        label=f"{r.label} {r.year}, cited (c for {CITED_MODEL[method]})")
    if sweep is not None:
        for color, proposer in zip(COLORS[3:], sweep.proposers(), strict=False):
            best = sweep.best(proposer)
            ax.plot([max(best.cost_ratio, 0.003)], [best.speedup], "*", ms=12, color=color,
                    label=f"{proposer} k={best.k}, measured here")
    ax.axhline(1, color="k", lw=0.8)
    ax.set(xlabel="draft cost c per drafted token (× one target step)", ylabel="speedup (×)", ylim=(0, None),
           xlim=(0, x_max), title=f"cited (hollow) and measured here (stars)\ngrey: chains of k = {CHAIN_K}; "
           f"{len(above_chain_curves(result))} cited speedups lie above them")
    ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(0, -0.16), ncol=2)  # below the axes: covers nothing
    models = list(dict.fromkeys(m.model for m in result.mechanisms))
    methods = list(dict.fromkeys(x.method.split(" (")[0] for x in result.mechanisms))
    width = 0.8 / len(models)
    for i, model in enumerate(models):
        vals = [next((100 * m.extra_fraction for m in result.mechanisms
                      if m.model == model and m.method.split(" (")[0] == meth), 0.0) for meth in methods]
        xs = [j + i * width for j in range(len(methods))]
        axes[1].bar(xs, vals, width, label=model)
        for x, val in zip(xs, vals, strict=True):
            if val == 0:
                axes[1].annotate("0", (x, 0), ha="center", va="bottom", fontsize=8)
    axes[1].set_xticks([j + width * (len(models) - 1) / 2 for j in range(len(methods))], methods, fontsize=9)
    axes[1].set(ylabel="extra parameters (% of the target)", ylim=(0, None),
                title="what each mechanism adds (computed from configs)")
    axes[1].legend(fontsize=8)
    where = f"stars measured on {source}" if sweep is not None and source else "no measurement in this figure"
    fig.suptitle(f"EAGLE, Medusa, MTP: cited speedups, computed costs; {where}", fontsize=9)
    finish(fig)
    return fig
