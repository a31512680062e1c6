"""Section 1 of chapter 02: KV memory grows with tokens and with users (the notebook's ``kv_after_prefill``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...analysis import memory
from ...figures import finish, subplots
from ...hardware import detect
from ...units import GB, human
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, Sizes
from .shared import _shape_dtype


@dataclass(frozen=True)
class MemoryPoint:
    """KV bytes after one prefill of ``users`` prompts of ``context`` tokens (from the cache tensors)."""

    axis: str  # "context" (1 user) or "users" (at the first context)
    context: int
    users: int
    kv_bytes: int
    weight_bytes: int

    @property
    def tokens(self) -> int:
        return self.context * self.users

    @property
    def kv_bytes_per_token(self) -> float:
        return self.kv_bytes / self.tokens


@dataclass(frozen=True)
class MemoryResult:
    points: list[MemoryPoint]
    device_memory_bytes: int
    device_memory_label: str  # "GPU memory" or "RAM"
    max_context: int  # the model's position limit (tokens)
    predicted_kv_bytes_per_token: int | None = None  # from the config alone (analysis.memory)

    @property
    def kv_bytes_per_token(self) -> float:
        return self.points[0].kv_bytes_per_token

    @property
    def weight_bytes(self) -> int:
        return self.points[0].weight_bytes

    @property
    def tokens_that_fit(self) -> float:
        """Tokens of KV the device memory holds beside the weights, shared by all users."""
        return (self.device_memory_bytes - self.weight_bytes) / self.kv_bytes_per_token


def predicted_kv_bytes_per_token(lm: Any) -> int:
    """KV bytes one token adds, from the model's config alone (:func:`infer_lab.analysis.memory.kv_bytes_per_token`)."""
    shape, dtype = _shape_dtype(lm)
    return memory.kv_bytes_per_token(shape, dtype)


def memory_prediction(lm: Any) -> str:
    """The KV formula with this model's numbers, before anything runs."""
    shape, dtype = _shape_dtype(lm)
    per_token = memory.kv_bytes_per_token(shape, dtype)
    return (f"**Predicted from the config alone:** 2 (K and V) × {shape.layers} layers × {shape.kv_heads} KV heads "
            f"× {shape.head_dim} dims × {memory.kv_bytes_per_element(dtype)} B ({dtype}) = "
            f"**{per_token:,} bytes per token**, so 4× the tokens or 4× the users is 4× the bytes.")


def memory_panels_text(contexts: tuple[int, ...], users: tuple[int, ...]) -> str:
    """What the memory figure's two panels show, from the sweep's contexts and user counts (tokens, users)."""
    def listed(numbers: tuple[int, ...]) -> str:
        words = [f"{n:,}" for n in numbers]
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]

    return (f"The dots are those counts; the line extends them. Left: one user at {listed(contexts)} tokens. "
            f"Right: {listed(users)} users, each at {contexts[0]:,} tokens, the context the right panel's dots were "
            "measured at, so its line carries that same context.")


def memory_result(lm: Any, kv: dict[tuple[int, int], int]) -> MemoryResult:
    """The notebook's ``kv_after_prefill`` output ({(context, users): bytes}) as a :class:`MemoryResult`."""
    first = min(c for c, _ in kv)
    points = [MemoryPoint("context", c, u, b, lm.weight_bytes) for (c, u), b in sorted(kv.items()) if u == 1]
    points += [MemoryPoint("users", c, u, b, lm.weight_bytes) for (c, u), b in sorted(kv.items())
               if c == first]
    info = detect(lm.device)
    return MemoryResult(points, info.memory_total_bytes, "GPU memory" if info.kind == "cuda" else "RAM",
                        lm.config.max_position_embeddings, predicted_kv_bytes_per_token(lm))


def run_memory(lm: Any, sizes: Sizes) -> MemoryResult:
    """Run the notebook's own experiment (``kv_after_prefill`` of ``infer_lab/notebooks/02_feel_the_pain.py``)."""
    experiment = notebook_function(NUMBER, "kv_after_prefill")
    return memory_result(lm, experiment(lm, sizes.contexts, sizes.users))


def memory_text(memory: MemoryResult) -> str:
    per_token = memory.kv_bytes_per_token
    predicted = memory.predicted_kv_bytes_per_token
    growth = ""
    ctx = [p for p in memory.points if p.axis == "context"]
    users = [p for p in memory.points if p.axis == "users"]
    if len(ctx) > 1:
        growth += (f"{human(ctx[-1].context / ctx[0].context, 3)}× the context ({ctx[0].context:,} → {ctx[-1].context:,} tokens) "
                   f"gave **{ctx[-1].kv_bytes / ctx[0].kv_bytes:.2f}×** the KV bytes; ")
    if len(users) > 1:
        growth += (f"{human(users[-1].users / users[0].users, 3)}× the users gave **{users[-1].kv_bytes / users[0].kv_bytes:.2f}×**. ")
    check = ("" if predicted is None else
             f"The config predicted {predicted:,} B per token: measured ÷ predicted = {per_token / predicted:.3f}. ")
    return growth + check + (
        f"Measured: **{per_token:,.0f} bytes of KV per token** ({per_token / 1024:.1f} KiB). At this rate "
        f"the {memory.device_memory_label} of this machine ({memory.device_memory_bytes / GB:.1f} GB) "
        f"holds about **{memory.tokens_that_fit:,.0f} tokens** of KV beside the weights, shared by all users, "
        "before anything else is counted."
    )


MEMORY_COLUMNS = [
    Column("axis", "sweep", "text"), Column("context", "context (tokens)", "int"),
    Column("users", "users", "int"), Column("kv_bytes", "KV", "bytes"),
    Column("kv_bytes_per_token", "KV per token (B)", "int"), Column("weight_bytes", "weights", "bytes"),
]


def memory_table(memory: MemoryResult):
    return people_table(memory.points, MEMORY_COLUMNS)


def users_panel_context(memory: MemoryResult) -> int:
    """Tokens per user in the figure's "users" panel: the context its dots were measured at."""
    users = [p for p in memory.points if p.axis == "users"]
    return users[0].context if users else memory.points[0].context


def memory_figure(memory: MemoryResult, source: str):
    """Weights + KV vs context (1 user) and vs users, in GB (1e9 B), on log axes.

    Dots are measured after a real prefill; the line extends the measured bytes per token and
    says so, to show where the device memory runs out. In the users panel every user has the
    context the dots were measured at (:func:`users_panel_context`), so the dots sit on the line.
    """
    per_token, weights = memory.kv_bytes_per_token, memory.weight_bytes
    budget = memory.device_memory_bytes
    users_context = users_panel_context(memory)
    users_full = (budget - weights) / (per_token * users_context)  # users at which the memory is full
    users_max = max(1024, 2 * users_full)
    fig, axes = subplots(1, 2, figsize=(10, 3.8), sharey=True)
    panels = ((axes[0], "context", max(memory.max_context, max(p.context for p in memory.points)), 1,
               "context length (tokens), 1 user", "measured after a prefill, 1 user"),
              (axes[1], "users", users_max, users_context, f"concurrent users at {users_context:,} tokens each",
               f"measured after a prefill at {users_context:,} tokens"))
    for ax, axis, x_max, tokens_per_x, xlabel, dots_label in panels:
        x = np.geomspace(1, x_max, 200)
        ax.plot(x, (weights + per_token * tokens_per_x * x) / GB, color="tab:red",
                label=f"weights + KV (extrapolated from the measured {per_token:,.0f} B/token)")
        ax.axhline(weights / GB, color="tab:gray", lw=1, label=f"weights ({weights / GB:.2f} GB)")
        measured = [p for p in memory.points if p.axis == axis]
        ax.plot([p.context if axis == "context" else p.users for p in measured],
                [(p.weight_bytes + p.kv_bytes) / GB for p in measured], "ko", label=dots_label)
        ax.axhline(budget / GB, color="k", ls="--", lw=1,
                   label=f"{memory.device_memory_label} ({budget / GB:.1f} GB)")
        limit = (budget - weights) / (per_token * tokens_per_x)
        if 1 <= limit <= x_max:
            ax.axvline(limit, color="k", ls=":", lw=1)
            # right of the line and below the budget: the curve has already left that corner
            ax.annotate(f"full at {limit:,.0f}", (limit, budget / GB), textcoords="offset points",
                        xytext=(5, -14), ha="left", fontsize=8,
                        bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.9))
        ax.set(xscale="log", yscale="log", xlabel=xlabel)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("GB (10⁹ bytes), log scale")
    fig.suptitle(f"Memory grows with tokens and users: {source}", fontsize=10)
    finish(fig)
    return fig
