"""Part 8 of chapter 07: SDPA backends and decode attention vs KV heads, timed on this machine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from matplotlib.ticker import FuncFormatter, NullFormatter

from ...bench.attention import BackendTime, DecodeAttentionTime
from ...figures import finish, subplots
from ...hardware import device_label
from ...units import human
from ..notebook_code import notebook_function
from ..tables import Column, people_table
from .scenario import NUMBER, Sizes
from .shared import threads_text


@dataclass(frozen=True)
class TimingResult:
    backends: list[BackendTime]
    decode: list[DecodeAttentionTime]
    device: str
    bandwidth_Bps: float  # measured copy bandwidth, the decode prediction's denominator
    threads: int


def timing_result(device: torch.device, measured: tuple[list[BackendTime], list[DecodeAttentionTime], float]
                  ) -> TimingResult:
    """The notebook's ``attention_times`` (backends, decode steps, copy bandwidth) as a result."""
    backends, decode, bandwidth = measured
    return TimingResult(backends, decode, device_label(device), bandwidth, torch.get_num_threads())


def run_timing(lm: Any, sizes: Sizes) -> TimingResult:
    """Run the notebook's own ``attention_times`` at this size."""
    device = lm.device if lm is not None else torch.device("cpu")
    attention_times = notebook_function(NUMBER, "attention_times")
    return timing_result(device, attention_times(device, sizes.sdpa_lengths, sizes.heads, sizes.head_dim,
                                                 sizes.decode_context, sizes.decode_kv_heads, sizes.repeats))


def timing_text(timing: TimingResult) -> str:
    ok = [b for b in timing.backends if b.available]
    longest = max(b.seq_len for b in ok)
    fastest = min((b for b in ok if b.seq_len == longest), key=lambda b: b.time_s_p50)
    few, many = timing.decode[0], timing.decode[-1]
    text = (f"On {timing.device} ({threads_text(timing.threads)}): at {longest:,} tokens the fastest available SDPA "
            f"backend is **{fastest.backend}** ({fastest.time_s_p50 * 1e3:.2f} ms); "
            f"{len(timing.backends) - len(ok)} of {len(timing.backends)} backend/length pairs cannot run here. "
            + (unavailable_text(timing) + " " if len(ok) < len(timing.backends) else "") +
            f"Decode attention over {few.context:,} tokens takes {few.time_s_p50 * 1e6:.0f} µs with {few.kv_heads} KV "
            f"head(s) and {many.time_s_p50 * 1e6:.0f} µs with {many.kv_heads}: {many.kv_bytes / few.kv_bytes:.0f}× "
            f"the bytes for {many.time_s_p50 / few.time_s_p50:.1f}× the time, against "
            f"{timing.bandwidth_Bps / 1e9:.1f} GB/s of measured copy bandwidth.")
    return text


BACKEND_COLUMNS = [
    Column("backend", "SDPA backend", "text"), Column("seq_len", "sequence (tokens)", "int"),
    Column("time_s_p50", "time p50 (ms)", scale=1e3, missing="— (not available here)"),
    Column("score_matrix_bytes", "score matrix (math backend)", "bytes"),
]
DECODE_COLUMNS = [
    Column("kv_heads", "KV heads", "int"), Column("context", "context (tokens)", "int"),
    Column("kv_bytes", "KV read", "bytes"), Column("time_s_p50", "measured p50 (µs)", scale=1e6),
    Column("predicted_s", "KV bytes / copy bandwidth (µs)", scale=1e6, missing="— (no bandwidth measured)"),
    Column("measured_over_predicted", "measured / predicted", "ratio", missing="—"),
]


def backend_table(timing: TimingResult):
    """The backends that ran here (those that cannot are named in :func:`unavailable_text`)."""
    return people_table([b for b in timing.backends if b.available], BACKEND_COLUMNS)


def plain_reason(reason: str) -> str:
    """PyTorch's refusal of a backend in words for the page (its raw message never reaches it)."""
    lowered = reason.lower()
    if "no viable backend" in lowered or "not compiled" in lowered or "cuda" in lowered:
        return "no kernel for this device and dtype in this PyTorch build (it is a GPU kernel)"
    if "out of memory" in lowered:
        return "out of memory at this length"
    return "refused by PyTorch on this device"


def unavailable_text(timing: TimingResult) -> str:
    """The backends that could not run, grouped by reason, in one sentence ('' when all ran)."""
    groups: dict[str, list[str]] = {}
    for b in timing.backends:
        if not b.available:
            names = groups.setdefault(plain_reason(b.reason), [])
            if b.backend not in names:
                names.append(b.backend)
    return " ".join(f"Not run here: **{', '.join(names)}**: {why}." for why, names in groups.items())


def decode_table(timing: TimingResult):
    return people_table(timing.decode, DECODE_COLUMNS)


def timing_figure(timing: TimingResult):
    """SDPA backend time vs length, and decode attention time vs KV heads with its bandwidth prediction."""
    plain = FuncFormatter(lambda v, _: f"{human(v, 4)}")
    fig, (left, right) = subplots(1, 2, figsize=(10, 3.6))
    for name in dict.fromkeys(b.backend for b in timing.backends):
        ok = [b for b in timing.backends if b.backend == name and b.available]
        if ok:
            left.plot([b.seq_len for b in ok], [b.time_s_p50 * 1e3 for b in ok], "o-", label=name)
    lengths = sorted({b.seq_len for b in timing.backends})
    left.set(xscale="log", yscale="log", xlabel="sequence length (tokens)", ylabel="prefill attention p50 (ms, log)",
             xticks=lengths)
    left.xaxis.set_major_formatter(plain)  # the lengths measured, and no minor labels between them
    left.xaxis.set_minor_formatter(NullFormatter())  # (the y axis gets plain log labels from finish)
    left.legend(fontsize=8)
    kv = [d.kv_heads for d in timing.decode]
    right.plot(kv, [d.time_s_p50 * 1e6 for d in timing.decode], "o-", label="measured p50")
    if all(d.predicted_s for d in timing.decode):
        right.plot(kv, [d.predicted_s * 1e6 for d in timing.decode], "k--", label="KV bytes / copy bandwidth")
    right.set_xscale("log", base=2)
    right.set(xlabel="KV heads", ylabel="decode attention step (µs)", ylim=(0, None), xticks=kv)
    right.xaxis.set_major_formatter(plain)
    right.xaxis.set_minor_formatter(NullFormatter())
    right.legend(fontsize=8)
    fig.suptitle(f"Attention measured on {timing.device}", fontsize=10)
    finish(fig)
    return fig
