"""Where KV memory goes, in bytes: the fragmentation simulation's slot counts per layout, summed up.

:func:`~infer_lab.analysis.fragmentation.simulate` classifies every token slot of every step
(used, reserved for future tokens, internal or external fragmentation). This module turns one
:class:`~infer_lab.analysis.fragmentation.Timeline` into a :class:`LayoutWaste` row (time-averaged
shares, mean bytes, steps, preemptions) with ``bytes = slots × the model's K/V bytes per token``,
builds the seeded mixed workload the course uses (:func:`mixed_lengths`) and says when a budget
cannot hold one request at all (:func:`budget_problem`). Plain ints: no tensors, no model.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from ..shape import ModelShape
from ..units import GiB
from .fragmentation import LAYOUTS, Timeline, make_layout, make_requests, simulate
from .memory import kv_bytes_per_token


def mixed_lengths(n: int, seed: int = 0, max_prompt: int = 512, max_output: int = 512) -> tuple[list[int], list[int]]:
    """A reproducible mixed workload: prompt (8 ..) and output (4 ..) lengths drawn log-uniformly, tokens."""
    rng = random.Random(seed)
    return (
        [int(math.exp(rng.uniform(math.log(8), math.log(max_prompt)))) for _ in range(n)],
        [int(math.exp(rng.uniform(math.log(4), math.log(max_output)))) for _ in range(n)],
    )


@dataclass(frozen=True)
class LayoutWaste:
    """One layout's KV memory over a simulated run (:func:`layout_waste`).

    The four ``*_fraction`` are time-averaged shares of the memory allocated or blocked (they
    sum to 1); the ``*_bytes`` are the same classes' mean over the steps, in bytes.
    ``eol_*`` are summed over requests at the last step of each one's life.
    """

    layout: str
    requests: int
    kv_budget_bytes: int
    max_model_len: int
    max_tokens: int | str | None
    block_size: int | None
    steps: int
    mean_running: float
    peak_running: int
    preemptions: int
    external_frag_steps: int
    used_fraction: float
    reserved_future_fraction: float
    internal_frag_fraction: float
    external_frag_fraction: float
    used_bytes: float
    reserved_future_bytes: float
    internal_frag_bytes: float
    external_frag_bytes: float
    eol_used_bytes: int
    eol_reserved_bytes: int
    eol_wasted_fraction: float

    @property
    def wasted_fraction(self) -> float:
        """The vLLM paper's waste: 1 − used."""
        return 1.0 - self.used_fraction

    @property
    def label(self) -> str:
        return self.layout + (f" (block {self.block_size})" if self.block_size else "")


# Timeline class -> LayoutWaste field prefix
WASTE_CLASSES = (("used", "used"), ("future", "reserved_future"), ("internal", "internal_frag"),
                 ("external", "external_frag"))


def layout_waste(layout: str, timeline: Timeline, requests: int, bytes_per_token: int, max_model_len: int,
                 max_tokens: int | str | None, block_size: int) -> LayoutWaste:
    """One layout's :class:`Timeline` of ``requests`` requests (slot counts per step) as bytes and
    time-averaged shares; ``max_tokens`` is what the requests declared (``None``: the oracle)."""
    frac, steps = timeline.fractions(), len(timeline.steps)
    running = [s.running for s in timeline.steps]
    classes: dict[str, float] = {}
    for kind, prefix in WASTE_CLASSES:
        classes[f"{prefix}_fraction"] = frac[kind]
        classes[f"{prefix}_bytes"] = timeline.total(kind) / steps * bytes_per_token
    return LayoutWaste(
        layout=layout, requests=requests, kv_budget_bytes=timeline.budget_slots * bytes_per_token,
        max_model_len=max_model_len, max_tokens=max_tokens, block_size=block_size if layout == "paged" else None,
        steps=steps, mean_running=sum(running) / steps, peak_running=max(running),
        preemptions=timeline.preemptions, external_frag_steps=sum(1 for s in timeline.steps if s.external),
        eol_used_bytes=timeline.eol_used * bytes_per_token, eol_reserved_bytes=timeline.eol_reserved * bytes_per_token,
        eol_wasted_fraction=1.0 - timeline.eol_used / timeline.eol_reserved, **classes,
    )


def kv_waste_breakdown(shape: ModelShape, prompt_lens: Sequence[int], output_lens: Sequence[int], max_model_len: int,
                       kv_budget_bytes: int, max_tokens: int | Sequence[int] | None = 512, block_size: int = 16,
                       arrival_every: float = 1.0, kv_dtype: str = "bf16") -> list[LayoutWaste]:
    """KV waste split into over-reservation, internal and external fragmentation, over time.

    The workload runs through :func:`~infer_lab.analysis.fragmentation.simulate` once per layout
    (``contiguous-max``, ``contiguous-exact``, ``paged``) in a shared budget of
    ``kv_budget_bytes // bytes_per_token`` token slots, where ``bytes_per_token = 2 (K and V) ×
    layers × kv_heads × head_dim × bytes per value``. Request ``i`` arrives at step
    ``int(i * arrival_every)`` and declares ``max_tokens`` (``None``: exactly its output length).
    Raises ``ValueError`` when one request's reservation exceeds the budget.
    """
    per_token = kv_bytes_per_token(shape, kv_dtype)
    budget_slots = kv_budget_bytes // per_token
    requests = make_requests(prompt_lens, output_lens, max_model_len, max_tokens, arrival_every)
    declared = max_tokens if max_tokens is None or isinstance(max_tokens, int) else "per request"
    return [layout_waste(name, simulate(make_layout(name, budget_slots, max_model_len, block_size), requests,
                                        budget_slots), len(requests), per_token, max_model_len, declared, block_size)
            for name in LAYOUTS]


def budget_problem(shape: ModelShape, prompt_lens: Sequence[int], output_lens: Sequence[int], max_model_len: int,
                   kv_budget_bytes: int, max_tokens: int | None = 512, block_size: int = 16,
                   kv_dtype: str = "bf16") -> str | None:
    """Why the workload cannot be simulated in this budget (one request needs more than all of it), or None."""
    per_token = kv_bytes_per_token(shape, kv_dtype)
    budget_slots = kv_budget_bytes // per_token
    try:
        requests = make_requests(prompt_lens, output_lens, max_model_len, max_tokens)
        for name in LAYOUTS:
            layout = make_layout(name, budget_slots, max_model_len, block_size)
            worst = max(layout.need(r, r.final_len) for r in requests)
            if worst > budget_slots:
                return (f"with {name}, one request needs {worst:,} token slots ({worst * per_token / GiB:.2f} GiB) "
                        f"and the budget holds {budget_slots:,} ({kv_budget_bytes / GiB:g} GiB)")
    except ValueError as err:
        return str(err)
    return None
