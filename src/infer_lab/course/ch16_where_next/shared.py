"""What several parts use: chapters to cite, the fewest GPUs that serve a workload, link times."""

from __future__ import annotations

from typing import Any

from ...analysis import memory
from ...catalog import get_gpu, get_interconnect
from .. import chapter, chapter_names
from .scenario import GPU_COUNTS, Sizes


def chapter_refs(*slugs: str) -> tuple[str, ...]:
    """'NN · title' of the course chapters whose slug is given, for those present in this checkout."""
    present = {n[5:]: n for n in chapter_names()}
    return tuple(chapter(present[s][2:4]).TITLE for s in slugs if s in present)


def serving_gpus(model: str, gpu: str, context: int, kv_dtype: str = "bf16", users: int = 1) -> int:
    """The fewest GPUs (1, 2, 4, 8) of ``gpu`` whose memory holds the weights and ``users`` users of
    ``context`` tokens each; a ValueError (with the planner's reason) when not even 8 do."""
    spec = get_gpu(gpu)
    for n in GPU_COUNTS:
        if memory.fit(model, spec.memory_bytes, context, users=users, n_gpus=n, kv_dtype=kv_dtype).fits:
            return n
    problems = memory.scenario_problems(model, spec.memory_bytes, context, users, GPU_COUNTS[-1], kv_dtype=kv_dtype)
    raise ValueError(f"{users} x {context:,} tokens of {model} do not fit on {GPU_COUNTS[-1]}x {gpu}: "
                     + "; ".join(problems))


def scenarios(sizes: Sizes) -> list[dict[str, Any]]:
    """Every serving scenario this chapter's text describes, as the planner's fit check takes them."""
    mem = get_gpu(sizes.gpu).memory_bytes
    disagg = serving_gpus(sizes.model, sizes.gpu, sizes.prompt, users=sizes.decode_batch)
    return [
        dict(what="disaggregation: decoding users at the long prompt's context", model=sizes.model, memory_bytes=mem,
             context=sizes.prompt, users=sizes.decode_batch, n_gpus=disagg),
        dict(what="one long request (eviction, tiers)", model=sizes.model, memory_bytes=mem,
             context=sizes.long_context, users=1, n_gpus=serving_gpus(sizes.model, sizes.gpu, sizes.long_context)),
        *[dict(what=f"tiers sweep at {c:,} tokens", model=sizes.model, memory_bytes=mem, context=c, users=1,
               n_gpus=serving_gpus(sizes.model, sizes.gpu, max(sizes.contexts))) for c in sizes.contexts],
    ]


def link_time_s(n_bytes: float, link: str, n_gpus: int = 1) -> float:
    """Seconds to move ``n_bytes`` one way over a catalog link, each of ``n_gpus`` GPUs moving its share."""
    spec = get_interconnect(link)
    return spec.base_latency_s + n_bytes / (spec.per_direction_Bps * n_gpus)
