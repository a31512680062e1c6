"""Section 2 of chapter 01: where one token's FLOPs are (the notebook's ``flop_shares``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ...analysis.compare import shape_of
from ...analysis.flops import COMPONENTS, ComponentFlops
from ...figures import finish, subplots
from ...shape import ModelShape, model_shape
from ...units import human
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER

if TYPE_CHECKING:
    from .scenario import Sizes


SEVEN_B = "mistral-7b"  # the catalog's 7B, next to the learner's model
SMALL = "smollm2-135m"  # shown instead when the learner's model is that 7B
RULE_OF_THUMB = 0.95  # "about 95 % of the compute is in the layers"


def _same_shape(a: ModelShape, b: ModelShape) -> bool:
    keys = ("vocab", "hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def flops_models(lm: Any) -> list[Any]:
    """The learner's model (its shape, named as loaded) and the catalog's 7B; the small embedded model
    instead when the learner's model already has the 7B's shape (the GPU default). Without a model
    (``lm=None``), the embedded model's catalog entry and the 7B."""
    if lm is None:
        return [SMALL, SEVEN_B]
    mine = dataclasses.replace(shape_of(lm), name=lm.name)
    other = SMALL if _same_shape(mine, model_shape(SEVEN_B)) else SEVEN_B
    return [mine, other]


def run_flops(lm: Any, sizes: Sizes) -> list[ComponentFlops]:
    """Run the notebook's own count (``flop_shares``) for the learner's model and the catalog's other one."""
    return notebook_function(NUMBER, "flop_shares")(flops_models(lm), sizes.flops_context)


COLOURS = {"embedding": "0.6", "attention projections": "tab:blue", "attention scores": "tab:cyan",
           "MLP": "tab:green", "norms": "tab:purple", "LM head": "tab:orange"}


def flops_figure(shares: list[ComponentFlops]):
    """One stacked bar per model: the share of one decode step's FLOPs in each component."""
    fig, ax = subplots(figsize=(8, 1.1 * len(shares) + 1.9))
    names = [s.model for s in shares]
    left = [0.0] * len(shares)
    for c in COMPONENTS:
        widths = [100 * s.share(c) for s in shares]
        label = c + (" (a lookup: 0)" if c == "embedding" else "")
        ax.barh(names, widths, left=left, color=COLOURS[c], label=label)
        for i, w in enumerate(widths):
            if w >= 6:
                ax.text(left[i] + w / 2, i, f"{human(w, 2)} %", ha="center", va="center", fontsize=8, color="white")
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.axvline(100 * RULE_OF_THUMB, color="k", ls="--", lw=1)
    ax.text(100 * RULE_OF_THUMB, -0.5, "95 % rule ", fontsize=8, va="bottom", ha="right")
    ax.set_xlim(0, 100)
    ax.invert_yaxis()
    ax.set_xlabel("% of one decode step's FLOPs (batch 1)")
    ax.set_title(f"Where one token's FLOPs are, at {shares[0].context:,} tokens of context: counted from the "
                 "config, no hardware", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, frameon=False)
    finish(fig)
    return fig


def flops_text(shares: list[ComponentFlops], guess_pct: float | None = None) -> str:
    """Each model's share in the layers against the 95 % rule, and the learner's guess beside the first."""
    lines = []
    mine = shares[0]
    if guess_pct is not None:
        lines.append(f"You guessed **{human(guess_pct)} %**; for {mine.model} it is **{human(100 * mine.layers_share)} %**.")
    for s in shares:
        holds = ("the rule of thumb holds for it" if s.layers_share >= RULE_OF_THUMB else
                 "the rule of thumb does not hold for it")
        lines.append(
            f"**{s.model}**: {human(s.total / 1e9)} GFLOP per token at {s.context:,} tokens of context, "
            f"**{human(100 * s.layers_share)} %** in the layers, {human(100 * s.share('LM head'))} % in the LM head: "
            f"{holds}.")
    small = min(shares, key=lambda s: s.layers_share)
    if small.layers_share < RULE_OF_THUMB:
        lines.append(f"The LM head does the same work per token whatever the depth: vocabulary × hidden "
                     f"multiply-adds. In {small.model} the layers are small next to its vocabulary matrix, so the "
                     "head's share is large; in a 7B the layers dwarf it. Attention over the cache is the only part "
                     "that grows with the context: raise `context` in the cell and watch it take a larger share.")
    return " ".join(lines)


def flops_rows(shares: list[ComponentFlops]) -> list[dict[str, Any]]:
    rows = []
    for c in COMPONENTS:
        row: dict[str, Any] = {"component": c}
        for i, s in enumerate(shares):
            row[f"gflop{i}"], row[f"share{i}"] = s.flops[c] / 1e9, s.share(c)
        rows.append(row)
    row = {"component": "in the layers (projections, scores, MLP, norms)"}
    for i, s in enumerate(shares):
        row[f"gflop{i}"], row[f"share{i}"] = s.layers / 1e9, s.layers_share
    return [*rows, row]


def flops_table(shares: list[ComponentFlops]):
    columns = [Column("component", "component", "text")]
    for i, s in enumerate(shares):
        columns += [Column(f"gflop{i}", f"{s.model}: GFLOP per token"), Column(f"share{i}", f"{s.model}: share", "pct")]
    return people_table(flops_rows(shares), columns)
