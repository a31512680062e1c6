"""Part 1's findings in words (``tp``): the paragraphs, the lead and derivation the page shows, and what it keeps one click away."""

from __future__ import annotations

from typing import Any

from ...analysis.plausibility import caution, line_fit_flags
from ...units import human
from .tp import TPResult, sweep_table, tp_steps_table


def tp_paragraphs(tp: TPResult) -> dict[str, str]:
    """What part 1 found, one paragraph per point ('split', 'tokens', 'counted', 'caution', 'cost',
    'step', 'why'; an empty one is left out), every number from ``tp``."""
    ref, one = tp.reference, tp.one_rank
    r0 = tp.run(tp.world_size, 0)
    slowest = max((tp.run(tp.world_size, r) for r in range(tp.world_size)), key=lambda r: r.step_ms)
    same = "identical" if tp.identical_ws1 and tp.identical_hf else "NOT identical"
    lines = [
        f"**Split:** {tp.plan}. Embedding, LM head and norms are replicated on every rank.",
        f"**Tokens:** world size {tp.world_size} picked {same} greedy tokens to world size 1 "
        f"({'same' if tp.identical_ws1 else 'different'}) and to transformers "
        f"({'same' if tp.identical_hf else 'different'}) on {len(tp.prompt_tokens)} prompts x "
        f"{tp.new_tokens} tokens.",
        f"**All-reduces, counted:** {r0.allreduces_per_step} per decode step = 2 x {tp.layers} layers, each of "
        f"{tp.message_bytes:,} bytes (tokens x {tp.hidden} x {tp.act_bytes} B) in the median step; "
        f"{tp.steps_matching_prediction} of rank 0's {len(tp.decode_steps)} decode steps made exactly the predicted "
        f"count and bytes (fewer tokens once a sequence stops at EOS, fewer bytes). World size 1 made "
        f"{tp.single_allreduces}. Nothing else crosses between ranks.",
        caution(line_fit_flags("the all-reduce time", tp.sweep.latency_s, 1 / tp.sweep.bus_bandwidth_Bps,
                               unit="µs", scale=1e6)),
        f"**All-reduce cost here:** the fit (to each size's {tp.sweep.fitted_on} time) gives "
        f"{tp.sweep.latency_s * 1e6:,.0f} µs per call plus "
        f"{tp.sweep.bus_bandwidth_Bps / 1e9:.2f} GB/s of bus bandwidth, so one decode step's "
        f"{r0.allreduces_per_step} calls are predicted at {tp.predicted_comm_ms:.1f} ms; rank 0 measured "
        f"{r0.comm_ms:.1f} ms inside them ({r0.comm_ms / max(1, r0.allreduces_per_step) * 1e3:,.0f} µs per call "
        f"vs {tp.sweep.predicted_s(tp.message_bytes) * 1e6:,.0f} µs in the sweep, where both ranks start "
        "together). The difference is waiting: for the rank with more heads, and, "
        f"when the cores are oversubscribed (load average {tp.load_average:.1f} on {tp.cores} cores during this "
        "run), for the operating system to schedule the other rank at all.",
        f"**Step time:** {ref.step_ms:.0f} ms on 1 process with {ref.threads} thread(s)"
        + "".join(f" ({r.step_ms:.0f} ms with {r.threads} thread(s))" for r in tp.single_process_runs if r is not ref)
        + f", {slowest.step_ms:.0f} ms with {tp.world_size} ranks ({slowest.step_ms / ref.step_ms:.2f}x the best "
        "single process). "
        f"The GPU model (each rank reads its own memory) predicts {tp.predicted_tp_step_ms:.0f} ms: one rank's "
        f"compute ({one.compute_ms:.0f} ms at {one.threads} thread(s)) x {tp.busiest_work_share:.2f} (the busiest "
        f"rank's share of the weights: {tp.largest_split_share:.0%} of the split layers plus the whole "
        f"replicated LM head) + {tp.predicted_comm_ms:.1f} ms of all-reduces; measured / predicted "
        f"{r0.step_ms / tp.predicted_tp_step_ms:.2f}x. With one memory bus shared by the ranks, as on this CPU, "
        f"the compute would not shrink: {tp.predicted_shared_bus_step_ms:.0f} ms "
        f"({r0.step_ms / tp.predicted_shared_bus_step_ms:.2f}x).",
    ]
    if slowest.step_ms > ref.step_ms:
        lines.append(
            f"**Why {tp.world_size} ranks are slower here:** they run on the same {tp.cores} CPU cores as the "
            f"single process (its fastest run used {ref.threads} thread(s); each rank uses {r0.threads}), and other "
            "programs share those cores too. A decode step is mostly reading weights, and both ranks read theirs "
            "through the same memory bus and caches, so halving each rank's weights need not halve its time: rank 0's "
            f"compute went from {one.compute_ms:.0f} to {r0.compute_ms:.0f} ms ({r0.compute_ms / one.compute_ms:.2f}x; "
            f"with memory of its own, as a GPU has, the split's ideal is {tp.busiest_work_share:.2f}x). And it added {r0.comm_ms:.0f} ms inside {r0.allreduces_per_step} "
            f"all-reduces ({r0.comm_share:.0%} of rank 0's step), each paying about "
            f"{tp.sweep.latency_s * 1e6:,.0f} µs of gloo latency for a few kilobytes. That is the all-reduce "
            "tax, made visible. On GPUs each rank brings its own memory bandwidth and NVLink makes a call a few "
            "microseconds: part 2 scales the same arithmetic up."
        )
    else:
        lines.append(
            f"Here {tp.world_size} ranks were faster than the best single process: the split cut rank 0's "
            f"compute from {one.compute_ms:.0f} to {r0.compute_ms:.0f} ms, and the all-reduces "
            f"({r0.comm_share:.0%} of its step) cost less than that saved."
        )
    keys = ("split", "tokens", "counted", "caution", "cost", "step", "why")
    return {key: line for key, line in zip(keys, lines, strict=True) if line}


def tp_text(tp: TPResult) -> str:
    """Identity, the all-reduce count, and why two ranks are slower here, from the numbers."""
    return "\n\n".join(tp_paragraphs(tp).values())


def tp_finding(tp: TPResult) -> str:
    """Part 1's finding in one paragraph: the step time with ``world_size`` ranks against the best
    single process, and how much of it the all-reduces took."""
    ref, r0 = tp.reference, tp.run(tp.world_size, 0)
    slowest = max((tp.run(tp.world_size, r) for r in range(tp.world_size)), key=lambda r: r.step_ms)
    verdict = "slower" if slowest.step_ms > ref.step_ms else "faster"
    return (f"**The finding:** a decode step took {human(slowest.step_ms)} ms with {tp.world_size} ranks against "
            f"{human(ref.step_ms)} ms in the best single process ({human(slowest.step_ms / ref.step_ms)}x, "
            f"{verdict}); rank 0 spent {human(r0.comm_ms)} ms of its step ({r0.comm_share:.0%}) inside its "
            f"{r0.allreduces_per_step} all-reduces. The figure shows where the time went; the derivation below "
            "says why, and what changes on GPUs.")


def tp_lead(tp: TPResult) -> str:
    """What part 1 shows at a glance: the tokens, the all-reduces counted, the finding (and a
    caution when the all-reduce fit is not trustworthy). The rest is :func:`tp_derivation`."""
    parts = tp_paragraphs(tp)
    return "\n\n".join([parts[k] for k in ("tokens", "counted", "caution") if k in parts] + [tp_finding(tp)])


def tp_derivation(tp: TPResult) -> str:
    """The derivation behind part 1's finding: the split, the all-reduce cost, the step time, why."""
    parts = tp_paragraphs(tp)
    return "\n\n".join(parts[k] for k in ("split", "cost", "step", "why") if k in parts)


def tp_details(tp: TPResult) -> dict[str, list[Any]]:
    """What part 1 keeps one click away (the page shows them in closed accordions): the derivation,
    the decode steps in the columns the finding reads, every column and the all-reduce sweep."""
    return {
        "Why: the split, the all-reduce cost, the step time": [tp_derivation(tp)],
        "The decode steps, in numbers": [tp_steps_table(tp, lesson=True)],
        "Every column, and the all-reduce sweep": [tp_steps_table(tp), sweep_table(tp)],
    }
